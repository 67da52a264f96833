"""The persistence operations of the core: checkpoint and restore on the server, dump and
load through the caller, export. Paths a client names stay in the data root's areas
(:mod:`.paths`); a dump's archive is untrusted on the way in (:mod:`tdreplay.codec.archive`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from tdreplay.codec import protocol
from tdreplay.codec.archive import Packed
from tdreplay.codec.archive import unpack as archive_unpack
from tdreplay.codec.exports import ExportedPath, export_format
from tdreplay.codec.minari_files import write_minari
from tdreplay.codec.params import (
    ExportBody,
    LoadBeginParams,
    LoadPartParams,
    LoadUpload,
    PathBody,
)
from tdreplay.storage import (
    CheckpointError,
    CheckpointPath,
    InvalidCheckpoint,
    InvalidRequest,
    PathExists,
    Table,
    TableSpec,
    find_checkpoint,
    on_full_disk,
    read_checkpoint_metadata,
)

from ..limits import Exports, ExportSlot
from .handle import TableHandle
from .paths import (
    EXPORT_SCRATCH,
    EXPORTS,
    TRANSFER_SCRATCH,
    checkpoint_target,
    confine_area,
    export_target,
    relative,
)
from .served import CorePart
from .uploads import Upload, Uploads, finish

log = logging.getLogger("tdreplay.service")


class PersistenceOps(CorePart):
    """Checkpoint, restore, export, dump and load (in one request or in parts) of
    :class:`~.ops.Core`."""

    uploads: Uploads
    exports: Exports

    async def checkpoint(self, name: str, body: PathBody) -> str:
        """Checkpoint a table; returns the folder relative to the data root.

        Raises:
            InvalidRequest, PathExists: see :func:`.paths.checkpoint_target`.
            CheckpointError: it could not be written (the previous one is kept).
        """
        self.table(name)
        target = checkpoint_target(self.root, name, body.path)
        path = await self.checkpoint_to(name, target)
        return relative(self.root, path)

    async def restore(self, name: str, body: PathBody) -> dict[str, Any]:
        """Replace (or create) a table from a checkpoint of it; returns its info.

        Raises:
            InvalidRequest: the path is not inside ``checkpoints/``, holds no
                checkpoint, or holds another table's.
            InvalidCheckpoint, CheckpointError: the checkpoint cannot be read.
        """
        source = (
            confine_area(self.root, protocol.CHECKPOINTS, body.path)
            if body.path is not None
            else None
        )
        handle = await self.restore_from(name, source)
        return await handle.info()

    async def export(self, name: str, body: ExportBody) -> tuple[ExportedPath, ExportSlot | None]:
        """Export the live items, oldest first, as Parquet or CSV. Each export counts
        against ``--max-exports`` (:class:`~tdreplay.service.limits.Exports`) from before
        it copies anything until its file is kept or, streamed, sent and deleted.

        Returns:
            The file (with its ``rows`` and ``skipped``; Minari: ``splits`` too), and for
            a scratch file (no ``path`` given: written for the caller to send and then
            delete) the export's slot, which the caller gives back once the file is gone;
            ``None`` for a file under ``exports/``.

        Raises:
            InvalidRequest, PathExists: see :func:`.paths.export_target`; InvalidRequest
                too for a format the path's suffix does not name
                (:func:`tdreplay.codec.exports.export_format`).
            BackendError: ``--max-exports`` exports are under way (503, ``Retry-After``).
            InsufficientStorage: the disk is full (nothing is left behind).
        """
        handle = self.table(name)
        if body.format == "minari":
            slot = self.exports.take(name)
            try:
                return await self._export_minari(handle, name, body), None
            finally:
                slot.give()
        if body.path is not None:
            target, scratch = export_target(self.root, name, body.path), False
        else:  # named for its format, which the route sends it as
            suffix = body.format or "parquet"
            target = self.root / EXPORT_SCRATCH / f"{name}-{uuid.uuid4().hex}.{suffix}"
            scratch = True
        fmt = export_format(target, body.format, name)
        slot = self.exports.take(name)  # before anything is copied
        began = time.monotonic()
        try:
            with handle.use() as table:
                # export_target refused an existing file; replace=False refuses one that
                # appeared since (another export racing for the name), at the final step
                written = await handle.call(lambda: table.export(target, format=fmt, replace=False))
            nbytes = written.stat().st_size
        except BaseException:  # nothing to send: the slot is free again
            slot.give()
            raise
        if not scratch:
            slot.give()
        log.info(
            "table %r exported as %s to %s: %d rows (%d skipped), %d bytes in %.2f s",
            name,
            fmt,
            "the client" if scratch else relative(self.root, written),
            written.rows,
            written.skipped,
            nbytes,
            time.monotonic() - began,
        )
        return written, slot if scratch else None

    async def _export_minari(
        self, handle: TableHandle, name: str, body: ExportBody
    ) -> ExportedPath:
        """The table as a Minari dataset under the datasets root ``body.path`` (inside
        ``exports/``): a Parquet export in scratch, converted (:mod:`tdreplay.codec.minari_files`).

        Raises:
            InvalidRequest: no ``path`` or ``dataset_id``, a path outside ``exports/``, or
                a malformed ``env_spec``.
            PathExists: the dataset exists already.
            SchemaError: no episodes in the table (a key missing, no boundary found).
        """
        if body.path is None or body.dataset_id is None:
            raise InvalidRequest(
                f"table {name!r}: a Minari export is written on the server: give path "
                "(a datasets root inside exports/) and dataset_id",
                table=name,
                field="path" if body.path is None else "dataset_id",
            )
        root = confine_area(self.root, EXPORTS, body.path)
        folder = confine_area(self.root, EXPORTS, f"{body.path}/{body.dataset_id}")
        if os.path.lexists(folder):
            raise PathExists(
                f"a dataset {body.dataset_id!r} exists under {body.path!r} already",
                table=name,
                field="dataset_id",
                got=body.dataset_id,
            )
        scratch = self.root / EXPORT_SCRATCH / f"{name}-{uuid.uuid4().hex}.parquet"
        began = time.monotonic()
        try:
            with handle.use() as table:
                rows = await handle.call(lambda: table.export(scratch, format="parquet"))
            written = await run_in_threadpool(
                write_minari, scratch, root, body.dataset_id, env_spec=body.env_spec
            )
        except ImportError as err:  # the [datasets] extra is not installed here
            raise InvalidRequest(
                f"table {name!r}: this server cannot write Minari datasets: {err}",
                table=name,
                field="format",
            ) from None
        finally:
            scratch.unlink(missing_ok=True)
        log.info(
            "table %r exported as the Minari dataset %r to %s: %d rows (%d skipped) in %.2f s",
            name,
            body.dataset_id,
            relative(self.root, written),
            rows.rows,
            rows.skipped,
            time.monotonic() - began,
        )
        return ExportedPath.of(written, rows=rows.rows, skipped=rows.skipped, splits=written.splits)

    async def dump(self, name: str) -> Packed:
        """A fresh checkpoint of a table, as the archive its folder makes (read a part at a
        time: the disk holds its files once), for the caller to send and then delete
        (``shutil.rmtree(packed.folder)``); nothing else of it stays behind.

        Raises:
            TableNotFound: no such table.
            CheckpointError, InsufficientStorage: it could not be written.
        """
        self.table(name)
        folder = self._scratch(name)
        try:
            await self.checkpoint_to(name, folder)
            return await run_in_threadpool(Packed, folder)
        except BaseException:
            await run_in_threadpool(shutil.rmtree, folder, True)
            raise

    async def load(self, name: str, data: bytes | memoryview) -> dict[str, Any]:
        """Replace (or create) a table from an archive :meth:`dump` made of it; returns its info.

        The archive is untrusted: unpacked by :func:`tdreplay.codec.archive.unpack`
        (regular files inside a scratch folder only, within the body limit), then
        restored as any checkpoint is (nothing in it can run code), then deleted.

        Raises:
            CodecError: not such an archive (the member at fault is named).
            InvalidRequest: the checkpoint is of another table.
            InvalidCheckpoint, CheckpointError: it cannot be restored.
            InsufficientStorage: the disk has no room for it.
        """
        folder = self._scratch(name)
        limit = self.uploads.unpack_bytes  # the one bound on what an archive unpacks into
        try:
            with on_full_disk(f"load of table {name!r}", folder, table=name):
                await run_in_threadpool(archive_unpack, bytes(data), folder, max_bytes=limit)
            handle = await self.restore_from(name, folder)
        finally:
            await run_in_threadpool(shutil.rmtree, folder, True)
        return await handle.info()

    async def load_begin(self, name: str, params: LoadBeginParams) -> Upload:
        """Begin a load in parts of an archive of ``params.size`` bytes (:mod:`.uploads`).

        Raises:
            PayloadTooLarge: over ``--max-load-bytes``.
            InsufficientStorage: too many loads under way, or no room on the disk.
        """
        upload = await self.uploads.begin(name, params.size)
        log.info("table %r: load %s of %d bytes begun", name, upload.id, upload.size)
        return upload

    async def load_part(
        self, name: str, params: LoadPartParams, read: Callable[[], Awaitable[memoryview]]
    ) -> Upload:
        """Add the part ``read()`` gives to a load in parts (see :meth:`.uploads.Uploads.part`)."""
        return await self.uploads.part(name, params.upload, params.offset, read)

    async def load_commit(self, name: str, params: LoadUpload) -> dict[str, Any]:
        """Restore the table from a load in parts, once whole; returns its info. As
        :meth:`load`: unpacked as untrusted, restored beside the table served, swapped in
        once whole. The upload ends either way; a failure leaves the table as it was.

        Raises:
            InvalidRequest: no such upload, bytes of it missing (it stays open), or the
                archive is of another table.
            CodecError, InvalidCheckpoint, CheckpointError: see :meth:`load`.
        """
        began = time.monotonic()
        async with self.uploads.committing(name, params.upload) as upload:
            handle = await self.restore_from(name, await run_in_threadpool(finish, upload))
        log.info(
            "table %r loaded from %d bytes in parts (load %s) in %.2f s",
            name,
            upload.size,
            upload.id,
            time.monotonic() - began,
        )
        return await handle.info()

    async def load_abort(self, name: str, params: LoadUpload) -> bool:
        """Drop a load in parts and its staged bytes; whether it was under way."""
        return await self.uploads.abort(name, params.upload)

    async def checkpoint_to(self, name: str, path: Path | None = None) -> Path:
        """Checkpoint ``name`` to ``path`` (default ``checkpoints/<name>``); the folder written."""
        handle = self.table(name)
        with handle.use() as table:
            target = path or self.served.checkpoint_path(name)
            began = time.monotonic()
            written, rows, nbytes = await handle.call(lambda: _checkpoint(table, target))
        log.info(
            "table %r %s %s: %d rows, %d bytes in %.2f s",
            name,
            "unchanged since its checkpoint (skipped, kept):"
            if written.skipped
            else "checkpointed to",
            written,
            rows,
            nbytes,
            time.monotonic() - began,
        )
        return written

    async def restore_from(self, name: str, path: Path | None = None) -> TableHandle:
        """Replace (or create) table ``name`` from the checkpoint at ``path``.

        The checkpoint is restored beside the table being served, which keeps
        serving meanwhile; only once the restore succeeded is the new table
        swapped in and the old one retired (its running calls finish) and
        destroyed. A failed restore changes nothing. Both tables' data is held
        while the restore runs.

        Raises:
            InvalidRequest: no checkpoint there, or it holds another table.
            CheckpointError: the checkpoint could not be read.
            BackendError: the restored table's storage could not be allocated.
        """
        path = path or self.served.checkpoint_path(name)
        try:
            await run_in_threadpool(find_checkpoint, path)
        except CheckpointError:
            raise InvalidRequest(
                f"no checkpoint of table {name!r} there", table=name, field="path"
            ) from None
        meta = await run_in_threadpool(read_checkpoint_metadata, path)
        raw = meta.get("spec")
        if not isinstance(raw, dict):
            raise InvalidCheckpoint(
                f"the checkpoint at {path.name!r} holds no table spec", table=name
            )
        spec = TableSpec.parse(raw, source=f"checkpoint {path.name!r}")
        held = spec.name
        if held != name:
            raise InvalidRequest(
                f"the checkpoint at {path.name!r} holds table {held!r}, not {name!r}",
                table=name,
                field="path",
                expected=name,
                got=held,
            )
        await self.served.settled(name)  # a clear or restore under way: this one follows it
        nbytes = self.served.admit(spec)
        with self.served.reserve(name, nbytes, replace=True):
            table = await run_in_threadpool(
                lambda: Table.restore(
                    path, self.root, seed=self.settings.seed, redis=self.served.redis, expect=spec
                )
            )
            return await self._swap(name, table, "restored")

    def _scratch(self, name: str) -> Path:
        """A new scratch folder's path for ``name`` (its parent made)."""
        parent = self.root / TRANSFER_SCRATCH
        parent.mkdir(mode=0o700, exist_ok=True)
        return parent / f"{name}-{uuid.uuid4().hex}"

    def relative(self, path: Path) -> str:
        """``path`` as a client sees it: relative to the data root."""
        return relative(self.root, path)


def _checkpoint(table: Table, target: Path) -> tuple[CheckpointPath, int, int]:
    """Checkpoint ``table``; the folder written, its rows and its bytes (for the log)."""
    # checkpoint_target refused another's path; own_only refuses one another table took
    # since (a checkpoint racing for the name), at the swap
    written = table.checkpoint(target, own_only=True)
    nbytes = sum(f.stat().st_size for f in written.rglob("*") if f.is_file())
    return written, table.size, nbytes

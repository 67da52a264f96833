"""Loads in parts: a table's archive larger than one request body, unpacked on the server's
disk part by part as it comes, restored only once whole.

A load in one request is bounded by ``--max-body-bytes``; a dump of a bigger table goes up
as an *upload*: ``load_begin`` declares the archive's size (at most ``--max-load-bytes``)
and the server answers the upload's id and the part size (its body limit); each
``load_part`` is one request within that limit, its bytes fed straight to a
:class:`~tdreplay.codec.archive.Unpacker` into the upload's folder (the archive is never
held whole: the disk holds the table's files once); ``load_commit`` checks the archive
ended and restores the table (:meth:`~.persistence.PersistenceOps.load_commit`);
``load_abort`` drops it.

The server names everything: the id is random, the folder ``<root>/.transfers/load-<id>/``
is made by the server, and a request names an upload only by its id, looked up here - no
client path reaches the disk. Parts come in order: a part must start where the bytes
received end, and may not run past the declared size; a retry may send the last part
again as it was (same offset, size and bytes: told by its digest), answered as the first
time. The first 512 bytes must be a tar header (:func:`~tdreplay.codec.archive.check_start`).
A part refused for its place, size or first block changes nothing; one the archive's reader
refuses (a damaged member, half written by then) ends the upload. An upload idle for
``--load-timeout`` seconds is deleted, as is one whose commit failed, every one at shutdown,
and (what a crash left) every one at start with the rest of ``.transfers``. At most
:data:`MAX_UPLOADS` are open at once: one more drops the one idle longest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from tdreplay.codec.archive import Unpacker, check_start
from tdreplay.storage import (
    InsufficientStorage,
    InvalidRequest,
    free_bytes,
    on_full_disk,
)

from ..errors import PayloadTooLarge
from ..settings import Settings

log = logging.getLogger("tdreplay.service")

#: uploads open at once, over all tables (each holds up to --max-load-bytes of disk)
MAX_UPLOADS = 16
#: the bytes of the archive's first header, checked as soon as they are in
HEADER = 512


@dataclass(eq=False)
class Upload:
    """One load in parts under way: the table it loads, its id, declared size, folder, the
    bytes received so far (in order, from the start) and the reader they went through
    (made by :meth:`Uploads.begin`)."""

    table: str
    id: str
    size: int
    folder: Path
    received: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    timer: asyncio.TimerHandle | None = None
    touched: float = 0.0  # when a request on it last ended (time.monotonic())
    unpacker: Unpacker | None = None
    head: bytes = b""  # the archive's first bytes, up to its first header's 512
    last: tuple[int, int, bytes] = (0, 0, b"")  # the last part: offset, end, digest


class Uploads:
    """The loads in parts under way, by id.

    Args:
        scratch: the folder their staging folders go in (``<root>/.transfers``).
        settings: ``max_load_bytes`` (an archive's size at most), ``max_body_bytes``
            (a part's), ``load_timeout`` (idle seconds before one is dropped).
    """

    def __init__(self, scratch: Path, settings: Settings) -> None:
        self.scratch = scratch
        self.max_bytes = settings.max_load_bytes
        #: the most bytes of files an archive may unpack into (a load in parts, or in one)
        self.unpack_bytes = max(settings.max_body_bytes, settings.max_load_bytes)
        self.part_bytes = settings.max_body_bytes
        self.idle = settings.load_timeout
        self._open: dict[str, Upload] = {}

    def __len__(self) -> int:
        return len(self._open)

    async def begin(self, table: str, size: int) -> Upload:
        """A new upload of ``size`` bytes into ``table``: its folder and empty file made.

        Raises:
            PayloadTooLarge: ``size`` is over ``--max-load-bytes``.
            InsufficientStorage: the disk has no room for it beside the bytes the open
                uploads still expect, or :data:`MAX_UPLOADS` are open and all receiving
                parts (else the one idle longest is dropped).
        """
        if size > self.max_bytes:
            raise PayloadTooLarge(
                f"table {table!r}: a load of {size} bytes exceeds the server's limit of "
                f"{self.max_bytes} bytes (--max-load-bytes)",
                table=table,
                field="size",
                expected=f"<= {self.max_bytes} bytes",
                got=size,
            )
        if len(self._open) >= MAX_UPLOADS:
            await self._evict(table)
        expected = size + sum(u.size - u.received for u in self._open.values())
        free = await run_in_threadpool(free_bytes, self.scratch)
        if free < expected:
            raise InsufficientStorage(
                f"table {table!r}: a load of {size} bytes needs {expected} bytes free with the "
                f"loads under way; the data root has {free}",
                table=table,
                field="size",
                expected=f">= {expected} bytes free",
                got=free,
            )
        upload_id = uuid.uuid4().hex
        upload = Upload(table, upload_id, size, self.scratch / f"load-{upload_id}")
        await run_in_threadpool(_make, upload, self.unpack_bytes)
        self._open[upload.id] = upload
        self._arm(upload)
        return upload

    async def part(
        self, table: str, upload_id: str, offset: int, read: Callable[[], Awaitable[memoryview]]
    ) -> Upload:
        """Unpack the part ``read()`` gives (the request's body, read once the upload is
        found and held, so it does not expire meanwhile) at ``offset``.

        Raises:
            InvalidRequest: no such upload of ``table``; the part is empty, leaves a gap,
                runs past the declared size, or repeats received bytes other than the
                last part's, as it was.
            CodecError: the archive's first 512 bytes are not a tar header; or the
                archive's reader refused a member (the upload is then dropped).
            InsufficientStorage: the disk filled up (the upload is then dropped).
        """
        upload = self.find(table, upload_id)
        async with upload.lock:
            data = await read()
            self.find(table, upload_id)  # dropped meanwhile (an abort)?
            end = offset + len(data)
            _check_part(upload, offset, end)
            if offset < upload.received:
                await run_in_threadpool(_check_repeat, upload, offset, end, data)
                self._arm(upload)
                return upload
            head = upload.head
            if len(head) < HEADER:
                head += bytes(data[: HEADER - len(head)])
                if len(head) == HEADER:
                    check_start(head)  # refused: as if never sent
            try:
                digest = await run_in_threadpool(_feed, upload, data)
            except BaseException:
                await self.drop(upload)
                raise
            upload.head, upload.received, upload.last = head, end, (offset, end, digest)
            self._arm(upload)
        return upload

    @asynccontextmanager
    async def committing(self, table: str, upload_id: str) -> AsyncIterator[Upload]:
        """The whole upload ``upload_id``, taken out of the open ones for its commit; its
        folder is deleted when the block ends, whichever way.

        Raises:
            InvalidRequest: no such upload of ``table``, or bytes of it are missing (it
                stays open: send them, then commit again).
        """
        upload = self.find(table, upload_id)
        async with upload.lock:
            self.find(table, upload_id)
            if upload.received != upload.size:
                raise InvalidRequest(
                    f"table {table!r}: load {upload.id} has {upload.received} of its "
                    f"{upload.size} bytes: send the rest before the commit",
                    table=table,
                    field="upload",
                    expected=upload.size,
                    got=upload.received,
                )
            self._forget(upload)
        try:
            yield upload
        finally:
            await run_in_threadpool(_delete, upload)

    async def abort(self, table: str, upload_id: str) -> bool:
        """Drop upload ``upload_id`` of ``table`` (a part being received ends first); whether
        it was open (an abort is answered alike twice)."""
        upload = self._open.get(upload_id)
        if upload is None or upload.table != table:
            return False
        async with upload.lock:
            if self._open.get(upload_id) is not upload:
                return False
            await self.drop(upload)
        return True

    async def _evict(self, table: str) -> None:
        """Make room for one more upload: drop the one idle longest (a client that left one
        behind never blocks the next load).

        Raises:
            InsufficientStorage: every open upload is receiving a part.
        """
        idle = [u for u in self._open.values() if not u.lock.locked()]
        if not idle:
            raise InsufficientStorage(
                f"table {table!r}: {len(self._open)} loads are receiving parts, the most this "
                "server takes at once; retry once one has ended",
                table=table,
                field="upload",
            )
        oldest = min(idle, key=lambda u: u.touched)
        log.warning(
            "load %s of table %r dropped for a new one (%d loads at most; idle %.1f s)",
            oldest.id,
            oldest.table,
            MAX_UPLOADS,
            time.monotonic() - oldest.touched,
        )
        await self.drop(oldest)

    def find(self, table: str, upload_id: str) -> Upload:
        """The open upload ``upload_id`` of ``table``.

        Raises:
            InvalidRequest: there is none (never begun, committed, aborted, ended, expired).
        """
        upload = self._open.get(upload_id)
        if upload is None or upload.table != table:
            raise InvalidRequest(
                f"table {table!r}: no load {upload_id!r} under way (committed, aborted, ended "
                f"by a part refused, or idle over {self.idle:g} s (--load-timeout)); begin the "
                "load again",
                table=table,
                field="upload",
                got=upload_id,
            )
        return upload

    async def drop(self, upload: Upload) -> None:
        """Forget ``upload`` and delete its folder."""
        self._forget(upload)
        await run_in_threadpool(_delete, upload)

    async def close(self) -> None:
        """Drop every upload (the server is stopping)."""
        for upload in list(self._open.values()):
            await self.drop(upload)

    def _forget(self, upload: Upload) -> None:
        self._open.pop(upload.id, None)
        if upload.timer is not None:
            upload.timer.cancel()
            upload.timer = None

    def _arm(self, upload: Upload) -> None:
        """(Re)start the idle timer of ``upload``."""
        upload.touched = time.monotonic()
        if upload.timer is not None:
            upload.timer.cancel()
        loop = asyncio.get_running_loop()
        upload.timer = loop.call_later(self.idle, self._expire, upload)

    def _expire(self, upload: Upload) -> None:
        if self._open.get(upload.id) is not upload:
            return
        if upload.lock.locked():  # a part is being received: idle only once it is in
            self._arm(upload)
            return
        log.warning(
            "load %s of table %r idle for %g s: dropped (%d of %d bytes received)",
            upload.id,
            upload.table,
            self.idle,
            upload.received,
            upload.size,
        )
        self._forget(upload)
        asyncio.get_running_loop().run_in_executor(None, _delete, upload)


def _make(upload: Upload, max_bytes: int) -> None:
    upload.folder.parent.mkdir(mode=0o700, exist_ok=True)
    upload.folder.mkdir(mode=0o700)
    upload.unpacker = Unpacker(upload.folder / "dump", max_bytes=max_bytes)


def _delete(upload: Upload) -> None:
    if upload.unpacker is not None:
        with contextlib.suppress(OSError):  # its last bytes unwritten (a full disk): it goes
            upload.unpacker.close()
    shutil.rmtree(upload.folder, True)


def _check_part(upload: Upload, offset: int, end: int) -> None:
    """Refuse a part of ``upload`` from ``offset`` to ``end`` unless it is next in order."""
    table, where = upload.table, f"load {upload.id}"
    if end == offset:
        raise InvalidRequest(
            f"table {table!r}: an empty part of {where}", table=table, field="body"
        )
    if offset > upload.received:
        raise InvalidRequest(
            f"table {table!r}: a part of {where} at offset {offset} leaves a gap: "
            f"{upload.received} bytes are in, send the part from there",
            table=table,
            field="offset",
            expected=upload.received,
            got=offset,
        )
    if end > upload.size:
        raise InvalidRequest(
            f"table {table!r}: a part of {where} ends at byte {end}, past the {upload.size} "
            "bytes its begin declared",
            table=table,
            field="offset",
            expected=f"<= {upload.size}",
            got=end,
        )


def _digest(data: memoryview) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def _check_repeat(upload: Upload, offset: int, end: int, data: memoryview) -> None:
    """Refuse a part over bytes received unless it is the last part again, as it was (a
    retry of a part whose answer was lost).

    Raises:
        InvalidRequest: it is not.
    """
    table, (last, last_end, digest) = upload.table, upload.last
    if (offset, end) != (last, last_end):
        raise InvalidRequest(
            f"table {table!r}: a part of load {upload.id} at offset {offset} repeats bytes "
            f"received ({upload.received} are in): only the last part, from {last} to "
            f"{last_end}, may be sent again, as it was",
            table=table,
            field="offset",
            expected=upload.received,
            got=offset,
        )
    if _digest(data) != digest:
        raise InvalidRequest(
            f"table {table!r}: a part of load {upload.id} at offset {offset} differs from the "
            "bytes received there; a retry sends the same bytes",
            table=table,
            field="body",
        )


def _feed(upload: Upload, data: memoryview) -> bytes:
    """Unpack ``data``, the archive's next bytes; their digest.

    Raises:
        CodecError: the archive's reader refused a member.
        InsufficientStorage: the disk is full.
    """
    assert upload.unpacker is not None
    with on_full_disk(f"load of table {upload.table!r}", upload.folder, table=upload.table):
        upload.unpacker.feed(data)
    return _digest(data)


def finish(upload: Upload) -> Path:
    """The folder ``upload``'s whole archive went into (its commit).

    Raises:
        CodecError: the archive did not end there (its end blocks are missing).
    """
    assert upload.unpacker is not None
    upload.unpacker.finish()
    return upload.unpacker.dest

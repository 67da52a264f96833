"""What a server does on start: reopen, restore and create its tables; and checkpoint periodically.

0. The keys of redis tables a killed process left in Redis (recorded under the root)
   are deleted: nothing reattaches them.
1. Memmap tables left under ``<root>/tables/`` are reopened with every row
   acknowledged before the last process ended (crash included).
2. With ``restore``, the checkpoints of tables not reopened are restored.
3. The schemas' tables still missing are created (not over a checkpoint left
   unrestored that the server's own checkpoints would replace).

A table that cannot be brought back is skipped, its data kept, the others
served (``Served.failed`` says why).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from tdreplay.codec import protocol
from tdreplay.storage import (
    SchemaError,
    TableNotFound,
    TableSpec,
    TDReplayError,
    checkpoint_table,
    is_checkpoint_debris,
    is_complete_checkpoint,
    stored_specs,
    sweep_redis_keys,
)

from ..settings import Settings
from .ops import Core

log = logging.getLogger("tdreplay.service")


def load_specs(settings: Settings) -> list[TableSpec]:
    """The schemas under every ``settings.schema_path``, with the settings' backend override
    applied.

    Raises:
        SchemaError: a schema is invalid, a path does not exist, or two schemas declare
            one table.
    """
    specs: list[TableSpec] = []
    seen: dict[str, Path] = {}
    for given in settings.schema_path:
        path = Path(given)
        if path.is_dir():
            found = TableSpec.from_dir(path)
        elif path.exists():
            found = [TableSpec.from_file(path)]
        else:
            raise SchemaError(f"{path}: no such schema file or folder")
        for spec in found:
            if spec.name in seen:
                where = path if seen[spec.name] == path else f"{seen[spec.name]} and {path}"
                raise SchemaError(
                    f"{where}: several schemas declare table {spec.name!r}", field="name"
                )
            seen[spec.name] = path
        specs += found
    return [_override_backend(s, settings) for s in specs]


def _override_backend(spec: TableSpec, settings: Settings) -> TableSpec:
    kind = settings.backend
    if kind is None:
        return spec
    data = spec.model_dump(mode="json")
    data["backend"] = {"kind": kind}  # redis: the operator's "default" connection
    return TableSpec.parse(data, source=f"{spec.name} (backend {kind})")


def checkpoints_under(root: Path) -> list[str]:
    """Tables with a complete checkpoint in ``<root>/checkpoints/<name>``.

    What interrupted checkpoints leave (``<name>.tmp-<hex>``, ``<name>.old-<hex>``)
    is not a table, whatever it holds.
    """
    folder = root / protocol.CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(
        p.name
        for p in folder.iterdir()
        if not is_checkpoint_debris(p.name)
        and "." not in p.name
        and is_complete_checkpoint(p)
        and checkpoint_table(p) == p.name  # a named checkpoint of another table is not one
    )


class PeriodicCheckpoints:
    """Checkpoint the tables that need it (:meth:`Served.needs_checkpoint`) every ``every`` seconds.

    Each to its default path (``<root>/checkpoints/<name>``), one table after the
    other, the next round ``every`` seconds after the previous one ended. A
    failed checkpoint is logged and counted (``tdreplay_periodic_checkpoints``
    on ``/metrics``, and :attr:`failures`); it never stops the server or the
    task. :meth:`stop` lets a checkpoint under way finish.

    Args:
        core: the server's core.
        every: seconds between the end of a round and the next.
        on_result: told of each checkpoint: the table, and ``"ok"`` or ``"failed"``.
    """

    def __init__(
        self,
        core: Core,
        every: float,
        on_result: Callable[[str, str], None] | None = None,
    ) -> None:
        self.core = core
        self.every = every
        self.done = 0
        self.failures = 0
        self._on_result = on_result or (lambda table, outcome: None)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tdreplay-periodic-checkpoints")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.every)
                return
            except TimeoutError:
                pass
            await self.round()

    async def round(self) -> None:
        """Checkpoint every table that needs it once."""
        for handle in self.core.served.handles():
            if self._stop.is_set():
                return
            if not self.core.served.needs_checkpoint(handle.table.spec):
                continue
            try:
                await self.core.checkpoint_to(handle.name)
            except TableNotFound:  # deleted since the round began
                continue
            except Exception:
                self.failures += 1
                self._on_result(handle.name, "failed")
                log.exception("periodic checkpoint of table %r failed", handle.name)
            else:
                self.done += 1
                self._on_result(handle.name, "ok")


async def load_tables(core: Core, settings: Settings) -> None:
    """Bring the tables back, newest data first, then create the schemas' new ones.

    0. The keys of redis tables the last process on this root did not delete (it was
       killed, or its Redis did not answer) are deleted; a Redis that does not answer
       now keeps them recorded, for the next sweep.
    1. Memmap tables left under ``<root>/tables/`` are reopened with every row
       acknowledged before the last process ended (crash included); a schema of
       the same name must describe the same table (else the start fails: the
       data is kept, never replaced behind the operator's back).
    2. With ``settings.restore``, the checkpoints of tables not reopened are restored.
    3. The schemas' tables still missing are created (dead data an earlier
       non-durable table of the same name left in its folder is replaced), except one
       with a checkpoint left unrestored (no ``settings.restore``) that this server's own
       checkpoints would replace with the new, empty table: that one is not served, its
       checkpoint kept (``Served.failed`` says so), until the operator restores it or
       moves it away.
    """
    specs = load_specs(settings)
    await run_in_threadpool(sweep_redis_keys, core.root, core.served.redis)
    wanted = {spec.name: spec for spec in specs}
    loaded = set()
    failed = core.served.failed  # name -> why: not served, data kept (shown by /readyz)
    for stored in await run_in_threadpool(stored_specs, core.root, failed):
        schema = wanted.get(stored.name)
        if schema is not None and schema != stored:
            why = (
                f"its data under {core.root / 'tables'} was written under another schema than "
                f"{', '.join(map(str, settings.schema_path))}'s (capacity {stored.capacity} vs {schema.capacity}, "
                f"backend {stored.backend.kind} vs {schema.backend.kind}); it is kept: serve the "
                "old schema, or move the folder away"
            )
            log.error("table %r not served: %s", stored.name, why)
            failed[stored.name] = why
            continue
        try:
            handle = await core.open(stored)
        except TDReplayError as err:
            # One damaged table must not keep the others from being served; its data is kept.
            log.error("table %r not reopened, its data is kept as it is: %s", stored.name, err)
            failed[stored.name] = str(err)
            continue
        loaded.add(stored.name)
        log.info("table %r reopened from disk (%d rows)", stored.name, handle.table.size)
    if settings.restore:
        for name in checkpoints_under(core.root):
            if name in loaded:
                log.info("table %r: its data on disk is newer than its checkpoint", name)
                continue
            try:
                await core.restore_from(name)
            except TDReplayError as err:
                log.error("table %r not restored, its checkpoint is kept as it is: %s", name, err)
                failed[name] = str(err)
                continue
            loaded.add(name)
            log.info("table %r restored from %s", name, core.served.checkpoint_path(name))
    unrestored = set() if settings.restore else set(checkpoints_under(core.root))
    for spec in specs:
        if spec.name in failed:
            continue  # its data (on disk, in its checkpoint) waits for the operator
        if spec.name in unrestored - loaded and core.served.checkpoints_itself(spec):
            why = (
                f"its checkpoint {core.served.checkpoint_path(spec.name)} was not restored "
                "(--restore is off), and this server's own checkpoints (--checkpoint-every, "
                "--checkpoint-on-shutdown) would replace it with a new, empty table; it is "
                "kept: start with --restore to serve it, or move it away to start the table "
                "empty"
            )
            log.error("table %r not created: %s", spec.name, why)
            failed[spec.name] = why
            continue
        if spec.name not in loaded:
            await core.create(spec, replace=True)
            log.info(
                "table %r created (%s, capacity %d)", spec.name, spec.backend.kind, spec.capacity
            )

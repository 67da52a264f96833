"""A redis table's keys, recorded under the data root until they are deleted.

A redis table's keys are ``<prefix>:{<td_id>}:*``, the id a fresh ``uuid4`` for every
allocation. Before the first of them is written, the allocation records them in the
table's own folder, ``<root>/tables/<name>/redis-<td_id>.json`` (the connection's name,
the prefix, the id); deleting the keys deletes the record. A record that outlives its
process (``kill -9``, an OOM kill, a Redis that did not answer when the table went) names
keys nothing reads again: no process reattaches a redis table's keys, a restart serves a
checkpoint's rows in keys of its own. :func:`sweep_keys` deletes them: a server's start
sweeps every record under its root (which it holds alone, :mod:`~tdreplay.storage.rootlock`),
and each allocation of a redis table the records of that table no open backend of this
process holds. Only the keys a record names are deleted: keys tdreplay did not create, and
another root's tables' keys under the same prefix, are never touched. A record whose Redis
does not answer, or whose connection is not configured, is kept for the next sweep.

    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp()) / "t"  # table t's folder
    >>> folder.mkdir()
    >>> record = KeysRecord.write(folder, "t", "default", "tdreplay:t",
    ...                           "0b8f8f3e-6f1e-4c1e-9d4e-2a5f8d7c6b5a")
    >>> record.pattern
    'tdreplay:t:{0b8f8f3e-6f1e-4c1e-9d4e-2a5f8d7c6b5a}:*'
    >>> [r.td_id == record.td_id for r in KeysRecord.under(folder)]
    [True]
    >>> record.remove(); KeysRecord.under(folder)
    []
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import names
from ..errors import TDReplayError
from ..redis_conn import Connections, RedisConnection, resolve
from .locations import TABLES_DIR, marker_of, release_folder
from .redis_identity import ask
from .redis_keys import delete_keys, redis_client

log = logging.getLogger("tdreplay.storage")

#: a record's file name, ``redis-<td_id>.json``
_FILE = re.compile(r"redis-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.json")
_PREFIX = re.compile(names.PREFIX, re.ASCII)

_HELD: set[Path] = set()  # the records of this process's open backends
_HELD_GUARD = threading.Lock()


@dataclass(frozen=True)
class KeysRecord:
    """The keys of one allocation of redis table ``table``: ``<namespace>:{<td_id>}:*`` on
    connection ``connection``, recorded at ``path``."""

    path: Path
    table: str
    connection: str
    namespace: str
    td_id: str

    @property
    def pattern(self) -> str:
        """The ``SCAN`` pattern of the keys."""
        return f"{self.namespace}:{{{self.td_id}}}:*"

    @classmethod
    def write(
        cls, folder: Path, table: str, connection: str, namespace: str, td_id: str
    ) -> KeysRecord:
        """Record (durably: written aside, flushed, renamed) keys about to be written, held
        by this process until :meth:`remove` or :meth:`release`."""
        record = cls(folder / f"redis-{td_id}.json", table, connection, namespace, td_id)
        body = {"table": table, "connection": connection, "prefix": namespace, "td_id": td_id}
        tmp = record.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record.path)
        with _HELD_GUARD:
            _HELD.add(record.path)
        return record

    @classmethod
    def read(cls, path: Path) -> KeysRecord | None:
        """The record at ``path`` (``None``: not one, or damaged: it is left as it is)."""
        try:
            body = json.loads(path.read_text())
            record = cls(
                path, body["table"], body["connection"], body["prefix"], str(body["td_id"])
            )
            names.check_connection(record.connection)
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("%s: not a readable record of a redis table's keys, kept: %s", path, err)
            return None
        match = _FILE.fullmatch(path.name)
        if (
            match is None
            or match.group(1) != record.td_id
            or record.table != path.parent.name
            or not isinstance(record.namespace, str)
            or _PREFIX.fullmatch(record.namespace) is None
        ):
            log.warning("%s: not a record of this table's keys, kept", path)
            return None
        return record

    @classmethod
    def under(cls, folder: Path) -> list[KeysRecord]:
        """The records in a table's folder ``folder``."""
        try:
            paths = sorted(p for p in folder.iterdir() if _FILE.fullmatch(p.name))
        except OSError:
            return []
        return [r for r in map(cls.read, paths) if r is not None]

    def release(self) -> None:
        """This process lets the keys go, recorded still (a later sweep deletes them)."""
        with _HELD_GUARD:
            _HELD.discard(self.path)

    def remove(self) -> None:
        """The keys are deleted: so is the record (and the table's folder, once empty)."""
        self.release()
        self.path.unlink(missing_ok=True)
        release_folder(self.path.parent, self.table)


def sweep_keys(
    root: str | Path, configured: Connections, table: str | None = None
) -> list[KeysRecord]:
    """Delete the keys recorded under ``root`` (of ``table`` only, if given) that no open
    backend of this process holds, and their records; returns the records swept.

    A record naming a connection not in ``configured``, or whose Redis fails or does not
    answer in time, is kept (logged); the rest of that connection's records are then left
    for the next sweep too, so that a Redis down costs one timeout.
    """
    area = Path(root) / TABLES_DIR
    try:
        folders = [area / table] if table is not None else sorted(area.iterdir())
    except OSError:
        return []
    swept: list[KeysRecord] = []
    failed: set[str] = set()
    for folder in folders:
        if folder.is_symlink() or marker_of(folder) != folder.name:
            continue  # not a table's own folder
        for record in KeysRecord.under(folder):
            with _HELD_GUARD:
                held = record.path in _HELD
            if held or record.connection in failed:
                continue
            try:
                _delete(record, resolve(record.table, record.connection, configured))
            except TDReplayError as err:
                failed.add(record.connection)
                log.warning("%s; its record %s is kept", err, record.path)
                continue
            record.remove()
            swept.append(record)
            log.warning(
                "table %r: deleted the keys %s that a stopped process left in Redis %r",
                record.table,
                record.pattern,
                record.connection,
            )
    return swept


def _delete(record: KeysRecord, conn: RedisConnection) -> None:
    """Delete the keys of ``record`` on ``conn``.

    Raises:
        BackendError: Redis failed or did not answer in time.
    """
    client = redis_client(conn)
    try:
        ask(
            record.table,
            conn,
            f"deleting keys a stopped process left ({record.pattern})",
            lambda: delete_keys(client, record.namespace, record.td_id),
        )
    finally:
        client.close()

"""The persistence commands: checkpoint and restore on the server, dump and load through the
caller, export. Like every command (:mod:`.commands`), each builds one request and reads
its answer; their plans (:class:`PersistencePlans`, part of :class:`~.plans.Calls`) run
them on every server of a sharded client.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..codec import operations as ops
from ..codec import protocol
from .commands import Command, Request, Response, json_body, op_request
from .merging import merge_infos
from .sinks import FileSink
from .steps import Call, Gather, Plan


@dataclass
class Checkpoint(Command[str]):
    op = ops.CHECKPOINT

    table: str
    path: str

    def request(self) -> Request:
        headers, body = json_body({"path": self.path})
        return op_request(self, self.table, headers=headers, body=body)

    def parse(self, response: Response) -> str:
        data = response.check().json()
        return str(data.get("path", self.path)) if isinstance(data, dict) else self.path


@dataclass
class Restore(Command[dict[str, Any]]):
    op = ops.RESTORE

    table: str
    path: str

    def request(self) -> Request:
        headers, body = json_body({"path": self.path})
        return op_request(self, self.table, headers=headers, body=body)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class Dump(Command[bytes]):
    """A fresh checkpoint of the table as one archive (:mod:`tdreplay.codec.archive`)."""

    op = ops.DUMP

    table: str

    def request(self) -> Request:
        return op_request(self, self.table, body=b"")

    def parse(self, response: Response) -> bytes:
        response.check()
        return bytes(response.body)


@dataclass
class Load(Command[dict[str, Any]]):
    """Replace (or create) the table from an archive :class:`Dump` made of it; its info."""

    op = ops.LOAD

    table: str
    archive: bytes

    def request(self) -> Request:
        return op_request(
            self, self.table, headers={"Content-Type": protocol.TAR}, body=self.archive
        )

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class Export(Command["str | bytes | Path"]):
    """Export as Parquet, CSV or (on the server, with ``path``) a Minari dataset: to a
    server-side ``path`` (returns it), streamed into ``sink`` (returns its file), or
    streamed back (bytes)."""

    op = ops.EXPORT

    table: str
    format: str = "parquet"
    path: str | None = None
    dataset_id: str | None = None
    env_spec: str | None = None
    sink: FileSink | None = None

    def request(self) -> Request:
        payload: dict[str, Any] = {"format": self.format}
        if self.path is not None:
            payload["path"] = self.path
        if self.dataset_id is not None:
            payload["dataset_id"] = self.dataset_id
        if self.env_spec is not None:
            payload["env_spec"] = self.env_spec
        headers, body = json_body(payload)
        req = op_request(self, self.table, headers=headers, body=body)
        if self.sink is not None and self.path is None:
            self.sink.start()  # every attempt writes the file from its start
            req.sink = self.sink
        return req

    def parse(self, response: Response) -> str | bytes | Path:
        response.check()
        if self.path is not None:
            data = response.json()
            return str(data.get("path", self.path)) if isinstance(data, dict) else self.path
        if self.sink is not None:
            self.sink.close()
            return self.sink.path
        return bytes(response.body)


class PersistencePlans:
    """The persistence plans of :class:`~.plans.Calls` (its servers, lock and size cache)."""

    n: int
    _lock: threading.Lock
    _sizes: dict[str, Any]

    def _paths(self, path: str) -> list[str]:
        return [path] if self.n == 1 else [f"{path}-shard{i}" for i in range(self.n)]

    def checkpoint(self, table: str, path: str) -> Plan[str | list[str]]:
        paths = self._paths(path)
        results = yield Gather([Call(i, Checkpoint(table, p)) for i, p in enumerate(paths)])
        return results[0] if self.n == 1 else results

    def restore(self, table: str, path: str) -> Plan[dict[str, Any]]:
        paths = self._paths(path)
        results = yield Gather([Call(i, Restore(table, p)) for i, p in enumerate(paths)])
        with self._lock:
            self._sizes.pop(table, None)
        return merge_infos(results)

    def dump(self, table: str) -> Plan[list[bytes]]:
        """Each server's archive of ``table`` (one per shard, in shard order)."""
        results = yield Gather([Call(i, Dump(table)) for i in range(self.n)])
        return list(results)

    def load(self, table: str, archives: Sequence[bytes]) -> Plan[dict[str, Any]]:
        """Restore each shard's ``table`` from its archive (as :meth:`dump` made them)."""
        if len(archives) != self.n:
            raise ValueError(
                f"{len(archives)} archives for {self.n} servers: load takes what dump made "
                "of the same servers"
            )
        calls = [Call(i, Load(table, a)) for i, a in enumerate(archives)]
        results = yield Gather(calls)
        with self._lock:
            self._sizes.pop(table, None)
        return merge_infos(results)

    def export(
        self,
        table: str,
        format: str = "parquet",
        path: str | None = None,
        *,
        dataset_id: str | None = None,
        env_spec: str | None = None,
        sink: FileSink | None = None,
    ) -> Plan[str | bytes | Path | list[str | bytes | Path]]:
        """Each server's export (one with ``sink``: it takes one file)."""
        paths: list[str | None] = [None] * self.n
        if path is not None:
            paths = list(self._paths(path))
        if sink is not None and self.n > 1 and path is None:
            raise ValueError("a streamed export takes one server's file; pass path= when sharded")
        calls = [
            Call(i, Export(table, format, p, dataset_id, env_spec, sink))
            for i, p in enumerate(paths)
        ]
        results = yield Gather(calls)
        return results[0] if self.n == 1 else results

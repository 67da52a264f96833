"""The persistence commands: checkpoint and restore on the server, dump and load through the
caller, export. Like every command (:mod:`.commands`), each builds one request and reads
its answer; their plans (:class:`PersistencePlans`, part of :class:`~.plans.Plans`) run
them on every server of a sharded client.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..codec import operations as ops
from ..codec import protocol
from ..codec.archive import Packed
from ..codec.errors import InvalidRequest, ReplayError
from ..codec.exports import ExportedName, ExportedPath, counted
from .commands import Command, Request, Response, json_body, op_request, op_target
from .errors import ProtocolError
from .merging import merge_infos
from .sinks import FileSink, UnpackSink, byte_bar
from .steps import Call, Gather, Plan, Work


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
class Dump(Command[bytes | Path]):
    """A fresh checkpoint of the table as one archive (:mod:`tdreplay.codec.archive`): its
    bytes, or with ``sink`` the folder it was unpacked into as it came (one read buffer in
    memory)."""

    op = ops.DUMP

    table: str
    sink: UnpackSink | None = None

    def request(self) -> Request:
        req = op_request(self, self.table, body=b"")
        if self.sink is not None:
            self.sink.start()  # every attempt unpacks anew
            req.sink = self.sink
        return req

    def parse(self, response: Response) -> bytes | Path:
        response.check()
        if self.sink is not None:
            self.sink.close()
            return self.sink.path
        return bytes(response.body)


@dataclass
class LoadBegin(Command[dict[str, Any]]):
    """Begin a load in parts of an archive of ``size`` bytes: the server's answer names the
    upload and the part size (``{"upload", "part_bytes", ...}``)."""

    op = ops.LOAD_BEGIN

    table: str
    size: int

    def request(self) -> Request:
        headers, body = json_body({"size": self.size})
        return op_request(self, self.table, headers=headers, body=body)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class LoadPart(Command[dict[str, Any]]):
    """The archive's bytes ``part`` from ``offset``; the answer counts the bytes received."""

    op = ops.LOAD_PART

    table: str
    upload: str
    offset: int
    part: bytes | memoryview

    def request(self) -> Request:
        target = op_target(self.op, self.table, upload=self.upload, offset=self.offset)
        headers = {"Content-Type": protocol.TAR}
        return Request(self.op.method, target, headers, self.part, idempotent=self.op.idempotent)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class LoadCommit(Command[dict[str, Any]]):
    """Replace (or create) the table from the whole upload; its info."""

    op = ops.LOAD_COMMIT

    table: str
    upload: str

    def request(self) -> Request:
        headers, body = json_body({"upload": self.upload})
        return op_request(self, self.table, headers=headers, body=body)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class LoadAbort(LoadCommit):
    """Drop the upload and its staged bytes (the answer says whether it was under way)."""

    op = ops.LOAD_ABORT


@dataclass
class Export(Command["str | bytes | Path"]):
    """Export as Parquet, CSV or (on the server, with ``path``) a Minari dataset: to a
    server-side ``path`` (returns it), streamed into ``sink`` (returns its file), or
    streamed back (bytes)."""

    op = ops.EXPORT

    table: str
    format: str | None = None  # None: the server tells it from path (Parquet streamed back)
    path: str | None = None
    dataset_id: str | None = None
    env_spec: str | None = None
    sink: FileSink | None = None

    def request(self) -> Request:
        payload: dict[str, Any] = {} if self.format is None else {"format": self.format}
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
        if self.path is not None:  # an ExportedName: the path, with rows and skipped
            data = response.json()
            if not isinstance(data, dict):
                return self.path
            return counted(ExportedName(data.get("path", self.path)), data)
        if self.sink is not None:  # an ExportedPath, the counts from the headers
            self.sink.close()
            head = response.headers
            return counted(
                ExportedPath.of(self.sink.path),
                {
                    "rows": head.get(protocol.EXPORT_ROWS.lower()),
                    "skipped": head.get(protocol.EXPORT_SKIPPED.lower()),
                },
            )
        return bytes(response.body)


class PersistencePlans:
    """The persistence plans of :class:`~.plans.Plans` (its servers, lock and size cache)."""

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

    def dump(self, table: str, sinks: Sequence[UnpackSink] | None = None) -> Plan[list[Any]]:
        """Each server's archive of ``table`` (one per shard, in shard order): its bytes, or
        unpacked into ``sinks`` (one per shard; returns their folders)."""
        each: Sequence[UnpackSink | None] = sinks if sinks is not None else [None] * self.n
        results = yield Gather([Call(i, Dump(table, sink)) for i, sink in enumerate(each)])
        return list(results)

    def load(
        self, table: str, archives: Sequence[bytes | Packed], progress: bool | None = False
    ) -> Plan[dict[str, Any]]:
        """Restore each shard's ``table`` from its archive (as :meth:`dump` made them, in
        memory or :class:`~tdreplay.codec.archive.Packed` from a folder: read a part at a
        time), sent in parts within each server's body limit: begin, parts (a round of one
        part per server at a time), commit. A failure aborts every upload begun, so no
        server keeps staged bytes, and leaves each table as it was unless its commit
        succeeded. ``progress``: a bar of the bytes sent (``None``: when stderr is a
        terminal)."""
        if len(archives) != self.n:
            raise ValueError(
                f"{len(archives)} archives for {self.n} servers: load takes what dump made "
                "of the same servers"
            )
        begun: list[dict[str, Any]] = []
        bar = byte_bar(progress, f"load {table}", total=sum(len(a) for a in archives))
        try:
            for i, archive in enumerate(archives):  # one by one: each begun one is known
                begun.append((yield Call(i, LoadBegin(table, len(archive)))))
            sent = [0] * self.n
            while todo := [i for i, archive in enumerate(archives) if sent[i] < len(archive)]:
                calls = []
                for i in todo:  # read here (a file's part: off the event loop), then sent
                    part = yield Work(_part, archives[i], sent[i], begun[i])
                    calls.append(Call(i, LoadPart(table, begun[i]["upload"], sent[i], part)))
                for call, answer in zip(calls, (yield Gather(calls)), strict=True):
                    received = int(answer["received"])
                    if received <= sent[call.shard]:  # never loop on a server that takes nothing
                        raise ProtocolError(f"load part at {sent[call.shard]}: {answer}")
                    bar.update(received - sent[call.shard])
                    sent[call.shard] = received
            results = yield Gather(
                [Call(i, LoadCommit(table, up["upload"])) for i, up in enumerate(begun)]
            )
        except (ReplayError, OSError):  # a server's refusal, or a dump file gone meanwhile
            for i, up in enumerate(begun):
                with contextlib.suppress(ReplayError):  # else dropped once idle (--load-timeout)
                    yield Call(i, LoadAbort(table, up["upload"]))
            raise
        finally:
            bar.close()
            with self._lock:
                self._sizes.pop(table, None)
        return merge_infos(results)

    def export(
        self,
        table: str,
        format: str | None = None,
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
            raise InvalidRequest(  # a ValueError too, as it was
                f"table {table!r}: a streamed export takes one server's file, and there are "
                f"{self.n}; write it on the servers with path= (one file each)",
                table=table,
                field="dest",
            )
        calls = [
            Call(i, Export(table, format, p, dataset_id, env_spec, sink))
            for i, p in enumerate(paths)
        ]
        results = yield Gather(calls)
        return results[0] if self.n == 1 else results


#: the largest part a load sends (the server's body limit may cap it lower): each request
#: stays short, and so does the body buffer the server keeps for its size
MAX_PART = 64 << 20


def _part(archive: bytes | Packed, start: int, upload: dict[str, Any]) -> memoryview:
    """The part of ``archive`` from ``start`` (uncopied when in memory), as long as the
    server allows."""
    size = max(1, min(int(upload["part_bytes"]), MAX_PART))
    if isinstance(archive, Packed):
        return memoryview(archive.read(start, size))
    return memoryview(archive)[start : start + size]

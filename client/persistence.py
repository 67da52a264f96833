"""The persistence commands: checkpoint and restore on the server, dump and load through the
caller, export. Like every command (:mod:`.commands`), each builds one request and reads
its answer; the plans (:mod:`.plans`) run them on every server of a sharded client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..codec import protocol
from .commands import Command, Request, Response, json_body, table_target


@dataclass
class Checkpoint(Command[str]):
    table: str
    path: str

    def request(self) -> Request:
        headers, body = json_body({"path": self.path})
        return Request("POST", table_target(self.table, "checkpoint"), headers, body)

    def parse(self, response: Response) -> str:
        data = response.check().json()
        return str(data.get("path", self.path)) if isinstance(data, dict) else self.path


@dataclass
class Restore(Command[dict[str, Any]]):
    table: str
    path: str

    def request(self) -> Request:
        headers, body = json_body({"path": self.path})
        return Request("POST", table_target(self.table, "restore"), headers, body)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class Dump(Command[bytes]):
    """A fresh checkpoint of the table as one archive (:mod:`tdreplay.codec.archive`)."""

    table: str

    def request(self) -> Request:
        return Request("POST", table_target(self.table, "dump"), {}, b"")

    def parse(self, response: Response) -> bytes:
        response.check()
        return bytes(response.body)


@dataclass
class Load(Command[dict[str, Any]]):
    """Replace (or create) the table from an archive :class:`Dump` made of it; its info."""

    table: str
    archive: bytes

    def request(self) -> Request:
        return Request(
            "POST", table_target(self.table, "load"), {"Content-Type": protocol.TAR}, self.archive
        )

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class Export(Command["str | bytes"]):
    """Export as Parquet or CSV: to a server-side ``path`` (returns it) or streamed back (bytes)."""

    table: str
    format: str = "parquet"
    path: str | None = None

    def request(self) -> Request:
        payload: dict[str, Any] = {"format": self.format}
        if self.path is not None:
            payload["path"] = self.path
        headers, body = json_body(payload)
        return Request("POST", table_target(self.table, "export"), headers, body)

    def parse(self, response: Response) -> str | bytes:
        response.check()
        if self.path is not None:
            data = response.json()
            return str(data.get("path", self.path)) if isinstance(data, dict) else self.path
        return bytes(response.body)

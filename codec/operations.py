"""The operations of the contract, each defined once for both sides: the server's
doors decode into them, the client's plans encode them.

An :class:`Operation` names one call - its HTTP method and route, the model of
its parameters (:mod:`.params`), how they travel, whether a repeat is harmless,
whether the same-host socket carries it - and :data:`OPERATIONS` lists them all.
The server declares its routes from it (a test checks that the OpenAPI document
and the client's requests match it) and validates with its models; the client
builds its requests from it and validates with the same models before sending.

    >>> SAMPLE.method, SAMPLE.path("cartpole")
    ('POST', '/v1/tables/cartpole/sample')
    >>> SAMPLE.params is SampleParams
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import protocol
from .params import (
    ExportBody,
    ExtendParams,
    InsertParams,
    LoadBeginParams,
    LoadPartParams,
    LoadUpload,
    Params,
    PathBody,
    PriorityUpdate,
    ReadParams,
    RemoveParams,
    SampleParams,
    StreamParams,
)

# ------------------------------------------------------------------ the operations
#: how an operation's parameters travel over HTTP: the query string, a JSON body, an
#: Arrow IPC body (the rows; the parameters in the query and headers), a tar archive, none
Carrier = Literal["query", "json", "arrow", "tar", "none"]


@dataclass(frozen=True, eq=False)  # each operation is one object: compared and hashed by identity
class Operation:
    """One call of the contract.

    Attributes:
        name: its name: the server's route name, the same-host socket's ``op``, the
            metrics' label.
        method: its HTTP method.
        route: its HTTP path, ``{name}`` standing for the table.
        params: the model its parameters are validated with on both sides (``None``:
            it takes none, or a table schema).
        carrier: how its parameters travel over HTTP.
        idempotent: whether sending it twice is harmless (a client may retry it after
            the request may have reached the server). An extend is, by its request id.
        same_host: whether the same-host socket carries it (the client's shared-memory
            channel; the rest go over HTTP).
    """

    name: str
    method: Literal["GET", "POST", "DELETE"]
    route: str
    params: type[Params] | None = None
    carrier: Carrier = "none"
    idempotent: bool = True
    same_host: bool = False

    def path(self, table: str = "") -> str:
        """The route with the table's name in it (quote it first: it is put in as given)."""
        return self.route.replace("{name}", table)


def _on_table(
    name: str, method: Literal["GET", "POST", "DELETE"], action: str = "", **kw: Any
) -> Operation:
    return Operation(name, method, protocol.table_path("{name}", action), **kw)


#: liveness (never needs the token)
HEALTHZ = Operation("healthz", "GET", "/healthz")
LIST_TABLES = Operation("list_tables", "GET", protocol.TABLES)
#: creating twice fails (409), unless ``if_absent``: then the client may retry it
CREATE_TABLE = Operation("create_table", "POST", protocol.TABLES, carrier="json", idempotent=False)
SERVER_INFO = Operation("server_info", "GET", f"{protocol.API}/info")
#: the status page's data: every table's figures and their recent history
STATUS = Operation("status", "GET", f"{protocol.API}/status")
#: the same rows into several tables (Reverb's insert with priorities per table)
INSERT = Operation("insert", "POST", f"{protocol.API}/insert", params=InsertParams, carrier="arrow")
INFO = _on_table("info", "GET", same_host=True)
DELETE_TABLE = _on_table("delete_table", "DELETE")
CLEAR = _on_table("clear", "POST", "clear", same_host=True)
EXTEND = _on_table("extend", "POST", "extend", params=ExtendParams, carrier="arrow", same_host=True)
SAMPLE = _on_table("sample", "POST", "sample", params=SampleParams, carrier="query", same_host=True)
#: a POST, as every call that takes items or changes anything: a GET is only ever a read
#: (what a web page on another site sends with neither ``Origin`` nor ``Sec-Fetch-Site``,
#: an ``<img src>`` in an older browser, passes the browser guard: it must change nothing)
STREAM = _on_table("stream", "POST", "stream", params=StreamParams, carrier="query")
UPDATE_PRIORITY = _on_table(
    "update_priority", "POST", "update_priority", params=PriorityUpdate, carrier="json",
    same_host=True,
)  # fmt: skip
REMOVE = _on_table("remove", "POST", "remove", params=RemoveParams, carrier="json")
READ = _on_table("read", "POST", "read", params=ReadParams, carrier="json")
CHECKPOINT = _on_table("checkpoint", "POST", "checkpoint", params=PathBody, carrier="json")
RESTORE = _on_table("restore", "POST", "restore", params=PathBody, carrier="json")
EXPORT = _on_table("export", "POST", "export", params=ExportBody, carrier="json")
DUMP = _on_table("dump", "POST", "dump")
LOAD = _on_table("load", "POST", "load", carrier="tar")
#: a load in parts (an archive over the body limit): begin (names the upload and the part
#: size; a repeat would stage another), parts in order, commit (restores it) or abort
LOAD_BEGIN = _on_table(
    "load_begin", "POST", "load/begin", params=LoadBeginParams, carrier="json", idempotent=False
)  # fmt: skip
LOAD_PART = _on_table("load_part", "POST", "load/part", params=LoadPartParams, carrier="tar")
LOAD_COMMIT = _on_table(
    "load_commit", "POST", "load/commit", params=LoadUpload, carrier="json", idempotent=False
)  # fmt: skip
LOAD_ABORT = _on_table("load_abort", "POST", "load/abort", params=LoadUpload, carrier="json")

#: every operation, by name
OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        HEALTHZ, LIST_TABLES, CREATE_TABLE, SERVER_INFO, STATUS, INSERT, INFO, DELETE_TABLE, CLEAR, EXTEND, SAMPLE,
        STREAM, UPDATE_PRIORITY, REMOVE, READ, CHECKPOINT, RESTORE, EXPORT, DUMP, LOAD,
        LOAD_BEGIN, LOAD_PART, LOAD_COMMIT, LOAD_ABORT,
    )
}  # fmt: skip

"""What one request on the same-host socket came to, and the frames of errors: the pieces
of :mod:`.connection` that hold no connection state.

    >>> op_of({"op": "info"}), op_of({"op": "drop_all"}), op_of({})
    ('info', 'other', 'other')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tdreplay.codec import operations as ops
from tdreplay.codec.shm import EXTEND, IDLE_ENDED, RELEASE, SAMPLE, frame
from tdreplay.storage import InsufficientStorage, InvalidRequest, TDReplayError

from ..errors import error_body, status_of
from ..limits import timed_out
from ..metrics import NO_TABLE, RequestHook
from ..settings import Settings
from .buffers import SlotBuffer

#: the operations a client may ask for in JSON (metrics label them; anything else is "other")
#: the binary operations, by code (sample and extend: the contract's, by their names)
HOT_OPS = {SAMPLE: ops.SAMPLE.name, EXTEND: ops.EXTEND.name, RELEASE: "release"}
#: the JSON operations: the contract's others the same-host socket carries, and its own
#: (a slot for extends)
OPS = frozenset(
    {"extend_slot"}
    | {op.name for op in ops.OPERATIONS.values() if op.same_host} - set(HOT_OPS.values())
)


def too_many(limit: int) -> TDReplayError:
    return InsufficientStorage(
        f"the server serves {limit} shared-memory connections, its limit "
        "(--shm-max-connections); use HTTP or try later",
        field="connection",
    )


#: what a connection's deadline is armed for (:class:`~.deadline.Deadline` hands it back):
#: the hello (``--shm-hello-timeout``), a frame under way (``--body-timeout``), the next
#: request (``--shm-idle-timeout``), an answer being taken (``--send-timeout``)
HELLO, FRAME, IDLE, SEND = "hello", "frame", "idle", "send"


def late(why: str, settings: Settings, received: int = 0, whole: int = 0) -> TDReplayError:
    """The error of the time limit ``why`` (not :data:`SEND`: its client reads nothing), as
    HTTP answers a limit of its own (408 ``InvalidRequest`` naming the flag); ``received`` of
    ``whole`` bytes (``0``: not known yet) of the frame under way, for :data:`FRAME`."""
    if why == HELLO:
        t = settings.shm_hello_timeout
        return timed_out(
            f"no hello within {t:g} s of connecting (--shm-hello-timeout)",
            field="hello",
            expected=f"a hello within {t:g} s",
        )
    if why == FRAME:
        t = settings.body_timeout
        got = f"{received} of {whole} bytes" if whole else f"{received} bytes"
        return timed_out(
            f"a control frame not complete within {t:g} s of its first bytes ({got} received; "
            "--body-timeout)",
            field="body",
            expected=f"the whole frame within {t:g} s",
            got=got,
        )
    t = settings.shm_idle_timeout
    return timed_out(
        f"no request within {t:g} s of the last answer (--shm-idle-timeout); connect again "
        "to go on",
        field=IDLE_ENDED,
        expected=f"a request within {t:g} s",
    )


def error_reply(err: BaseException, root: Path) -> dict[str, Any]:
    """The reply of a request that failed with ``err``: its error body (paths relative to
    the data root ``root``, as on every door) and the HTTP status it stands for (the
    class's, but where a limit answers with its own, as a time limit's 408)."""
    return {"ok": False, "status": status_of(err), "error": error_body(err, root)}


def error_frame(err: BaseException, root: Path) -> bytes:
    return frame(error_reply(err, root))


@dataclass
class Done:
    """What a request came to: its operation (validated: one of :data:`OPS` or
    :data:`HOT_OPS`, else ``"other"``), the reply (a JSON object, or a binary frame),
    the slot whose descriptor goes with it, and the table and rows it moved (for the
    metrics; the table's name is set once it was found)."""

    op: str
    reply: dict[str, Any] | bytes = field(default_factory=lambda: {"ok": False})
    slot: SlotBuffer | None = None
    table: str = NO_TABLE
    rows: int = 0
    item_nbytes: int = 0

    @property
    def ok(self) -> bool:
        return isinstance(self.reply, bytes) or self.reply.get("ok") is True

    def frame(self) -> bytes:
        """The reply's frame."""
        return self.reply if isinstance(self.reply, bytes) else frame(self.reply)

    def failed(self, err: BaseException, root: Path) -> None:
        """The request failed with ``err``: its reply says so (paths relative to the data
        root ``root``, as on every door), and no slot goes with it."""
        self.reply, self.slot = error_reply(err, root), None

    def report(self, on_request: RequestHook, s: float, rx: int, tx: int) -> None:
        """Tell the metrics of the request, from what its operation validated (never the
        raw frame); slot data counts as bytes moved (rows x item bytes)."""
        ok = self.ok
        if ok:
            moved = self.rows * self.item_nbytes
            rx, tx = (rx + moved, tx) if self.op == "extend" else (rx, tx + moved)
        on_request("shm", self.op, self.table if ok else NO_TABLE, s, rx, tx, ok)


def op_of(m: dict[str, Any]) -> str:
    op = m.get("op")
    return op if type(op) is str and op in OPS else "other"


def table_of(m: dict[str, Any]) -> str:
    name = m.get("table")
    if not isinstance(name, str):
        raise InvalidRequest("the request names no table", field="table")
    return name


def params_of(m: dict[str, Any]) -> dict[str, Any]:
    """A JSON frame's operation parameters: the frame less what names the operation and its
    table (a parameter model refuses any field it does not know)."""
    return {k: v for k, v in m.items() if k not in _FRAMING}


#: the keys of a JSON frame that are not parameters
_FRAMING = frozenset({"op", "table"})


def bad(detail: str) -> dict[str, Any]:
    return {"ok": False, "error": InvalidRequest(detail).to_dict()}

"""The operations of the same-host door: what each frame asks of the core, and its answer.

:class:`Operations` is the half of a :class:`~.connection.Connection` that
decodes a request into a core operation, with the operation's parameter model,
and encodes what the operation gives: a binary frame for the hot operations
(sample, extend, release), JSON for the rest. It reaches tables only through
the core: a sample's slot is laid out by the :class:`~tdreplay.service.core.Shape`
the core gives, and an extend's columns are handed to the core.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from tdreplay.codec import operations as ops
from tdreplay.codec.arrow import nest
from tdreplay.codec.params import (
    BufferParams,
    ExtendParams,
    PriorityUpdate,
    parse,
    sample_params,
)
from tdreplay.codec.shm import (
    EXTEND,
    RELEASE,
    SAMPLE,
    Request,
    SlotLayout,
    extended_frame,
    released_frame,
    sampled_frame,
)
from tdreplay.storage import InvalidRequest

from ..core import Core, Shape
from .buffers import SlotBuffer, SlotBuffers
from .requests import Done, params_of, table_of

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from tdreplay.storage import SampleTarget


class Operations:
    """The operations of one connection (its core and its slots)."""

    core: Core
    slots: SlotBuffers

    async def _dispatch(self, m: dict[str, Any], done: Done) -> None:
        """Run a JSON frame's operation. Every field is validated once, here and in the
        operation's parameter model; only validated values go on (into ``done``)."""
        op = done.op
        if op == "extend_slot":
            self._extend_slot(m, done)
        elif op == ops.UPDATE_PRIORITY.name:
            done.table = table_of(m)
            updated = await self.core.update_priority(
                done.table, parse(PriorityUpdate, params_of(m))
            )
            done.reply = {"ok": True, "updated": updated}
        elif op == ops.INFO.name:
            done.table = table_of(m)
            done.reply = {"ok": True, "info": await self.core.info(done.table)}
        elif op == ops.CLEAR.name:
            done.table = table_of(m)
            done.reply = {"ok": True, "info": await self.core.clear(done.table)}
        else:
            raise InvalidRequest(f"unknown operation {m.get('op')!r:.40}", field="op")

    def _run_hot(self, request: Request, done: Done) -> Awaitable[None] | None:
        """Run a binary request; ``None`` when it is done, else what finishes it."""
        if request.op == SAMPLE:
            return self._sample(request, done)
        if request.op == EXTEND:
            return self._extend(request, done)
        assert request.op == RELEASE
        self.slots.drop(self.slots.check_number(request.slot))
        done.reply = released_frame()
        return None

    def _sample(self, request: Request, done: Done) -> Awaitable[None] | None:
        name = request.table
        params = sample_params(request.rows, request.timeout)
        number = self.slots.check_number(request.slot)
        placed: list[SlotBuffer] = []

        def place(shape: Shape) -> TensorDictBase | SampleTarget:
            """The connection's slot of that number, laid out for the sample's shape."""
            slot = self.slots.get(number, "sample", shape.owner, shape.rows)
            if slot is None:
                layout = SlotLayout.of(shape.schema, shape.rows)
                slot = self.slots.make(number, "sample", shape.owner, layout)
                assert shape.target is not None
                slot.out = shape.target(nest(slot.views(), shape.rows))
            placed.append(slot)
            assert slot.out is not None
            return slot.out

        try:
            drawn = self.core.sample_to(name, params, place)
        except BaseException:
            self._unplace(placed, number)
            raise
        if isinstance(drawn, Shape):
            self._sampled(name, number, placed[0], drawn, done)
            return None
        return self._sampled_later(drawn, name, number, placed, done)

    async def _sampled_later(
        self,
        drawn: Awaitable[Shape],
        name: str,
        number: int,
        placed: list[SlotBuffer],
        done: Done,
    ) -> None:
        try:
            shape = await drawn
        except BaseException:
            self._unplace(placed, number)
            raise
        self._sampled(name, number, placed[0], shape, done)

    def _unplace(self, placed: list[SlotBuffer], number: int) -> None:
        """A sample failed: a slot made for it and never handed over starts anew."""
        if placed and placed[0].fresh:
            self.slots.drop(number)

    def _sampled(self, name: str, number: int, slot: SlotBuffer, shape: Shape, done: Done) -> None:
        slot.generation += 1
        done.table, done.rows, done.item_nbytes = name, shape.rows, shape.item_nbytes
        if slot.fresh:
            done.reply = {
                "ok": True, "slot": number, "generation": slot.generation, "rows": shape.rows,
                "layout": slot.layout.to_json(), "nbytes": slot.size,
            }  # fmt: skip
            done.slot = slot
        else:
            done.reply = sampled_frame(number, slot.generation)

    def _extend_slot(self, m: dict[str, Any], done: Done) -> None:
        """A slot for extends of up to ``rows`` rows (at most the table's capacity)."""
        name = table_of(m)
        shape = self.core.extend_shape(name, parse(BufferParams, m))
        number = self.slots.check_number(m.get("slot"))
        layout = SlotLayout.of(shape.schema, shape.rows)
        slot = self.slots.make(number, "extend", shape.owner, layout)
        done.reply = {
            "ok": True, "slot": number, "rows": shape.rows, "layout": layout.to_json(),
            "nbytes": slot.size,
        }  # fmt: skip
        done.table, done.slot = name, slot

    async def _extend(self, request: Request, done: Done) -> None:
        name = request.table
        handle = self.core.table(name)  # the one lookup: the slot must be this table's
        number = self.slots.check_number(request.slot)
        slot = self.slots.get(number, "extend", handle)
        if slot is None:  # never made, or made for a table of that name since replaced
            raise InvalidRequest(
                f"slot {number} is no extend slot of table {name!r} as it is now "
                "(ask for one with extend_slot)",
                table=name,
                field="slot",
                expected="extend_slot",
                got=number,
            )
        rows = request.rows
        if not 1 <= rows <= slot.layout.rows:
            raise InvalidRequest(
                f"rows must be an integer in [1, {slot.layout.rows}], got {rows}",
                table=name,
                field="rows",
            )
        params = parse(
            ExtendParams, {"timeout": request.timeout, "X-Request-Id": request.request_id}
        )
        # The client can write into its slot at any time. The columns the table reads values
        # of before inserting them (categories, trajectory ids, end flags, max-value keys)
        # are copied first, so what was checked is what goes in; the others go from the
        # slot straight into the table (a client racing itself tears only its own rows).
        copied = handle.read_keys
        columns = {
            key: view[:rows].clone() if key in copied else view[:rows]
            for key, view in slot.views().items()
        }
        # the rows are the slot's, which the connection keeps: no body held while waiting
        index, replayed = await self.core.extend(handle, columns, params, holds=False)
        done.table, done.rows, done.item_nbytes = name, len(index), handle.item_nbytes
        done.reply = extended_frame(index.numpy().astype("<i8", copy=False).tobytes(), replayed)

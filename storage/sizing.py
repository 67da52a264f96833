"""What a table costs in bytes: its rows and every per-slot structure beside them.

A server's byte limits (``--max-table-bytes`` per table, ``--max-total-bytes``
over all tables) are checked against :func:`table_nbytes` before anything is
allocated. Besides ``capacity x item_nbytes`` of rows, a table keeps per-slot
bookkeeping (liveness, ordinals, times sampled), its sampler's and
writer's per-slot state (priorities and their sum tree, permutations, episode
ids, values) and transient masks of the same length while it works; a table of
many tiny items costs mostly that. An offline export of a checkpoint loads only
what it holds: its rows and the state of the slots ever written (``held``).

    >>> from tdreplay.storage import TableSpec
    >>> spec = TableSpec.model_validate({"name": "t", "capacity": 1000,
    ...     "fields": {"obs": {"shape": [4], "dtype": "float32"}}})
    >>> table_nbytes(spec) > 1000 * 16
    True
    >>> table_nbytes(spec, held=(10, 20)) < table_nbytes(spec)
    True
"""

from __future__ import annotations

from . import spec as S
from .errors import SchemaError

#: the default of ``--max-table-bytes``: the largest table (:func:`table_nbytes`) a server
#: creates or restores, and the most of one (its rows held and slots written) an offline
#: export loads from a checkpoint
MAX_TABLE_BYTES = 16 << 30

#: slots: live + busy (bool), times_sampled + ordinal (int64)
SLOT_BYTES = 1 + 1 + 8 + 8
#: transient per-slot masks and index lists (free-slot masks, live indices, sorts)
TRANSIENT_BYTES = 16

#: sampler kind -> per-slot bytes it keeps
SAMPLER_BYTES: dict[str, int] = {
    "uniform": 0,
    "fifo": 0,
    "lifo": 0,
    # permutation + its ordinals (int64 each) + stale mask
    "without_replacement": 8 + 8 + 1,
    # priorities (float64) + sum and min trees (float64, ~1.03 nodes per leaf each) + a where()
    "prioritized": 8 + 9 + 9 + 8,
    # episode ids (int64) + valid-start mask
    "slice": 8 + 1,
}

#: writer kind -> per-slot bytes it keeps
WRITER_BYTES: dict[str, int] = {"round_robin": 0, "max_value": 8 + 8}


def bookkeeping_nbytes_per_slot(spec: S.TableSpec) -> int:
    """Bytes per slot a table keeps beside its rows."""
    return (
        SLOT_BYTES
        + TRANSIENT_BYTES
        + SAMPLER_BYTES[spec.sampler.kind]
        + WRITER_BYTES[spec.writer.kind]
    )


def table_nbytes(spec: S.TableSpec, *, held: tuple[int, int] | None = None) -> int:
    """Bytes a table of ``spec`` allocates: rows (on its backend) plus bookkeeping (in memory).

    Args:
        spec: the table's spec.
        held: ``(rows, slots)``: what is loaded of such a table instead of its whole
            capacity (an offline export of a checkpoint: the rows it holds, and the slots
            ever written, which its state covers).
    """
    rows, slots = held if held is not None else (spec.capacity, spec.capacity)
    return rows * spec.item_nbytes + slots * bookkeeping_nbytes_per_slot(spec)


def check_table_bytes(spec: S.TableSpec, limit: int, *, held: tuple[int, int] | None = None) -> int:
    """:func:`table_nbytes` of ``spec`` (or of what is ``held`` of it), checked against
    ``limit`` (``--max-table-bytes``) before anything is allocated: a spec is a few bytes
    of JSON (a checkpoint's too), the table it declares may be terabytes.

    Raises:
        SchemaError: the table would take more than ``limit`` bytes (the message gives
            its capacity, or the rows and slots held, its item bytes and the flag).
    """
    nbytes = table_nbytes(spec, held=held)
    if nbytes > limit:
        if held is None:
            what = f"capacity {spec.capacity} x ({spec.item_nbytes} bytes per item + bookkeeping)"
        else:
            what = (
                f"{held[0]} rows x {spec.item_nbytes} bytes per item + {held[1]} written slots "
                f"x {bookkeeping_nbytes_per_slot(spec)} bytes of bookkeeping (capacity "
                f"{spec.capacity})"
            )
        raise SchemaError(
            f"table {spec.name!r}: {what} = {nbytes} bytes exceeds the limit of {limit} bytes "
            "(--max-table-bytes)",
            table=spec.name,
            field="capacity",
            expected=f"<= {limit} bytes",
            got=nbytes,
        )
    return nbytes

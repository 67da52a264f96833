"""The scalar record of a durable table: its parts' declared scalars, packed.

A memmap table keeps its scalar state (:mod:`~tdreplay.storage.durable`) in a
fixed 128-byte record, written at the end of every state change into one of
two alternating slots of ``record.bin``: a generation number (u64), one
8-byte field per scalar, and a CRC-32 of both (u64). Which scalars a table has,
and their types, its parts declare (``SCALARS``,
:mod:`~tdreplay.storage.scalars`), the same declaration their
``state_dict()`` uses; the record only fixes where each one lies
(:data:`RECORD_FIELDS`), so a file keeps its meaning across versions.

    >>> from types import SimpleNamespace as NS
    >>> parts = {p: NS(SCALARS={}) for p in ("slots", "sampler", "writer", "rate_limiter")}
    >>> table = NS(SCALARS={"episode_base": int}, episode_base=7, **parts)
    >>> layout = RecordLayout(table)
    >>> layout.unpack(layout.pack(1, table))
    (1, {('table', 'episode_base'): 7})
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Collection
from typing import Any

from .errors import BackendError
from .scalars import Scalar

#: Where the record keeps each scalar a part declares: the part (its key in
#: ``Table.state_dict()``; ``"table"``: the table's own) and the scalar, in the order the
#: record stores them, 8 bytes each, and as what (the part must declare the same type).
#: This is the file format: a field is only ever added at the end. A field no part of a
#: table declares is stored as zeros.
RECORD_FIELDS: dict[tuple[str, str], type] = {
    ("writer", "cursor"): int,
    ("sampler", "head"): int,
    ("writer", "top"): int,
    ("rate_limiter", "inserts"): int,
    ("rate_limiter", "samples"): int,
    ("rate_limiter", "insert_waits"): int,
    ("rate_limiter", "sample_waits"): int,
    ("table", "episode_base"): int,
    ("slots", "inserted"): int,
    ("sampler", "max_priority"): float,
}
#: the parts of a table with scalar state, by their key in ``Table.state_dict()``
PARTS = ("slots", "sampler", "writer", "rate_limiter", "table")
#: one record's room in ``record.bin``
RECORD_BYTES = 128
#: a declared scalar's type -> its field's struct code
_CODES: dict[type, str] = {int: "q", float: "d"}
#: a record: the generation (u64) and the fields; then a CRC-32 of those (u64)
_BODY = struct.Struct("<Q" + "".join(_CODES[kind] for kind in RECORD_FIELDS.values()))
_RECORD = struct.Struct(_BODY.format + "Q")
assert _RECORD.size <= RECORD_BYTES


class RecordLayout:
    """The record of one table: its parts' declared scalars at their :data:`RECORD_FIELDS`.

    Args:
        table: the table (its parts are its attributes named in :data:`PARTS`).

    Raises:
        BackendError: a part declares a scalar the record has no field for, or keeps
            as another type.
    """

    def __init__(self, table: Any) -> None:
        declared = set()
        for part in PARTS:
            owner = table if part == "table" else getattr(table, part)
            for name, kind in owner.SCALARS.items():
                kept = RECORD_FIELDS.get((part, name))
                if kept is not kind:
                    how = "has no field for it" if kept is None else f"keeps it as {kept.__name__}"
                    raise BackendError(
                        f"{part} {type(owner).__name__} declares scalar {name!r} "
                        f"({getattr(kind, '__name__', kind)}), but the durable record {how}"
                    )
                declared.add((part, name))
        #: the fields this table's parts fill, in record order
        self.fields = [field for field in RECORD_FIELDS if field in declared]
        self._pack_body = _packer(declared)

    def pack(self, generation: int, table: Any) -> bytes:
        """The record of ``table``'s scalars now, numbered ``generation``."""
        body = self._pack_body(generation, table)
        return body + zlib.crc32(body).to_bytes(8, "little")

    def unpack(self, raw: bytes) -> tuple[int, dict[tuple[str, str], Scalar]] | None:
        """The generation and fields of the record at the start of ``raw``; ``None`` for
        a slot never written, or one a crash tore (its checksum does not match)."""
        raw = raw[: _RECORD.size]
        generation, *values, check = _RECORD.unpack(raw)
        if generation == 0 or zlib.crc32(raw[: _BODY.size]) != check:
            return None
        found = zip(RECORD_FIELDS, values, strict=True)
        return generation, {field: value for field, value in found if field in self.fields}


def _packer(declared: Collection[tuple[str, str]]) -> Callable[[int, Any], bytes]:
    """A function packing a generation and a table's fields into a record's body, in
    order (0 for a field not ``declared``):
    ``lambda gen, t: _BODY.pack(gen, t.writer.cursor, 0, 0, t.rate_limiter.inserts, ...)``.

    Compiled from its source, as :mod:`dataclasses` compiles ``__init__``: the record is
    written on every state change, and compiled attribute loads read a table's 7 or 8
    fields in ~0.14 us, ``operator.attrgetter``'s dotted paths in ~0.4 us. The source
    holds nothing but the identifiers of :data:`RECORD_FIELDS`.
    """
    loads = [
        ("t" if part == "table" else f"t.{part}") + f".{name}" if (part, name) in declared else "0"
        for part, name in RECORD_FIELDS
    ]
    namespace: dict[str, Any] = {"pack": _BODY.pack}
    exec(f"def pack_body(gen, t):\n    return pack(gen, {', '.join(loads)})", namespace)
    packer: Callable[[int, Any], bytes] = namespace["pack_body"]
    return packer

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
#: record stores them, 8 bytes each. This is the file format: a field is only ever added
#: at the end. A field no part of a table declares is stored as zeros.
RECORD_FIELDS = (
    ("writer", "cursor"),
    ("sampler", "head"),
    ("writer", "top"),
    ("rate_limiter", "inserts"),
    ("rate_limiter", "samples"),
    ("rate_limiter", "insert_waits"),
    ("rate_limiter", "sample_waits"),
    ("table", "episode_base"),
    ("slots", "inserted"),
    ("sampler", "max_priority"),
)
#: the parts of a table with scalar state, by their key in ``Table.state_dict()``
PARTS = ("slots", "sampler", "writer", "rate_limiter", "table")
#: one record's room in ``record.bin``
RECORD_BYTES = 128
#: a declared scalar's type -> its field's struct code
_CODES: dict[type, str] = {int: "q", float: "d"}
assert 8 + 8 * len(RECORD_FIELDS) + 8 <= RECORD_BYTES


class RecordLayout:
    """The record of one table: its parts' declared scalars at their :data:`RECORD_FIELDS`.

    Args:
        table: the table (its parts are its attributes named in :data:`PARTS`).

    Raises:
        BackendError: a part declares a scalar the record has no field for, or of a
            type other than ``int`` and ``float``.
    """

    def __init__(self, table: Any) -> None:
        declared: dict[tuple[str, str], type] = {}
        for part in PARTS:
            owner = table if part == "table" else getattr(table, part)
            for name, kind in owner.SCALARS.items():
                if (part, name) not in RECORD_FIELDS or kind not in _CODES:
                    raise BackendError(
                        f"{part} {type(owner).__name__} declares scalar {name!r} "
                        f"({getattr(kind, '__name__', kind)}) that the durable record has no "
                        "field for"
                    )
                declared[part, name] = kind
        #: the fields this table's parts fill, in record order
        self.fields = [field for field in RECORD_FIELDS if field in declared]
        codes = (_CODES[declared[f]] if f in declared else "q" for f in RECORD_FIELDS)
        self._body = struct.Struct("<Q" + "".join(codes))
        self._record = struct.Struct(self._body.format + "Q")
        self._pack_body = _packer(self._body, declared)

    def pack(self, generation: int, table: Any) -> bytes:
        """The record of ``table``'s scalars now, numbered ``generation``."""
        body = self._pack_body(generation, table)
        return body + zlib.crc32(body).to_bytes(8, "little")

    def unpack(self, raw: bytes) -> tuple[int, dict[tuple[str, str], Scalar]] | None:
        """The generation and fields of the record at the start of ``raw``; ``None`` for
        a slot never written, or one a crash tore (its checksum does not match)."""
        raw = raw[: self._record.size]
        generation, *values, check = self._record.unpack(raw)
        if generation == 0 or zlib.crc32(raw[: self._body.size]) != check:
            return None
        found = zip(RECORD_FIELDS, values, strict=True)
        return generation, {field: value for field, value in found if field in self.fields}


def _packer(
    body: struct.Struct, declared: Collection[tuple[str, str]]
) -> Callable[[int, Any], bytes]:
    """A function packing a generation and a table's fields into ``body``, in record order
    (0 for a field not ``declared``):
    ``lambda gen, t: body.pack(gen, t.writer.cursor, 0, 0, t.rate_limiter.inserts, ...)``.

    Compiled from its source, as :mod:`dataclasses` compiles ``__init__``: the record is
    written on every state change, and compiled attribute loads read a table's 7 or 8
    fields in ~0.14 us, ``operator.attrgetter``'s dotted paths in ~0.4 us. The source
    holds nothing but the identifiers of :data:`RECORD_FIELDS`.
    """
    loads = [
        ("t" if part == "table" else f"t.{part}") + f".{name}" if (part, name) in declared else "0"
        for part, name in RECORD_FIELDS
    ]
    namespace: dict[str, Any] = {"pack": body.pack}
    exec(f"def pack_body(gen, t):\n    return pack(gen, {', '.join(loads)})", namespace)
    packer: Callable[[int, Any], bytes] = namespace["pack_body"]
    return packer

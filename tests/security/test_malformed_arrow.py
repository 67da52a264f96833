"""Every malformed Arrow IPC extend body is a 4xx naming the field and the problem, and writes nothing.

The bodies are a valid extend's, broken one way each: not Arrow, cut short,
several or no record batches, lengths and offsets that lie, types and
metadata the codec cannot honour, columns the table does not have. Each is
posted after a valid body of the same table, so the server's fast path
(:class:`tdreplay.service.bodies.BodyDecoder`) has a layout to be fooled by.
Two sweeps go past the list: every 64-bit integer of a record batch's
metadata replaced by lies, and random byte-level mutations (hypothesis).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
import testkit
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdreplay.codec import arrow, encode, protocol
from tdreplay.service.bodies import metadata_len

ARROW = {"Content-Type": protocol.ARROW_STREAM}
EXTEND = protocol.table_path("t", "extend")
N = 4


# ---------------------------------------------------------------- bodies
def good(n: int = N, start: int = 0) -> bytes:
    return encode(testkit.rows(start, n)).to_pybytes()


def stream(schema: pa.Schema, *batches: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for rb in batches:
            writer.write_batch(rb)
    return sink.getvalue().to_pybytes()


def replaced(name: str, array: pa.Array | None, field: pa.Field | None = None) -> bytes:
    """A valid body with column ``name`` replaced (``array`` None: removed; a new name: added)."""
    rb = arrow.to_record_batch(testkit.rows(0, N))
    fields, arrays = list(rb.schema), list(rb.columns)
    names = [f.name for f in fields]
    if array is not None and field is None:
        field = pa.field(name, array.type)
    if name in names:
        i = names.index(name)
        if array is None:
            del fields[i], arrays[i]
        else:
            assert field is not None
            fields[i], arrays[i] = field, array
    else:
        assert field is not None and array is not None
        fields.append(field)
        arrays.append(array)
    return stream(pa.schema(fields), pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields)))


def with_meta(name: str, meta: dict[bytes, bytes]) -> bytes:
    """A valid body whose column ``name`` carries ``meta`` (merged over its own)."""
    rb = arrow.to_record_batch(testkit.rows(0, N))
    i = rb.schema.get_field_index(name)
    f = rb.schema.field(i)
    return replaced(name, rb.column(i), f.with_metadata({**(f.metadata or {}), **meta}))


def observations(nesting: int, meta: dict[bytes, bytes] | None = None) -> bytes:
    """``observation`` as ``nesting`` levels of fixed-size lists of size 1 around its 3 floats."""
    arr: pa.Array = pa.FixedSizeListArray.from_arrays(
        pa.array(torch.arange(N * 3.0).numpy(), pa.float32()), 3
    )
    for _ in range(nesting):
        arr = pa.FixedSizeListArray.from_arrays(arr, 1)
    return replaced("observation", arr, pa.field("observation", arr.type, metadata=meta))


def lie(body: bytes, old: int, new: int) -> bytes:
    """``body`` with the last int64 ``old`` of the record batch's metadata replaced by ``new``."""
    end = metadata_len(memoryview(body))
    assert end is not None
    hits = [m.start() for m in re.finditer(re.escape(struct.pack("<q", old)), body[:end])]
    assert hits, f"{old} not in the metadata"
    out = bytearray(body)
    struct.pack_into("<q", out, hits[-1], new)
    return bytes(out)


def one_column(name: str, array: pa.Array) -> bytes:
    return stream(pa.schema([pa.field(name, array.type)]), pa.record_batch([array], names=[name]))


def two_batches() -> bytes:
    rb = arrow.to_record_batch(testkit.rows(0, N))
    return stream(rb.schema, rb, rb)


def zero_batches() -> bytes:
    return stream(arrow.to_record_batch(testkit.rows(0, N)).schema)


def non_utf8_name() -> bytes:
    body = bytearray(good())
    at = body.index(b"pixels")
    body[at : at + 2] = b"\xff\xfe"
    return bytes(body)


def many_columns(k: int) -> bytes:
    cols = {f"c{i}": pa.array([0] * N, pa.int8()) for i in range(k)}
    return stream(pa.record_batch(cols).schema, pa.record_batch(cols))


def duplicate_column() -> bytes:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("id", pa.int64())])
    ids = pa.array(range(N), pa.int64())
    return stream(schema, pa.RecordBatch.from_arrays([ids, ids], schema=schema))


def eos_replaced() -> bytes:
    """Same metadata and length as a remembered layout, but the end-of-stream marker is garbage."""
    body = bytearray(good())
    body[-8:] = b"\xff\xff\xff\xff\x10\x00\x00\x00"
    return bytes(body)


def floats(n: int = N * 3) -> pa.Array:
    return pa.array(torch.arange(float(n)).numpy(), pa.float32())


# (case, body, status, error type, field or None, detail fragment)
Case = tuple[str, Callable[[], bytes], int, str, "str | None", str]
CASES: list[Case] = [
    ("not arrow", lambda: b"\x00not arrow at all" * 10, 400, "CodecError", None, "malformed"),
    ("empty body", lambda: b"", 400, "CodecError", None, "malformed"),
    ("truncated in the data", lambda: good()[:-40], 400, "CodecError", None, ""),
    ("truncated in the metadata", lambda: good()[:300], 400, "CodecError", None, "malformed"),
    ("end of stream replaced", eos_replaced, 400, "CodecError", None, "malformed"),
    ("trailing garbage message", lambda: good() + b"\xff" * 16, 400, "CodecError", None, ""),
    ("several record batches", two_batches, 400, "CodecError", None, "got 2"),
    ("zero record batches", zero_batches, 400, "CodecError", None, "got 0"),
    ("zero rows", lambda: good(0), 400, "InvalidRequest", "batch_size", "no rows"),
    (
        "row count vs column lengths",
        lambda: lie(one_column("id", pa.array([1, 2, 3], pa.int64())), 3, 5),
        400,
        "CodecError",
        None,
        "length",
    ),
    (
        "buffer smaller than the rows",
        lambda: lie(one_column("id", pa.array([1, 2, 3], pa.int64())), 24, 8),
        400,
        "CodecError",
        "id",
        "too small",
    ),
    (
        "buffer past the end of the body",
        lambda: lie(one_column("id", pa.array([1, 2, 3], pa.int64())), 24, 1 << 40),
        400,
        "CodecError",
        None,
        "malformed",
    ),
    (
        "list child shorter than the rows",
        lambda: lie(
            one_column("observation", pa.FixedSizeListArray.from_arrays(floats(6), 3)), 6, 4
        ),
        400,
        "CodecError",
        "observation",
        "Values length",
    ),
    (
        # crashed the whole server process (an abort in Arrow C++) before decoding validated lengths
        "list child of negative length",
        lambda: lie(
            one_column("observation", pa.FixedSizeListArray.from_arrays(floats(6), 3)), 6, -4
        ),
        400,
        "CodecError",
        "observation",
        "Values length",
    ),
    (
        "nested lists deeper than the schema",
        lambda: observations(1),
        422,
        "SchemaError",
        "observation",
        "shape",
    ),
    (
        "nested lists deeper than any tensor",
        lambda: observations(arrow.MAX_NDIM),
        400,
        "CodecError",
        "observation",
        "deeper",
    ),
    (
        "shape metadata nested a million deep",  # was a RecursionError in json.loads: 500
        lambda: with_meta("observation", {b"tdreplay.shape": b"[" * 1_000_000}),
        400,
        "CodecError",
        "observation",
        "metadata",
    ),
    (
        "shape metadata nested",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[[3]]"}),
        400,
        "CodecError",
        "observation",
        "bad shape metadata",
    ),
    (
        "shape metadata huge",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[99999999999999999999999]"}),
        400,
        "CodecError",
        "observation",
        "too large",
    ),
    (
        "shape metadata huge with a zero",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[0, 99999999999999999999999]"}),
        400,
        "CodecError",
        "observation",
        "too large",
    ),
    (
        "shape metadata negative",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[-3]"}),
        400,
        "CodecError",
        "observation",
        "bad shape metadata",
    ),
    (
        "shape metadata not integers",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[3.0]"}),
        400,
        "CodecError",
        "observation",
        "bad shape metadata",
    ),
    (
        "shape metadata booleans",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[true, true, true]"}),
        400,
        "CodecError",
        "observation",
        "bad shape metadata",
    ),
    (
        "shape metadata not UTF-8",
        lambda: with_meta("observation", {b"tdreplay.shape": b"\xff[3]"}),
        400,
        "CodecError",
        "observation",
        "not ASCII",
    ),
    (
        "shape metadata vs list size",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[4]"}),
        400,
        "CodecError",
        "observation",
        "does not match list size",
    ),
    (
        "shape metadata reshapes the list",
        lambda: with_meta("observation", {b"tdreplay.shape": b"[3, 1]"}),
        422,
        "SchemaError",
        "observation",
        "shape",
    ),
    (
        "null values",
        lambda: replaced("id", pa.array([1, None, 3, 4], pa.int64())),
        400,
        "CodecError",
        "id",
        "nulls",
    ),
    (
        "null list",
        lambda: replaced(
            "observation",
            pa.array([[1, 2, 3], None, [1, 2, 3], [1, 2, 3]], pa.list_(pa.float32(), 3)),
        ),
        400,
        "CodecError",
        "observation",
        "nulls",
    ),
    (
        "null inside a list",
        lambda: replaced(
            "observation",
            pa.array([[1, 2, None]] + [[1, 2, 3]] * 3, pa.list_(pa.float32(), 3)),
        ),
        400,
        "CodecError",
        "observation",
        "nulls",
    ),
    (
        "null bool",
        lambda: replaced(
            "next.done", pa.array([[True], [None], [False], [True]], pa.list_(pa.bool_(), 1))
        ),
        400,
        "CodecError",
        "next.done",
        "nulls",
    ),
    (
        "dictionary type",
        lambda: replaced("id", pa.array([1, 2, 1, 2], pa.int64()).dictionary_encode()),
        400,
        "CodecError",
        "id",
        "not supported",
    ),
    (
        "extension type",
        lambda: replaced(
            "id",
            pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"0" * 16] * N, pa.binary(16))),
        ),
        400,
        "CodecError",
        "id",
        "not supported",
    ),
    (
        "union type",
        lambda: replaced(
            "id", pa.UnionArray.from_sparse(pa.array([0] * N, pa.int8()), [pa.array(range(N))])
        ),
        400,
        "CodecError",
        "id",
        "not supported",
    ),
    ("string type", lambda: replaced("id", pa.array(list("abcd"))), 400, "CodecError", "id", ""),
    (
        "variable-size list",
        lambda: replaced("observation", pa.array([[1.0, 2.0, 3.0]] * N, pa.list_(pa.float32()))),
        400,
        "CodecError",
        "observation",
        "variable-size",
    ),
    (
        "wrong dtype",
        lambda: replaced("id", pa.array(range(N), pa.int32())),
        422,
        "SchemaError",
        "id",
        "dtype",
    ),
    (
        "wrong dtype in a list",
        lambda: replaced("pixels", pa.array([[1, 2, 3, 4]] * N, pa.list_(pa.int16(), 4))),
        422,
        "SchemaError",
        "pixels",
        "dtype",
    ),
    (
        "bfloat16 declared on float32",
        lambda: replaced(
            "action",
            pa.array([[1.0, 2.0]] * N, pa.list_(pa.float32(), 2)),
            pa.field(
                "action",
                pa.list_(pa.float32(), 2),
                metadata={b"tdreplay.dtype": b"bfloat16", b"tdreplay.shape": b"[2]"},
            ),
        ),
        400,
        "CodecError",
        "action",
        "bfloat16",
    ),
    (
        "bfloat16 declared on int16",
        lambda: replaced(
            "action",
            pa.array([[1, 2]] * N, pa.list_(pa.int16(), 2)),
            pa.field("action", pa.list_(pa.int16(), 2), metadata={b"tdreplay.dtype": b"bfloat16"}),
        ),
        400,
        "CodecError",
        "action",
        "bfloat16",
    ),
    (
        "unknown dtype metadata",
        lambda: with_meta("id", {b"tdreplay.dtype": b"complex128"}),
        400,
        "CodecError",
        "id",
        "unknown dtype",
    ),
    (
        "dtype metadata not UTF-8",
        lambda: with_meta("id", {b"tdreplay.dtype": b"\xffint64"}),
        400,
        "CodecError",
        "id",
        "not ASCII",
    ),
    (
        "duplicate column",
        duplicate_column,
        400,
        "CodecError",
        "id",
        "twice",
    ),
    (
        "unknown column",
        lambda: replaced("extra", pa.array(range(N), pa.int64())),
        422,
        "SchemaError",
        "extra",
        "unexpected key",
    ),
    ("missing column", lambda: replaced("id", None), 422, "SchemaError", "id", "missing"),
    (
        "column clashing with a nested key",
        lambda: replaced("next", pa.array(range(N), pa.int64())),
        400,
        "CodecError",
        "next.reward",
        "clashes",
    ),
    (
        "empty key part",
        lambda: replaced("next..done", pa.array(range(N), pa.int64())),
        400,
        "CodecError",
        "next..done",
        "empty key part",
    ),
    ("column name not UTF-8", non_utf8_name, 400, "CodecError", None, "UTF-8"),
    (
        "huge number of columns",
        lambda: many_columns(arrow.MAX_COLUMNS + 1),
        400,
        "CodecError",
        None,
        "columns",
    ),
]


# ---------------------------------------------------------------- the server
@pytest.fixture
def client(service: Callable[..., Any]) -> Any:
    """A table of :data:`testkit.FIELDS`, with rows in it and its body layout remembered."""
    client = service(max_body_bytes=4 << 20, raise_server_exceptions=False)
    spec = {
        "name": "t",
        "capacity": 64,
        "fields": testkit.FIELDS,
        "backend": {"kind": "memory"},
    }
    assert client.post(protocol.TABLES, json=spec).status_code == 201
    for start in (0, 100):  # the second one takes the fast path
        assert client.post(EXTEND, content=good(N, start), headers=ARROW).status_code == 200
    return client


def state(client: Any) -> tuple[int, int]:
    info = client.get(protocol.table_path("t")).json()
    return info["size"], info["inserts"]


@pytest.mark.parametrize(
    ("case", "make", "status", "type_", "field", "fragment"), CASES, ids=[c[0] for c in CASES]
)
def test_malformed_body_is_a_4xx_that_writes_nothing(
    client: Any,
    case: str,
    make: Callable[[], bytes],
    status: int,
    type_: str,
    field: str | None,
    fragment: str,
) -> None:
    before = state(client)
    r = client.post(EXTEND, content=make(), headers=ARROW)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == type_, err
    assert err["field"] == field, err
    assert fragment in err["detail"], err
    assert len(err["detail"]) < 500, err  # says what is wrong, without echoing the body
    assert state(client) == before
    # the layout the server remembers still decodes valid bodies
    assert client.post(EXTEND, content=good(N, 200), headers=ARROW).status_code == 200


LIES = [-1, 0, 1, 3, 5, 7, 1 << 31, 1 << 40, -(1 << 40), (1 << 63) - 1]


def test_every_length_and_offset_that_lies_is_rejected(client: Any) -> None:
    """Each 64-bit integer of the record batch's metadata (row count, field lengths, null
    counts, buffer offsets and sizes, body length) replaced by a lie: never a 5xx, never a write
    on a 4xx; a lie that still makes a valid body (a length equal to the truth) may go in."""
    body = good()
    end = metadata_len(memoryview(body))
    assert end is not None
    schema_end = 8 + struct.unpack_from("<i", body, 4)[0]
    for at in range(schema_end, end - 7, 8):
        (truth,) = struct.unpack_from("<q", body, at)
        for value in LIES:
            if value == truth:
                continue
            bad = bytearray(body)
            struct.pack_into("<q", bad, at, value)
            before = state(client)
            r = client.post(EXTEND, content=bytes(bad), headers=ARROW)
            assert r.status_code < 500, (at, truth, value, r.text)
            if r.status_code >= 400:
                assert r.json()["type"] in ("CodecError", "SchemaError", "InvalidRequest"), r.text
                assert state(client) == before, (at, truth, value)


# ---------------------------------------------------------------- random mutations
def _mutate(data: st.DataObject, body: bytes) -> bytes:
    out = bytearray(body)
    if len(out) < 16:
        return bytes(out) + data.draw(st.binary(max_size=16))
    end = metadata_len(memoryview(body)) or len(body)
    kind = data.draw(st.sampled_from(["byte", "int32", "int64", "cut", "append", "tail"]))
    if kind == "byte":
        for at in data.draw(st.lists(st.integers(0, end - 1), min_size=1, max_size=4)):
            out[at] = data.draw(st.integers(0, 255))
    elif kind in ("int32", "int64"):
        size = 4 if kind == "int32" else 8
        at = data.draw(st.integers(0, (end - size) // size)) * size
        value = data.draw(st.sampled_from([-1, 0, 1, 2, 3, 8, 255, 1 << 16, (1 << 31) - 1]))
        struct.pack_into("<i" if size == 4 else "<q", out, at, value)
    elif kind == "cut":
        del out[data.draw(st.integers(0, len(out) - 1)) :]
    elif kind == "append":
        out += data.draw(st.binary(min_size=1, max_size=64))
    else:  # the data and the end-of-stream marker: same metadata, the fast path's territory
        start = min(end, len(out) - 8)
        for at in data.draw(st.lists(st.integers(start, len(out) - 1), min_size=1, max_size=4)):
            out[at] = data.draw(st.integers(0, 255))
    return bytes(out)


def test_mutated_bodies_never_fail_the_server(client: Any) -> None:
    bodies = [good(1), good(N), good(9)]

    @given(data=st.data())
    @settings(
        max_examples=400,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(data: st.DataObject) -> None:
        body = _mutate(data, data.draw(st.sampled_from(bodies)))
        if data.draw(st.booleans()):
            body = _mutate(data, body)
        before = state(client)
        r = client.post(EXTEND, content=body, headers=ARROW)
        assert r.status_code < 500, r.text
        if r.status_code >= 400:
            assert state(client) == before

    fuzz()

"""The wire codec: exact round trips, zero-copy decoding, foreign streams, typed errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.codec import (
    CodecError,
    decode,
    dtypes,
    encode,
    from_column,
    from_record_batch,
    read_batches,
    to_record_batch,
)
from tdreplay.codec.arrow import MAX_COLUMNS, MAX_NDIM

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
SHAPES = [[], [3], [2, 3, 4]]


def random_bits(shape: list[int], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Every bit pattern is fair game: NaN payloads, infinities, subnormals, -0.0."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    raw = torch.randint(0, 256, [*shape, dtype.itemsize], dtype=torch.uint8, generator=g)
    return raw.view(dtype).squeeze(-1)


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return (t.to(torch.uint8) if t.dtype == torch.bool else t).reshape(-1).view(torch.uint8)


def assert_exact(a: TensorDict, b: TensorDict) -> None:
    assert a.batch_size == b.batch_size
    assert sorted(map(str, a.keys(True, True))) == sorted(map(str, b.keys(True, True)))
    for key in a.keys(True, True):
        x, y = a[key], b[key]
        assert (x.dtype, x.shape) == (y.dtype, y.shape), key
        assert torch.equal(bits(x), bits(y)), key


def address_range(buf: pa.Buffer) -> tuple[int, int]:
    return buf.address, buf.address + buf.size


# ------------------------------------------------------------------ round trips
def test_the_codec_carries_the_one_dtype_list() -> None:
    """Every dtype of :mod:`tdreplay.codec.dtypes`, as its Arrow type, named in the metadata."""
    assert list(dtypes.TORCH.values()) == DTYPES
    rb = to_record_batch({dtypes.NAMES[d]: torch.zeros(2, dtype=d) for d in DTYPES})
    for d in DTYPES:
        field = rb.schema.field(dtypes.NAMES[d])
        assert field.type == dtypes.ARROW[d], d
        assert field.metadata[b"tdreplay.dtype"] == dtypes.NAMES[d].encode(), d


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_exactly(dtype: torch.dtype) -> None:
    n = 7
    td = TensorDict(
        {
            f"s{i}": random_bits([n, *shape], dtype, seed=i)
            for i, shape in enumerate(SHAPES)  # scalar, vector, 3-d per row
        },
        batch_size=[n],
    )
    td["next", "deep", "x"] = random_bits([n, 2], dtype, seed=9)
    buf = encode(td)
    schema = read_batches(buf)[0].schema
    assert schema.field("next.deep.x").metadata[b"tdreplay.shape"] == b"[2]"
    assert schema.field("s2").metadata[b"tdreplay.shape"] == b"[2, 3, 4]"
    assert schema.field("s0").metadata[b"tdreplay.dtype"] == name(dtype).encode()
    assert_exact(decode(buf), td)


def test_non_contiguous_tensorclass_and_dict_inputs() -> None:
    @tensorclass
    class Step:
        obs: torch.Tensor
        reward: torch.Tensor

    base = torch.arange(24.0).reshape(4, 6)
    step = Step(obs=base[:, ::2], reward=torch.ones(4, 1).expand(4, 3), batch_size=[4])
    back = decode(encode(step))
    assert torch.equal(back["obs"], base[:, ::2]) and torch.equal(back["reward"], torch.ones(4, 3))
    back = decode(encode({("a", "b"): torch.arange(3), "c": torch.zeros(3, 2)}))
    assert back["a", "b"].tolist() == [0, 1, 2] and back["c"].shape == (3, 2)


def test_zero_rows_and_sliced_batches() -> None:
    td = TensorDict({name(k): random_bits([0, 2], k) for k in DTYPES}, batch_size=[0])
    assert_exact(decode(encode(td)), td)
    full = TensorDict({name(k): random_bits([9, 3], k, seed=3) for k in DTYPES}, batch_size=[9])
    rb = to_record_batch(full)
    # a slice has an offset into its buffers (bools too: not on a byte boundary)
    assert_exact(from_record_batch(rb.slice(3, 4)), full[3:7])


# ------------------------------------------------------------------ zero copy
def test_decode_is_zero_copy_except_bool() -> None:
    td = TensorDict({name(d): random_bits([5, 4], d) for d in DTYPES}, batch_size=[5])
    buf = encode(td)
    lo, hi = address_range(buf)
    back = decode(buf)
    for d in DTYPES:
        t = back[name(d)]
        inside = lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi
        assert inside == (d != torch.bool), d
    # a view, not a copy: changing the bytes changes the tensor
    raw = bytearray(buf.to_pybytes())
    back = decode(raw)
    f = back["float32"]
    before = f.clone()
    lo2 = np.frombuffer(raw, dtype=np.uint8).ctypes.data
    offset = f.data_ptr() - lo2
    raw[offset : offset + 4] = np.float32(123.5).tobytes()
    assert f[0, 0].item() == 123.5 and torch.equal(f.reshape(-1)[1:], before.reshape(-1)[1:])


# ------------------------------------------------------------------ foreign streams
def ipc(rb: pa.RecordBatch | pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    batches = rb.to_batches() if isinstance(rb, pa.Table) else [rb]
    with pa.ipc.new_stream(sink, batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def test_foreign_stream_with_nested_fixed_size_lists_decodes() -> None:
    """A client with only pyarrow: nested fixed-size lists give the shape, no metadata."""
    pixels = np.arange(2 * 3 * 4, dtype=np.uint8)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(pixels), 4)
    nested = pa.FixedSizeListArray.from_arrays(inner, 3)
    rb = pa.record_batch(
        {
            "pixels": nested,
            "obs": pa.FixedSizeListArray.from_arrays(
                pa.array([1.5, 2.5, 3.5, 4.5], pa.float32()), 2
            ),
            "next.done": pa.array([True, False]),
            "next.reward": pa.array([0.5, -1.0], pa.float16()),
            "count": pa.array([7, 8], pa.uint16()),  # plain uint16 widens to int32
        }
    )
    td = decode(ipc(rb))
    assert td.batch_size == torch.Size([2])
    assert td["pixels"].shape == (2, 3, 4) and td["pixels"].dtype == torch.uint8
    assert torch.equal(td["pixels"].reshape(-1), torch.from_numpy(pixels))
    assert td["obs"].tolist() == [[1.5, 2.5], [3.5, 4.5]]
    assert td["next", "done"].tolist() == [True, False]
    assert td["next", "reward"].dtype == torch.float16
    assert td["count"].dtype == torch.int32 and td["count"].tolist() == [7, 8]


# ------------------------------------------------------------------ errors
def test_malformed_bytes() -> None:
    for data in (b"", b"not arrow at all", ipc(pa.record_batch({"a": [1, 2]}))[:-20]):
        with pytest.raises(
            CodecError, match=r"malformed Arrow IPC stream|expected one record batch"
        ):
            decode(data)


def test_bytes_after_the_end_of_stream() -> None:
    data = ipc(pa.record_batch({"a": [1, 2]}))
    assert decode(data)["a"].tolist() == [1, 2]
    with pytest.raises(CodecError, match="16 bytes after the end of the Arrow IPC stream"):
        decode(data + b"\x00" * 16)


def test_too_many_columns() -> None:
    rb = pa.record_batch({f"c{i}": pa.array([1], pa.int8()) for i in range(MAX_COLUMNS + 1)})
    with pytest.raises(CodecError, match=f"{MAX_COLUMNS + 1} columns"):
        decode(ipc(rb))


def test_batch_count() -> None:
    two = pa.Table.from_batches([pa.record_batch({"a": [1]}), pa.record_batch({"a": [2]})])
    with pytest.raises(CodecError, match="expected one record batch, got 2"):
        decode(ipc(two))
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, pa.schema([("a", pa.int64())])).close()
    with pytest.raises(CodecError, match="got 0"):
        decode(sink.getvalue())


def _nested(arr: pa.Array, levels: int) -> pa.Array:
    for _ in range(levels):
        arr = pa.FixedSizeListArray.from_arrays(arr, 1)
    return arr


def _tagged(arr: pa.Array, name: str = "x", **meta: object) -> pa.RecordBatch:
    md = {
        f"tdreplay.{k}".encode(): (v if isinstance(v, str) else json.dumps(v)).encode()
        for k, v in meta.items()
    }
    return pa.RecordBatch.from_arrays(
        [arr], schema=pa.schema([pa.field(name, arr.type, metadata=md or None)])
    )


BAD = {
    "null values": (_tagged(pa.array([1.0, None]), "obs"), "obs", "1 nulls"),
    "null rows": (
        _tagged(pa.array([[1, 2], None], pa.list_(pa.int64(), 2)), "next.obs"),
        "next.obs",
        "1 nulls",
    ),
    "null elements": (
        _tagged(pa.array([[1, None], [3, 4]], pa.list_(pa.int64(), 2)), "a"),
        "a",
        "1 nulls",
    ),
    "variable lists": (_tagged(pa.array([[1, 2], [3]]), "act"), "act", "variable-size lists"),
    "strings": (_tagged(pa.array(["a", "b"]), "s"), "s", "not supported"),
    "uint64": (_tagged(pa.array([1, 2], pa.uint64()), "u"), "u", "not supported"),
    "metadata dtype vs type": (
        _tagged(pa.array([1, 2], pa.int64()), "r", dtype="float32"),
        "r",
        "metadata says float32 but the Arrow type is int64",
    ),
    "unknown metadata dtype": (
        _tagged(pa.array([1, 2], pa.int64()), "r", dtype="complex64"),
        "r",
        "unknown dtype 'complex64'",
    ),
    "metadata shape vs size": (
        _tagged(pa.array([[1, 2, 3]], pa.list_(pa.int64(), 3)), "p", shape=[2, 2]),
        "p",
        "does not match list size 3",
    ),
    "bad shape metadata": (
        _tagged(pa.array([[1, 2]], pa.list_(pa.int64(), 2)), "p", shape="[2,"),
        "p",
        "bad shape metadata",
    ),
    "negative shape": (
        _tagged(pa.array([[1, 2]], pa.list_(pa.int64(), 2)), "p", shape=[-2]),
        "p",
        "bad shape metadata",
    ),
    "duplicate columns": (
        pa.record_batch([pa.array([1]), pa.array([2])], names=["a", "a"]),
        "a",
        "appears twice",
    ),
    "leaf and prefix": (
        pa.record_batch([pa.array([1]), pa.array([2])], names=["a", "a.b"]),
        "a.b",
        "clashes",
    ),
    "prefix after the leaf": (
        pa.record_batch([pa.array([1]), pa.array([2])], names=["a.b", "a"]),
        "a.b",
        "clashes with column 'a'",
    ),
    "empty key part": (
        pa.record_batch([pa.array([1])], names=["a..b"]),
        "a..b",
        "empty key part",
    ),
    "shape metadata nested deep": (  # json.loads of it raised RecursionError
        _tagged(pa.array([[1, 2]], pa.list_(pa.int64(), 2)), "p", shape="[" * 100_000),
        "p",
        "metadata of 100000 bytes",
    ),
    "shape metadata of booleans": (
        _tagged(pa.array([[1, 2]], pa.list_(pa.int64(), 2)), "p", shape="[true, 2]"),
        "p",
        "bad shape metadata",
    ),
    "shape metadata too large": (
        _tagged(pa.array([[1, 2]], pa.list_(pa.int64(), 2)), "p", shape="[0, 1" + "0" * 30 + "]"),
        "p",
        "too large",
    ),
    "non-ASCII dtype metadata": (
        pa.RecordBatch.from_arrays(
            [pa.array([1])],
            schema=pa.schema([pa.field("d", pa.int64(), metadata={b"tdreplay.dtype": b"\xff"})]),
        ),
        "d",
        "not ASCII",
    ),
    "bfloat16 on float32": (
        _tagged(pa.array([1.0], pa.float32()), "b", dtype="bfloat16"),
        "b",
        "a bfloat16 column travels as uint16",
    ),
    "lists nested too deep": (
        pa.record_batch([_nested(pa.array([1.0]), MAX_NDIM + 1)], names=["deep"]),
        "deep",
        f"nested deeper than {MAX_NDIM}",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_columns_name_the_column(case: str) -> None:
    rb, column, message = BAD[case]
    with pytest.raises(CodecError, match=message) as err:
        decode(ipc(rb))
    assert err.value.field == column


def test_encode_errors_name_the_key() -> None:
    with pytest.raises(CodecError, match="nothing to encode"):
        encode(TensorDict(batch_size=[2]))
    with pytest.raises(CodecError, match="complex64 has no Arrow mapping") as err:
        encode({"z": torch.zeros(2, dtype=torch.complex64)})
    assert err.value.field == "z"
    with pytest.raises(CodecError, match="0-d tensor") as err:
        encode({"s": torch.tensor(1.0)})
    assert err.value.field == "s"
    with pytest.raises(CodecError, match="has 3 rows, others have 2") as err:
        encode({"a": torch.zeros(2), "b": torch.zeros(3)})
    assert err.value.field == "b"
    with pytest.raises(CodecError, match="not a tensor") as err:
        encode({"a": torch.zeros(2), "b": [1, 2]})  # type: ignore[dict-item]
    assert err.value.field == "b"


def test_from_column_checks_row_count() -> None:
    arr = pa.array([1.0, 2.0, 3.0], pa.float32())
    f = pa.field("x", arr.type, metadata={b"tdreplay.shape": b"[1]"})
    assert from_column(f, arr).shape == (3, 1)


@pytest.mark.parametrize("shape", [[0], [3, 0], [0, 2]], ids=str)
@pytest.mark.parametrize("n", [0, 4])
def test_zero_size_fields_round_trip(shape: list[int], n: int) -> None:
    """A field with no elements per item keeps its shape and dtype (and never reads a buffer)."""
    td = TensorDict(
        {str(d).removeprefix("torch."): torch.zeros([n, *shape], dtype=d) for d in DTYPES},
        batch_size=[n],
    )
    td["id"] = torch.arange(n)
    back = decode(encode(td))
    for key, t in td.items():
        assert back[key].shape == t.shape and back[key].dtype == t.dtype, key

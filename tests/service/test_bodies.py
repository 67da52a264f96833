"""Request bodies: decoded fast for layouts seen before, exactly as the codec decodes them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from service_helpers import assert_rows_match, rows

from tdreplay.codec import CodecError, encode
from tdreplay.service.bodies import BodyDecoder, metadata_len


def _view(data: bytes) -> memoryview:
    return memoryview(bytearray(data))  # writable, as the pooled body buffers are


def test_the_service_decodes_with_the_codecs_decoder() -> None:
    from tdreplay.codec import ipc

    assert BodyDecoder is ipc.LayoutDecoder and metadata_len is ipc.metadata_len


def test_repeated_layouts_are_sliced_not_parsed() -> None:
    decoder = BodyDecoder()
    first = decoder.decode(_view(encode(rows(0, 8)).to_pybytes()))
    assert decoder.hits == 0
    assert_rows_match(first)
    for start in (8, 100, 1000):
        td = decoder.decode(_view(encode(rows(start, 8)).to_pybytes()))
        assert_rows_match(td)
        assert td["id"].tolist() == list(range(start, start + 8))
    assert decoder.hits == 3
    decoder.decode(_view(encode(rows(0, 9)).to_pybytes()))  # another row count: another layout
    assert decoder.hits == 3


def test_views_share_the_body() -> None:
    decoder = BodyDecoder()
    data = encode(rows(0, 4)).to_pybytes()
    decoder.decode(_view(data))
    body = _view(data)
    td = decoder.decode(body)
    assert decoder.hits == 1
    start = np.frombuffer(body, dtype=np.uint8).ctypes.data
    for key in ("id", "observation", "action", ("next", "reward"), "pixels", "wide"):
        assert start <= td.get(key).data_ptr() < start + len(body), key


def test_bodies_that_do_not_fit_go_to_the_codec() -> None:
    decoder = BodyDecoder()
    data = encode(rows(0, 4)).to_pybytes()
    decoder.decode(_view(data))
    with pytest.raises(CodecError):
        decoder.decode(_view(data[:-40]))  # same metadata, truncated
    td = decoder.decode(memoryview(data))  # read-only (a chunked upload)
    assert_rows_match(td)
    assert decoder.hits == 0
    with pytest.raises(CodecError):
        decoder.decode(_view(b"\xff\xff\xff\xff" + b"\x10\x00\x00\x00" + b"x" * 40))
    assert metadata_len(_view(b"short")) is None


def test_converted_columns_are_never_sliced() -> None:
    """A plain uint16 column (no tdreplay metadata) is widened to int32 by the codec: no fast path."""
    rb = pa.record_batch({"x": pa.array([1, 2, 65535], pa.uint16())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
    data = sink.getvalue().to_pybytes()
    decoder = BodyDecoder()
    for _ in range(3):
        td = decoder.decode(_view(data))
        assert td["x"].dtype == torch.int32 and td["x"].tolist() == [1, 2, 65535]
    assert decoder.hits == 0


def test_a_body_like_a_remembered_layout_is_checked() -> None:
    """Same metadata bytes as a remembered layout, but not the same body: the codec judges it."""
    decoder = BodyDecoder()
    data = encode(rows(0, 4)).to_pybytes()
    decoder.decode(_view(data))
    broken_end = data[:-8] + b"\xff\xff\xff\xff\x10\x00\x00\x00"  # same length, no end of stream
    for bad in (broken_end, data + b"\x00" * 8, data[:-9]):
        with pytest.raises(CodecError):
            decoder.decode(_view(bad))
    assert_rows_match(decoder.decode(_view(data[:-8])))  # no end-of-stream marker: still a stream
    assert decoder.hits == 0


def test_only_canonical_bodies_are_remembered() -> None:
    """A body with bytes after its end of stream is refused, and no layout is learnt from it."""
    decoder = BodyDecoder()
    data = encode(rows(0, 4)).to_pybytes()
    for _ in range(2):
        with pytest.raises(CodecError, match="after the end"):
            decoder.decode(_view(data + b"\x00" * 8))
    assert decoder.hits == 0
    assert all(layout is None for layout in decoder._layouts.values())


@pytest.mark.parametrize("shape", [[0], [3, 0]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.bfloat16], ids=str)
def test_zero_size_fields(shape: list[int], dtype: torch.dtype) -> None:
    """Zero-size fields neither break the fast path in nor the sample bodies out."""
    from tensordict import TensorDict

    from tdreplay.codec import decode
    from tdreplay.codec.ipc import SampleLayout
    from tdreplay.service.wire import SampleBuffer, sample_schema

    td = TensorDict({"id": torch.arange(3), "z": torch.zeros([3, *shape], dtype=dtype)}, [3])
    decoder = BodyDecoder()
    for _ in range(3):
        back = decoder.decode(_view(encode(td).to_pybytes()))
        assert back["z"].shape == (3, *shape) and back["z"].dtype == dtype
        assert back["id"].tolist() == [0, 1, 2]
    assert decoder.hits == 2
    layout = SampleLayout(sample_schema({("id",): ([], torch.int64), ("z",): (shape, dtype)}), n=3)
    lease = SampleBuffer(layout).lease()
    lease.out["id"].copy_(torch.arange(3))
    lease.finish()
    sampled = decode(lease.body)
    assert sampled["z"].shape == (3, *shape) and sampled["id"].tolist() == [0, 1, 2]
    run = TensorDict(
        {
            k: torch.zeros([6, *lease.out.get(k).shape[1:]], dtype=lease.out.get(k).dtype)
            for k in lease.out.keys(True, True)
        },
        [6],
    )
    assert len(layout.tile(run, 2)) == 2 * layout.batch_len


@pytest.mark.parametrize("n", [1, 7, 9, 64])
def test_bool_columns_of_any_shape_pack_into_the_sample_body(n: int) -> None:
    """Bool columns are packed together (one packbits for all): each lands as its own bits."""
    from tdreplay.codec import decode
    from tdreplay.codec.ipc import SampleLayout
    from tdreplay.service.wire import SampleBuffer, sample_schema

    shapes = {("a",): [], ("b",): [3], ("c", "d"): [2, 5], ("e",): [1]}
    schema = {k: (s, torch.bool) for k, s in shapes.items()}
    layout = SampleLayout(sample_schema({("id",): ([], torch.int64), **schema}), n=n)
    buffer = SampleBuffer(layout)
    gen = torch.Generator().manual_seed(n)
    for round_ in range(2):  # a reused body: the second fill overwrites the first's bits
        lease = buffer.lease()
        want = {k: torch.rand([n, *s], generator=gen) < 0.5 for k, s in shapes.items()}
        for key, value in want.items():
            lease.out.get(key).copy_(value)
        lease.out["id"].copy_(torch.arange(n) + round_)
        lease.finish()
        back = decode(lease.body)
        for key, value in want.items():
            assert torch.equal(back.get(key), value), key
        assert back["id"].tolist() == list(range(round_, n + round_))
        del lease, back

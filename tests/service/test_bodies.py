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

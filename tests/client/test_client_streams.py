"""Sample streams cut into one-batch streams, however the bytes were chunked."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tdreplay.client.staging import StagingBuffer
from tdreplay.client.streams import one_batch_streams
from tdreplay.codec import decode


def stream_bytes(batches: int, rows: int = 2) -> bytes:
    schema = pa.schema([("x", pa.int64()), ("y", pa.list_(pa.float32(), 3))])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for i in range(batches):
            x = pa.array(range(i, i + rows), pa.int64())
            y = pa.array([[float(i)] * 3] * rows, pa.list_(pa.float32(), 3))
            w.write_batch(pa.record_batch([x, y], schema=schema))
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("cut", [1, 5, 8, 64, 333, 10**6])
def test_every_batch_comes_out_whole_whatever_the_chunking(cut: int) -> None:
    data = stream_bytes(6)
    chunks = [data[i : i + cut] for i in range(0, len(data), cut)]
    got = [decode(body) for body in one_batch_streams(chunks)]
    assert [b["x"].tolist() for b in got] == [[i, i + 1] for i in range(6)]
    assert all(not body.readonly for body in one_batch_streams([data]))  # sliceable in place


def test_an_empty_stream_has_no_batches() -> None:
    assert list(one_batch_streams([stream_bytes(0)])) == []


@pytest.mark.parametrize(
    "data",
    [
        stream_bytes(3)[:-8],  # cut before its end-of-stream marker
        stream_bytes(3)[:-30],  # cut inside a batch
        b"HTTP/1.1 200 OK\r\n\r\n not arrow at all",
    ],
    ids=["no-end", "cut", "garbage"],
)
def test_broken_streams_are_errors(data: bytes) -> None:
    with pytest.raises(ValueError):
        list(one_batch_streams([data]))


def test_each_batch_lands_in_the_memory_alloc_gives() -> None:
    """The loader hands its pinned buffers here when batches go to CUDA: each body is
    written there, and decodes the same."""
    slot = StagingBuffer(pinned=False)
    slot.want = 1 << 16
    slot.reset()
    assert slot.buf is not None
    base, end = slot.buf.data_ptr(), slot.buf.data_ptr() + slot.buf.numel()

    def alloc(n: int) -> memoryview:
        slot.reset()
        return slot.alloc(n)

    data = stream_bytes(4)
    for i, body in enumerate(one_batch_streams([data[:100], data[100:]], alloc)):
        x = decode(body)["x"]
        assert base <= x.data_ptr() < end  # decoded in place, in the given memory
        assert x.tolist() == [i, i + 1]

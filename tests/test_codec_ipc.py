"""Arrow IPC byte layouts: sample templates and the layout-caching decoder give what the codec gives."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

from tdreplay.client import batches as B
from tdreplay.client import errors
from tdreplay.client.batches import decode_batch
from tdreplay.codec import decode, dtypes, encode, from_record_batch, read_batches, to_leaves
from tdreplay.codec.arrow import read_one
from tdreplay.codec.ipc import CONTINUATION, EOS, LayoutDecoder, SampleLayout, metadata_len

DTYPES = list(dtypes.TORCH.values())
#: item shapes: scalar, vector, 3-d, and two zero-size fields
SHAPES = [[], [3], [2, 3, 4], [0], [3, 0]]


def random_bits(shape: list[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every bit pattern: NaN payloads, infinities, subnormals, -0.0."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    raw = torch.randint(0, 256, [*shape, dtype.itemsize], dtype=torch.uint8, generator=g)
    return raw.view(dtype).squeeze(-1)


def every_dtype(n: int, seed: int = 0) -> TensorDict:
    """A batch with a field of every dtype in every shape, some nested."""
    td = TensorDict(batch_size=[n])
    for i, dtype in enumerate(DTYPES):
        for j, shape in enumerate(SHAPES):
            key = (dtypes.NAMES[dtype], f"s{j}") if j % 2 else f"{dtypes.NAMES[dtype]}_{j}"
            td[key] = random_bits([n, *shape], dtype, seed=seed + 10 * i + j)
    return td


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


def schema_of(td: TensorDict) -> dict[tuple[str, ...], tuple[list[int], torch.dtype]]:
    return {
        k if isinstance(k, tuple) else (k,): (list(v.shape[1:]), v.dtype)
        for k, v in td.items(True, True)
    }


def fill(layout: SampleLayout, body: np.ndarray, td: TensorDict) -> None:
    """Write ``td``'s columns into a copy of the layout's template, as the server's gather does."""
    for key, c in layout.columns.items():
        t = td.get(key).reshape(-1)
        raw = (
            np.packbits(t.numpy(), bitorder="little") if c.dtype == torch.bool else bits(t).numpy()
        )
        assert len(raw) <= c.nbytes
        body[c.offset : c.offset + len(raw)] = raw


def writable(data: bytes | pa.Buffer) -> memoryview:
    return memoryview(bytearray(data))


# ------------------------------------------------------------------ framing
def test_framing_constants_are_pyarrows() -> None:
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, pa.schema([("a", pa.int64())])).close()
    assert sink.getvalue().to_pybytes()[-len(EOS) :] == EOS
    assert EOS[:4] == CONTINUATION.to_bytes(4, "little")
    body = encode({"a": torch.arange(3)}).to_pybytes()
    end = metadata_len(body)
    assert end is not None and end < len(body)
    assert metadata_len(body[:end]) == end and metadata_len(body[: end - 1]) is None
    assert metadata_len(b"\x00" * 64) is None and metadata_len(EOS + EOS) is None


# ------------------------------------------------------------------ samples out
@pytest.mark.parametrize("n", [1, 5, 64])
def test_sample_layout_round_trips_every_dtype(n: int) -> None:
    td = every_dtype(n)
    layout = SampleLayout(schema_of(td), n)
    assert layout.nbytes == len(layout.template)
    assert bytes(layout.template[: layout.header_len]) == layout.header
    body = layout.template.copy()
    fill(layout, body, td)
    assert_exact(decode(body), td)
    # the layout is the codec's own: the same stream, byte for byte
    assert body.tobytes() == encode(td).to_pybytes()


def test_sample_layout_template_is_a_zero_batch() -> None:
    td = every_dtype(4)
    layout = SampleLayout(schema_of(td), 4)
    back = decode(layout.template)
    for key in td.keys(True, True):
        assert not back[key].any(), key
        assert back[key].shape == td[key].shape and back[key].dtype == td[key].dtype


def test_sample_layout_tiles_runs_of_batches() -> None:
    n, m = 3, 4
    td = every_dtype(n * m, seed=5)
    layout = SampleLayout(schema_of(td), n)
    run = layout.tile(td, m)
    assert len(run) == m * layout.batch_len
    batches = read_batches(layout.header + bytes(run) + EOS)
    assert len(batches) == m
    for i, rb in enumerate(batches):
        assert_exact(from_record_batch(rb), td[i * n : (i + 1) * n])


# ------------------------------------------------------------------ bodies in
@pytest.mark.parametrize("n", [0, 1, 7, 64])
def test_decoder_round_trips_every_dtype(n: int) -> None:
    decoder = LayoutDecoder()
    for seed in range(3):
        td = every_dtype(n, seed=seed)
        assert_exact(decoder.decode(writable(encode(td))), td)
    assert decoder.hits == 2


def test_decoder_views_the_body_except_bool() -> None:
    td = every_dtype(6)
    decoder = LayoutDecoder()
    decoder.decode(writable(encode(td)))
    body = writable(encode(td))
    back = decoder.decode(body)
    assert decoder.hits == 1
    lo = np.frombuffer(body, dtype=np.uint8).ctypes.data
    for key in td.keys(True, True):
        t = back[key]
        if t.numel() == 0:
            continue
        inside = lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= lo + len(
            body
        )
        assert inside == (t.dtype != torch.bool), key


def test_decoder_flat_columns() -> None:
    """``decode_columns``: the codec's flat columns, in column order, parsed or sliced."""
    td = every_dtype(5)
    data = encode(td)
    expected = to_leaves(read_one(data))
    decoder = LayoutDecoder()
    for hits in (0, 1, 2):
        columns, n = decoder.decode_columns(writable(data))
        assert decoder.hits == hits and n == 5
        assert list(columns) == list(expected)
        for key, t in expected.items():
            assert columns[key].dtype == t.dtype and columns[key].shape == t.shape, key
            assert torch.equal(bits(columns[key]), bits(t)), key


def test_decoder_read_only_bodies_go_to_the_codec() -> None:
    data = encode(every_dtype(4)).to_pybytes()
    decoder = LayoutDecoder()
    for body in (data, memoryview(data), data, memoryview(data)):
        assert_exact(decoder.decode(body), every_dtype(4))
    assert decoder.hits == 0
    decoder.decode(writable(data))
    assert decoder.hits == 1


def test_decoder_forgets_the_least_recently_used_layout() -> None:
    decoder = LayoutDecoder(max_layouts=2)
    bodies = [encode({"x": torch.zeros(n)}).to_pybytes() for n in (1, 2, 3)]
    for data in bodies:
        decoder.decode(writable(data))
    assert len(decoder._layouts) == 2
    decoder.decode(writable(bodies[0]))  # forgotten: parsed (and learnt) again
    assert decoder.hits == 0
    decoder.decode(writable(bodies[2]))
    assert decoder.hits == 1


def test_decoder_is_thread_safe() -> None:
    """Threads decoding many layouts through one small LRU all get their own rows back."""
    decoder = LayoutDecoder(max_layouts=3)
    failures: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(60):
                n = 1 + (worker + i) % 5  # five layouts, three remembered: constant eviction
                start = 1000 * worker + i
                body = writable(
                    encode({"id": torch.arange(start, start + n), "b": torch.ones(n) > 0})
                )
                td = decoder.decode(body)
                assert td["id"].tolist() == list(range(start, start + n))
                assert td["b"].all()
        except BaseException as err:
            failures.append(err)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures
    assert len(decoder._layouts) <= 3 and decoder.hits > 0


# ------------------------------------------------------------------ the client's decode path
def test_client_decodes_sample_responses_through_the_layout_decoder() -> None:
    td = every_dtype(8)
    layout = SampleLayout(schema_of(td), 8)
    response = layout.template.copy()
    fill(layout, response, td)
    before = B._decoder.hits
    for _ in range(3):  # a fresh buffer per response, as the default allocator gives
        body = memoryview(np.frombuffer(response.tobytes(), dtype=np.uint8).copy())
        assert_exact(decode_batch(body), td)
    assert B._decoder.hits - before >= 2
    assert_exact(decode_batch(response.tobytes()), td)  # bytes: the codec decodes them


@pytest.mark.parametrize(
    "body",
    [b"", b"not arrow", EOS, encode({"x": torch.zeros(2)}).to_pybytes()[:-20]],
    ids=["empty", "garbage", "eos", "truncated"],
)
def test_client_bad_responses_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(errors.ProtocolError, match="bad Arrow response"):
        decode_batch(writable(body) if body else memoryview(bytearray()))

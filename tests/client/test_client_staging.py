"""The loader's receive buffers: pieces handed out, and what is built on them kept while the buffer lasts."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import ReplayClient
from tdreplay.client.staging import _MAX_KEPT, StagingBuffer

FIELDS = {
    "x": {"shape": [], "dtype": "int64"},
    "obs": {"shape": [8], "dtype": "float32"},
    "next.done": {"shape": [], "dtype": "bool"},
}


def _sized(n: int) -> StagingBuffer:
    """A buffer that has seen a request of ``n`` bytes (the first is a fresh one: unsized)."""
    buf = StagingBuffer(pinned=False)
    buf.reset()
    buf.alloc(n)
    buf.reset()  # grows to fit
    return buf


def test_a_buffer_hands_out_the_same_piece_for_the_same_place_and_keeps_what_is_built_on_it() -> (
    None
):
    buf = _sized(256)
    built: list[str] = []

    def make(tag: str) -> torch.Tensor:
        built.append(tag)
        return torch.frombuffer(piece, dtype=torch.uint8)

    piece = buf(100)
    first = buf.kept("layout", piece, lambda: make("a"))
    first.fill_(7)
    buf.reset()
    again = buf(100)
    assert again is piece  # the same place: the same piece object
    assert buf.kept("layout", again, lambda: make("b")) is first
    assert buf.kept("other", again, lambda: make("c")) is not first  # another key: its own
    assert built == ["a", "c"]
    assert bytes(again[:3]) == b"\x07\x07\x07"  # the kept tensor views the piece


def test_a_piece_that_did_not_fit_keeps_nothing_and_a_grown_buffer_builds_again() -> None:
    buf = _sized(64)
    small = buf(64)
    kept = buf.kept("k", small, lambda: torch.frombuffer(small, dtype=torch.uint8))
    buf.reset()
    big = buf(10_000)  # past the buffer: a fresh one, this time
    calls = []
    for _ in range(2):
        buf.kept("k", big, lambda: calls.append(1))
    assert calls == [1, 1]
    buf.reset()  # grows: what was built on the old buffer is dropped
    grown = buf(64)
    assert grown is not small
    rebuilt = buf.kept("k", grown, lambda: torch.frombuffer(grown, dtype=torch.uint8))
    assert rebuilt is not kept
    assert rebuilt.data_ptr() != kept.data_ptr()


def test_a_buffer_keeps_a_bounded_number_of_pieces() -> None:
    # sharded batches split their rows anew each time: the pieces they take vary
    buf = _sized(_MAX_KEPT * 64 * 4)
    for n in range(1, 3 * _MAX_KEPT):
        buf.reset()
        piece = buf(n)
        buf.kept("k", piece, lambda: 1)
        assert len(buf._pieces) <= _MAX_KEPT and len(buf._kept) <= _MAX_KEPT


def test_a_batch_decoded_into_the_buffer_goes_over_as_one_copy_its_leaves_views_of_it(
    server: Any,
) -> None:
    """What the loader's fetchers send to a CUDA device (here the CPU: the same calls), from
    real answers decoded into a buffer by both doors: equal leaves, all in one allocation
    that is a copy (the buffer reused for the next batch changes nothing of it)."""
    name = unique("staging")
    http = ReplayClient(server.url, transport="http", timeout=30)
    http.create_table(
        {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    x = torch.arange(64)
    http.extend(
        name,
        TensorDict(
            {"x": x, "obs": x[:, None].float().expand(64, 8).clone(), "next": {"done": x % 3 == 0}},
            [64],
        ),
    )
    for transport in ("http", "shm"):
        client = ReplayClient(server.url, transport=transport, timeout=30)
        buf = _sized(1 << 16)
        td = client._sample_into(name, 16, None, buf)
        moved = buf.to_device(td, torch.device("cpu"))
        assert moved is not None, transport
        out, owners = moved
        expected = td.clone()
        assert (out == expected).all() and out.batch_size == td.batch_size, transport
        whole, apart = owners[0], owners[1:]
        base, end = whole.data_ptr(), whole.data_ptr() + whole.numel()
        viewing = [t for t in out.values(True, True) if base <= t.data_ptr() < end]
        assert all(t.data_ptr() + t.nbytes <= end for t in viewing)
        # every leaf views the one copy, but over HTTP the bool column (unpacked from
        # Arrow's bits apart from the buffer), which is copied by itself
        assert len(viewing) + len(apart) == len(list(td.values(True, True))), transport
        assert [t.dtype for t in apart] == ([torch.bool] if transport == "http" else [])
        if apart:
            assert out["next", "done"].data_ptr() == apart[0].data_ptr()
        assert whole.numel() <= sum(t.nbytes for t in viewing) + 64 * len(viewing)
        assert buf.buf is not None
        buf.buf.fill_(0)  # the next batch lands here: the copy keeps its values
        assert (out == expected).all(), transport
        client.close()
    http.delete_table(name)


def test_a_batch_with_no_leaf_in_the_buffer_is_copied_leaf_by_leaf() -> None:
    buf = _sized(256)
    piece = buf(64)
    inside = torch.frombuffer(piece, dtype=torch.float32)
    assert buf.to_device(TensorDict({"a": inside}, []), torch.device("cpu")) is not None
    strided = TensorDict({"a": inside.view(4, 4)[:, 0], "b": torch.zeros(3)}, [])
    assert buf.to_device(strided, torch.device("cpu")) is None  # no leaf in the buffer
    assert (
        StagingBuffer(pinned=False).to_device(TensorDict({"a": inside}, []), torch.device("cpu"))
        is None
    )

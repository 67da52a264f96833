"""The loader's receive buffers: pieces handed out, and what is built on them kept while the buffer lasts."""

from __future__ import annotations

import torch

from tdreplay.client.staging import _MAX_KEPT, StagingBuffer


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

"""The loader's prefetch credits: never more than ``prefetch`` ahead; a stream's fetcher wakes in batches."""

from __future__ import annotations

import threading

from tdreplay.client.staging import Credits as _Credits


def _taker(credits: _Credits) -> threading.Thread:
    t = threading.Thread(target=credits.acquire, daemon=True)
    t.start()
    return t


def test_at_most_n_are_taken_and_a_fetcher_out_of_credits_waits_for_wake_of_them() -> None:
    credits = _Credits(4, wake=2)
    for _ in range(4):
        credits.acquire()  # four ahead: none blocks
    waiting = _taker(credits)
    waiting.join(0.2)
    assert waiting.is_alive()  # a fifth waits
    credits.release()
    waiting.join(0.2)
    assert waiting.is_alive()  # one credit back is not enough to wake it...
    credits.release()
    waiting.join(5)
    assert not waiting.is_alive()  # ...two are, and it takes one
    credits.acquire()  # the other one, without waiting
    again = _taker(credits)
    again.join(0.2)
    assert again.is_alive()  # out again: shut until two are back
    credits.open()
    again.join(5)
    assert not again.is_alive()


def test_wake_one_is_a_plain_semaphore() -> None:
    credits = _Credits(2)
    credits.acquire()
    credits.acquire()
    waiting = _taker(credits)
    waiting.join(0.2)
    assert waiting.is_alive()
    credits.release()
    waiting.join(5)
    assert not waiting.is_alive()


def test_open_lets_every_fetcher_through() -> None:
    credits = _Credits(1)
    credits.acquire()
    waiting = [_taker(credits) for _ in range(3)]
    credits.open()
    for t in waiting:
        t.join(5)
        assert not t.is_alive()

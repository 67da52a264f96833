"""The loader's prefetch credits: never more than ``prefetch`` ahead; a stream's fetcher wakes in batches."""

from __future__ import annotations

import threading
import time

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


class _CountingCondition(threading.Condition):
    """A condition that counts how often a waiter woke (each wake-up costs the GIL twice)."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.woken = 0

    def wait(self, timeout: float | None = None) -> bool:
        got = super().wait(timeout)
        self.woken += 1
        return got


def _blocked(credits: _Credits, k: int) -> list[threading.Thread]:
    """``k`` fetchers waiting in ``acquire`` (the credits all taken)."""
    takers = [_taker(credits) for _ in range(k)]
    deadline = time.monotonic() + 5
    while len(credits._cond._waiters) < k:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the takers did not block"
        time.sleep(0.001)
    return takers


def test_a_credit_given_back_wakes_one_fetcher_not_all_of_them() -> None:
    # every waiter woken for one credit took the GIL to go back to sleep: eight
    # fetchers of one-item batches over shm spent 400 us of CPU per batch in futex calls
    credits = _Credits(1)
    credits._cond = cond = _CountingCondition()
    credits.acquire()
    takers = _blocked(credits, 8)
    credits.release()
    deadline = time.monotonic() + 5
    while sum(t.is_alive() for t in takers) > 7:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(0.05)  # any other waiter woken would have run by now
    assert sum(t.is_alive() for t in takers) == 7
    assert cond.woken == 1
    credits.open()
    for t in takers:
        t.join(5)


def test_credits_given_back_at_once_each_reach_a_waiting_fetcher() -> None:
    # the second release comes before the first waiter woken took its credit: it must
    # wake another waiter itself (the buffer is no longer shut then), or a credit is lost
    credits = _Credits(1)
    credits.acquire()
    takers = _blocked(credits, 8)
    for _ in range(8):
        credits.release()
    for t in takers:
        t.join(5)
        assert not t.is_alive()

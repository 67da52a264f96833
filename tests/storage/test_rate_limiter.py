"""Rate limiting (Reverb semantics): min_size_to_sample, samples_per_insert with an error buffer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import (
    EmptyTableError,
    InvalidRequest,
    RateLimiter,
    RateLimitTimeout,
    SchemaError,
    TableClosed,
)


def limited(tables, capacity: int = 64, **rate_limiter):
    return tables.create(make_spec(capacity=capacity, rate_limiter=rate_limiter))


class Call:
    """Runs ``fn`` in a thread and records its result or error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as err:
            self.error = err
        self.finished_at = time.monotonic()

    def blocked(self, seconds: float = 0.15) -> bool:
        self.thread.join(seconds)
        return self.thread.is_alive()

    def join(self) -> Any:
        self.thread.join(10)
        assert not self.thread.is_alive(), "the call was never released"
        if self.error is not None:
            raise self.error
        return self.result


def test_min_size_to_sample_blocks_until_enough_items(tables) -> None:
    table = limited(tables, min_size_to_sample=5)
    table.extend(rows(0, 4))
    assert not table.can_sample(1)
    t0 = time.monotonic()
    with pytest.raises(RateLimitTimeout) as info:
        table.sample(1, timeout=0.2)
    assert 0.2 <= time.monotonic() - t0 < 2
    message = str(info.value)
    assert "table 't'" in message and "size 4" in message and "min_size_to_sample 5" in message
    assert info.value.table == "t"
    assert table.rate_limiter.samples == 0
    table.extend(rows(4, 1))
    assert table.can_sample(1)
    assert len(table.sample(3)) == 3


def test_blocked_sample_is_released_by_an_insert(tables) -> None:
    table = limited(tables, min_size_to_sample=3)
    table.extend(rows(0, 2))
    call = Call(lambda: table.sample(2, timeout=10))
    assert call.blocked()
    released_at = time.monotonic()
    table.extend(rows(2, 1))
    batch = call.join()
    assert batch["id"].max() <= 2
    assert call.finished_at is not None and call.finished_at - released_at < 2
    assert table.rate_limiter.sample_waits == 1


def test_zero_timeout_fails_at_once(tables) -> None:
    table = limited(tables, min_size_to_sample=2)
    t0 = time.monotonic()
    with pytest.raises(RateLimitTimeout):
        table.sample(1, timeout=0)
    assert time.monotonic() - t0 < 0.1


def test_a_sample_held_back_by_an_empty_table_is_empty_table_error(tables) -> None:
    """A sample whose timeout runs out while the table holds no item at all raises
    EmptyTableError, a RateLimitTimeout (429) too: ``except RateLimitTimeout`` still catches
    it. Held back with items in the table (too few), it is a plain RateLimitTimeout."""
    table = limited(tables, min_size_to_sample=2)
    for timeout in (0, 0.05):
        with pytest.raises(EmptyTableError, match=r"table 't' holds no item") as info:
            table.sample(1, timeout=timeout)
        assert isinstance(info.value, RateLimitTimeout) and info.value.status == 429
        assert info.value.table == "t"
    table.extend(rows(0, 1))
    with pytest.raises(RateLimitTimeout) as held:
        table.sample(1, timeout=0)
    assert type(held.value) is RateLimitTimeout
    full = tables.create(make_spec(name="q", capacity=2, sampler={"kind": "fifo"}))
    full.extend(rows(0, 2))
    with pytest.raises(RateLimitTimeout) as insert:
        full.extend(rows(2, 1), timeout=0)  # a full queue holds inserts back
    assert type(insert.value) is RateLimitTimeout
    fifo = tables.create(make_spec(name="f", sampler={"kind": "fifo"}))
    fifo.extend(rows(0, 2))
    fifo.sample(2)  # a queue's samples take its items: empty again
    with pytest.raises(EmptyTableError, match="'f'"):
        fifo.sample(1, timeout=0)


def test_by_default_a_sample_waits_until_another_thread_inserts(tables) -> None:
    """The in-process default the README and ``Table.sample`` state: ``timeout=None`` waits
    for good (only another thread's extend releases it); ``try_sample`` and ``timeout=0``
    are the answers for a single-threaded script."""
    table = limited(tables)
    assert table.try_sample(1) is None and not table.can_sample(1)
    call = Call(lambda: table.sample(1))
    assert call.blocked(0.3)
    table.extend(rows(0, 1))
    assert call.join()["id"].tolist() == [0]


def spi_table(tables, **extra):
    # min_diff = 2*1 - 4 = -2, max_diff = 2*1 + 4 = 6
    return limited(tables, min_size_to_sample=1, samples_per_insert=2.0, error_buffer=4.0, **extra)


def test_samples_per_insert_blocks_inserts_that_run_ahead(tables) -> None:
    table = spi_table(tables)
    table.extend(rows(0, 3))  # 3 * 2 - 0 = 6 <= max_diff
    assert not table.can_insert(1)  # 8 > 6
    with pytest.raises(RateLimitTimeout) as info:
        table.extend(rows(3, 1), timeout=0.05)
    assert "insert timed out" in str(info.value)
    assert table.rate_limiter.inserts == 3 and len(table) == 3
    table.sample(2)  # 6 - 2 = 4
    assert table.can_insert(1)  # 6 <= 6
    assert not table.can_insert(2)
    table.extend(rows(3, 1))


def test_samples_per_insert_blocks_samples_that_run_ahead(tables) -> None:
    table = spi_table(tables)
    table.extend(rows(0, 1))  # diff 2
    table.sample(4)  # 2 - 4 = -2 >= min_diff
    assert not table.can_sample(1)
    with pytest.raises(RateLimitTimeout) as info:
        table.sample(1, timeout=0.05)
    assert "sample timed out" in str(info.value)
    assert table.rate_limiter.samples == 4
    table.extend(rows(1, 1))  # diff 0
    assert table.can_sample(2) and not table.can_sample(3)


def test_blocked_insert_is_released_by_a_sample(tables) -> None:
    table = spi_table(tables)
    table.extend(rows(0, 3))
    call = Call(lambda: table.extend(rows(3, 1), timeout=10))
    assert call.blocked()
    table.sample(2)
    assert call.join().tolist() == [3]
    assert table.rate_limiter.insert_waits == 1


def test_producer_and_consumer_keep_the_ratio(tables) -> None:
    """Both sides running flat out: the ratio stays inside the error buffer throughout."""
    table = spi_table(tables, capacity=256)
    lo, hi = table.rate_limiter.min_diff, table.rate_limiter.max_diff
    diffs: list[float] = []
    stop = time.monotonic() + 0.5

    def produce() -> int:
        i = 0
        while time.monotonic() < stop:
            try:
                table.extend(rows(i, 1), timeout=0.05)
                i += 1
            except RateLimitTimeout:
                pass
        return i

    def consume() -> int:
        n = 0
        while time.monotonic() < stop:
            try:
                table.sample(2, timeout=0.05)
                n += 2
            except RateLimitTimeout:
                pass
            rl = table.rate_limiter
            diffs.append(rl.inserts * 2.0 - rl.samples)
        return n

    producer, consumer = Call(produce), Call(consume)
    inserted, sampled = producer.join(), consumer.join()
    assert inserted > 5 and sampled > 10
    assert all(lo <= d <= hi for d in diffs), (min(diffs), max(diffs))
    assert abs(sampled - 2 * inserted) <= 4 + 2


def test_calls_that_can_never_pass_are_invalid(tables) -> None:
    table = spi_table(tables)
    # an insert of n moves the difference by 2n; the buffer spans max_diff - min_diff = 8
    with pytest.raises(InvalidRequest, match="can never pass the rate limiter"):
        table.extend(rows(0, 5), timeout=0)
    # the largest sample that can ever pass is max_diff - min_diff = 8 items
    with pytest.raises(InvalidRequest, match="can never pass the rate limiter"):
        table.sample(9, timeout=0)
    with pytest.raises(InvalidRequest, match="can never pass the rate limiter"):
        table.sample(10, timeout=0)
    assert table.rate_limiter.inserts == table.rate_limiter.samples == 0
    table.extend(rows(0, 3))  # diff 6 = max_diff
    table.sample(8)  # 6 - 8 = -2 = min_diff
    assert table.rate_limiter.samples == 8


def test_can_sample_and_can_insert_move_no_counter(tables) -> None:
    table = spi_table(tables)
    for _ in range(3):
        assert table.can_insert(3) and not table.can_insert(4)
        assert not table.can_sample(1)
    rl = table.rate_limiter
    assert (rl.inserts, rl.samples, rl.insert_waits, rl.sample_waits) == (0, 0, 0, 0)


def test_close_releases_a_waiting_call(tables) -> None:
    table = limited(tables, min_size_to_sample=2)
    call = Call(lambda: table.sample(1))
    assert call.blocked()
    table.close()
    with pytest.raises(TableClosed, match="closed while a call waited"):
        call.join()


def test_rate_limiter_counts_only() -> None:
    rl = RateLimiter(min_size_to_sample=2, samples_per_insert=1.0, error_buffer=4)
    assert (rl.min_diff, rl.max_diff) == (-2.0, 6.0)
    assert not rl.can_sample(1, size=1)
    assert rl.can_insert(6, size=0) and not rl.can_insert(7, size=0)
    rl.inserted(6)
    assert rl.can_sample(8, size=6) and not rl.can_sample(9, size=6)
    rl.sampled(8)  # diff -2
    assert rl.can_insert(8, size=6) and not rl.can_insert(9, size=6)
    state = rl.state_dict()
    other = RateLimiter(min_size_to_sample=2, samples_per_insert=1.0, error_buffer=4)
    other.load_state_dict(state)
    assert other.info() == rl.info()
    plain = RateLimiter(min_size_to_sample=3)
    assert (
        plain.can_insert(10**9, size=0)
        and not plain.can_sample(1, size=2)
        and plain.can_sample(99, size=3)
    )
    assert not plain.insert_never_fits(10**9) and not plain.sample_never_fits(10**9)


# ---------------------------------------------------------------- attempts and wait accounting
def test_attempts_neither_wait_nor_count(tables) -> None:
    """``try_extend`` / ``try_sample`` answer ``None`` when held back, and change nothing."""
    table = spi_table(tables)
    assert table.try_sample(1) is None  # empty: below min_size_to_sample
    assert table.try_extend(rows(0, 3)).tolist() == [0, 1, 2]
    assert table.try_extend(rows(3, 1)) is None  # 8 > max_diff 6
    rl = table.rate_limiter
    assert (rl.inserts, rl.samples, rl.insert_waits, rl.sample_waits) == (3, 0, 0, 0)
    assert rl.timeouts == {"insert": 0, "sample": 0} and len(table) == 3
    batch = table.try_sample(2)
    assert batch is not None and batch["id"].max() <= 2
    assert rl.samples == 2


def test_a_wait_counts_once_however_often_the_call_is_woken(tables) -> None:
    table = spi_table(tables)
    table.extend(rows(0, 3))  # diff 6 = max_diff: inserts wait
    call = Call(lambda: table.extend(rows(3, 3), timeout=10))  # needs diff <= 0
    assert call.blocked()
    assert table.rate_limiter.waiting == {"insert": 1, "sample": 0}
    for _ in range(2):  # each sample wakes the waiting insert, which still cannot proceed
        table.sample(2)
        assert call.blocked(0.05)
    table.sample(2)  # diff 0: through
    assert call.join().tolist() == [3, 4, 5]
    rl = table.rate_limiter
    assert rl.insert_waits == 1 and rl.waiting == {"insert": 0, "sample": 0}
    assert rl.timeouts["insert"] == 0 and rl.blocked_seconds["insert"] > 0.1
    with pytest.raises(RateLimitTimeout):
        table.extend(rows(6, 4), timeout=0.05)  # 6 + 8 > max_diff
    assert rl.insert_waits == 2 and rl.timeouts["insert"] == 1
    info = table.info()["rate_limiter"]
    assert info["insert_waits"] == 2 and info["timeouts"] == {"insert": 1, "sample": 0}


def test_an_insert_held_back_uses_no_episode_ids(tables) -> None:
    """Episodes counted from end flags: a held-back attempt must not move the episode counter,
    or the episode under way would be split in two when the insert goes through."""
    spec = make_spec(
        capacity=64,
        sampler={"kind": "slice", "slice_len": 2, "end_key": "next.done"},
        rate_limiter={"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 5},
    )
    table = tables.create(spec)
    table.extend(rows(0, 5))  # episode 0: ids 0..4, not ended (episode_len 10)
    for _ in range(3):
        assert table.try_extend(rows(5, 5)) is None  # 10 > max_diff 6; the ended flag at id 9
        with pytest.raises(RateLimitTimeout):
            table.extend(rows(5, 5), timeout=0)
    table.sample(4)
    assert table.try_extend(rows(5, 5)) is not None  # ids 5..9 end episode 0
    episodes = table.sampler.episode[:10]
    assert episodes.tolist() == [episodes[0].item()] * 10, episodes


def test_extend_takes_flat_columns_as_a_tensordict(tables) -> None:
    table = limited(tables)
    td = rows(0, 4)
    columns = {k if isinstance(k, tuple) else (k,): v for k, v in td.items(True, True)}
    assert table.extend(columns).tolist() == [0, 1, 2, 3]
    back = table.read(torch.arange(4))
    assert (back == td).all()
    del columns[("next", "reward")]
    with pytest.raises(SchemaError, match=r"missing key 'next\.reward'"):
        table.extend(columns)
    with pytest.raises(SchemaError, match="takes a TensorDict"):
        table.extend({"id": td["id"]})  # a nested dict is not flat columns
    assert len(table) == 4 and table.rate_limiter.inserts == 4


def test_a_target_is_checked_once_and_sampled_into_again(tables) -> None:
    table = limited(tables)
    table.extend(rows(0, 16))
    out = table.sample(4).clone()
    target = table.target(out, 4)
    for _ in range(3):
        got = table.sample(4, out=target)
        assert got is out
        assert_consistent(out)
    assert table.try_sample(4, out=target) is out
    with pytest.raises(InvalidRequest, match="for 4 rows, not 5"):
        table.sample(5, out=target)
    with pytest.raises(InvalidRequest, match="out"):
        table.target(out, 5)  # checked when made: it has 4 rows
    assert table.rate_limiter.samples == 4 * 5

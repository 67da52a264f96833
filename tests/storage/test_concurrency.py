"""Many writers and samplers at once: no torn rows, no lost or doubled queue items, no deadlock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import RateLimitTimeout

SECONDS = 0.8
#: writer w writes ids from BASE * (w + 1) on: disjoint ranges, exact in float32
BASE = 1_000_000


#: seconds a run may go on past ``seconds`` until ``enough`` holds (a loaded machine)
GRACE = 20.0


def run_threads(
    targets: list[Callable[[], None]],
    seconds: float,
    enough: Callable[[], bool] = lambda: True,
) -> list[BaseException]:
    """Run every target in its own thread until ``seconds`` pass and ``enough()`` holds (at
    most ``GRACE`` seconds more: the interleavings under test need some calls of each
    kind, however slow the machine); return their errors."""
    errors: list[BaseException] = []
    start = time.monotonic()

    def going() -> bool:
        spent = time.monotonic() - start
        return spent < seconds or (spent < seconds + GRACE and not enough())

    def loop(fn: Callable[[], None]) -> None:
        try:
            while going():
                fn()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=loop, args=(fn,), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + GRACE + 30)
        assert not t.is_alive(), "a thread is stuck (deadlock?)"
    return errors


def test_overwrites_during_samples_never_tear_a_row(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=24, backend=backend))
    table.extend(rows(0, 24))
    counters = {"extends": 0, "samples": 0}
    lock = threading.Lock()

    def writer(w: int) -> Callable[[], None]:
        g = torch.Generator().manual_seed(w)
        next_id = [BASE * (w + 1)]

        def step() -> None:
            n = int(torch.randint(1, 11, (1,), generator=g))  # often wraps the ring
            table.extend(rows(next_id[0], n))
            next_id[0] += n
            with lock:
                counters["extends"] += 1

        return step

    def sampler(s: int) -> Callable[[], None]:
        out = [None]

        def step() -> None:
            if s == 0 and out[0] is not None:  # one sampler gathers into a reused batch
                batch = table.sample(16, out=out[0])
            else:
                batch = table.sample(16)
                out[0] = batch
            assert_consistent(batch)
            with lock:
                counters["samples"] += 1

        return step

    errors = run_threads(
        [writer(w) for w in range(3)] + [sampler(s) for s in range(3)],
        SECONDS,
        lambda: counters["extends"] > 10 and counters["samples"] > 10,
    )
    assert not errors, errors[0]
    assert counters["extends"] > 10 and counters["samples"] > 10, counters
    final = table.read(table.live_index())
    assert_consistent(final)
    assert len(table) == 24 and table.slots.busy.sum() == 0
    # every live slot holds a distinct item, oldest first per writer
    ids = final["id"]
    assert len(set(ids.tolist())) == 24
    for w in range(3):
        mine = ids[(ids // BASE) == w + 1]
        assert torch.equal(mine, mine.sort().values)


def test_small_samples_into_targets_race_with_overwrites(backend: dict, tables) -> None:
    """Samples of a few items into reused targets (each row copied on its own, the readers
    of the rows' lock waking a writer only as the last leaves) while writers overwrite
    every slot: no torn row, no thread stuck, the writers never starved."""
    table = tables.create(make_spec(capacity=24, backend=backend))
    table.extend(rows(0, 24))
    counts = {"extends": 0, "samples": 0}
    lock = threading.Lock()

    def writer(w: int) -> Callable[[], None]:
        next_id = [BASE * (w + 1)]

        def step() -> None:
            n = 1 + next_id[0] % 7
            table.extend(rows(next_id[0], n))
            next_id[0] += n
            with lock:
                counts["extends"] += 1

        return step

    def sampler(n: int) -> Callable[[], None]:
        target = table.target(table.sample(n).clone(), n)

        def step() -> None:
            batch = table.sample(n, out=target)
            assert_consistent(batch)
            assert batch is target.out
            with lock:
                counts["samples"] += 1

        return step

    errors = run_threads(
        [writer(0), writer(1)] + [sampler(n) for n in (1, 2, 8, 8)],
        SECONDS,
        lambda: counts["extends"] > 20 and counts["samples"] > 20,
    )
    assert not errors, errors[0]
    assert counts["extends"] > 20 and counts["samples"] > 20, counts
    assert_consistent(table.read(table.live_index()))


def test_a_sample_that_cannot_allocate_its_batch_lets_go_of_the_rows(
    tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample whose fresh buffers cannot be allocated raises, and leaves the rows' lock:
    an extend after it goes through, and so does a sample."""
    table = tables.create(make_spec(capacity=16))
    table.extend(rows(0, 16))

    def no_memory(n: int) -> None:
        raise MemoryError(f"no room for {n} rows")

    monkeypatch.setattr(table.backend, "empty", no_memory)
    with pytest.raises(MemoryError):
        table.sample(4)
    monkeypatch.undo()
    done: list[torch.Tensor] = []
    extend = threading.Thread(target=lambda: done.append(table.extend(rows(16, 4))), daemon=True)
    extend.start()
    extend.join(10)
    if not done:  # the lock a failed sample kept: let the extend and the teardown go on
        table._data_lock.release_read()
    assert done, "the extend waits for a reader that is gone"
    assert_consistent(table.sample(4))


def test_fifo_with_many_producers_and_consumers_delivers_each_item_once(tables) -> None:
    table = tables.create(make_spec(capacity=16, sampler={"kind": "fifo"}))
    produced: list[list[int]] = [[] for _ in range(3)]
    consumed: list[list[int]] = [[] for _ in range(3)]

    def producer(p: int) -> Callable[[], None]:
        next_id = [BASE * (p + 1)]

        def step() -> None:
            n = 1 + next_id[0] % 4
            try:
                table.extend(rows(next_id[0], n), timeout=0.02)
            except RateLimitTimeout:
                return
            produced[p].extend(range(next_id[0], next_id[0] + n))
            next_id[0] += n

        return step

    def consumer(c: int) -> Callable[[], None]:
        def step() -> None:
            try:
                batch = table.sample(1 + c, timeout=0.02)
            except RateLimitTimeout:
                return
            assert_consistent(batch)
            consumed[c].extend(batch["id"].tolist())

        return step

    errors = run_threads(
        [producer(p) for p in range(3)] + [consumer(c) for c in range(3)],
        SECONDS,
        lambda: sum(len(c) for c in consumed) > 20,
    )
    assert not errors, errors[0]
    left = table.read(table.live_index())["id"].tolist()
    everything = sorted([i for c in consumed for i in c] + left)
    assert everything == sorted(i for p in produced for i in p)
    assert len(set(everything)) == len(everything)
    # each producer's items come out in the order they went in
    for p in range(3):
        base = BASE * (p + 1)
        for c in consumed:
            mine = [i for i in c if base <= i < base + BASE]
            assert mine == sorted(mine)
    assert sum(len(c) for c in consumed) > 20


def test_priority_updates_race_with_samples_and_inserts(tables) -> None:
    table = tables.create(
        make_spec(capacity=32, sampler={"kind": "prioritized", "alpha": 0.8, "beta": 0.6})
    )
    table.extend(rows(0, 32))
    g = torch.Generator().manual_seed(0)

    def learner() -> None:
        batch = table.sample(8)
        assert_consistent(batch)
        w = batch["sample_info", "weight"]
        assert ((w > 0) & (w <= 1.0 + 1e-6)).all(), w
        table.update_priority(batch["index"], torch.rand(8, generator=g) * 10)

    def collector() -> None:
        start = int(table.rate_limiter.inserts) + BASE
        table.extend(rows(start, 5))

    errors = run_threads([learner, learner, collector], SECONDS / 2)
    assert not errors, errors[0]
    # the sum-tree still matches the priorities of the live items
    s = table.sampler
    live = table.slots.live
    expected = ((s.priorities[live] + s.eps) ** s.alpha).sum()
    assert s.tree.total() == pytest.approx(float(expected), rel=1e-9)

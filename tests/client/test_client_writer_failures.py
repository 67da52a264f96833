"""What a writer's failed send leaves, against a real server: the rows not acknowledged stay
in the writer and go again first (under their request ids), the error counts them; a
writer dropped with steps never sent warns; a step no column can take is refused by key."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import AsyncReplayClient, RateLimitTimeout, ReplayClient, TableNotFound
from tdreplay.client.writer import Writer

FIELDS = {
    "x": {"shape": [], "dtype": "int64"},
    "episode": {"shape": [], "dtype": "int64"},
    "next.done": {"shape": [1], "dtype": "bool"},
}
#: 2 rows go in; then each 2 more wait for a sample of 1 item (timeout 0: refused at once)
LIMITED = {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 2.0}


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


def spec(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS, **extra}


def slice_spec(name: str) -> dict[str, Any]:
    """Slices of episodes told apart by their ``next.done`` flags."""
    return spec(name, sampler={"kind": "slice", "slice_len": 2})


def step(x: int, *, done: bool = False, episode: int = 0) -> TensorDict:
    return TensorDict(
        {
            "x": torch.tensor(x),
            "episode": torch.tensor(episode),
            "next": {"done": torch.tensor([done])},
        },
        [],
    )


def steps(*xs: int, done: int | None = None, episode: int = 0) -> TensorDict:
    return torch.stack([step(x, done=x == done, episode=episode) for x in xs])


def stored(client: ReplayClient, name: str) -> list[int]:
    """The table's ``x`` in slot order."""
    return client.read(name, torch.arange(client.info(name)["size"]))["x"].tolist()


def notes(err: BaseException) -> str:
    return "\n".join(getattr(err, "__notes__", []))


# ------------------------------------------------------------------ the time limit's send
def test_a_failed_time_limit_send_keeps_the_unfinished_episode(client: ReplayClient) -> None:
    """The time limit sends episode 0 and fails; episode 1 has begun. Episode 0 is sent
    again later and episode 1 goes whole (the buffer was cleared: episode 0 and the first
    steps of episode 1 were lost, the rest of it stored as a shorter episode)."""
    name = unique("wf")
    client.create_table(slice_spec(name))
    w = Writer(client, name, chunk=100, max_delay=0.05)
    w.append(step(0))  # no whole episode yet: the time limit waits
    client.delete_table(name)
    # the end of episode 0 and the start of episode 1 in one append: the time limit, due
    # now, sends episode 0 alone
    w.append(torch.cat([steps(1, 2, done=2), steps(3, 4, episode=1)]))
    with pytest.raises(TableNotFound) as got:
        w.wait_sent(3, timeout=30)
    assert "0 row(s) acknowledged so far; 3 row(s) not acknowledged are kept" in notes(got.value)
    client.create_table(slice_spec(name))
    w.append(steps(5, 6, done=6, episode=1))
    w.close()
    assert stored(client, name) == list(range(7))


def test_an_async_failed_time_limit_send_keeps_the_unfinished_episode(
    server: Any, client: ReplayClient
) -> None:
    name = unique("awf")
    client.create_table(slice_spec(name))

    async def main() -> None:
        async with AsyncReplayClient(server.url) as aclient:
            w = aclient.writer(name, chunk=100, max_delay=0.05)
            await w.append(step(0))
            await aclient.delete_table(name)
            await w.append(torch.cat([steps(1, 2, done=2), steps(3, 4, episode=1)]))
            with pytest.raises(TableNotFound) as got:
                await w.wait_sent(3, timeout=30)
            assert "3 row(s) not acknowledged are kept" in notes(got.value)
            await aclient.create_table(slice_spec(name))
            await w.append(steps(5, 6, done=6, episode=1))
            await w.aclose()

    asyncio.run(main())
    assert stored(client, name) == list(range(7))


# ------------------------------------------------------------------ several chunks, one send
def test_a_send_of_several_chunks_keeps_those_not_acknowledged(
    client: ReplayClient, make_writer: Any
) -> None:
    """One append brings 3 chunks; the second is refused. It and the third stay, and the
    error says 2 rows were acknowledged and 4 kept (both were lost, silently)."""
    name = unique("wc")
    client.create_table(spec(name, rate_limiter=LIMITED))
    w = make_writer(client, name, chunk=2, max_delay=None, timeout=0)
    with pytest.raises(RateLimitTimeout) as got:
        w.append(steps(*range(6)))  # from this thread: raised here
        w.flush()  # in the background: raised by the next call
    assert "2 row(s) acknowledged so far; 4 row(s) not acknowledged are kept" in notes(got.value)
    assert stored(client, name) == [0, 1] and w.kept_rows == 4
    for _ in range(3):
        client.sample(name, 1)  # room for 4 more rows
    w.flush()
    assert stored(client, name) == list(range(6)) and w.kept_rows == 0
    w.close()


def test_an_async_send_of_several_chunks_keeps_those_not_acknowledged(
    server: Any, client: ReplayClient
) -> None:
    name = unique("awc")
    client.create_table(spec(name, rate_limiter=LIMITED))

    async def main() -> None:
        async with AsyncReplayClient(server.url) as aclient:
            w = aclient.writer(name, chunk=2, max_delay=None, timeout=0)
            with pytest.raises(RateLimitTimeout) as got:
                await w.append(steps(*range(6)))
            assert "2 row(s) acknowledged so far; 4 row(s) not acknowledged" in notes(got.value)
            for _ in range(3):
                await aclient.sample(name, 1)
            await w.aclose()  # sends the kept chunks first

    asyncio.run(main())
    assert stored(client, name) == list(range(6))


def test_a_close_that_fails_keeps_the_rows_for_the_next_close(client: ReplayClient) -> None:
    name = unique("wcc")
    client.create_table(spec(name, rate_limiter=LIMITED))
    client.extend(name, steps(0, 1))  # the 2 rows the limiter lets in
    w = Writer(client, name, chunk=8, max_delay=None, timeout=0)
    w.append(steps(2, 3))
    with pytest.raises(RateLimitTimeout) as got:
        w.close()
    assert "2 row(s) not acknowledged are kept" in notes(got.value)
    with pytest.raises(RuntimeError, match="closed"):
        w.append(step(4))
    client.sample(name, 1)
    w.close()  # sends them now
    assert stored(client, name) == list(range(4))


def test_an_extend_given_an_earlier_request_id_is_its_retry(client: ReplayClient) -> None:
    """What a writer's re-send of a chunk relies on: the same id stores the rows once."""
    name = unique("wr")
    client.create_table(spec(name))
    first = client.extend(name, steps(0, 1, 2), request_id="chunk-1")
    again = client.extend(name, steps(0, 1, 2), request_id="chunk-1")
    assert torch.equal(first, again) and stored(client, name) == [0, 1, 2]


# ------------------------------------------------------------------ dropped unclosed
@pytest.mark.parametrize("max_delay", [None, 3600.0])
def test_a_writer_dropped_with_steps_never_sent_warns(
    client: ReplayClient, max_delay: float | None
) -> None:
    name = unique("wd")
    client.create_table(spec(name))
    w = client.writer(name, chunk=100, max_delay=max_delay)
    w.append(steps(0, 1, 2))
    with pytest.warns(RuntimeWarning, match=rf"writer of table '{name}' dropped with 3 step"):
        del w
        gc.collect()
    closed = client.writer(name, chunk=100, max_delay=max_delay)
    closed.append(steps(3))
    closed.close()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del closed
        gc.collect()
    assert not [m for m in seen if "dropped" in str(m.message)]  # nothing lost


def test_an_async_writer_left_unclosed_when_its_loop_ends_warns(
    server: Any, client: ReplayClient
) -> None:
    """``asyncio.run`` ends, cancelling the writer's timer task; the writer is dropped."""
    name = unique("awd")
    client.create_table(spec(name))

    async def main() -> None:
        aclient = AsyncReplayClient(server.url)
        w = aclient.writer(name, chunk=100, max_delay=3600)
        await w.append(steps(0, 1))
        await aclient.aclose()

    with pytest.warns(RuntimeWarning, match=rf"writer of table '{name}' dropped with 2 step"):
        asyncio.run(main())
        gc.collect()


# ------------------------------------------------------------------ steps no column takes
def unusable_steps() -> list[tuple[TensorDict, str]]:
    meta = step(0).set("x", torch.empty((), dtype=torch.float64, device="meta"))
    sparse = step(0).set("next", {"done": torch.tensor([True]).to_sparse()})
    return [(meta, r"'x' holds a meta tensor"), (sparse, r"'next\.done' holds a torch\.sparse_coo")]


@pytest.mark.parametrize("case", [0, 1])
def test_a_meta_or_sparse_step_is_refused_by_key_and_sets_no_layout(
    client: ReplayClient, case: int
) -> None:
    """The first step is refused with an error naming the key (torch's "Cannot copy out of
    meta tensor" was raised), and the right step after it is taken (it was refused: the
    failed step had fixed the layout); so is one laid out like the first, later."""
    bad, match = unusable_steps()[case]
    name = unique("wm")
    client.create_table(spec(name))
    with client.writer(name, chunk=4, max_delay=None) as w:
        with pytest.raises(TypeError, match=match):
            w.append(bad)
        w.append(step(1))
        later = step(2)  # laid out as step 1: passes the layout check, fails the copy
        if case == 0:
            later["x"] = torch.empty((), dtype=torch.int64, device="meta")
        else:
            later["next", "done"] = torch.tensor([True]).to_sparse()
        with pytest.raises(TypeError, match=match):
            w.append(later)
        w.append(step(3))
    assert stored(client, name) == [1, 3]


def test_an_async_writer_refuses_a_meta_step_by_key(server: Any, client: ReplayClient) -> None:
    name = unique("awm")
    client.create_table(spec(name))
    bad, match = unusable_steps()[0]

    async def main() -> None:
        async with (
            AsyncReplayClient(server.url) as aclient,
            aclient.writer(name, chunk=4, max_delay=None) as w,
        ):
            with pytest.raises(TypeError, match=match):
                await w.append(bad)
            await w.append(step(1))

    asyncio.run(main())
    assert stored(client, name) == [1]

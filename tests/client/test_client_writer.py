"""The writer against a real server: chunks, time limit, exit rules, the trajectory rule."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import AsyncReplayClient, ReplayClient
from tdreplay.client.errors import SchemaError, TableNotFound
from tdreplay.client.writer import Writer

FIELDS = {"x": {"shape": [], "dtype": "int64"}, "next.done": {"shape": [1], "dtype": "bool"}}
TRAJ = {
    "x": {"shape": [], "dtype": "int64"},
    "episode": {"shape": [], "dtype": "int64"},
    "next.done": {"shape": [1], "dtype": "bool"},
}


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


def table(client: ReplayClient, fields: dict[str, Any] = FIELDS, **extra: Any) -> str:
    name = unique("w")
    client.create_table(
        {"name": name, "capacity": 512, "backend": {"kind": "memory"}, "fields": fields, **extra}
    )
    return name


def step(x: int, *, done: bool = False, episode: int | None = None) -> TensorDict:
    td = TensorDict({"x": torch.tensor(x), "next": {"done": torch.tensor([done])}}, [])
    if episode is not None:
        td["episode"] = torch.tensor(episode)
    return td


def test_chunks_and_close(client: ReplayClient) -> None:
    name = table(client)
    with client.writer(name, chunk=4, max_delay=None) as w:
        for i in range(10):
            w.append(step(i))
            assert w.wait_sent(4 * ((i + 1) // 4), timeout=30)  # full chunks go in the background
            assert client.info(name)["size"] == w.sent_rows == 4 * ((i + 1) // 4)
    assert w.sent_chunks == 3 and w.sent_rows == 10
    assert client.info(name)["size"] == 10
    # 512 draws from 10 items: each item is drawn (a miss has odds 10 x 0.9^512, ~1e-22)
    assert sorted(client.sample(name, 512)["x"].unique().tolist()) == list(range(10))


def test_time_limit_sends(client: ReplayClient) -> None:
    name = table(client)
    w = client.writer(name, chunk=100, max_delay=0.05)
    w.append(torch.stack([step(i) for i in range(3)]))
    assert w.wait_sent(3, timeout=10)  # the timer thread sent it
    assert client.info(name)["size"] == 3
    w.close()


def test_the_time_limit_sends_the_steps_after_a_full_chunk(
    client: ReplayClient, make_writer: Any
) -> None:
    """Once a full chunk has left, the next step gives the sleeping timer a deadline again
    (the one append of a chunk that takes the timer's lock)."""
    name = table(client)
    w = make_writer(client, name, chunk=4, max_delay=0.05)
    for i in range(6):
        w.append(step(i))
    assert w.wait_sent(6, timeout=10)  # 4 as a full chunk, 2 by the timer
    assert w.sent_chunks == 2 and client.info(name)["size"] == 6
    w.close()


def test_exception_discards_the_buffer(client: ReplayClient) -> None:
    name = table(client)
    with pytest.raises(RuntimeError, match="collector crashed"), client.writer(name, chunk=8) as w:
        for i in range(3):
            w.append(step(i))
        raise RuntimeError("collector crashed")
    assert client.info(name)["size"] == 0
    with pytest.raises(RuntimeError, match="closed"):
        w.append(step(0))


def slice_table(client: ReplayClient, **sampler: Any) -> str:
    return table(
        client,
        TRAJ,
        sampler={"kind": "slice", "slice_len": 4, **sampler},
    )


@pytest.mark.parametrize("by", ["end_key", "traj_key"])
def test_trajectory_rule_with_interleaved_collectors(
    client: ReplayClient, by: str, make_writer: Any
) -> None:
    """Two collectors write episodes at once; every sampled slice stays in one episode."""
    name = slice_table(client, **({"traj_key": "episode"} if by == "traj_key" else {}))
    barrier = threading.Barrier(2)

    def collect(worker: int) -> None:
        key = {"episode_key": "episode"} if by == "traj_key" else {}
        with make_writer(client, name, chunk=4, max_delay=None, **key) as w:
            for e in range(6):
                episode = worker * 100 + e
                length = 5 + (e % 3)
                for t in range(length):
                    w.append(step(episode * 1000 + t, done=t == length - 1, episode=episode))
                    if t == 2:
                        barrier.wait(timeout=30)  # both collectors are mid-episode here

    threads = [threading.Thread(target=collect, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    batch = client.sample(name, 64).reshape(-1, 4)
    for row in batch.unbind(0):
        x = row["x"]
        assert (row["episode"] == row["episode"][0]).all(), x
        assert torch.equal(x - x[0], torch.arange(4)), x  # consecutive steps of one episode


def test_unfinished_episode_on_close(client: ReplayClient) -> None:
    name = slice_table(client)
    w = client.writer(name, chunk=2, max_delay=None)
    for t in range(4):
        w.append(step(t, done=t == 3, episode=0))
    w.append(step(10, episode=1))
    with pytest.warns(RuntimeWarning, match="unfinished episode"):
        w.close()  # with end flags, the tail of episode 1 is dropped
    assert client.info(name)["size"] == 4
    named = slice_table(client, traj_key="episode")
    # (the table's info does not name its traj_key yet: say it here)
    with client.writer(named, chunk=2, max_delay=None, episode_key="episode") as w2:
        for t in range(3):
            w2.append(step(t, episode=7))
    assert client.info(named)["size"] == 3  # trajectory ids keep it apart: sent


def test_a_dropped_writer_stops_its_timer(client: ReplayClient) -> None:
    import gc

    name = table(client)
    w = client.writer(name, chunk=100, max_delay=30.0)
    w.append(step(0))
    timer = w._timer
    assert timer is not None and timer.is_alive()
    with pytest.warns(RuntimeWarning, match="dropped with 1 step"):  # its step is lost
        del w
        gc.collect()
    timer.join(10)
    assert not timer.is_alive()


def test_steps_are_copied_into_columns_allocated_once(
    client: ReplayClient, make_writer: Any
) -> None:
    """A collector may reuse one step object, writing each new step into it in place."""
    name = table(client)
    step0 = step(0, done=True)
    with make_writer(client, name, chunk=4, max_delay=None) as w:
        w.append(step0)
        buf = w._buffer
        assert buf is not None
        columns = {tuple(t.data_ptr() for t in buf._rows._cols)}
        for i in range(1, 13):
            step0["x"].fill_(i)  # the same tensors, new values: copied at append
            step0["next", "done"].fill_(i % 5 == 0)
            w.append(step0)
            columns.add(tuple(t.data_ptr() for t in buf._rows._cols))
        # no allocation per chunk (in the background: the columns being filled and
        # those being sent take turns)
        assert len(columns) == (1 if make_writer.send == "inline" else 2)
    batch = client.sample(name, 256)
    assert sorted(batch["x"].unique().tolist()) == list(range(13))
    assert torch.equal(batch["next", "done"].squeeze(-1), batch["x"] % 5 == 0)


def test_single_steps_and_batches_of_steps_mix(client: ReplayClient) -> None:
    name = table(client)
    with client.writer(name, chunk=5, max_delay=None) as w:
        w.append(step(0))
        w.append(torch.stack([step(i) for i in range(1, 8)]))  # [7]
        w.append(torch.stack([step(i) for i in range(8, 14)]).reshape(2, 3))  # [envs, time]
        w.append(step(14))
    assert w.sent_rows == 15 and w.sent_chunks == 3
    got = client.sample(name, 512)
    assert sorted(got["x"].unique().tolist()) == list(range(15))


def test_a_step_unlike_the_first_is_refused_at_append(client: ReplayClient) -> None:
    name = table(client)
    with client.writer(name, chunk=4, max_delay=None) as w:
        w.append(step(0))
        with pytest.raises(KeyError, match=r"lacks key.*next\.done"):
            w.append(TensorDict({"x": torch.tensor(1)}, []))
        with pytest.raises(KeyError, match=r"has key.*extra"):
            w.append(step(1).set("extra", torch.zeros(2)))
        with pytest.raises(ValueError, match=r"'x' has shape \[2\].*was \[\]"):
            w.append(step(1).set("x", torch.zeros(2, dtype=torch.int64)))
        with pytest.raises(TypeError, match=r"'x' has dtype torch\.float32"):
            w.append(step(1).set("x", torch.tensor(1.0)))
        w.append(step(2))
    assert w.sent_rows == 2  # the refused steps changed nothing
    assert sorted(client.sample(name, 64)["x"].unique().tolist()) == [0, 2]


def test_trajectory_rows_move_to_the_front_between_chunks(
    client: ReplayClient, make_writer: Any
) -> None:
    """Unfinished episodes stay in the buffer across sends; what is sent is whole and in order."""
    name = slice_table(client)
    with make_writer(client, name, chunk=4, max_delay=None) as w:
        x = 0
        for e, length in enumerate([3, 6, 2, 7, 5, 4, 9]):
            for t in range(length):
                w.append(step(x, done=t == length - 1, episode=e))
                x += 1
    assert w.sent_rows == x
    batch = client.sample(name, 256)
    order = batch["index"].argsort()
    assert torch.equal(batch["x"][order], batch["index"][order])  # row i went to slot i


# ------------------------------------------------------------------ in the background
def in_slot_order(client: ReplayClient, name: str) -> list[int]:
    batch = client.sample(name, 512)
    order = batch["index"].argsort()
    return batch["x"][order].unique_consecutive().tolist()


@pytest.mark.parametrize("make_writer", ["thread", "post"], indirect=True)
def test_background_sends_keep_the_order(client: ReplayClient, make_writer: Any) -> None:
    name = table(client)
    with make_writer(client, name, chunk=4, max_delay=None) as w:
        for i in range(50):
            w.append(step(i))
        w.append(torch.stack([step(i) for i in range(50, 61)]))  # several chunks at once
    assert w.sent_rows == 61 and w.sent_chunks == 16
    assert in_slot_order(client, name) == list(range(61))  # row i went to slot i


@pytest.mark.parametrize("make_writer", ["thread", "post"], indirect=True)
def test_flush_returns_once_the_chunk_in_flight_and_the_rest_are_acknowledged(
    client: ReplayClient, make_writer: Any
) -> None:
    name = table(client)
    w = make_writer(client, name, chunk=4, max_delay=None)
    for i in range(6):
        w.append(step(i))  # 0..3 go to the sender, 4..5 wait
    w.flush()
    assert w.sent_rows == 6 and client.info(name)["size"] == 6
    for i in range(6, 10):
        w.append(step(i))
    w.close()
    assert client.info(name)["size"] == 10 and in_slot_order(client, name) == list(range(10))


def bad_step(x: int) -> TensorDict:
    return step(x).set("extra", torch.zeros(2))  # the writer takes it; the table does not


@pytest.mark.parametrize("make_writer", ["thread", "post"], indirect=True)
def test_an_error_of_a_background_send_is_raised_by_the_next_append(
    client: ReplayClient, make_writer: Any
) -> None:
    name = table(client)
    w = make_writer(client, name, chunk=2, max_delay=None)
    for i in range(2):
        w.append(bad_step(i))  # chunk 1 goes to the sender
    for i in range(2, 4):
        w.append(bad_step(i))  # chunk 2 waits for chunk 1 to be done (its error kept)
    with pytest.raises(SchemaError, match="extra"):
        w.append(bad_step(4))
    with pytest.raises(SchemaError, match="extra"):
        w.flush()  # chunk 2's error: flush waits for it
    w.close(discard=True)
    assert client.info(name)["size"] == 0


@pytest.mark.parametrize("make_writer", ["thread", "post"], indirect=True)
@pytest.mark.parametrize("end", ["flush", "close", "wait_sent"])
def test_an_error_of_a_background_send_is_raised_by_flush_close_and_wait_sent(
    client: ReplayClient, make_writer: Any, end: str
) -> None:
    name = table(client)
    w = make_writer(client, name, chunk=2, max_delay=None)
    # one chunk, handed to the sender by the last append (a further append could meet
    # its error first, on a busy machine)
    for i in range(2):
        w.append(bad_step(i))
    with pytest.raises(SchemaError, match="extra"):
        if end == "wait_sent":
            w.wait_sent(2, timeout=30)
        else:
            getattr(w, end)()
    w.close(discard=True)


@pytest.mark.parametrize("make_writer", ["thread", "post"], indirect=True)
def test_leaving_with_on_an_exception_discards_what_is_unsent(
    client: ReplayClient, make_writer: Any
) -> None:
    name = table(client)
    with (
        pytest.raises(RuntimeError, match="collector crashed"),
        make_writer(client, name, chunk=4, max_delay=None) as w,
    ):
        for i in range(6):
            w.append(step(i))  # 0..3 were handed to the sender: they are sent
        raise RuntimeError("collector crashed")
    assert client.info(name)["size"] == 4 and w.sent_rows == 4
    with pytest.raises(RuntimeError, match="closed"):
        w.append(step(0))


def test_the_default_sends_in_the_background_over_shm_and_posts_over_http(
    server: Any, client: ReplayClient
) -> None:
    """Over HTTP the append that fills a chunk sends it and returns without its answer,
    which the next send (or ``flush``, ``close``, ``wait_sent``) reads; over shm a sender
    thread sends it."""
    import time

    name = table(client)
    with (
        ReplayClient(server.url, transport="http") as http,
        http.writer(name, chunk=2, max_delay=None) as w,
    ):
        w.append(step(0))
        w.append(step(1))
        deadline = time.monotonic() + 30
        while client.info(name)["size"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # stored with no further call of the writer's
        assert client.info(name)["size"] == 2
        assert w.sent_rows == 0  # its answer is not read yet
        w.flush()
        assert w.sent_rows == 2 and w.sent_chunks == 1
    assert w.background is False and w._mode == "post"
    with client.writer(name, chunk=2, max_delay=None) as w:
        w.append(step(2))
    assert w.background is (client.transport == "shm")
    with ReplayClient([server.url, server.url], transport="http") as sharded:
        with sharded.writer(name, chunk=2, max_delay=None) as w:
            w.append(step(3))
        assert w._mode == "inline"  # each chunk's server is chosen when it goes


def test_a_posted_chunk_held_by_the_rate_limiter_does_not_hold_the_collector(
    server: Any, client: ReplayClient
) -> None:
    """The server holds a posted chunk (the rate limiter waits for samples): the appends
    go on meanwhile (they waited up to the timeout before), and the chunk is acknowledged
    once a sample lets it in."""
    limited = {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 2.0}
    name = table(client, rate_limiter=limited)  # 2 rows go in, then inserts wait for samples
    with ReplayClient(server.url, transport="http") as http:
        w = http.writer(name, chunk=2, max_delay=None, timeout=60)
        for i in range(5):  # chunk 1 goes in; chunk 2 is held by the rate limiter; 4 is buffered
            w.append(step(i))
        while client.info(name)["waiting"]["insert"] < 1:  # chunk 2 is held now
            threading.Event().wait(0.01)
        assert w.sent_rows == 2 and client.info(name)["size"] == 2
        for _ in range(2):
            client.sample(name, 1)  # room for chunk 2
        w.close()
    assert w.sent_rows == 5 and client.read(name, torch.arange(5))["x"].tolist() == list(range(5))


def test_a_dropped_background_writer_stops_its_sender(client: ReplayClient) -> None:
    import gc

    name = table(client)
    before = set(threading.enumerate())
    w = Writer(client, name, chunk=2, max_delay=None, background=True)
    for i in range(3):
        w.append(step(i))
    assert w.wait_sent(2, timeout=30)
    (sender,) = [t for t in set(threading.enumerate()) - before if "send" in t.name]
    with pytest.warns(RuntimeWarning, match="dropped with 1 step"):  # step 2 is lost
        del w
        gc.collect()
    sender.join(10)
    assert not sender.is_alive()


class _MeetingInfo:
    """The real client, whose ``info`` (the writer's first call) two threads enter together."""

    transport = "http"

    def __init__(self, client: ReplayClient) -> None:
        self.client = client
        self.barrier = threading.Barrier(2)

    def info(self, name: str) -> dict[str, Any]:
        self.barrier.wait(timeout=30)
        return self.client.info(name)

    def extend(self, name: str, data: Any, **options: Any) -> Any:
        return self.client.extend(name, data, **options)


def test_first_appends_from_two_threads_both_arrive(client: ReplayClient) -> None:
    """Two threads append the first steps of a new writer at once: both steps are sent
    (each made its own buffer, and the one made first was dropped with its step)."""
    name = table(client)
    w = Writer(_MeetingInfo(client), name, chunk=8, max_delay=0.05)
    threads = [threading.Thread(target=w.append, args=(step(i),)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    w.close()
    assert w.sent_rows == 2
    assert sorted(client.read(name, torch.arange(2))["x"].tolist()) == [0, 1]


def test_an_append_that_meets_close_is_sent_or_refused(
    client: ReplayClient, make_writer: Any
) -> None:
    """An append that passed its closed check when another thread closed the writer
    either is sent by that close or raises; it never returns with its step kept nowhere."""
    name = table(client)
    w = make_writer(client, name, chunk=2, max_delay=None)
    w.append(step(0))
    lock = w._send_lock

    class CloseFirst:  # the append's lock: another thread closes the writer just before
        def __enter__(self) -> bool:
            w._send_lock = lock
            closer = threading.Thread(target=w.close)
            closer.start()
            closer.join(30)
            return lock.__enter__()

        def __exit__(self, *exc: object) -> None:
            lock.__exit__(*exc)

    w._send_lock = CloseFirst()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="closed"):
        w.append(step(1))
    assert w.sent_rows == 1 and client.info(name)["size"] == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("tdreplay-writer-send")]


def test_wait_sent_raises_the_time_limits_failed_send_at_once(
    client: ReplayClient, make_writer: Any
) -> None:
    """The timer's send fails (the table was deleted): ``wait_sent`` raises its error then,
    not once its own timeout has passed (with none, it waited for ever)."""
    import time

    from tdreplay.client import TableNotFound

    name = table(client)
    w = make_writer(client, name, chunk=100, max_delay=0.3)
    w.append(step(0))
    client.delete_table(name)  # before the time limit sends the step
    began = time.monotonic()
    with pytest.raises(TableNotFound):
        w.wait_sent(1, timeout=15)
    assert time.monotonic() - began < 10
    w.close(discard=True)


def test_close_sends_the_rest_after_a_failed_background_chunk(client: ReplayClient) -> None:
    """A background chunk fails (its table deleted while the rate limiter held it, then
    made again) with steps buffered after it: close sends that chunk again and them, then
    raises its error (it raised first and dropped them; a second close said nothing)."""
    limited = {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 2.0}
    name = table(client, rate_limiter=limited)  # 2 rows go in, then inserts wait for samples
    w = Writer(client, name, chunk=2, max_delay=None, timeout=30, background=True)
    for i in range(5):  # chunk 1 goes in; chunk 2 is held by the rate limiter; 4 is buffered
        w.append(step(i))
    while client.info(name)["waiting"]["insert"] < 1:  # chunk 2 is held now
        threading.Event().wait(0.01)
    client.delete_table(name)  # chunk 2 fails
    client.create_table(
        {"name": name, "capacity": 512, "backend": {"kind": "memory"}, "fields": FIELDS,
         "rate_limiter": limited}
    )  # fmt: skip
    with pytest.raises(TableNotFound, match="deleted while a call waited"):
        w.close()
    assert client.read(name, torch.arange(client.info(name)["size"]))["x"].tolist() == [2, 3, 4]
    w.close()  # nothing more to tell


@pytest.mark.parametrize(
    ("setting", "error", "match"),
    [
        ({"max_delay": "0.5"}, TypeError, "max_delay must be a number"),
        ({"max_delay": float("nan")}, ValueError, "max_delay must be >= 0"),
        ({"max_delay": -1.0}, ValueError, "max_delay must be >= 0"),
        ({"chunk": 2.5}, TypeError, "chunk must be an int"),
        ({"chunk": 0}, ValueError, "chunk must be >= 1"),
    ],
)
def test_a_bad_chunk_or_max_delay_is_refused_when_the_writer_is_made(
    server: Any, setting: dict[str, Any], error: type, match: str
) -> None:
    """Both writers refuse it at once, before any call (a string ``max_delay`` ended the
    timer thread with a traceback and no time limit; NaN sent each step alone; ``chunk=2.5``
    was torch's error at the first append)."""
    with pytest.raises(error, match=match):
        ReplayClient(server.url).writer("no-such-table", **setting)
    with pytest.raises(error, match=match):
        AsyncReplayClient(server.url).writer("no-such-table", **setting)

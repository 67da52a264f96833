"""The plans, driven by hand: sharding, index encoding, failover (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.client import ClientSettings, ConnectionFailed, ProtocolError, route, split_batch
from tdreplay.client import commands as C
from tdreplay.client.plans import Plans
from tdreplay.client.steps import Call, Gather, Pause
from tdreplay.codec import encode


def drive(plan: Any, answer: Any, pauses: list[float] | None = None) -> Any:
    """Run ``plan``, answering each Call with ``answer(call)`` (which may raise); pauses are
    recorded in ``pauses``, not slept."""
    result: Any = None
    exc: BaseException | None = None
    while True:
        try:
            step = plan.send(result) if exc is None else plan.throw(exc)
        except StopIteration as stop:
            return stop.value
        result, exc = None, None
        try:
            if isinstance(step, Call):
                result = answer(step)
            elif isinstance(step, Pause):
                if pauses is not None:
                    pauses.append(step.seconds)
            else:
                assert isinstance(step, Gather)
                result = [_partial(answer, c) if step.partial else answer(c) for c in step.calls]
        except ConnectionFailed as err:
            exc = err


def _partial(answer: Any, call: Call) -> Any:
    try:
        return answer(call)
    except ConnectionFailed as err:
        return err


def calls(n: int) -> Plans:
    return Plans(ClientSettings(urls=tuple(f"http://s{i}" for i in range(n))))


def rows(n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(n)}, [n])


def test_split_batch_is_proportional_and_whole() -> None:
    g = torch.Generator().manual_seed(0)
    counts = [split_batch(1000, [300, 100], generator=g) for _ in range(50)]
    assert all(sum(c) == 1000 for c in counts)
    share = sum(c[0] for c in counts) / (50 * 1000)
    assert 0.70 < share < 0.80
    assert all(c % 8 == 0 for c in split_batch(64, [5, 5, 5], unit=8))
    assert split_batch(16, [0, 7]) == [0, 16]
    assert sum(split_batch(16, [0, 0])) == 16
    with pytest.raises(ValueError):
        split_batch(10, [1], unit=4)


def test_single_server_passes_indices_through() -> None:
    plan = calls(1).extend("t", rows(3))
    sent: list[Call] = []

    def answer(call: Call) -> Any:
        sent.append(call)
        return torch.tensor([7, 8, 9])

    assert drive(plan, answer).tolist() == [7, 8, 9]
    assert sent[0].shard == 0 and isinstance(sent[0].command, C.Extend)
    assert sent[0].command.wait == 30.0  # the client's default wait, never unbounded


def test_extend_round_robin_and_index_encoding() -> None:
    c = calls(3)
    shards = []
    for _ in range(6):

        def answer(call: Call) -> Any:
            shards.append(call.shard)
            return torch.tensor([5])

        index = drive(c.extend("t", rows(1)), answer)
        assert int(index) == 5 * 3 + shards[-1]
    assert shards == [0, 1, 2, 0, 1, 2]


def test_extend_fails_over_only_when_nothing_was_sent() -> None:
    c = calls(2)
    tried: list[int] = []

    def refused_first(call: Call) -> Any:
        tried.append(call.shard)
        if call.shard == 0:
            raise ConnectionFailed("refused", sent=False)
        return torch.tensor([1])

    assert int(drive(c.extend("t", rows(1)), refused_first)) == 1 * 2 + 1
    assert tried == [0, 1]

    def lost(call: Call) -> Any:
        raise ConnectionFailed("lost", sent=True)

    pauses: list[float] = []
    with pytest.raises(ConnectionFailed):
        drive(calls(2).extend("t", rows(1)), lost, pauses)
    assert sum(pauses) >= 30.0  # resent to the same server for the retry deadline, then raised


def test_an_extend_that_may_have_arrived_goes_to_that_server_only() -> None:
    c = calls(3)
    tried: list[int] = []

    def back_on_third_try(call: Call) -> Any:
        tried.append(call.shard)
        if len(tried) < 3:
            raise ConnectionFailed("lost mid-call", sent=True)
        return torch.tensor([7])

    pauses: list[float] = []
    first = drive(c.extend("t", rows(1)), back_on_third_try, pauses)
    assert tried == [0, 0, 0] and len(pauses) == 2  # never to another server: no duplicate
    assert int(first) == 7 * 3 + 0
    assert c.shards.is_up(0)  # it answered: up again
    nxt = drive(c.extend("t", rows(1)), lambda call: torch.tensor([1]))
    assert int(nxt) % 3 == 1  # the round robin goes on


def test_a_server_that_fails_mid_sample_has_its_share_drawn_elsewhere() -> None:
    c = calls(3)
    asked: list[tuple[int, int]] = []

    def answer(call: Call) -> Any:
        if isinstance(call.command, C.Info):
            return info(100)
        n = call.command.batch_size
        asked.append((call.shard, n))
        if call.shard == 1:
            raise ConnectionFailed("refused", sent=False)
        return TensorDict({"index": torch.zeros(n, dtype=torch.int64)}, [n])

    torch.manual_seed(0)
    batch = drive(c.sample("t", 300), answer)
    assert len(batch) == 300 and set((batch["index"] % 3).tolist()) <= {0, 2}
    assert not c.shards.is_up(1)
    asked.clear()
    drive(c.sample("t", 300), answer)  # sizes cached: the down server is not asked
    assert {shard for shard, _ in asked} <= {0, 2}


def info(size: int) -> dict[str, Any]:
    return {"name": "t", "size": size, "capacity": 100, "sampler": {"kind": "uniform"}}


def test_sharded_sample_splits_by_size_and_encodes_the_server() -> None:
    c = calls(2)
    seen: dict[int, int] = {}

    def answer(call: Call) -> Any:
        cmd = call.command
        if isinstance(cmd, C.Info):
            return info([0, 50][call.shard])
        assert isinstance(cmd, C.Sample)
        seen[call.shard] = cmd.batch_size
        return TensorDict({"index": torch.full((cmd.batch_size,), 3)}, [cmd.batch_size])

    batch = drive(c.sample("t", 32), answer)
    assert seen == {1: 32}  # the empty server gets nothing
    assert batch.batch_size == torch.Size([32])
    assert (batch["index"] == 3 * 2 + 1).all()


def test_sharded_update_priority_routes_by_server() -> None:
    c = calls(2)
    got: dict[int, tuple[list[int], list[float], list[int] | None]] = {}

    def answer(call: Call) -> Any:
        cmd = call.command
        assert isinstance(cmd, C.UpdatePriority)
        keys = None if cmd.key is None else cmd.key.tolist()
        got[call.shard] = (cmd.index.tolist(), cmd.priority.tolist(), keys)
        return len(cmd.index) - call.shard  # the server skipped a stale slot on shard 1

    index = torch.tensor([4 * 2 + 0, 9 * 2 + 1, 6 * 2 + 0])
    priority = torch.tensor([1.0, 2.0, 3.0])
    assert drive(c.update_priority("t", index, priority), answer) == 2
    assert got == {0: ([4, 6], [1.0, 3.0], None), 1: ([9], [2.0], None)}
    key = torch.tensor([40, 90, 60])
    assert drive(c.update_priority("t", index, priority, key), answer) == 2
    assert got == {0: ([4, 6], [1.0, 3.0], [40, 60]), 1: ([9], [2.0], [90])}
    with pytest.raises(ValueError, match="keys"):
        drive(c.update_priority("t", index, priority, key[:2]), answer)


def test_merged_info_sums_sizes() -> None:
    merged = drive(calls(2).info("t"), lambda call: info(10 + call.shard))
    assert merged["size"] == 21 and merged["capacity"] == 200 and len(merged["shards"]) == 2


def test_settings_refuse_unbounded_timeouts() -> None:
    with pytest.raises(ValueError):
        ClientSettings(urls=("http://x",), timeout=float("inf"))
    with pytest.raises(ValueError):
        ClientSettings(urls=("http://x",), wait=0)
    with pytest.raises(ValueError):
        ClientSettings(urls=("http://x",), wait=float("nan"))
    assert ClientSettings(urls=("http://x",), wait=float("inf")).wait == float("inf")
    with pytest.raises(ValueError):
        ClientSettings(urls=())


def test_extend_request_carries_one_id_across_retries() -> None:
    data = rows(4)
    cmd = C.Extend("t", data, wait=2.0)
    a, b = cmd.request(), cmd.request()
    assert a.headers["X-Request-Id"] == b.headers["X-Request-Id"]
    assert a.parts and b"".join(a.parts) == b"".join(b.parts) == encode(data).to_pybytes()
    assert a.nbytes == sum(len(p) for p in a.parts)
    assert a.target == "/v1/tables/t/extend?timeout=2.0"
    assert C.Extend("t", rows(1)).request_id != C.Extend("t", rows(1)).request_id


def test_as_batch_shapes() -> None:
    step = TensorDict({"x": torch.tensor(1.0)}, [])
    assert C.as_batch(step).batch_size == torch.Size([1])
    grid = TensorDict({"x": torch.arange(6).reshape(2, 3)}, [2, 3])
    flat = C.as_batch(grid)
    assert flat.batch_size == torch.Size([6]) and flat["x"].tolist() == list(range(6))
    assert C.as_batch({"x": torch.zeros(4, 2)}).batch_size == torch.Size([4])
    with pytest.raises(TypeError):
        C.as_batch([1, 2])


def test_table_names_are_quoted() -> None:
    assert C.Info("a b").request().target == "/v1/tables/a%20b"


def test_the_old_settings_name_warns_and_still_works() -> None:
    import tdreplay.client as client

    with pytest.warns(DeprecationWarning, match="ClientSettings"):
        old = client.Settings
    assert old is ClientSettings


def test_a_call_whose_socket_answered_garbage_stays_in_doubt_over_http() -> None:
    """The same-host socket carried an extend and its answer could not be read (the server
    got the request); the HTTP tries after it are refused. The call may have been stored:
    its error says so (``sent``), so a sharded extend goes to no other server."""
    settings = ClientSettings(urls=("http://s0",), transport="auto")
    plan = route.transmit(Call(0, C.Extend("t", rows(1))), settings, [object()])
    step, tries = next(plan), 0
    with pytest.raises(ConnectionFailed) as info:
        while True:
            if isinstance(step, route.Link):
                step = plan.send(object())
            elif isinstance(step, route.OverShm):
                step = plan.throw(ProtocolError("shared-memory socket: a garbled reply"))
            elif isinstance(step, route.OverHttp):
                tries += 1
                step = plan.throw(ConnectionFailed("refused", sent=False))
            else:
                assert isinstance(step, Pause)
                step = plan.send(None)
    assert tries == settings.retry.attempts and info.value.sent

"""TDReplayBuffer against a real server: TorchRL's buffer contract, call by call."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torchrl.checkpoint import Checkpoint
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.transforms import RewardScaling, Transform
from torchrl.modules import QValueActor
from torchrl.objectives import DQNLoss
from torchrl_kit import check_exactly_once, make_env, stored_frame_ids

from tdreplay.client import InvalidRequest, ReplayClient, SchemaError, TableExists, TableNotFound
from tdreplay.torchrl import TDReplayBuffer, spec_from_tensordict


def rollout(frames: int = 64) -> TensorDict:
    """``frames`` CartPole frames, as a TorchRL collector emits them."""
    collector = Collector(make_env(), policy=None, frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


@pytest.fixture(scope="module")
def frames() -> TensorDict:
    return rollout(64)


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_extend_sample_len(
    server: Any, make_table: Callable[..., str], frames: TensorDict, transport: str
) -> None:
    table = make_table()
    rb = TDReplayBuffer(server.url, table, batch_size=16, transport=transport)
    assert isinstance(rb, TensorDictReplayBuffer)
    assert rb.replay_client.transport == transport
    data = frames.clone()
    index = rb.extend(data)
    assert index.tolist() == list(range(64))
    assert "index" not in data.keys()  # noqa: SIM118  (left as it was, as TorchRL leaves it)
    assert len(rb) == rb.write_count == 64
    batch = rb.sample()
    assert batch.batch_size == (16,)
    assert "priority_weight" not in batch  # uniform table: TorchRL adds none either
    by_id = {int(i): k for k, i in enumerate(frames["next", "frame_id"])}
    rows = torch.tensor([by_id[int(i)] for i in batch["next", "frame_id"]])
    assert torch.equal(batch["index"], rows)
    assert torch.equal(batch["observation"], frames["observation"][rows])
    # samples own their memory: later samples do not overwrite them (shared memory is leased)
    kept = batch.clone()
    for _ in range(4):
        rb.sample()
    assert (batch == kept).all()
    assert rb.sample(5).batch_size == (5,)
    _, info = rb.sample(return_info=True)
    assert set(info) == {"index"}


def test_prioritized_with_a_torchrl_loss(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    table = make_table(sampler="prioritized")
    rb = TDReplayBuffer(server.url, table, batch_size=32)
    rb.extend(frames.clone())
    batch, info = rb.sample(return_info=True)
    assert torch.equal(batch["priority_weight"], batch["sample_info", "weight"])
    assert torch.equal(info["priority_weight"], batch["priority_weight"])
    qnet = torch.nn.Linear(4, 2)
    actor = QValueActor(qnet, in_keys=["observation"], action_space="one-hot")
    loss = DQNLoss(actor, action_space="one-hot")
    loss.make_value_estimator(gamma=0.99)
    loss(batch)  # reads priority_weight, writes td_error
    assert batch["td_error"].shape[0] == 32
    rb.update_tensordict_priority(batch)
    # one item's priority far above the rest: it is (nearly) all that is sampled
    target = int(batch["index"][0])
    rb.update_priority(torch.tensor([target]), torch.tensor([1e6]))
    again = rb.sample(64)
    assert (again["index"] == target).float().mean() > 0.9
    # a loss's output extended back in: index, priority_weight, sample_info and
    # td_error are not stored, and td_error sets the new items' priorities
    loss(again)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = rb.extend(again)
    assert len(rb) == 128
    assert new.tolist() == list(range(64, 128))


def test_extra_keys_are_left_out_with_a_warning_or_refused_when_strict(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    table = make_table()
    data = frames.clone().set("action_value", torch.zeros(64, 2))
    rb = TDReplayBuffer(server.url, table)
    with pytest.warns(UserWarning, match=r"does not declare \['action_value'\]"):
        rb.extend(data.exclude("index"))
    assert len(rb) == 64
    strict = TDReplayBuffer(server.url, table, strict=True)
    with pytest.raises(SchemaError, match="action_value"):
        strict.extend(data.exclude("index"))
    with pytest.raises(SchemaError, match="frame_id"):
        rb.extend(frames.exclude("frame_id"))  # a declared key missing: the server names it
    assert len(rb) == 64


def test_add_steps_and_batches_of_envs(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    rb = TDReplayBuffer(server.url, make_table())
    assert rb.add(frames[0].clone()) == 0
    assert rb.extend(frames[1:9].clone().reshape(2, 4)).shape == (2, 4)
    assert len(rb) == 9


def test_pickles_as_connection_info(
    server: Any, client: ReplayClient, make_table: Callable[..., str], frames: TensorDict
) -> None:
    table = make_table()
    rb = TDReplayBuffer(server.url, table, batch_size=8, priority_key="err")
    blob = pickle.dumps(rb)
    assert len(blob) < 2000  # settings, not state
    copy = pickle.loads(blob)
    assert copy.replay_client is not rb.replay_client
    assert (copy.table, copy.batch_size, copy.priority_key) == (table, 8, "err")
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_extend_in_child, args=(rb, frames[:10].clone()))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    check_exactly_once(stored_frame_ids(client, table))
    assert len(rb) == 10
    assert rb.share() is rb and rb.shared  # nothing to share
    assert [type(c) for c in rb.clients(2)] == [TDReplayBuffer] * 2


def _extend_in_child(rb: TDReplayBuffer, data: TensorDict) -> None:
    rb.extend(data)


def test_dumps_and_loads_on_the_server_when_asked(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    table = make_table()
    rb = TDReplayBuffer(server.url, table)
    rb.extend(frames[:20].clone())
    path = rb.dumps(f"checkpoints/adapter/{table}", on_server=True)
    assert path == f"checkpoints/adapter/{table}"
    rb.extend(frames[20:].clone())
    assert len(rb) == 64
    rb.loads(path, on_server=True)
    assert len(rb) == rb.write_count == 20
    with pytest.raises(TypeError, match="local folder"):
        rb.dumps()


def test_torchrl_checkpoint_saves_and_resumes_the_buffer(
    server: Any,
    client: ReplayClient,
    make_table: Callable[..., str],
    frames: TensorDict,
    tmp_path: Any,
) -> None:
    """TorchRL's own ``Checkpoint(replay_buffer=rb)`` round-trips the buffer through local
    files (``dump``/``load``): rows, priorities, counters and the sampler's draws come back
    as they were; so does ``state_dict`` through ``torch.save`` / ``torch.load``."""
    table = make_table(sampler="prioritized")
    rb = TDReplayBuffer(server.url, table, batch_size=16)
    rb.extend(frames.clone())
    batch = rb.sample()
    rb.update_priority(batch["index"], torch.linspace(0.1, 5.0, 16))
    before = client.info(table)
    stored = client.export(table)
    Checkpoint(replay_buffer=rb).save(tmp_path / "ckpt")
    assert not any(p.name.startswith(".") for p in (tmp_path / "ckpt").rglob("*"))  # no scratch
    rb.extend(frames[:10].clone())  # the run goes on, then is resumed from the checkpoint
    rb.update_priority(batch["index"], torch.ones(16))
    assert client.info(table)["inserts"] == 74
    Checkpoint(replay_buffer=rb).load(tmp_path / "ckpt")
    after = client.info(table)
    for key in ("size", "inserts", "samples", "sampler"):
        assert after[key] == before[key], key
    assert client.export(table) == stored  # every row, bit for bit
    state = rb.state_dict()
    torch.save(state, tmp_path / "rb.pt")
    rb.extend(frames[:10].clone())
    rb.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=True))
    assert client.info(table)["inserts"] == 64
    with pytest.raises(ValueError, match="of table 'other', not of"):
        rb.load_state_dict({"table": "other", "archives": state["archives"]})
    other = TDReplayBuffer(server.url, make_table())
    with pytest.raises(InvalidRequest, match="holds table"):
        other.load(tmp_path / "ckpt" / "components" / "0000-replay_buffer")  # another table's


def test_iteration_prefetch_and_consuming_tables(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    rb = TDReplayBuffer(server.url, make_table(), batch_size=8, prefetch=2)
    rb.extend(frames.clone())
    batches = [b for _, b in zip(range(3), rb, strict=False)]
    assert [b.batch_size for b in batches] == [(8,)] * 3
    assert len({id(b) for b in batches}) == 3
    rb.close()
    fifo = TDReplayBuffer(server.url, make_table(sampler="fifo"), batch_size=20)
    fifo.extend(frames.clone())
    drained = list(fifo)  # each item once: 3 batches, 4 items left
    assert len(drained) == 3
    ids = torch.cat([b["next", "frame_id"] for b in drained])
    assert torch.equal(ids, frames["next", "frame_id"][:60])
    assert fifo.next() is None


def test_create_lays_out_the_table_from_the_first_batch(
    server: Any, client: ReplayClient, frames: TensorDict
) -> None:
    rb = TDReplayBuffer(
        server.url, "lazy_cartpole", create={"capacity": 500, "sampler": "prioritized"}
    )
    assert len(rb) == rb.write_count == 0  # as TorchRL's lazy storages, before the first write
    rb.extend(frames.clone())
    info = client.info("lazy_cartpole")
    assert info["capacity"] == 500 and info["sampler"]["kind"] == "prioritized"
    assert info["fields"] == spec_from_tensordict(frames, "x", capacity=1)["fields"]
    assert "index" not in info["fields"]
    assert len(rb) == 64


def test_clear_errors(server: Any, make_table: Callable[..., str]) -> None:
    rb = TDReplayBuffer(server.url, make_table())
    with pytest.raises(RuntimeError, match="needs a batch size"):
        rb.sample()
    with pytest.raises(TypeError, match="TensorDict or a tensorclass"):
        rb.extend({"observation": torch.zeros(3, 4)})
    with pytest.raises(ValueError, match="cannot keep write_count"):
        rb.empty(empty_write_count=False)
    with pytest.raises(ValueError, match="prefetch needs a batch_size"):
        TDReplayBuffer(server.url, "t", prefetch=2)
    # the contract's batch size rule (as each sample's), not one of its own: 2.5
    # and 2**40 were taken here and refused only at the first sample
    for bad in (0, 2.5, 1 << 40):
        with pytest.raises(InvalidRequest, match="batch_size") as err:
            TDReplayBuffer(server.url, "t", batch_size=bad)
        assert err.value.field == "batch_size"
    with pytest.raises(ValueError, match="capacity"):
        TDReplayBuffer(server.url, "t", create={"sampler": "uniform"})
    with pytest.warns(UserWarning, match="keeps no priorities"):
        assert rb.update_priority(torch.tensor([0]), torch.tensor([1.0])) == 0
    with pytest.raises(TableNotFound):
        len(TDReplayBuffer(server.url, "no_such_table"))


class _Twice(Transform):  # TorchRL's insert_transform takes Transforms only
    def forward(self, td: Any) -> Any:
        return td.set("twice", td["next", "reward"] * 2)


def _plus_one(td: Any) -> Any:
    return td.set("twice", td["twice"] + 1)


def _mark_written(td: Any) -> Any:  # appended inverted: runs on extend
    td = td.clone()
    td["next", "reward"] = td["next", "reward"] + 100
    return td


def test_transforms_as_torchrl_applies_them(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    """``append_transform`` / ``insert_transform`` / ``transform=`` act as on TorchRL's own
    buffer: forward on every sample in order, an inverted one on the way in; the buffer
    pickles with them (collector workers get them)."""
    ours = TDReplayBuffer(server.url, make_table(), batch_size=8)
    theirs = TensorDictReplayBuffer(batch_size=8)
    for rb in (ours, theirs):
        rb.append_transform(_plus_one)
        rb.insert_transform(0, _Twice())  # before plus_one
        rb.append_transform(_mark_written, invert=True)
        rb.append_transform(RewardScaling(loc=0.0, scale=0.5, in_keys=[("next", "reward")]))
    data = frames.clone()
    ours.extend(data)
    theirs.extend(frames.clone())
    assert torch.equal(data["next", "reward"], frames["next", "reward"])  # the caller's is kept
    a, b = ours.sample(), theirs.sample()
    for batch in (a, b):
        stored = batch["twice"] - 1  # twice the stored reward, written +100
        assert torch.allclose(stored, 2 * (frames["next", "reward"][:8].new_ones(8, 1) * 101))
        assert torch.allclose(batch["next", "reward"], torch.full((8, 1), 50.5))  # scaled
    again = pickle.loads(pickle.dumps(ours))
    assert torch.allclose(again.sample()["twice"], a["twice"])


def _identity_inv(td: Any) -> Any:  # an inverse transform that hands back a new TensorDict
    return td.clone()


@pytest.mark.parametrize("with_transform", [False, True])
def test_extend_sets_index_where_torchrl_does(
    server: Any, make_table: Callable[..., str], frames: TensorDict, with_transform: bool
) -> None:
    """The caller's data is left as TorchRL's own buffer leaves it: TorchRL sets ``index`` on
    what its transforms' inverse returns, a copy even when it has no transform."""
    ours = TDReplayBuffer(server.url, make_table())
    theirs = TensorDictReplayBuffer()
    given = {}
    for name, rb in (("ours", ours), ("theirs", theirs)):
        if with_transform:
            rb.append_transform(_identity_inv, invert=True)
        data = frames[:16].clone()
        rb.extend(data)
        given[name] = "index" in data.keys()  # noqa: SIM118  (a TensorDict: its keys)
    assert given["ours"] == given["theirs"] is False


def test_create_on_a_table_with_rows_reuses_with_a_warning_or_refuses(
    server: Any, client: ReplayClient, frames: TensorDict
) -> None:
    name = "reused_cartpole"
    first = TDReplayBuffer(server.url, name, create={"capacity": 100})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it made the table: nothing to say
        first.extend(frames[:10].clone())
    again = TDReplayBuffer(server.url, name, create={"capacity": 100})
    with pytest.warns(UserWarning, match="holds 10 rows; they are reused"):
        again.extend(frames[:5].clone())
    assert len(again) == 15
    strict = TDReplayBuffer(server.url, name, create={"capacity": 100}, existing="refuse")
    with pytest.raises(TableExists, match="holds 15 rows"):
        strict.extend(frames[:5].clone())
    assert client.info(name)["size"] == 15  # refused before anything was written
    assert pickle.loads(pickle.dumps(strict))._existing == "refuse"
    with pytest.raises(ValueError, match="existing must be"):
        TDReplayBuffer(server.url, name, create={"capacity": 100}, existing="clear")


def test_a_sample_above_the_capacity_is_drawn_with_replacement(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    """As TorchRL's samplers: ``sample(n)`` past the capacity draws with replacement (in
    pieces the server serves); a fifo table, whose items go out once, says it cannot."""
    ours = TDReplayBuffer(server.url, make_table(capacity=32))
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(32))
    for rb in (ours, theirs):
        rb.extend(frames[:32].clone())
        rb.extend(frames[32:].clone())  # 64 frames into 32 slots: the newest 32 stay
        batch = rb.sample(100)
        assert batch.batch_size == torch.Size([100])
        assert set(batch["index"].tolist()) <= set(range(32))
    assert set(ours.sample(100)["observation"][:, 0].tolist()) <= set(
        frames["observation"][32:, 0].tolist()
    )
    fifo = TDReplayBuffer(server.url, make_table(sampler="fifo", capacity=32))
    fifo.extend(frames[:32].clone())
    with pytest.raises(InvalidRequest, match="hands out each item once"):
        fifo.sample(40)
    assert len(fifo) == 32  # nothing was drawn


def test_empty_clears_the_table(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    """As TorchRL's ``empty()``: no rows, ``write_count`` back to 0, and the buffer goes on."""
    rb = TDReplayBuffer(server.url, make_table(), batch_size=8)
    rb.extend(frames.clone())
    rb.empty()
    assert len(rb) == rb.write_count == 0
    rb.extend(frames[:8].clone())
    assert len(rb) == 8 and rb.sample().batch_size == (8,)


def test_items_by_index_as_torchrl_reads_them(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    """``rb[i]``, ``rb[a:b]``, ``rb[tensor]`` and ``rb[key]`` give what TorchRL's own buffer
    gives for the same data (storage slots, as stored), with transforms applied."""
    ours = TDReplayBuffer(server.url, make_table())
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(4096))
    for rb in (ours, theirs):
        rb.extend(frames[:20].clone())
    keys = ["observation", ("next", "reward"), "action"]
    for index in (3, -1, slice(2, 9), slice(None), torch.tensor([7, 1, 7])):
        a, b = ours[index], theirs[index]
        assert a.batch_size == b.batch_size, index
        for key in keys:
            assert torch.equal(a[key], b[key]), (index, key)
    assert torch.equal(ours["observation"], theirs["observation"])
    assert ours.info()["samples"] == 0  # reading is not sampling
    with pytest.raises(IndexError):
        ours[20]
    batch = ours.sample(8)
    assert torch.equal(ours[batch["index"]]["observation"], batch["observation"])
    ours.append_transform(_Twice())
    assert torch.equal(ours[0]["twice"], frames["next", "reward"][0] * 2)


def test_extend_past_the_capacity_wraps_as_torchrl_does(
    server: Any, make_table: Callable[..., str], frames: TensorDict
) -> None:
    """64 frames into 32 slots: every row gets the slot it went to, the newest 32 stay."""
    ours = TDReplayBuffer(server.url, make_table(capacity=32))
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(32))
    a, b = ours.extend(frames.clone()), theirs.extend(frames.clone())
    assert a.tolist() == b.tolist() == [*range(32), *range(32)]
    for key in ("observation", ("next", "reward")):
        assert torch.equal(ours[:][key], theirs[:][key])
    assert len(ours) == 32 and ours.write_count == 64

"""Sentinels for upstream bugs tdreplay works around.

Each test calls the upstream library directly and is ``xfail(strict=True)``:
when upstream fixes the bug the test passes, strict mode turns that into a
failure, and the workaround in tdreplay can be revisited (then the sentinel
goes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import torch
from tensordict import TensorDict


@pytest.mark.xfail(
    strict=True,
    raises=redis.exceptions.DataError,
    reason="tensordict 0.14: from_schema(storage='redis') rejects nested (tuple) keys; "
    "tdreplay stores them flat (storage/backends/redis.py RedisBackend)",
)
def test_from_schema_redis_nested_keys(redis_server: dict) -> None:
    td = TensorDict.from_schema(
        {("next", "reward"): ([1], torch.float32)},
        batch_size=[4],
        storage="redis",
        host=redis_server["host"],
        port=redis_server["port"],
        prefix="sentinel-nested",
    )
    td["next", "reward"] = torch.arange(4.0)[:, None]
    assert torch.equal(td["next", "reward"], torch.arange(4.0)[:, None])


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="tensordict 0.14: from_schema(storage='redis') sizes every field's string to the "
    "capacity at create (Redis holds capacity x item bytes before a row); tdreplay lays the "
    "keys out itself (storage/backends/redis_keys.py lay_out)",
)
def test_from_schema_redis_holds_no_row_before_one_is_written(redis_server: dict) -> None:
    td = TensorDict.from_schema(
        {"x": ([1024], torch.uint8)},
        batch_size=[1024],
        storage="redis",
        host=redis_server["host"],
        port=redis_server["port"],
        prefix="sentinel-lazy",
    )
    try:
        assert redis_server["client"].strlen(td._data_key("x")) == 0
    finally:
        td.clear_redis()
        td.close()


@pytest.mark.xfail(
    strict=True,
    raises=TypeError,
    reason="tensordict 0.14 on Redis cannot hold bfloat16; tdreplay stores its bits as int16",
)
def test_from_schema_redis_bfloat16(redis_server: dict) -> None:
    td = TensorDict.from_schema(
        {"action": ([2], torch.bfloat16)},
        batch_size=[4],
        storage="redis",
        host=redis_server["host"],
        port=redis_server["port"],
        prefix="sentinel-bf16",
    )
    value = torch.linspace(-3, 3, 8).bfloat16().reshape(4, 2)
    td["action"] = value
    assert torch.equal(td["action"], value)


@pytest.mark.xfail(
    strict=True,
    raises=TypeError,
    reason="h5py/numpy have no bfloat16; tdreplay stores its bits as int16",
)
def test_from_schema_h5_bfloat16(tmp_path: Path) -> None:
    td = TensorDict.from_schema(
        {"action": ([2], torch.bfloat16)},
        batch_size=[4],
        storage="h5",
        filename=str(tmp_path / "bf16.h5"),
    )
    value = torch.linspace(-3, 3, 8).bfloat16().reshape(4, 2)
    td["action"] = value
    assert torch.equal(td["action"], value)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="TorchRL's TensorStorage over from_schema reports len == capacity, so its samplers "
    "draw never-written rows; tdreplay tracks its own size",
)
def test_torchrl_storage_over_from_schema_samples_only_written_rows() -> None:
    from torchrl.data import ReplayBuffer, TensorStorage

    storage = TensorDict.from_schema({"written": ([1], torch.bool)}, batch_size=[1000])
    rb = ReplayBuffer(storage=TensorStorage(storage), batch_size=256)
    rb.extend(TensorDict({"written": torch.ones(10, 1, dtype=torch.bool)}, [10]))
    assert bool(rb.sample()["written"].all())


@pytest.mark.xfail(
    strict=True,
    raises=RuntimeError,
    reason="TorchRL's C++ extension does not load with this torch; its PrioritizedSampler "
    "needs it, so tdreplay has its own sum-tree",
)
def test_torchrl_prioritized_sampler_loads() -> None:
    from torchrl.data import PrioritizedSampler

    PrioritizedSampler(max_capacity=8, alpha=0.6, beta=0.4)


def _ted(n: int) -> TensorDict:
    """``n`` TED steps of one episode ending at the last step."""
    obs = torch.arange(n + 1, dtype=torch.float32)[:, None].expand(n + 1, 2).clone()
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[-1] = True
    return TensorDict(
        {
            "observation": obs[:-1],
            "next": {"observation": obs[1:], "done": done, "reward": torch.ones(n, 1)},
        },
        batch_size=[n],
    )


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="TorchRL's Flat2TED leaves the last row's next entries unset when the storage is "
    "not full; tdreplay's checkpoint restores them from the flat data",
)
def test_flat2ted_restores_the_last_next_observation(tmp_path: Path) -> None:
    from torchrl.data.replay_buffers.utils import Flat2TED, TED2Flat

    data = _ted(6)
    hook = TED2Flat()
    hook.shift, hook.is_full = 6, False
    hook(data, tmp_path / "flat")
    out = Flat2TED()(TensorDict.load_memmap(tmp_path / "flat"), data.clone().zero_())
    assert torch.equal(out["next", "observation"], data["next", "observation"])


@pytest.mark.xfail(
    strict=True,
    raises=RuntimeError,
    reason="TorchRL's TED2Flat breaks on a full storage whose cursor is 0 (a roll by 0); "
    "tdreplay saves such a ring as not full",
)
def test_ted2flat_full_storage_with_cursor_at_zero(tmp_path: Path) -> None:
    from torchrl.data.replay_buffers.utils import TED2Flat

    hook = TED2Flat()
    hook.shift, hook.is_full = 0, True
    hook(_ted(6), tmp_path / "flat")

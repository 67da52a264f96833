"""TorchRL's checkpointers on a buffer whose dump is larger than the server's
``--max-body-bytes``: the load goes up in parts (issue 21 item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from testkit import make_rows
from torchrl.checkpoint import Checkpoint
from torchrl_kit import CARTPOLE_FIELDS, table_spec

from tdreplay.client import ReplayClient
from tdreplay.torchrl import TDReplayBuffer

LIMIT = 64 << 10


def test_checkpoint_load_above_the_body_limit(live_server: Any, tmp_path: Path) -> None:
    server = live_server(max_body_bytes=LIMIT)
    client = ReplayClient(server.url, transport="http")
    client.create_table(table_spec("rb_big", capacity=4096, sampler="prioritized"))
    rb = TDReplayBuffer(server.url, "rb_big", batch_size=32, transport="http")
    for chunk in make_rows(CARTPOLE_FIELDS, 4096 + 300).split(256):
        rb.extend(chunk)
    batch = rb.sample()
    rb.update_priority(batch["index"], torch.linspace(0.1, 5.0, 32))
    before, stored = client.info("rb_big"), client.export("rb_big")
    Checkpoint(replay_buffer=rb).save(tmp_path / "ckpt")
    size = sum(p.stat().st_size for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    assert size > 4 * LIMIT, size
    rb.extend(make_rows(CARTPOLE_FIELDS, 100, seed=1))
    rb.update_priority(batch["index"], torch.ones(32))
    Checkpoint(replay_buffer=rb).load(tmp_path / "ckpt")
    after = client.info("rb_big")
    for key in ("size", "inserts", "samples", "sampler", "writer"):
        assert after[key] == before[key], key
    assert client.export("rb_big") == stored
    state = rb.state_dict()  # in memory, through load_state_dict: the same parts
    rb.extend(make_rows(CARTPOLE_FIELDS, 100, seed=2))
    rb.load_state_dict(state)
    assert client.export("rb_big") == stored

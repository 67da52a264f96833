"""TDReplayBuffer against a real server, next to TorchRL's own buffer: the checkpoint hooks
TorchRL documents (``TED2Flat`` / ``Flat2TED``), the seeding and update calls a server-held
table cannot take, and the buffer's parts before ``create=`` made its table."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from parity_kit import FIELDS, rows
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.utils import Flat2TED, TED2Flat

from tdreplay.torchrl import TDReplayBuffer


def ours_for(server: Any, **create: Any) -> TDReplayBuffer:
    name = f"hooks_{uuid.uuid4().hex[:8]}"
    options = {"capacity": 16, "backend": "memory", **create}
    return TDReplayBuffer(server.url, name, create=options, timeout=5.0)


@pytest.mark.parametrize("ted2flat", [False, True], ids=["plain", "ted2flat"])
def test_ted2flat_hooks_as_torchrl_registers_them(
    server: Any, tmp_path: Path, ted2flat: bool
) -> None:
    """TorchRL's pattern for compact checkpoints, ``rb.register_save_hook(TED2Flat())`` and
    ``rb.register_load_hook(Flat2TED())``, raised ``AttributeError: 'ServiceStorage' object
    has no attribute 'register_save_hook'``. The server applies them (the table's
    ``checkpoint.ted2flat``): the script runs unchanged and both buffers come back as saved."""
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    ours = ours_for(server, checkpoint={"ted2flat": ted2flat})
    for i, rb in enumerate((theirs, ours)):
        rb.register_save_hook(TED2Flat())
        rb.register_load_hook(Flat2TED())
        rb.extend(rows(0, 10))
        rb.dumps(tmp_path / str(i))
        rb.extend(rows(10, 3))
        rb.loads(tmp_path / str(i))
    assert len(ours) == len(theirs) == 10
    saved, back = theirs[:], ours[:]
    for key in FIELDS:
        assert torch.equal(back[key], saved[key]), key


def test_what_the_server_cannot_take_is_named(server: Any) -> None:
    """``set_rng`` raised ``FrozenInstanceError: cannot assign to field '_rng'`` and
    ``mark_update`` an ``AttributeError`` on the sampler's marker; another save hook an
    ``AttributeError`` too. Each now says what to do instead."""
    ours = ours_for(server)
    ours.extend(rows(0, 4))
    with pytest.raises(NotImplementedError, match=r"set_rng\(\).*serve --seed"):
        ours.set_rng(torch.Generator().manual_seed(0))
    with pytest.raises(NotImplementedError, match=r"mark_update\(\).*update_priority"):
        ours.mark_update(torch.tensor([0]))
    with pytest.raises(NotImplementedError, match=r"a save hook \(function\).*TED2Flat is taken"):
        ours.register_save_hook(lambda td: td)
    with pytest.raises(NotImplementedError, match=r"a load hook \(TED2Flat\).*Flat2TED is taken"):
        ours.register_load_hook(TED2Flat())
    assert len(ours) == 4


def test_the_parts_before_create_made_the_table(server: Any) -> None:
    """TorchRL's ``rb.writer`` exists before the first write; here it raised
    ``TableNotFound`` (the table is made by the first extend) while ``rb.sampler`` answered
    from the ``create=`` options. Both do now, and the same once the table exists."""
    ours = ours_for(server, sampler="prioritized", writer={"kind": "max_value", "key": "id"})
    before = (ours.sampler.kind, ours.writer.kind)
    assert before == ("prioritized", "max_value")
    ours.extend(rows(0, 4))
    assert (ours.sampler.kind, ours.writer.kind) == before
    assert ours_for(server).writer.kind == "round_robin"

"""Twin buffers for the parity suite: TorchRL's ``TensorDictReplayBuffer`` and ``TDReplayBuffer``.

A :class:`Twins` holds TorchRL's in-process buffer (``theirs``) and a
``TDReplayBuffer`` on a real server (``ours``) built for the same table
kind, and writes the same rows to both. Every row has a unique ``id``
(its insert number), so what a sampler returns is checked by content:
each sampled row must be a row the buffer holds now, in the slot it
names. Rows belong to episodes of :data:`EPISODE` steps (``traj``), the
last step done.

TorchRL's ``PrioritizedSampler`` needs its C++ extension, which does not
load with this torch (``tests/storage/test_upstream_sentinels.py``). Then
the prioritized twin is TorchRL's buffer with its ``RandomSampler`` (the
same storage, writer, ``index``, ``len`` and ``write_count``) and the
priorities are checked against :class:`DocumentedPriorities`, the
behaviour TorchRL's ``PrioritizedSampler`` documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    SliceSampler,
    TensorDictReplayBuffer,
)

from tdreplay.torchrl import TDReplayBuffer

#: steps per episode of :func:`rows`
EPISODE = 5
#: the prioritized tables' settings (eps as TorchRL's default, so priorities compare exactly)
ALPHA, BETA, EPS = 0.6, 0.4, 1e-8
#: the slice tables' slice length (TorchRL's twin: ``num_slices = batch / SLICE_LEN``)
SLICE_LEN = 4


def rows(start: int, n: int) -> TensorDict:
    """Rows ``start .. start+n-1``: ``id``, an observation and reward made of it, episodes."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "id": ids,
            "observation": ids[:, None].float().expand(n, 3) * torch.tensor([1.0, -1.0, 0.5]),
            "traj": ids // EPISODE,
            "next": {
                "reward": ids[:, None].float() / 10,
                "done": (ids % EPISODE == EPISODE - 1)[:, None],
            },
        },
        [n],
    )


def prioritized_sampler_loads() -> bool:
    """Whether TorchRL's own ``PrioritizedSampler`` runs here (its C++ extension loads)."""
    try:
        PrioritizedSampler(max_capacity=2, alpha=ALPHA, beta=BETA)
    except RuntimeError:
        return False
    return True


@dataclass
class DocumentedPriorities:
    """What TorchRL's ``PrioritizedSampler`` documents (with its default
    ``max_priority_within_buffer=False``): a new item gets the largest priority
    ever set (1 before any), ``update_priority`` sets it, sampling weights are
    ``w_i = (p_i / min_j p_j) ** -beta`` with ``p = (priority + eps) ** alpha``
    over the items held; ``empty()`` starts anew."""

    priority: dict[int, float] = field(default_factory=dict)
    top: float = 1.0

    def written(self, slots: torch.Tensor) -> None:
        for slot in slots.reshape(-1).tolist():
            self.priority[slot] = self.top

    def update(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        for slot, value in zip(
            slots.reshape(-1).tolist(), values.reshape(-1).tolist(), strict=True
        ):
            self.priority[slot] = value
            self.top = max(self.top, value)

    def weight(self, slots: torch.Tensor) -> torch.Tensor:
        leaf = {s: (p + EPS) ** ALPHA for s, p in self.priority.items()}
        low = min(leaf.values())
        return torch.tensor([(leaf[s] / low) ** -BETA for s in slots.tolist()])


@dataclass
class Twins:
    """The same table kind on both sides; ``priorities`` set for prioritized tables."""

    kind: str
    ours: TDReplayBuffer
    theirs: TensorDictReplayBuffer
    capacity: int
    priorities: DocumentedPriorities | None = None
    next_id: int = 0

    @classmethod
    def make(cls, kind: str, url: str, table: str, capacity: int, transport: str = "auto") -> Twins:
        """``kind``: ``uniform``, ``prioritized``, ``slice`` (TorchRL's ``num_slices``) or
        ``slice_len`` (TorchRL's ``slice_len``); ours is created lazily, by ``create=``."""
        sampler: dict[str, Any] = {"kind": "uniform"}
        theirs: Any = RandomSampler()
        priorities = None
        if kind == "prioritized":
            sampler = {"kind": "prioritized", "alpha": ALPHA, "beta": BETA, "eps": EPS}
            if prioritized_sampler_loads():
                theirs = PrioritizedSampler(capacity, alpha=ALPHA, beta=BETA, eps=EPS)
            priorities = DocumentedPriorities()
        elif kind in ("slice", "slice_len"):
            sampler = {"kind": "slice", "slice_len": SLICE_LEN, "traj_key": "traj"}
            how = {"num_slices": 2} if kind == "slice" else {"slice_len": SLICE_LEN}
            theirs = SliceSampler(traj_key="traj", **how)
        create = {"capacity": capacity, "backend": "memory", "sampler": sampler}
        return cls(
            kind=kind,
            ours=TDReplayBuffer(url, table, create=create, timeout=5.0, transport=transport),
            theirs=TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=theirs),
            capacity=capacity,
            priorities=priorities,
        )

    def __enter__(self) -> Twins:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ours.close()

    def fresh(self, n: int) -> TensorDict:
        data = rows(self.next_id, n)
        self.next_id += n
        return data

    def held(self) -> dict[int, tuple[int, TensorDictBase]]:
        """``id -> (slot, row)`` of every row TorchRL's buffer holds now."""
        stored = self.theirs[:]
        return {int(i): (slot, stored[slot]) for slot, i in enumerate(stored["id"].tolist())}


def leaves(td: TensorDictBase) -> dict[Any, tuple[torch.dtype, tuple[int, ...]]]:
    """Each leaf key's dtype and shape."""
    return {
        k: (v.dtype, tuple(v.shape)) for k, v in td.items(include_nested=True, leaves_only=True)
    }


def same_rows(a: TensorDictBase, b: TensorDictBase, keys: list[Any]) -> None:
    """``a`` and ``b`` hold the same values in ``keys`` (dtype and shape included)."""
    assert a.batch_size == b.batch_size, (a.batch_size, b.batch_size)
    for key in keys:
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, (key, x.dtype, y.dtype, x.shape, y.shape)
        assert torch.equal(x, y), key


#: the row fields both buffers store (what :func:`rows` writes)
FIELDS: list[Any] = ["id", "observation", "traj", ("next", "reward"), ("next", "done")]

"""Importance weights of a prioritized table sharded over servers (no I/O: the plans use it).

A sharded sample is split across the servers in proportion to their sizes
(:func:`~tdreplay.client.merging.split_batch`), so item ``i`` of server ``s`` is drawn
with probability ``P(i) = N_s / N * p_i / T_s`` (``N_s`` the server's items, ``p_i``
the item's priority to the power alpha, ``T_s`` their sum on that server). Its weight
over the union, as one table's (TorchRL's), is ``(N P(i))^-beta = (N_s p_i / T_s)^-beta``
divided by the largest of every item, ``max_s (N_s p_min,s / T_s)^-beta``: the largest
of the servers' own largest weights. A server divides by its own, and sends it with
each item (``sample_info.max_weight``); :class:`ServerWeights` divides by the largest
of all servers holding items instead: those the batch was drawn from as they answered
it, any other as it last said (its last sample's answer, or its ``info``).

    >>> part = TensorDict({"sample_info": {"weight": torch.tensor([1.0, 0.5]),
    ...     "max_weight": torch.tensor([2.0, 2.0], dtype=torch.float64)}}, [2])
    >>> weights = ServerWeights(2)
    >>> weights.heard("t", 1, 8.0)  # server 1's largest weight, as its info said
    >>> weights.normalised("t", [(0, part)], sizes=[5, 5])[0]["sample_info", "weight"].tolist()
    [0.25, 0.125]
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from tensordict import TensorDict

from ..codec.protocol import MAX_WEIGHT

_WEIGHT = ("sample_info", "weight")


def largest_weight(part: TensorDict) -> float | None:
    """The largest ``max_weight`` of one server's answer (what it divided its weights by);
    ``None`` for a table that sends none (not prioritized)."""
    scale = part.get(MAX_WEIGHT, None)
    return None if scale is None or not len(scale) else float(scale.max())


class ServerWeights:
    """Each server's largest weight, by table, as it last said it (thread safe).

    Args:
        n: the servers.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._said: dict[str, list[float | None]] = {}
        self._lock = threading.Lock()

    def heard(self, table: str, shard: int, largest: float | None) -> None:
        """Server ``shard`` said ``largest`` is its largest weight of ``table`` (``None``:
        said nothing)."""
        if largest is not None:
            with self._lock:
                self._said.setdefault(table, [None] * self.n)[shard] = largest

    def heard_infos(self, table: str, infos: list[dict[str, Any] | None]) -> None:
        """What the servers' infos of ``table`` say (``None``: a server that did not answer)."""
        for shard, info in enumerate(infos):
            largest = ((info or {}).get("sampler") or {}).get("max_weight")
            self.heard(table, shard, float(largest) if isinstance(largest, int | float) else None)

    def forget(self, table: str) -> None:
        with self._lock:
            self._said.pop(table, None)

    def normalised(
        self, table: str, parts: list[tuple[int, TensorDict]], sizes: list[int]
    ) -> list[TensorDict]:
        """The ``(server, answer)`` parts of a sample of ``table``, each one's weights divided
        by the largest weight of every server holding items (``sizes``, as the batch was
        split) rather than by its own, and that as every item's ``max_weight``.

        A table without weights (no ``max_weight``) comes back as it is.
        """
        for shard, part in parts:
            self.heard(table, shard, largest_weight(part))
        if not parts or largest_weight(parts[0][1]) is None:
            return [part for _, part in parts]
        with self._lock:
            said = list(self._said[table])
        drawn = {shard for shard, _ in parts}
        largest = max(
            w for s, w in enumerate(said) if w is not None and (sizes[s] > 0 or s in drawn)
        )
        return [_reweigh(part, largest) for _, part in parts]


def _reweigh(part: TensorDict, largest: float) -> TensorDict:
    scale = part.get(MAX_WEIGHT)
    weight = part.get(_WEIGHT).to(torch.float64) * scale / largest
    part.set(_WEIGHT, weight.to(torch.float32))
    part.set(MAX_WEIGHT, torch.full_like(scale, largest))
    return part

"""``TDReplayBuffer``'s priority calls: TorchRL's names, the table's priorities."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.client import ReplayClient
from tdreplay.codec.params import check_lengths

from . import rows as R
from .remote import ServiceSampler


class PrioritiesMixin:
    """``update_priority`` and ``update_tensordict_priority`` of :class:`~.buffer.TDReplayBuffer`."""

    _client: ReplayClient
    _table: str
    _warned_uniform: bool
    priority_key: Any
    _sampler: ServiceSampler  # the buffer's (a property there)

    def update_priority(  # type: ignore[override]
        self, index: Any, priority: Any, *, key: Any = None
    ) -> int:
        """Set the priorities of the items at ``index`` (from ``batch["index"]``).

        ``priority`` is one per item, or one number for all of them (as TorchRL's).
        Pass ``key=batch["sample_info", "key"]`` and slots overwritten since the
        sample keep their new items' priorities. On a table without priorities
        this does nothing (with a warning, as TorchRL's samplers do).

        Returns:
            How many priorities were applied.

        Raises:
            InvalidRequest: ``index``, ``priority`` (and ``key``) differ in length (a
                ``ValueError``, naming them), or a bad index or priority (negative, not finite).
        """
        if not self._sampler.prioritized:
            if not self._warned_uniform:
                self._warned_uniform = True
                warnings.warn(
                    f"update_priority on table {self._table!r}, whose sampler "
                    f"{self._sampler.kind!r} keeps no priorities: nothing is updated",
                    UserWarning,
                    stacklevel=2,
                )
            return 0
        if isinstance(index, tuple):
            index = torch.stack([torch.as_tensor(i) for i in index], -1)[..., 0]
        index = torch.as_tensor(index).reshape(-1)
        priority = torch.as_tensor(priority).reshape(-1)
        if priority.numel() == 1:  # as TorchRL: one number for every item
            priority = priority.expand(len(index))
        if key is not None:
            key = torch.as_tensor(key).reshape(-1)
        check_lengths(index, priority=priority, key=key, table=self._table)
        kept = index >= 0  # as TorchRL: -1 is a row a max_value writer dropped
        if not bool(kept.all()):
            index, priority = index[kept], priority[kept]
            key = None if key is None else key[kept]
        if not len(index):  # as TorchRL: nothing to update
            return 0
        return self._client.update_priority(self._table, index, priority, key=key)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:  # type: ignore[override]
        """Send the priorities a loss wrote in a sampled batch (``priority_key``) to the table.

        Reads ``index`` and ``priority_key`` (reduced to one value per item with
        ``max``, as TorchRL does) and ``("sample_info", "key")`` when present, so
        items overwritten since the sample are left alone. Does nothing for
        tables without priorities, like TorchRL.

        Raises:
            KeyError: the batch has no ``index`` or no ``priority_key``.
        """
        if not self._sampler.prioritized:
            return
        index = R.flat_index(data)
        priority = R.priority_vector(data, self.priority_key)
        key = data.get(("sample_info", "key"), None)
        self._client.update_priority(
            self._table, index, priority, key=None if key is None else key.reshape(-1)
        )

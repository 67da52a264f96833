"""TorchRL's buffer constructor arguments that ``TDReplayBuffer`` does not take, and what to use.

A TorchRL script switching constructors may carry arguments of TorchRL's
``ReplayBuffer`` / ``TensorDictPrioritizedReplayBuffer`` along. The table's
schema (or ``create=``) decides what they decide there, so each is refused
by name with the way to get the same (:func:`refuse_torchrl_options`),
rather than reaching the client's constructor as an unknown keyword.

    >>> refuse_torchrl_options({"token": "t"})  # client options pass
    >>> refuse_torchrl_options({"alpha": 0.7})
    Traceback (most recent call last):
    ...
    TypeError: TDReplayBuffer does not take TorchRL's alpha=: the table's sampler decides it: create={'sampler': {'kind': 'prioritized', 'alpha': ..., 'beta': ..., 'eps': ...}} (or the schema's sampler block)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SAMPLER = (
    "the table's sampler decides it: create={'sampler': {'kind': 'prioritized', 'alpha': ..., "
    "'beta': ..., 'eps': ...}} (or the schema's sampler block)"
)
_SERVED = "the buffer's work is done by the server: nothing runs in this process to configure"

#: each TorchRL constructor argument ``TDReplayBuffer`` refuses -> what gives the same here
TORCHRL_ONLY: dict[str, str] = {
    "storage": "the table's storage is declared by its schema, or create={'capacity': N, "
    "'backend': 'memmap'}",
    "sampler": "the table's sampler is declared by its schema, or create={'sampler': {'kind': "
    "'prioritized' | 'slice' | 'without_replacement' | 'fifo' | 'lifo', ...}}",
    "writer": "the table's writer is declared by its schema, or create={'writer': {'kind': "
    "'max_value', 'key': ...}}",
    "alpha": _SAMPLER,
    "beta": _SAMPLER,
    "eps": _SAMPLER,
    "dtype": _SAMPLER,
    "reduction": "priorities are reduced to one per item with max (TorchRL's default)",
    "sample_unit": "a slice table samples sequences: create={'sampler': {'kind': 'slice', "
    "'slice_len': L, 'traj_key': ...}}",
    "consume_after_n_samples": "the table's max_times_sampled removes an item sampled that often",
    "collate_fn": "samples come back as TensorDicts; change them with transform= or "
    "append_transform()",
    "pin_memory": "ReplayClient.loader(table, n, device=...) stages batches in pinned memory",
    "sampler_device": _SERVED,
    "dim_extend": "a [B, T] batch is stored as B * T rows (its steps), slots returned [B, T]",
    "generator": "the server's samplers draw from its own generator (serve --seed N)",
    "transform_factory": "pass transform= (it pickles with the buffer to collector workers)",
    "checkpointer": "dumps()/loads() save the table's whole state; the table's checkpoint: "
    "{ted2flat: true} writes TorchRL's flat TED layout",
    "shared": "nothing to share: every process opens its own connection",
    "sync": _SERVED,
    "compilable": _SERVED,
    "delayed_init": "the table exists on the server, or create= makes it at the first extend",
    "service_backend": "the buffer is a service already (its server)",
    "service_backend_options": "the buffer is a service already (its server)",
    "transport_options": "client options (token=, transport=, retry=...) are keywords of "
    "TDReplayBuffer",
}


def refuse_torchrl_options(options: Mapping[str, Any]) -> None:
    """Refuse the first of ``options`` that is one of TorchRL's constructor arguments.

    Raises:
        TypeError: naming the argument and what decides it for a table.
    """
    for name in options:
        if name in TORCHRL_ONLY:
            raise TypeError(f"TDReplayBuffer does not take TorchRL's {name}=: {TORCHRL_ONLY[name]}")

"""TorchRL integration: a replay buffer whose storage and sampler live in a tdreplay server.

:class:`TDReplayBuffer` is a TorchRL ``TensorDictReplayBuffer`` to TorchRL —
collectors take it as ``replay_buffer=``, losses read its ``priority_weight``
and ``update_tensordict_priority`` sends their ``td_error`` back — while its
table is held by a tdreplay server. Switching is one constructor line::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)
    rb = TDReplayBuffer("http://replay:8000", "cartpole", batch_size=256)

:func:`spec_from_tensordict` writes the schema of a table that stores what a
TensorDict (a collector's batch) holds. Needs the ``tdreplay[torchrl]``
extra. Client-side only: it uses :mod:`tdreplay.client` and
:mod:`tdreplay.codec`, never the service or the storage.

    >>> from tdreplay.torchrl import TDReplayBuffer, spec_from_tensordict
"""

from .buffer import TDReplayBuffer
from .remote import ServiceSampler, ServiceStorage, ServiceWriter
from .rows import spec_from_tensordict

__all__ = [
    "ServiceSampler",
    "ServiceStorage",
    "ServiceWriter",
    "TDReplayBuffer",
    "spec_from_tensordict",
]

"""A batch on the client: the rows a caller hands to ``extend`` (:func:`as_batch`), and a
sample's body decoded into a TensorDict (:func:`decode_batch`), for both transports.

    >>> import torch
    >>> as_batch({"obs": torch.zeros(4, 3)}).batch_size
    torch.Size([4])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensordict import TensorDict, TensorDictBase, is_tensorclass

from ..codec import arrow
from ..codec.ipc import LayoutDecoder
from . import errors


def as_batch(data: Any) -> TensorDictBase:
    """The rows to send: a TensorDict of batch ``[N]``.

    A tensorclass is unwrapped; a mapping of tensors becomes a TensorDict; a
    single item (batch ``[]``) becomes one row; several batch dims
    (``[envs, time]`` from a vectorized collector) are flattened in row-major
    order, which keeps each environment's steps together.
    """
    if is_tensorclass(data):
        data = data._tensordict
    elif isinstance(data, Mapping) and not isinstance(data, TensorDictBase):
        data = TensorDict(dict(data), batch_size=[])
        data.auto_batch_size_(batch_dims=1)
    if not isinstance(data, TensorDictBase):
        raise TypeError(f"expected a TensorDict, tensorclass or mapping, got {type(data).__name__}")
    if data.batch_dims == 0:
        return data.unsqueeze(0)
    if data.batch_dims > 1:
        return data.reshape(-1)
    return data


#: decodes sample responses: a client receives the same layout (table, batch size) again and
#: again, so after the first one the columns are sliced, not parsed (shared by every thread)
_decoder = LayoutDecoder()


def decode_batch(body: memoryview | bytes) -> TensorDict:
    """The TensorDict a sample response carries: views on ``body`` (bool columns excepted).

    Raises:
        errors.ProtocolError: the body is not an Arrow stream of one record batch
            the codec can decode.
    """
    try:
        return _decoder.decode(body)
    except arrow.CodecError as err:
        raise errors.ProtocolError(f"bad Arrow response: {err}") from None

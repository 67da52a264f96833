"""Parity: a ``batch_size`` given both to the constructor and to ``sample``.

TorchRL's ``ReplayBuffer.sample`` warns (a ``UserWarning``, once per buffer) when the two
differ, and the size given to ``sample`` prevails; the same size twice, or ``sample()``
alone, is silent. ``TDReplayBuffer`` sampled the size given to ``sample`` without a word.
Both buffers, TorchRL's in-process one and ours on a real server, get the same calls.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest
from parity_kit import rows
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from tdreplay.client import InvalidRequest
from tdreplay.torchrl import TDReplayBuffer

_names = itertools.count()


def test_a_conflicting_sample_size_warns_once_as_torchrl(server: Any) -> None:
    create = {"capacity": 16, "backend": "memory"}
    ours = TDReplayBuffer(
        server.url, f"batch_size_{next(_names)}", batch_size=4, create=create, timeout=5.0
    )
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    with ours:
        for rb in (ours, theirs):
            rb.extend(rows(0, 8))
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the same size, or none: silent
                assert rb.sample().batch_size == (4,)
                assert rb.sample(4).batch_size == (4,)
            with pytest.warns(
                UserWarning,
                match=r"conflicting batch_sizes in constructor \(4\) "
                r"and `sample` \(6\).*sample method will prevail",
            ) as told:
                assert rb.sample(6).batch_size == (6,)
            assert len(told) == 1 and told[0].category is UserWarning
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # once per buffer
                assert rb.sample(3).batch_size == (3,)
                assert rb.sample().batch_size == (4,)


def test_a_refused_sample_size_neither_warns_nor_spends_the_warning(server: Any) -> None:
    """``sample(0)`` is refused (InvalidRequest, the contract's rule): it warned first that
    0 would prevail, and spent the one warning, so the conflicting size that followed was
    sampled without a word. Bad input changes nothing."""
    create = {"capacity": 16, "backend": "memory"}
    with TDReplayBuffer(
        server.url, f"batch_size_{next(_names)}", batch_size=4, create=create, timeout=5.0
    ) as rb:
        rb.extend(rows(0, 8))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(InvalidRequest, match="batch_size"):
                rb.sample(0)
        with pytest.warns(UserWarning, match=r"constructor \(4\) and `sample` \(6\)"):
            assert rb.sample(6).batch_size == (6,)

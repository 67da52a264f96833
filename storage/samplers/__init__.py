"""Samplers: which slots a sample returns. They see indices and priorities, never data."""

from __future__ import annotations

import torch

from .. import spec as S
from ..slots import Slots
from .base import Sampler, no_priorities
from .prioritized import PrioritizedSampler
from .queue import FifoSampler, LifoSampler
from .slice import SliceSampler
from .sumtree import SumTree
from .uniform import UniformSampler, WithoutReplacementSampler

__all__ = [
    "FifoSampler",
    "LifoSampler",
    "PrioritizedSampler",
    "Sampler",
    "SliceSampler",
    "SumTree",
    "UniformSampler",
    "WithoutReplacementSampler",
    "make_sampler",
    "no_priorities",
]


def make_sampler(
    spec: S.TableSpec, slots: Slots, writer: object, generator: torch.Generator | None = None
) -> Sampler:
    """Build the sampler ``spec.sampler`` declares."""
    s = spec.sampler
    if isinstance(s, S.UniformSamplerSpec):
        return UniformSampler(slots, generator)
    if isinstance(s, S.PrioritizedSamplerSpec):
        return PrioritizedSampler(
            slots,
            generator,
            alpha=s.alpha,
            beta=s.beta,
            eps=s.eps,
            initial_priority=s.initial_priority,
        )
    if isinstance(s, S.FifoSamplerSpec):
        return FifoSampler(slots, generator, ring=writer)
    if isinstance(s, S.LifoSamplerSpec):
        return LifoSampler(slots, generator, stack=writer)
    if isinstance(s, S.WithoutReplacementSamplerSpec):
        return WithoutReplacementSampler(slots, generator)
    if isinstance(s, S.SliceSamplerSpec):
        return SliceSampler(slots, generator, slice_len=s.slice_len)
    raise AssertionError(f"unknown sampler {s!r}")

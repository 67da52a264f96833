"""Process-wide settings the hot path depends on, applied on purpose at start.

* glibc's malloc: by default its mmap threshold adapts at run time, and
  multi-megabyte request bodies then flip between heap and fresh ``mmap``
  allocations from run to run (seen: 8 MiB bodies at 0.8 or 2.9 GB/s). The
  server pins ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` with ``mallopt``,
  the same as starting it with ``MALLOC_MMAP_THRESHOLD_`` /
  ``MALLOC_TRIM_THRESHOLD_`` in the environment (which, when set, win).
* what loading the tables freed (fresh bookkeeping replaced by the mapped
  state of a reopened table, scans on reopen) goes back to the system at the
  end of the start (``malloc_trim``): a reopened table costs its bookkeeping,
  not the start's garbage (seen: 121 MB for a 1M-row table without it).
* torch's intra-op threads: a server sharing its cores with clients holds up
  better on one thread than on torch's default of one per core.
"""

from __future__ import annotations

import logging

import torch

from tdreplay.system import pin_malloc, trim

from .settings import Settings

__all__ = ["apply", "pin_malloc", "trim"]

log = logging.getLogger("tdreplay.service")


def apply(settings: Settings) -> None:
    """Apply the settings' malloc thresholds and torch thread count to this process."""
    if pin_malloc(settings.malloc_mmap_threshold, settings.malloc_trim_threshold):
        log.debug(
            "malloc: mmap threshold %d, trim threshold %d",
            settings.malloc_mmap_threshold,
            settings.malloc_trim_threshold,
        )
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)

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

import ctypes
import ctypes.util
import logging
import os

import torch

from .settings import Settings

log = logging.getLogger("tdreplay.service")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def pin_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's mmap and trim thresholds with ``mallopt``; ``False`` where that is not possible."""
    if not mmap_threshold:
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False  # glibc read the operator's choice at process start
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)))
    if trim_threshold and "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        ok = bool(mallopt(M_TRIM_THRESHOLD, int(trim_threshold))) and ok
    return ok


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name is not None else None
    except OSError:
        return None


def trim() -> bool:
    """Give memory malloc holds free back to the system (glibc's ``malloc_trim``); ``False``
    where there is no such call (musl, macOS)."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_size_t]
    return bool(fn(0))


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

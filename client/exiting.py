"""The loader's fetcher threads, stopped and joined when the interpreter exits.

Fetchers are daemon threads so that a learner that never closes its loader
can still exit; :func:`track` registers a pass's fetching side (anything with
``close()`` and ``threads``), and the first registration hooks the exit.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Any


def track(pipe: Any) -> None:
    """Stop ``pipe`` (``close()``, then join its ``threads``) at interpreter exit if it still runs."""
    _hook_exit()
    _PIPELINES.add(pipe)


#: the pipelines whose fetcher threads may still run; stopped and joined at interpreter exit
_PIPELINES: weakref.WeakSet[Any] = weakref.WeakSet()
_EXIT_JOIN_S = 5.0
_exit_hook = threading.Lock()
_hooked = False


def _stop_at_exit() -> None:
    """Stop every fetcher and wait for it (up to ``_EXIT_JOIN_S`` in all).

    Fetchers are daemon threads so that a learner that never closes its
    loader can still exit. Left running, one would be inside torch (decoding
    or copying a batch) while the interpreter tears torch down — a segfault,
    or a C++ thread unwound mid-call ("terminate called without an active
    exception"). A fetcher stops at its next batch boundary; one waiting on
    the server finishes its request first.
    """
    pipes = list(_PIPELINES)
    for pipe in pipes:
        pipe.close()
    deadline = time.monotonic() + _EXIT_JOIN_S
    for pipe in pipes:
        for t in pipe.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _hook_exit() -> None:
    """Run :func:`_stop_at_exit` when the interpreter exits, before anything is torn down."""
    global _hooked
    with _exit_hook:
        if _hooked:
            return
        _hooked = True
    # threading's exit hooks run first at shutdown: before the executors' (whose
    # workers may be waiting on a batch: the async loader), before atexit and
    # weakref finalizers (torch's among them); concurrent.futures uses it so
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_stop_at_exit)
            return
        except RuntimeError:  # the interpreter is already shutting down
            return
    atexit.register(_stop_at_exit)  # pragma: no cover - Pythons without the hook

"""What tdreplay asks of the operating system, in one place: shared memory (``memfd``
files, mappings that keep no descriptor), the host's identity, polling a socket, and
glibc's malloc.

Everything here is Linux (glibc for the malloc calls); each call says what it
does where that is missing, and the same-host transport is offered only where
:func:`shm_supported` holds.

    >>> len(host_id()) > 0
    True
    >>> fd = sealed_memfd("doc", 4096)
    >>> m = SharedMap(fd, 4096); os.close(fd)
    >>> m.buffer[0] = b"x"; m.buffer[0]
    b'x'
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import math
import mmap
import os
import socket
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = [
    "MADV_REMOVE",
    "SEALS",
    "SharedMap",
    "host_id",
    "pin_malloc",
    "poll",
    "Poller",
    "cpu_to_spare",
    "sealed_memfd",
    "shm_supported",
    "trim",
]


def host_id() -> str:
    """This host's identity: the kernel's boot id (containers on one host share it), else
    the host name. A server publishes it; a client on the same host finds it equal."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


# -- shared memory ------------------------------------------------------------------
def shm_supported() -> bool:
    """Whether this OS offers what the transport needs (``memfd_create``, seals, ``SCM_RIGHTS``)."""
    return (
        hasattr(os, "memfd_create")
        and hasattr(fcntl, "F_ADD_SEALS")
        and hasattr(socket, "AF_UNIX")
        and hasattr(socket, "SCM_RIGHTS")
    )


#: a memfd's size is fixed for good before its descriptor leaves the process
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def sealed_memfd(name: str, size: int) -> int:
    """An anonymous memory file (``memfd_create``: no name in any file system, no
    ``/dev/shm``) of ``size`` bytes, reserved (``posix_fallocate``: a full memory fails
    here, not as SIGBUS later) and sealed against resizing (whoever gets its descriptor
    cannot truncate it under another's mapping). Returns its descriptor.

    Raises:
        OSError: no memory or descriptors (``ENOSPC``, ``ENOMEM``, ``EMFILE``, ...).
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
#: madvise: free the pages *and* their backing store (a hole punched in the memfd)
MADV_REMOVE = getattr(mmap, "MADV_REMOVE", 9)
_MAP_FAILED = ctypes.c_void_p(-1).value


class SharedMap:
    """A shared, writable mapping of ``size`` bytes of file ``fd`` that keeps no descriptor.

    (``mmap.mmap`` keeps a duplicate of the descriptor for as long as the
    mapping lives: one descriptor per slot.) ``buffer`` is a ctypes array
    over the mapping; views of it (``torch.frombuffer``) keep it alive, and
    the mapping is unmapped once it and they are gone.

    Raises:
        OSError: the mapping failed (``ENOMEM`` and the like).
    """

    def __init__(self, fd: int, size: int) -> None:
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.size = size
        self.addr = addr
        self.buffer = (ctypes.c_char * size).from_address(addr)
        # unmapped when the buffer goes: after this object and every view of it
        weakref.finalize(self.buffer, _libc.munmap, addr, size)

    def discard(self) -> None:
        """Free the file's memory, in every process that maps it (a hole punched in it:
        reads give zeros from then on). What another process still holds of the file
        costs nothing until it writes there again - its own memory then, not this one's.

        Raises:
            OSError: the kernel refused (a file sealed against writes, or no hole support).
        """
        if _libc.madvise(self.addr, self.size, MADV_REMOVE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


# -- polling ---------------------------------------------------------------------------
T = TypeVar("T")


def poll(read: Callable[[], T], seconds: float) -> T | None:
    """Call ``read`` (a read of a non-blocking socket) again and again while it raises
    ``BlockingIOError``, for at most ``seconds``: its result, or ``None`` when nothing
    came in time.

    A thread that sleeps in the kernel until an answer comes leaves its CPU idle, and
    waking an idle CPU costs tens of microseconds on a virtual machine (measured here:
    ~35 µs a wake-up, two per round trip). Polling for an answer that comes soon keeps
    the CPU awake, for the CPU time the polling burns; both ends of the same-host
    socket poll through a :class:`Poller`, only while the other end answered within the
    window the last time. Between reads the thread yields its CPU
    (``sched_yield``) to any other thread that wants it.

        >>> a, b = socket.socketpair(); a.setblocking(False)
        >>> poll(lambda: a.recv(8), 0.0005) is None
        True
        >>> b.send(b"hi")
        2
        >>> poll(lambda: a.recv(8), 1.0)
        b'hi'
        >>> a.close(); b.close()
    """
    end = time.perf_counter() + seconds
    while True:
        try:
            return read()
        except BlockingIOError:
            if time.perf_counter() >= end:
                return None
            os.sched_yield()


#: seconds a reading of the runnable threads is trusted
_RUNNABLE_TTL = 0.01
#: [when read, whether a CPU was to spare, whether that reading had more threads than CPUs]
_runnable: list[float] = [-math.inf, 1.0, 0.0]


def cpu_to_spare() -> bool:
    """Whether the machine had no more runnable threads than CPUs, the caller included, a
    moment ago: ``False`` once two readings of ``/proc/loadavg`` in a row (read at most
    every 10 ms) counted more (one such reading is often a passing kernel thread);
    ``True`` where it is missing. Polling on a machine with no CPU to spare takes a CPU
    another thread needs."""
    now = time.perf_counter()
    if now - _runnable[0] < _RUNNABLE_TTL:
        return bool(_runnable[1])
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        over = running > (os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        over = False
    spare = not (over and _runnable[2])
    _runnable[0], _runnable[1], _runnable[2] = now, spare, over
    return spare


#: seconds a poll may spend off its CPU before that counts as losing it (a passing
#: interrupt or kernel thread takes tens of microseconds; a busy thread beside the poller
#: takes milliseconds)
LOST_CPU = 0.0005
#: seconds a :class:`Poller` pauses after a poll that did not pay (doubled for each more
#: in a row)
FIRST_PAUSE = 0.001


class Poller:
    """:func:`poll` for up to ``seconds`` while polling pays: when the other end's last
    answer (or request) came within ``seconds``, and not for a while after a poll that did
    not pay: one that found nothing in time, or during which the thread lost its CPU for
    half the time or more, and :data:`LOST_CPU` at least (the machine has more runnable
    threads than CPUs: a thread polling then holds a CPU the answer needs; measured here
    with one busy process beside a client and server, polling made one-item calls 2.5x
    slower).

    The pause doubles with each such poll in a row, from :data:`FIRST_PAUSE` up to
    ``pause`` seconds, and a poll that pays ends the run: one passing interrupt costs a
    millisecond of polling, not ``pause`` (a tight loop of one-item calls makes ten in a
    millisecond and hundreds in 50), while a busy machine is polled a few times a second.

        >>> a, b = socket.socketpair(); a.setblocking(False)
        >>> poller = Poller(0.0005, spare=lambda: True)
        >>> poller.ready(), poller.read(lambda: a.recv(8)), poller.ready()
        (True, None, False)
        >>> a.close(); b.close()
    """

    def __init__(
        self, seconds: float, pause: float = 0.05, spare: Callable[[], bool] = cpu_to_spare
    ) -> None:
        self.seconds = seconds
        self.pause = pause
        self.spare = spare  # whether the machine has a CPU to spare (:func:`cpu_to_spare`)
        self.resume = 0.0  # time.perf_counter() from which polling is tried again
        self.unpaid = 0  # polls in a row that did not pay
        self.polls = 0  # polls so far

    def ready(self, waited: float = 0.0) -> bool:
        """Whether polling is worth trying now, the other end's last answer having taken
        ``waited`` seconds to come (the machine must have a CPU to spare, too)."""
        return waited < self.seconds and time.perf_counter() >= self.resume and self.spare()

    def read(self, read: Callable[[], T], most: float = math.inf) -> T | None:
        """:func:`poll` ``read`` for up to ``seconds`` (``most``, if less: a poll cut short
        that finds nothing is no sign polling does not pay): its result, or ``None``."""
        self.polls += 1
        began, cpu = time.perf_counter(), time.thread_time()
        got = poll(read, min(self.seconds, most))
        now = time.perf_counter()
        missed = got is None and most >= self.seconds
        lost = (now - began) - (time.thread_time() - cpu)  # off its CPU meanwhile
        if missed or (lost > LOST_CPU and lost > (now - began) / 2):
            self.unpaid += 1
            self.resume = now + min(self.pause, FIRST_PAUSE * 2 ** min(self.unpaid - 1, 32))
        elif got is not None:
            self.unpaid = 0
        return got


# -- glibc's malloc -------------------------------------------------------------------
#: mallopt's parameters
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def pin_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's mmap and trim thresholds with ``mallopt``; ``False`` where that is not possible."""
    if not mmap_threshold:
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False  # glibc read the operator's choice at process start
    mallopt = getattr(_libc, "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)))
    if trim_threshold and "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        ok = bool(mallopt(M_TRIM_THRESHOLD, int(trim_threshold))) and ok
    return ok


def trim() -> bool:
    """Give memory malloc holds free back to the system (glibc's ``malloc_trim``); ``False``
    where there is no such call (musl, macOS)."""
    fn = getattr(_libc, "malloc_trim", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_size_t]
    return bool(fn(0))

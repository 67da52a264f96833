"""What tdreplay asks of the operating system, in one place: shared memory (``memfd``
files, mappings that keep no descriptor), the host's identity, polling a socket
(:mod:`.polling`), glibc's malloc, and a writable temporary directory before torch is
imported (:mod:`.tempdir`); and free loopback ports for the servers the test suite and the
benchmarks start (:mod:`.ports`).

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
import mmap
import os
import socket
import weakref
from pathlib import Path

from .polling import Poller, cpu_allowance, cpu_to_spare, poll

__all__ = [
    "MADV_REMOVE",
    "SEALS",
    "SharedMap",
    "host_id",
    "pin_malloc",
    "poll",
    "Poller",
    "cpu_allowance",
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

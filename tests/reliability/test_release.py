"""A deleted or cleared table gives its disk and memory back at once, under a real ``tdreplay serve``.

What a server process still holds is read from ``/proc/<pid>/maps`` (files mapped, deleted
ones marked ``(deleted)``: their blocks stay taken while mapped) and ``/proc/<pid>/fd``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reliability_helpers import call, create, extend
from service_helpers import rows, spec

from tdreplay.client import ReplayClient
from tdreplay.codec import protocol


def deleted_mappings(server: Any, under: Path | str) -> set[str]:
    """Files under ``under`` the server still maps though they were deleted."""
    with open(f"/proc/{server.proc.pid}/maps") as maps:
        return {
            line.split(maxsplit=5)[5].strip()
            for line in maps
            if line.rstrip().endswith("(deleted)") and str(under) in line
        }


def test_a_deleted_or_cleared_memmap_table_unmaps_its_files(
    live_server: Callable[..., Any],
) -> None:
    """The files of a memmap table deleted (or replaced by a clear) were still mapped by the
    server until Python's cycle collector ran, which a quiet server may never do: their
    disk blocks stayed taken though the files were gone."""
    server = live_server()
    create(server, "gone", capacity=256, backend={"kind": "memmap"})
    extend(server, 0, 200, name="gone")
    call(server, "POST", protocol.table_path("gone", "clear"))
    assert deleted_mappings(server, server.root) == set()
    extend(server, 0, 200, name="gone")
    call(server, "DELETE", protocol.table_path("gone"))
    assert deleted_mappings(server, server.root) == set()
    assert not os.path.exists(server.root / "tables" / "gone")


def shared_segments(server: Any) -> set[str]:
    """The shared-memory segments (files of ``/dev/shm``, deleted once opened) the server holds."""
    fds = Path(f"/proc/{server.proc.pid}/fd")
    held = set()
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("/dev/shm/"):
            held.add(target)
    return held


def test_a_table_sampled_over_shared_memory_is_let_go_when_deleted_or_cleared(
    live_server: Callable[..., Any],
) -> None:
    """A shared-memory slot held its table (the slot's owner) while the client held the slot,
    and for ``linger`` (10 minutes) after: each clear of a table a learner sampled over
    shared memory kept the old table's whole storage (seen: +200 MB a clear of a 200 MB
    memory table), and a deleted table stayed in memory."""
    server = live_server()
    client = ReplayClient(server.url, transport="shm")
    before = shared_segments(server)
    client.create_table(spec("pinned", 256, backend={"kind": "shared"}))
    client.extend("pinned", rows(0, 200))
    first = shared_segments(server) - before
    assert first, "a shared table holds segments"
    client.sample("pinned", 8)
    client.clear("pinned")
    client.extend("pinned", rows(0, 200))
    assert shared_segments(server) - before - first, "the cleared table's segments"
    assert not first & shared_segments(server), "the old table's segments are let go"
    client.sample("pinned", 8)  # the same slot, laid out for the new table
    client.delete_table("pinned")
    assert shared_segments(server) == before
    client.close()


def test_a_stopped_server_leaves_no_redis_keys_behind(
    live_server: Callable[..., Any], redis_server: dict
) -> None:
    """A restarted server allocates its redis tables afresh (it never reattaches their
    keys): the keys a stopped server left were never read again, and each restart of a
    server with a redis table left another capacity-sized copy in Redis for good (seen:
    6, 12, 18 keys after three restarts)."""
    client = redis_server["client"]
    for _ in range(2):  # what the first server wrote is gone before the second starts
        server = live_server(redis=redis_server["url"])
        create(server, "kept", capacity=256, backend={"kind": "redis", "prefix": "release-test"})
        extend(server, 0, 100, name="kept")
        assert list(client.scan_iter(match="release-test:*"))
        server.stop()  # SIGTERM: a graceful stop
        assert list(client.scan_iter(match="release-test:*")) == []

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

"""A server with no writable temporary directory, as in ``docker run --read-only`` without
``--tmpfs /tmp``: it starts, its temporary folder under the data root; or, with no data root
to fall back to, it says what to mount in one line.

torch asks Python for a temporary directory as it is imported, and Python finds none when
``/tmp``, ``/var/tmp`` and the working directory are read-only: the server ended at start in
a 25-line traceback out of torch. Each server here runs in a mount namespace of its own
(``unshare -m``: needs root or CAP_SYS_ADMIN; skipped with the reason where it is refused)
whose ``/tmp`` and ``/var/tmp`` are read-only, its working directory ``/tmp``, its data root
(under pytest's ``/tmp`` folder) writable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import check_rows, create, extend

#: runs the command after it (``$1``: the data root, kept writable) with /tmp and /var/tmp
#: read-only and /tmp its working directory
READ_ONLY_TMP = (
    'mount --make-rprivate / && mount --bind /tmp /tmp && mount --bind "$0" "$0" && '
    "mount -o remount,bind,ro /tmp && mount --bind /var/tmp /var/tmp && "
    'mount -o remount,bind,ro /var/tmp && cd /tmp && exec "$@"'
)
NO_TMPDIR = {"TMPDIR": ""}  # Python skips an empty TMPDIR


@pytest.fixture
def read_only_tmp(tmp_path: Path) -> tuple[list[str], Path]:
    """``(wrap, root)``: the command prefix, and the data root it keeps writable."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    root = tmp_path / "data"
    root.mkdir()
    wrap = [unshare, "-m", "sh", "-c", READ_ONLY_TMP, str(root)]
    probe = "import tempfile\ntry: tempfile.gettempdir()\nexcept FileNotFoundError: print('none')"
    tried = subprocess.run(
        [*wrap, "env", "TMPDIR=", sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if tried.returncode != 0:
        pytest.skip(f"cannot mount /tmp read-only here: {tried.stderr.strip()}")
    if tried.stdout.strip() != "none":  # a writable /usr/tmp, say
        pytest.skip(f"Python finds a writable temporary directory all the same: {tried.stdout}")
    return wrap, root


def test_the_server_starts_with_no_writable_tmp(
    live_server: Any, read_only_tmp: tuple[list[str], Path]
) -> None:
    wrap, root = read_only_tmp
    env = {**NO_TMPDIR, "TDREPLAY_ROOT": str(root)}  # as the image sets it
    server = live_server(root=root, env=env, fresh=True, wrap=wrap)
    create(server, "t")
    extend(server, 0, 16)
    check_rows(server, 16, batch=4)  # sampled, bit for bit
    assert (root / ".tmp").is_dir() and oct((root / ".tmp").stat().st_mode & 0o777) == "0o700"
    assert "Traceback" not in server.output()
    assert json.loads(server.request("GET", "/readyz")[2])["status"] == "ready"


def test_with_no_data_root_to_fall_back_to_it_says_what_to_mount_in_one_line(
    read_only_tmp: tuple[list[str], Path],
) -> None:
    wrap, root = read_only_tmp
    env = {k: v for k, v in os.environ.items() if not k.startswith("TDREPLAY_")}
    done = subprocess.run(
        [*wrap, sys.executable, "-m", "tdreplay.cli", "serve", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, **NO_TMPDIR},
    )
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    for named in ("tdreplay: no writable temporary directory", "--tmpfs /tmp", "TMPDIR"):
        assert named in lines[0]
    assert list(root.iterdir()) == []  # nothing was made

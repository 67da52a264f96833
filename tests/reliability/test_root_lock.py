"""One process per data root: a second server, or the demo, is refused and the first keeps its data."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import check_rows, create, env, extend, python
from testkit import free_port

from tdreplay.storage.errors import RootLocked, TDReplayError
from tdreplay.storage.rootlock import lock_root

HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "os.write(fd, str(os.getpid()).encode())\n"
    "print('locked', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_root_has_one_holder_until_it_lets_go(tmp_path: Path) -> None:
    root = tmp_path / "data"
    lock = lock_root(root)
    assert (root / ".lock").read_text().strip() == str(os.getpid())
    with pytest.raises(RootLocked) as caught:
        lock_root(root)  # a second lock of this very process is refused too
    err = caught.value
    assert isinstance(err, TDReplayError)
    assert err.pid == os.getpid() and err.root == str(root)
    assert f"process {os.getpid()}" in str(err) and str(root) in str(err)
    lock.close()
    lock.close()  # idempotent
    assert not lock.held
    with lock_root(root) as again:
        assert again.held
    assert not again.held


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RootLocked, match=f"process {holder.pid}"):
            lock_root(root)
    finally:
        holder.kill()
        holder.wait()
    assert (root / ".lock").read_text().strip() == str(holder.pid)  # stale, as a crash leaves it
    with lock_root(root):
        assert (root / ".lock").read_text().strip() == str(os.getpid())


def test_a_second_server_and_the_demo_are_refused(
    live_server: Callable[..., Any], tmp_path: Path
) -> None:
    root = tmp_path / "data"
    first = live_server(root=root)
    create(first, backend={"kind": "memmap"})  # on disk: what a second process would delete
    extend(first, 0, 20)
    files = sorted(p.relative_to(root) for p in (root / "tables").rglob("*"))
    assert files
    second = python(
        "-m", "tdreplay.service", "serve", "--root", str(root), "--port", str(free_port()),
        "--log-level", "warning",
    )  # fmt: skip
    demo = python("-m", "tdreplay.storage.demo", "--root", str(root), "--steps", "100")
    for proc, what in ((second, "tdreplay serve"), (demo, "the demo")):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode != 0, f"{what} started on a locked root:\n{out}"
        assert f"is in use by process {first.proc.pid}" in out, out
        assert repr(str(root)) in out, out
    assert not (root / "demo").exists()
    assert sorted(p.relative_to(root) for p in (root / "tables").rglob("*")) == files
    check_rows(first, 20, batch=64)
    extend(first, 20, 5)
    check_rows(first, 25, batch=64)


def test_a_root_of_another_user_is_refused_saying_whose(tmp_path: Path) -> None:
    """A volume made by another user (a host folder Docker created as root, mounted into a
    container that runs as uid 10001): the server names the root, its owner and its own user."""
    base = tmp_path / "base"
    base.mkdir()
    if os.geteuid() == 0:
        # root may write anywhere: the server runs as root without the capabilities that let
        # it (util-linux's setpriv drops them for good), in a folder of another user's. It
        # stays root, so it still runs an interpreter only root may reach (one under /root)
        os.chown(base, 65534, 65534)
        base.chmod(0o755)
        caps = "-dac_override,-dac_read_search"
        wrap = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]
    else:  # a folder this user may not write
        base.chmod(0o555)
        wrap = []
    root = base / "data"
    try:
        done = subprocess.run(
            [*wrap, sys.executable, "-m", "tdreplay.service", "serve", "--root", str(root),
             "--port", str(free_port()), "--no-shm"],
            capture_output=True, text=True, timeout=120, env=env(), cwd="/",
        )  # fmt: skip
        out = done.stderr
        assert done.returncode != 0, out
        who = f"(uid {os.geteuid()}, gid {os.getegid()})"
        assert f"the data root {str(root)!r} is not writable by this process {who}" in out, out
        assert f"{base} is uid {base.stat().st_uid}'s" in out and "chown" in out, out
        assert not root.exists()
    finally:
        base.chmod(0o755)

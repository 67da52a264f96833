"""Plain test helpers shared by every test package (fixtures stay in the conftest files).

Imported as ``from testkit import ...``: pytest's conftest modules all share the
module name ``conftest``, so helpers imported from there resolve to whichever
conftest was loaded last.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tensordict import TensorDict

from tdreplay.cli import main as cli_main
from tdreplay.storage import TableSpec
from tdreplay.system import ports

REPO = Path(__file__).resolve().parents[1]

#: the fields of :func:`make_spec`'s table, each encoding the item id (see :func:`rows`)
FIELDS: dict[str, dict[str, Any]] = {
    "id": {"shape": [], "dtype": "int64"},
    "observation": {"shape": [3], "dtype": "float32"},
    "action": {"shape": [2], "dtype": "bfloat16"},
    "next.reward": {"shape": [1], "dtype": "float16"},
    "next.done": {"shape": [1], "dtype": "bool"},
    "pixels": {"shape": [2, 2], "dtype": "uint8"},
}


def make_spec(
    name: str = "t", capacity: int = 64, backend: dict | None = None, **extra
) -> TableSpec:
    """A small TED-like table: every field of item ``i`` holds ``i`` (see :func:`rows`)."""
    fields = dict(FIELDS)
    fields.update(extra.pop("fields", {}))
    return TableSpec.model_validate(
        {
            "name": name,
            "capacity": capacity,
            "fields": fields,
            "backend": backend or {"kind": "memory"},
            **extra,
        }
    )


def rows(start: int, n: int, *, episode_len: int = 10) -> TensorDict:
    """Items ``start .. start+n-1``; every field encodes the item id, episodes end every ``episode_len``."""
    ids = torch.arange(start, start + n, dtype=torch.int64)
    return TensorDict(
        {
            "id": ids,
            "observation": ids[:, None].float().expand(n, 3).clone(),
            "action": ids[:, None].bfloat16().expand(n, 2).clone(),
            "next": {
                "reward": ids[:, None].half(),
                "done": (ids % episode_len == episode_len - 1)[:, None],
            },
            "pixels": (ids % 251).to(torch.uint8)[:, None, None].expand(n, 2, 2).clone(),
        },
        batch_size=[n],
    )


def assert_consistent(batch: TensorDict) -> None:
    """Every field of every row agrees with its ``id`` (no torn rows)."""
    ids = batch["id"]
    assert torch.equal(batch["observation"], ids[:, None].float().expand(-1, 3))
    assert torch.equal(batch["action"], ids[:, None].bfloat16().expand(-1, 2))
    assert torch.equal(batch["next", "reward"], ids[:, None].half())
    assert torch.equal(batch["pixels"], (ids % 251).to(torch.uint8)[:, None, None].expand(-1, 2, 2))


#: Redis connections by name for tables made here; the session's redis-server adds "default"
REDIS: dict[str, str] = {}


class Tables:
    """Creates and restores tables under one temporary root; :meth:`cleanup` destroys them all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list = []

    def create(
        self,
        spec: TableSpec,
        *,
        root: Path | None = None,
        seed: int | None = 0,
        replace: bool = False,
    ):
        from tdreplay.storage import Table

        table = Table.create(spec, root=root or self.root, seed=seed, replace=replace, redis=REDIS)
        return self.track(table)

    def restore(self, path: Path, *, root: Path | None = None, seed: int | None = None):
        from tdreplay.storage import Table

        return self.track(Table.restore(path, root=root, seed=seed, redis=REDIS))

    def track(self, table):
        self.made.append(table)
        return table

    def cleanup(self) -> None:
        import contextlib

        for table in reversed(self.made):
            with contextlib.suppress(Exception):  # already destroyed by the test
                table.destroy()


_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_names)}"


def schema_fields(name: str) -> dict[str, Any]:
    """The ``fields`` of a shipped schema (schemas/{name}.yaml)."""
    return yaml.safe_load((REPO / "schemas" / f"{name}.yaml").read_text())["fields"]


def make_rows(fields: dict[str, Any], n: int, *, seed: int = 0) -> Any:
    """``n`` random rows for ``fields`` (every dtype, no NaN), batch ``[n]``."""
    import torch
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    td = TensorDict(batch_size=[n])
    for name, f in fields.items():
        shape = [n, *f["shape"]]
        dtype = getattr(torch, f["dtype"])
        if dtype == torch.bool:
            t = torch.rand(shape, generator=g) < 0.5
        elif dtype.is_floating_point:
            t = torch.randn(shape, generator=g).to(dtype)
        else:
            info = torch.iinfo(dtype)
            lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
            t = torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)
        td.set(tuple(name.split(".")), t)
    return td


def free_port() -> int:
    """A free loopback port for a test server, below the kernel's ephemeral range: in this
    pytest-xdist worker's part of the suite's slice, so two test processes never pick the
    same port (:mod:`tdreplay.system.ports`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    first = (index % 10) * ports.TEST_SPAN
    return ports.free_port(ports.TEST_PORTS[first : first + ports.TEST_SPAN])


@contextlib.contextmanager
def small_tmpfs(mnt: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` mounted at the new folder ``mnt`` (``mount -t tmpfs``: root or
    CAP_SYS_ADMIN; the test is skipped with the reason where it is refused), unmounted lazily
    after (a server stopped at its module's end may still hold files there)."""
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}M", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


#: Python a child script starts with to measure its own peak resident memory from a point on:
#: ``since = reset_peak()``, then ``peak_growth(since)`` (bytes). A child's ``ru_maxrss``
#: counts the pages of the process it was forked from before its exec (a test worker's
#: hundreds of MB), so a growth read from it hides under that peak and a bound on it cannot
#: fail; writing 5 to ``/proc/self/clear_refs`` starts ``VmHWM`` again from the RSS now.
PEAK = """
def _status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS:")
def peak_growth(since):
    return _status("VmHWM:") - since
"""


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``, now (its ``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def run_cli(*argv: str, capsys: Any, monkeypatch: Any = None, **env: str) -> tuple[int, str, str]:
    """Run ``tdreplay *argv`` in this process: ``(exit status, stdout, stderr)``; its errors are
    never a traceback. With ``monkeypatch``, the caller's ``TDREPLAY_URL`` / ``_TOKEN`` /
    ``_TOKEN_FILE`` are unset and ``env`` is set for the run."""
    if monkeypatch is not None:
        for name in ("TDREPLAY_URL", "TDREPLAY_TOKEN", "TDREPLAY_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
    capsys.readouterr()
    try:
        cli_main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err

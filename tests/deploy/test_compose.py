"""The shipped docker-compose.yml, started for real: tdreplay on a Redis with a password.

The images are the ones ``make image`` builds and a Redis stand-in built from Debian's
``redis-server`` on the debootstrap base (``TDREPLAY_IMAGE`` / ``REDIS_IMAGE`` name them);
the project runs in a folder of its own with its two secrets, published on 127.0.0.1, and is
taken down with its volumes at the end. ``make test-deploy`` runs it (not ``make test``).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deploykit import REPO
from dockerkit import (
    BASE_IMAGE,
    DOCKER,
    PREFIX,
    as_root,
    cartpole_rows,
    docker,
    free_port,
    ids_of,
    remove_images,
    token_file,
    wait_ready,
)

from tdreplay.client import ReplayClient

pytestmark = pytest.mark.docker

ROWS = 300


def compose_command() -> list[str]:
    """``docker compose`` where the plugin is there, else ``docker-compose`` (1.29 from apt)."""
    done = subprocess.run([DOCKER, "compose", "version"], capture_output=True, check=False)
    if done.returncode == 0:
        return [DOCKER, "compose"]
    for exe in ("docker-compose", "/usr/bin/docker-compose"):
        if subprocess.run(["sh", "-c", f"command -v {exe}"], capture_output=True).returncode == 0:
            return [exe]
    command = as_root(["apt-get", "install", "-y", "-qq", "docker-compose"])
    assert command is not None, "no docker compose, and no apt-get as root to install it"
    install = subprocess.run(
        command,
        capture_output=True, text=True, check=False,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )  # fmt: skip
    assert install.returncode == 0, f"no docker compose, and apt-get failed: {install.stderr}"
    return ["docker-compose"]


@dataclass
class Project:
    command: list[str]
    folder: Path
    env: dict[str, str]
    url: str
    token: str
    password: str

    def __call__(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [*self.command, "--file", str(REPO / "docker-compose.yml"),
             "--project-directory", str(self.folder), *args],
            capture_output=True, text=True, timeout=timeout, check=False, env=self.env,
        )  # fmt: skip
        assert done.returncode == 0, f"compose {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def client(self) -> ReplayClient:
        return ReplayClient(self.url, self.token, transport="http")

    def redis_cli(self, *args: str, password: str | None = None) -> str:
        env = ["-e", f"REDISCLI_AUTH={password}"] if password else []
        return self("exec", "-T", *env, "redis", "redis-cli", *args)


@pytest.fixture(scope="module")
def redis_image(engine: None) -> Iterator[str]:
    tag = f"{PREFIX}:redis"
    docker(
        "build", "--network", "host", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
        "-f", str(REPO / "tests/deploy/redis-standin.Dockerfile"), "-t", tag,
        str(REPO / "tests/deploy"),
    )  # fmt: skip
    try:
        yield tag
    finally:
        remove_images(tag)


@pytest.fixture(scope="module")
def project(
    image: str, redis_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Project]:
    folder = tmp_path_factory.mktemp("compose")
    token, password = secrets.token_hex(16), secrets.token_hex(16)
    token_file(folder / "secrets", "tdreplay_token", token)
    token_file(folder / "secrets", "redis_password", password)
    port = free_port()
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": PREFIX,
        "TDREPLAY_IMAGE": image,
        "REDIS_IMAGE": redis_image,
        "TDREPLAY_PUBLISH": f"127.0.0.1:{port}",
    }
    p = Project(compose_command(), folder, env, f"http://127.0.0.1:{port}", token, password)
    try:
        p("up", "--detach")
        wait_ready(p.url)
        yield p
    finally:
        subprocess.run(
            [*p.command, "--file", str(REPO / "docker-compose.yml"), "--project-directory",
             str(folder), "down", "--volumes", "--remove-orphans", "--timeout", "60"],
            capture_output=True, timeout=300, check=False, env=env,
        )  # fmt: skip


def test_redis_asks_for_the_password_from_the_secret(project: Project) -> None:
    assert "NOAUTH" in project.redis_cli("ping")
    assert project.redis_cli("ping", password="not-it").strip() != "PONG"
    assert project.redis_cli("ping", password=project.password).strip() == "PONG"
    # in no container's command line, environment or configuration
    containers = project("ps", "--quiet").split()
    assert len(containers) == 2
    assert project.password not in docker("inspect", *containers)
    assert project.password not in docker("top", containers[0]) + docker("top", containers[1])


def test_a_redis_table_survives_down_and_up(project: Project) -> None:
    with project.client() as client:
        assert client.info("cartpole")["backend"] == "redis"
        client.extend("cartpole", cartpole_rows(ROWS))
        assert client.info("cartpole")["size"] == ROWS
    project("down", "--timeout", "60")  # the containers go, the volumes stay
    project("up", "--detach")
    wait_ready(project.url)
    with project.client() as client:
        assert client.info("cartpole")["size"] == ROWS
        assert ids_of(client.sample("cartpole", 256)) <= set(range(ROWS))


def test_a_redis_table_survives_a_redis_restart(project: Project) -> None:
    project("restart", "redis")
    deadline = time.monotonic() + 60
    while True:  # the first calls may meet the Redis still starting (loading its file)
        try:
            with project.client() as client:
                size = client.info("cartpole")["size"]
                batch = client.sample("cartpole", 256)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    assert size == ROWS and ids_of(batch) <= set(range(ROWS))
    with project.client() as client:  # and it takes new rows
        client.extend("cartpole", cartpole_rows(10, start=ROWS))
        assert client.info("cartpole")["size"] == ROWS + 10


def test_the_learner_profile_gets_shared_memory(project: Project) -> None:
    out = project("--profile", "learner", "run", "--rm", "-T", "learner")
    assert "transport: shm" in out and "cartpole" in out, out

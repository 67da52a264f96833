"""The image, built by ``make image`` and run on a real Docker engine, as a user runs it.

One server container (read-only root filesystem, token from a secret file, port published on
127.0.0.1, the ``data`` and ``run`` volumes) serves the shipped schemas; the tests talk to it
from the host over HTTP and from a second container over the shared-memory socket, and stop
and start it. ``make test-deploy`` runs them (not ``make test``).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dockerkit import (
    PREFIX,
    cartpole_rows,
    cleanup,
    docker,
    free_port,
    get,
    ids_of,
    inspect,
    token_file,
    wait_ready,
)

from tdreplay.client import ReplayClient

pytestmark = pytest.mark.docker

#: the image goal for the CPU build (issue 24): torch alone is ~0.7 GB installed
MAX_IMAGE_BYTES = 1_300_000_000
ROWS = 1000  # cartpole rows, memmap (the shipped schema's backend)
MEM_ROWS = 100  # rows of a memory table, durable through the checkpoint on stop


@dataclass
class Server:
    name: str
    url: str
    token: str
    token_path: Path
    data: str
    run: str
    network: str

    def client(self) -> ReplayClient:
        return ReplayClient(self.url, self.token, transport="http")


@pytest.fixture(scope="module")
def server(image: str, secrets_dir: Path) -> Iterator[Server]:
    token = secrets.token_hex(16)
    s = Server(
        name=f"{PREFIX}-server",
        url=f"http://127.0.0.1:{free_port()}",
        token=token,
        token_path=token_file(secrets_dir, "tdreplay_token", token),
        data=f"{PREFIX}-data",
        run=f"{PREFIX}-run",
        network=f"{PREFIX}-net",
    )
    port = s.url.rsplit(":", 1)[1]
    docker("network", "create", s.network)
    try:
        docker(
            "run", "--detach", "--name", s.name,
            "--network", s.network, "--network-alias", "tdreplay",
            "--publish", f"127.0.0.1:{port}:8000",
            "--volume", f"{s.data}:/data", "--volume", f"{s.run}:/run/tdreplay",
            "--volume", f"{s.token_path}:/run/secrets/tdreplay_token:ro",
            "--read-only", "--tmpfs", "/tmp",
            "--stop-timeout", "60",
            image,
        )  # fmt: skip
        wait_ready(s.url, s.name)
        yield s
    finally:
        cleanup("container", [s.name])
        cleanup("volume", [s.data, s.run])
        cleanup("network", [s.network])


def test_the_image_is_small_and_carries_no_wheels(image: str) -> None:
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image))
    assert size <= MAX_IMAGE_BYTES, f"{image} is {size / 1e9:.2f} GB"
    found = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
        # (the base's own pip and setuptools for ensurepip are not ours)
        "find / -xdev -name '*.whl' ! -path '*/python-wheels/*' ! -path '*/ensurepip/*'"
        "; test ! -e /wheels || echo /wheels",
    )  # fmt: skip
    assert found == "", f"wheel copies in the image: {found}"
    version = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c",
        "import torch, tdreplay.service; print(torch.__version__)",
    )  # fmt: skip
    assert version.startswith("2.13.0"), version


def test_it_refuses_to_start_without_a_token(image: str) -> None:
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "/run/secrets/tdreplay_token" in out and "cannot be read" in out, out[-2000:]


def test_a_read_only_root_needs_no_tmpfs(image: str, secrets_dir: Path) -> None:
    """``--read-only`` without ``--tmpfs /tmp`` ended at start in torch's traceback (torch
    asks for a writable temporary directory as it is imported); the server's temporary
    folder is ``/data/.tmp`` then (its volumes here: anonymous ones, removed with it)."""
    name, port, token = f"{PREFIX}-no-tmpfs", free_port(), secrets.token_hex(16)
    path = token_file(secrets_dir, "no_tmpfs_token", token)
    try:
        docker(
            "run", "--detach", "--name", name, "--publish", f"127.0.0.1:{port}:8000",
            "--volume", f"{path}:/run/secrets/tdreplay_token:ro", "--read-only", image,
        )  # fmt: skip
        wait_ready(f"http://127.0.0.1:{port}", name)
        assert get(f"http://127.0.0.1:{port}/v1/tables", token)[0] == 200
        docker("exec", name, "test", "-d", "/data/.tmp")
    finally:
        cleanup("container", [name])


def test_readyz_and_the_token_from_the_secret_file(server: Server) -> None:
    assert get(f"{server.url}/readyz")[0] == 200
    assert get(f"{server.url}/v1/tables")[0] == 401  # the port is guarded
    status, body = get(f"{server.url}/v1/tables", server.token)
    assert status == 200, body
    # the read-only root filesystem: the server wrote only to its volumes
    assert inspect(server.name)["HostConfig"]["ReadonlyRootfs"] is True


def test_the_healthcheck_turns_healthy(server: Server) -> None:
    deadline = time.monotonic() + 90
    while (status := inspect(server.name)["State"]["Health"]["Status"]) != "healthy":
        assert status in ("starting", "healthy"), inspect(server.name)["State"]["Health"]
        assert time.monotonic() < deadline, "the HEALTHCHECK never turned healthy"
        time.sleep(1)


def test_extend_and_sample_from_the_host(server: Server) -> None:
    spec = yaml.safe_load((Path(__file__).parents[2] / "schemas/cartpole.yaml").read_text())
    spec.update(name="mem", capacity=MEM_ROWS, backend={"kind": "memory"})
    with server.client() as client:
        assert client.info("cartpole")["size"] == 0
        client.extend("cartpole", cartpole_rows(ROWS))
        client.create_table(spec)
        client.extend("mem", cartpole_rows(MEM_ROWS, start=10_000))
        assert client.info("cartpole")["size"] == ROWS
        assert ids_of(client.sample("cartpole", 256)) <= set(range(ROWS))
        assert ids_of(client.sample("mem", 64)) <= set(range(10_000, 10_000 + MEM_ROWS))


def test_stop_and_start_keep_the_tables(server: Server) -> None:
    docker("stop", server.name, timeout=120)
    assert inspect(server.name)["State"]["ExitCode"] == 0  # a graceful stop
    docker("start", server.name)
    wait_ready(server.url, server.name)
    with server.client() as client:
        assert client.info("cartpole")["size"] == ROWS  # memmap: reopened from its files
        assert client.info("mem")["size"] == MEM_ROWS  # memory: checkpointed on stop, restored
        assert ids_of(client.sample("cartpole", 512)) <= set(range(ROWS))
        assert ids_of(client.sample("mem", 64)) <= set(range(10_000, 10_000 + MEM_ROWS))


LEARNER = """
import json
from tdreplay.client import ReplayClient
with ReplayClient() as client:  # TDREPLAY_URL and TDREPLAY_TOKEN_FILE from the environment
    batch = client.sample("cartpole", 128)
    print(json.dumps({
        "transport": client.transport,
        "size": client.info("cartpole")["size"],
        "ids": sorted({int(v) for v in batch["observation"][:, 0].tolist()}),
    }))
"""


def learner(server: Server, image: str, *extra: str) -> dict:
    out = docker(
        "run", "--rm", "--network", server.network,
        "--env", "TDREPLAY_URL=http://tdreplay:8000",
        "--volume", f"{server.token_path}:/run/secrets/tdreplay_token:ro",
        *extra, "--entrypoint", "python", image, "-c", LEARNER,
    )  # fmt: skip
    return json.loads(out.splitlines()[-1])


def test_a_learner_container_on_the_run_volume_gets_shared_memory(
    server: Server, image: str
) -> None:
    seen = learner(
        server, image, "--user", "10001:10001", "--volume", f"{server.run}:/run/tdreplay",
        "--read-only", "--tmpfs", "/tmp",
    )  # fmt: skip
    assert seen["transport"] == "shm"
    assert seen["size"] == ROWS and set(seen["ids"]) <= set(range(ROWS))
    # without the volume the same client code goes over HTTP, with the token from its file
    seen = learner(server, image, "--user", "10001:10001")
    assert seen["transport"] == "http" and seen["size"] == ROWS

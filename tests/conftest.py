"""Shared fixtures: a real redis-server per session, temporary data roots, small specs."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib
import testkit
from forkserver import ForkServer
from testkit import Tables, free_port

BACKENDS = ["memory", "memmap", "h5", "shared", "redis"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (whole files: ``pytestmark``) run first: the suite's workers
    take whole files (``--dist loadfile``), and a long file collected last would run on
    one worker while the others sit idle. Otherwise the order is the collection's."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A real ``redis-server`` on a free loopback port, for the whole session."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (make redis installs it)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis_lib.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis_lib.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    url = f"redis://127.0.0.1:{port}/0"
    testkit.REDIS["default"] = url  # the connection tables' specs name ("default")
    yield {"host": "127.0.0.1", "port": port, "client": client, "url": url}
    testkit.REDIS.pop("default", None)
    proc.terminate()
    proc.wait(10)


def backend_options(kind: str, request: pytest.FixtureRequest) -> dict:
    """The ``backend`` block of a spec for ``kind``; starts redis when needed."""
    if kind == "redis":
        request.getfixturevalue("redis_server")  # registers the "default" connection
        return {"kind": "redis"}
    return {"kind": kind}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> dict:
    """Parametrizes a test over every backend; yields the spec's ``backend`` block."""
    return backend_options(request.param, request)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def tables(tmp_path: Path) -> Iterator[Tables]:
    """Build tables (``tables.create(spec)``); their data (files, shared memory, Redis keys) is destroyed afterwards."""
    made = Tables(tmp_path / "data")
    yield made
    made.cleanup()


# ---------------------------------------------------------------- live tdreplay servers
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class LiveServer:
    """A ``tdreplay serve`` process started by :func:`live_server`.

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        port, host: where it listens.
        root: its data root.
        token: its bearer token, if any.
        proc: the process.
        log: the file its output goes to.
    """

    def __init__(
        self, proc: subprocess.Popen, port: int, root: Path, token: str | None, log: Path
    ) -> None:
        self.proc = proc
        self.host = "127.0.0.1"
        self.port = port
        self.url = f"http://{self.host}:{port}"
        self.root = root
        self.token = token
        self.log = log

    def request(
        self,
        method: str,
        path: str,
        body: bytes | bytearray | memoryview | None = None,
        headers: dict[str, str] | None = None,
        *,
        timeout: float = 30.0,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a fresh connection: ``(status, headers (lower-case names), body)``."""
        import http.client

        hdrs = dict(headers or {})
        if self.token and "Authorization" not in hdrs:
            hdrs["Authorization"] = f"Bearer {self.token}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (graceful shutdown), then SIGKILL after ``timeout`` seconds; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def _wait_ready(server: LiveServer, timeout: float) -> None:
    import http.client

    deadline = time.monotonic() + timeout
    while True:
        if server.proc.poll() is not None:
            pytest.fail(f"tdreplay serve exited with {server.proc.returncode}:\n{server.output()}")
        try:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            pytest.fail(f"tdreplay serve not ready after {timeout}s:\n{server.output()}")
        time.sleep(0.05)  # poll interval of the readiness probe


#: ``python -m tdreplay.service`` with automatic garbage collection off from the start
SERVE_WITHOUT_GC = (
    "import gc, sys; gc.disable(); from tdreplay.cli.serve import main; main(sys.argv[1:])"
)

_FORK_SERVER: list[ForkServer] = []


def fork_server() -> ForkServer:
    """This pytest process's fork server, started on first use, closed at its exit."""
    if not _FORK_SERVER:
        import atexit

        _FORK_SERVER.append(ForkServer(REPO))
        atexit.register(_FORK_SERVER[0].close)
    return _FORK_SERVER[0]


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    """Factory of real servers: ``live_server(*flags, token=None, root=None, env=None,
    fresh=False, **flags)``.

    Each call starts ``python -m tdreplay.service serve --port <free> --root <tmp>
    *flags`` (from the repository root, so ``--schema schemas/...`` works; keyword
    flags are spelled ``schema="schemas/"`` -> ``--schema schemas/``), waits until
    ``/readyz`` answers 200, and returns a :class:`LiveServer`. The process is forked
    from one that imported the server already (:mod:`forkserver`: the same entry
    point, 2.5 s less each). ``TDREPLAY_*`` variables of the test environment are not
    passed on. Every server started is stopped when the module's tests are done, and
    the roots it made are deleted.

    ``fresh=True`` starts a fresh interpreter instead, as an operator's shell would,
    for a test about the process itself (its command line, its memory): the test
    environment's ``MALLOC_*`` variables are not passed on either (glibc reads them
    at start, and CI's keep freed heap that a test of RSS would count; a fork would
    inherit the tuning the fork server started with). With it, ``gc=False`` runs
    the server with automatic garbage collection off from its start (so what it
    lets go of is freed by reference counting alone, or never), and ``wrap`` is a
    command the server's command line is appended to (``unshare ... exec "$@"``).

        >>> server = live_server("--schema", "schemas/cartpole.yaml", backend="memory")  # doctest: +SKIP
        >>> server.request("GET", "/v1/tables")[0]  # doctest: +SKIP
        200
    """
    started: list[LiveServer] = []
    made: list[Path] = []

    def start(
        *args: str,
        token: str | None = None,
        root: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        port: int | None = None,
        fresh: bool = False,
        gc: bool = True,
        wrap: Sequence[str] = (),
        **flags: object,
    ) -> LiveServer:
        if not fresh and (not gc or wrap):
            raise ValueError("gc=False and wrap need a process of their own: fresh=True")
        port = port or free_port()  # a given port: a server started again where it was
        if root is None:
            made.append(tmp_path_factory.mktemp("live"))
            root = made[-1] / "data"
        log = root.parent / f"server-{port}.log"
        cmd = [
            sys.executable,
            "-m",
            "tdreplay.service",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--root",
            str(root),
            "--log-level",
            "warning",
            *args,
        ]
        for name, value in flags.items():
            cmd += [f"--{name.replace('_', '-')}", str(value)]
        withheld = ("TDREPLAY_", "MALLOC_") if fresh else ("TDREPLAY_",)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(withheld)}
        if token:
            full_env["TDREPLAY_TOKEN"] = token  # never on the command line (there is no --token)
        full_env.update(env or {})
        proc: Any
        if fresh or os.environ.get("TDREPLAY_TEST_SPAWN") == "1":
            if not gc:
                cmd[1:3] = ["-c", SERVE_WITHOUT_GC]
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [*wrap, *cmd], stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO
                )
        else:  # forked from a process that imported the server once (tests/forkserver.py)
            proc = fork_server().start(cmd[3:], full_env, REPO, log)
        server = LiveServer(proc, port, root, token, log)
        started.append(server)
        _wait_ready(server, timeout)
        return server

    yield start
    for server in started:
        server.stop()
    for folder in made:  # the servers' roots: a module's tables do not outlive it
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- in-process tdreplay apps
@pytest.fixture
def service(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory of in-process apps under ``TestClient``: ``service(**settings) -> TestClient``.

    The app runs with its lifespan (tables loaded), a data root under
    ``tmp_path`` and one torch thread left as it is; keyword arguments are
    :class:`~tdreplay.service.Settings` fields. Every client is closed (and its
    tables closed) at teardown.
    """
    import warnings

    with warnings.catch_warnings():  # starlette's notice about httpx; TestClient works as is
        warnings.filterwarnings("ignore", message="Using `httpx`")
        from fastapi.testclient import TestClient

    from tdreplay.service import Settings, create_app

    opened: list[TestClient] = []

    def make(*, raise_server_exceptions: bool = True, **settings: Any) -> TestClient:
        settings.setdefault("root", tmp_path / "data")
        settings.setdefault("torch_threads", 0)
        if "default" in testkit.REDIS:  # the session's redis-server, when a test started it
            settings.setdefault("redis", [testkit.REDIS["default"]])
        app = create_app(Settings(**settings))
        client = TestClient(app, raise_server_exceptions=raise_server_exceptions)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in reversed(opened):
        client.__exit__(None, None, None)

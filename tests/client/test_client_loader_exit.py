"""The loader's threads and the interpreter: a CUDA device that is not there, exits left open."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import Loader, ReplayClient

FIELDS = {"x": {"shape": [], "dtype": "int64"}, "obs": {"shape": [64], "dtype": "float32"}}


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


@pytest.fixture(scope="module")
def table(client: ReplayClient) -> str:
    name = unique("exit")
    client.create_table(
        {"name": name, "capacity": 512, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    x = torch.arange(512)
    client.extend(name, TensorDict({"x": x, "obs": torch.randn(512, 64)}, [512]))
    return name


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the GPU path runs instead")
@pytest.mark.timeout(30)
def test_cuda_without_cuda_fails_at_once(client: ReplayClient, table: str) -> None:
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        client.loader(table, 8, device="cuda")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        Loader(client, table, 8, device=torch.device("cuda", 0), stream=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.timeout(60)
def test_cuda_device_out_of_range(client: ReplayClient, table: str) -> None:  # pragma: no cover
    with pytest.raises(RuntimeError, match="CUDA device"):
        client.loader(table, 8, device=f"cuda:{torch.cuda.device_count()}")
    batch = next(iter(client.loader(table, 8, device="cuda:0", num_batches=1)))
    assert batch["obs"].is_cuda


# A learner that exits with its loaders still fetching: a sync loader left open
# over HTTP and over shared memory, one broken out of, a stream loader, and the
# async loader. Its fetchers are inside a request or a decode when it ends.
#
# The script imports the client once, then forks each run (4 at a time): a
# child runs the learner at the top level and exits as a script does, through
# the interpreter's whole teardown. A dozen fresh interpreters would spend a
# minute importing torch; the teardown is the same.
SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from tdreplay.client import AsyncReplayClient, ReplayClient

    url, table, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])


    def learner():
        left_open = []
        for transport in ("http", "shm"):
            client = ReplayClient(url, transport=transport, timeout=30)
            it = iter(client.loader(table, 32, prefetch=4))
            for _ in range(3):
                next(it)
            left_open.append(it)
            for n, batch in enumerate(client.loader(table, 16, prefetch=3)):
                if n == 2:
                    break
        stream = iter(ReplayClient(url, transport="http").loader(table, 4, stream=True))
        next(stream)
        left_open.append(stream)

        async def learn():
            async with AsyncReplayClient(url) as aclient:
                n = 0
                async for batch in aclient.loader(table, 32, prefetch=4):
                    n += 1
                    if n == 3:
                        break

        asyncio.run(learn())
        return left_open


    def exit_code(pid):
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


    def fork_runs():
        codes, running = [], []
        for _ in range(runs):
            if len(running) == 4:
                codes.append(exit_code(running.pop(0)))
            pid = os.fork()
            if pid == 0:
                return None
            running.append(pid)
        return codes + [exit_code(pid) for pid in running]


    codes = fork_runs()
    if codes is None:  # a child: learn, then leave with the loaders still open
        kept = learner()
    else:
        print("exit codes:", *codes)
    """
)


#: learners forked, 4 at a time: each ends inside a different request or decode
RUNS = 12


@pytest.mark.timeout(180)
def test_exit_with_loaders_running_is_clean(server: Any, table: str) -> None:
    """12 learners that exit without closing their loaders all exit 0 (no abort, no segfault)."""
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT, server.url, table, str(RUNS)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = proc.stdout.split("exit codes:")[-1].split()
    assert codes == ["0"] * RUNS, f"exit codes {codes}; stderr:\n{proc.stderr[-3000:]}"


def test_close_wakes_a_learner_waiting_for_a_batch(client: ReplayClient) -> None:
    """A loader closed from another thread (or at exit) ends a ``next()`` that waits on the server."""
    import threading

    name = unique("starved")
    client.create_table(
        {
            "name": name,
            "capacity": 8,
            "backend": {"kind": "memory"},
            "fields": FIELDS,
            "rate_limiter": {"min_size_to_sample": 8},
        }
    )
    it = iter(client.loader(name, 4, prefetch=1, timeout=60))
    got: list[Any] = []
    learner = threading.Thread(target=lambda: got.append(next(it, "ended")))
    learner.start()
    learner.join(0.5)
    assert learner.is_alive()  # waiting: the table is empty
    it.close()
    learner.join(30)
    assert not learner.is_alive() and got == ["ended"]

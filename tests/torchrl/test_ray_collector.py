"""TorchRL's ``RayCollector`` writes through TDReplayBuffer: every frame stored exactly once.

A real local Ray runtime (started here, every port on loopback, no dashboard)
runs two remote collectors on gymnasium's CartPole-v1, each numbering its
frames (:class:`~torchrl_kit.FrameId`); the buffer travels to them pickled as
its connection settings (``TDReplayBuffer.clients``), and each actor writes
over its own connection to a real tdreplay server. The table is then read
back through a Parquet export: each env's frames are there once each, none
missing, as many as the collector reports; ``len`` and ``write_count`` agree.
The README's "With Ray" block runs here as written, on the same runtime.

Skipped with the reason where ``ray`` is not installed (``pip install
tdreplay[ray]``); under ``CI`` (whose test extra installs it) that fails instead.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from torchrl.collectors import Collector
from torchrl_kit import check_exactly_once, make_env, stored_frame_ids

from tdreplay.client import ReplayClient
from tdreplay.torchrl import TDReplayBuffer

try:
    import ray
except ImportError as err:  # the ray extra is not installed
    if os.environ.get("CI"):
        pytest.fail(f"CI: the Ray tests must run (the test extra installs ray), but: {err}")
    pytest.skip(
        f"ray is not installed (pip install 'tdreplay[ray]'): {err}", allow_module_level=True
    )

from torchrl.collectors.distributed import RayCollector

REPO = Path(__file__).resolve().parents[2]
COLLECTORS = 2
FRAMES_PER_BATCH = 200
TOTAL_FRAMES = 2000
#: Ray's one-host mode: without it a loopback node address is swapped for a routable one
ONE_HOST = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

pytestmark = [
    pytest.mark.ray,  # make test-long: Ray and its actors take ~25-40 s to start and stop
    # policy=None: a random policy, which has no weights for the collector to send
    pytest.mark.filterwarnings("ignore:The policy is not an nn.Module:UserWarning"),
    pytest.mark.filterwarnings("ignore:RayCollector iteration started before:UserWarning"),
]


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[dict[str, Any]]:
    """A local Ray runtime on loopback only (GCS, raylet, workers), no dashboard, 2 CPUs.

    Ray replaces a loopback ``_node_ip_address`` with the host's routable
    address unless its one-host mode is on (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    the default on macOS and Windows; read when ``ray`` is imported, so set on
    the imported constant too). Its session files go to a short temporary
    folder (Unix socket paths are limited to 107 bytes), removed with the runtime.
    """
    from ray._private import ray_constants

    saved = os.environ.get(ONE_HOST)
    os.environ[ONE_HOST] = "0"  # for the processes Ray starts
    cluster, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    temp = tempfile.mkdtemp(prefix="tdr-ray-")
    path = [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    started = time.perf_counter()
    try:
        context = ray.init(
            num_cpus=COLLECTORS,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp,
            object_store_memory=80 * 1024**2,  # rows never go through it
            log_to_driver=False,
            # the actors unpickle the env maker and its transform from torchrl_kit, here
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(path)}},
        )
        yield {"context": context, "start_s": time.perf_counter() - started}
    finally:
        ours = ray_processes() if ray.is_initialized() else set()
        ray.shutdown()
        reap(ours)
        ray_constants.ENABLE_RAY_CLUSTER = cluster
        if saved is None:
            os.environ.pop(ONE_HOST, None)
        else:
            os.environ[ONE_HOST] = saved
        shutil.rmtree(temp, ignore_errors=True)


def reap(pids: set[int], timeout: float = 15.0) -> None:
    """Wait for Ray's processes ``pids`` to end after ``ray.shutdown()`` (a killed actor's
    worker takes a moment); kill those still there after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if _running(pid)}
        time.sleep(0.1)  # exit poll
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def collect(collector: RayCollector) -> int:
    """Run ``collector`` to its end; the number of batches it yielded (each ``None``)."""
    batches = 0
    try:
        for out in collector:
            assert out is None  # the remote collectors write to the buffer, yield nothing
            batches += 1
    finally:
        collector.shutdown()
    return batches


def extends(server: Any, table: str) -> dict[str, int]:
    """The server's count of successful extends of ``table``, by transport (``/metrics``)."""
    status, _, body = server.request("GET", "/metrics")
    assert status == 200, body
    wanted = {"table": table, "op": "extend", "outcome": "ok"}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            got = sample.labels
            if sample.name == "tdreplay_requests_total" and wanted.items() <= got.items():
                counts[got["transport"]] = counts.get(got["transport"], 0) + int(sample.value)
    return counts


def test_ray_collector_stores_every_frame_once(
    ray_runtime: dict[str, Any], server: Any, client: ReplayClient
) -> None:
    """Two remote collectors race to create the table (``create=``) and write every frame
    they collect once: the Parquet export holds each env's frame ids once, none missing,
    as many as the collector reports (``sync=True``: every round one batch from each actor,
    none in flight at the end; the README's block below runs the default, ``sync=False``)."""
    table = "ray_sync"
    rb = TDReplayBuffer(server.url, table, create={"capacity": 8192})
    collector = RayCollector(
        [make_env] * COLLECTORS,
        policy=None,
        collector_class=Collector,
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=TOTAL_FRAMES,
        sync=True,
        replay_buffer=rb,
        remote_configs={"num_cpus": 1, "memory": 256 * 1024**2},
    )
    started = time.perf_counter()
    batches = collect(collector)
    seconds = time.perf_counter() - started
    assert batches == TOTAL_FRAMES // FRAMES_PER_BATCH
    assert collector.collected_frames == TOTAL_FRAMES
    ids = stored_frame_ids(client, table)
    per_env = check_exactly_once(ids)
    assert per_env == dict.fromkeys(per_env, TOTAL_FRAMES // COLLECTORS)
    assert len(per_env) == COLLECTORS  # one env per remote collector, each its own process
    assert ids.numel() == len(rb) == rb.write_count == TOTAL_FRAMES
    # the actors share the server's host: each wrote over its own shared-memory connection
    assert extends(server, table) == {"shm": TOTAL_FRAMES // (FRAMES_PER_BATCH // COLLECTORS)}
    print(
        f"ray start {ray_runtime['start_s']:.1f} s; {TOTAL_FRAMES} frames in {seconds:.2f} s, "
        f"{TOTAL_FRAMES / seconds:,.0f} frames/s"
    )


def test_readme_ray_block_runs_as_written(
    ray_runtime: dict[str, Any], server: Any, client: ReplayClient
) -> None:
    """The README's "With Ray" block, against this server, on the running Ray (which the
    collector joins and leaves running); what it prints is what its comment says."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"\*\*With Ray\*\*.*?```python\n(.*?)```", text, re.S)
    assert block, "the README has no 'With Ray' block"
    code = block.group(1).replace('"http://127.0.0.1:8000"', repr(server.url))
    assert code != block.group(1), "the block no longer connects to http://127.0.0.1:8000"
    expected = re.search(r"print\(.*\)  # ([\d ]+)\n", code)
    assert expected, "the block's print has no comment saying what it prints"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md (With Ray)", "exec"), {"__name__": "readme_ray"})
    assert out.getvalue().split() == expected.group(1).split()
    assert ray.is_initialized()  # joined, not owned: still running for the other tests
    stored = int(expected.group(1).split()[1])
    info = client.info("cartpole_ray")
    assert info["capacity"] == 100_000 and info["size"] == info["inserts"] == stored
    batch = re.search(r"frames_per_batch=(\d+)", code)
    assert batch, "the block no longer sets frames_per_batch"
    # sync=False: every batch an actor finished is one extend, none sent twice
    assert extends(server, "cartpole_ray") == {"shm": stored // int(batch.group(1))}


def test_an_error_in_an_actor_reaches_the_driver(
    ray_runtime: dict[str, Any], server: Any, client: ReplayClient
) -> None:
    """``existing="refuse"`` meeting a table with rows: the actor's ``TableExists``, with its
    message, is in the error the driver gets, and nothing was written."""
    table = "ray_refused"
    TDReplayBuffer(server.url, table, create={"capacity": 64}).extend(_one_batch())
    rb = TDReplayBuffer(server.url, table, create={"capacity": 64}, existing="refuse")
    collector = RayCollector(
        [make_env],
        policy=None,
        collector_class=Collector,
        frames_per_batch=10,
        total_frames=20,
        replay_buffer=rb,
        remote_configs={"num_cpus": 1, "memory": 256 * 1024**2},
    )
    with pytest.raises(ray.exceptions.RayError) as caught:
        collect(collector)
    assert "TableExists" in str(caught.value)
    assert "existing='refuse'" in str(caught.value)
    assert client.info(table)["inserts"] == 10


def _one_batch() -> Any:
    env = make_env()
    try:
        return env.rollout(10, break_when_any_done=False)
    finally:
        env.close()


def test_ray_runtime_is_loopback_only(ray_runtime: dict[str, Any]) -> None:
    """Every socket the runtime's processes listen on is on loopback; no dashboard."""
    context = ray_runtime["context"]
    assert context.address_info["node_ip_address"] == "127.0.0.1"
    assert context.address_info["gcs_address"].startswith("127.0.0.1:")
    assert not context.dashboard_url
    addresses = listening(ray_processes())
    assert addresses, "no listening socket found for the Ray processes"
    assert all(ipaddress.ip_address(a).is_loopback for a in addresses), sorted(addresses)


def ray_processes() -> set[int]:
    """The processes of the Ray runtime this process started: the ones it launched (GCS,
    raylet, monitors, agents) and their children (the workers), all from /proc."""
    node = ray._private.worker._global_node
    roots = {info.process.pid for infos in node.all_processes.values() for info in infos}
    return roots.union(*(descendants(pid) for pid in roots))


def descendants(root: int) -> set[int]:
    """``root``'s child processes, their children, and so on (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):  # ended meanwhile
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def listening(pids: set[int]) -> set[str]:
    """The local addresses of the TCP sockets processes ``pids`` listen on (from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        fds: list[str] = []
        with contextlib.suppress(OSError):  # the process ended meanwhile
            fds = os.listdir(f"/proc/{pid}/fd")
        for fd in fds:
            with contextlib.suppress(OSError):  # the file was closed meanwhile
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                raw = bytes.fromhex(cols[1].split(":")[0])  # 32-bit words, each little-endian
                packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                address = ipaddress.ip_address(packed)
                mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:a.b.c.d
                found.add(str(mapped or address))
    return found

"""End to end: real ``tdreplay serve`` processes (uvicorn) on free ports, spoken to over loopback.

One server (token, memory backend, the cartpole schema) serves most tests;
the restart test starts its own pair. Every process is started and stopped
by the fixtures.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.codec import decode, encode, protocol, read_batches
from tdreplay.storage import TableSpec

pytestmark = pytest.mark.filterwarnings("ignore:Creating .*WeightUpdater:DeprecationWarning")

TOKEN = "e2e-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ARROW = {"Content-Type": protocol.ARROW_STREAM, **AUTH}


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    return live_server(
        "--schema",
        "schemas/cartpole.yaml",
        backend="memory",
        token=TOKEN,
        max_body_bytes=1 << 20,
    )


def _create(server: Any, spec: dict[str, Any]) -> None:
    status, _, body = server.request(
        "POST", protocol.TABLES, json.dumps(spec).encode(), {"Content-Type": protocol.JSON}
    )
    assert status == 201, body


def _cartpole_fields() -> dict[str, Any]:
    spec = TableSpec.from_file("schemas/cartpole.yaml")
    return {k: f.model_dump() for k, f in spec.fields.items()}


def test_foreign_client_with_pyarrow_and_http_client_only(server: Any) -> None:
    """What any Arrow-speaking client does, with no tdreplay installed: pyarrow + http.client."""
    import pyarrow as pa  # the only data library this test uses

    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    schema = {
        "name": "foreign",
        "capacity": 16,
        "backend": {"kind": "memory"},
        "sampler": {"kind": "fifo"},
        "fields": {
            "obs": {"shape": [2, 3], "dtype": "uint8"},
            "next.reward": {"shape": [], "dtype": "float16"},
            "next.done": {"shape": [1], "dtype": "bool"},
            "act": {"shape": [2], "dtype": "bfloat16"},
        },
    }
    conn.request(
        "POST", "/v1/tables", json.dumps(schema), {**auth, "Content-Type": "application/json"}
    )
    assert conn.getresponse().read() and True
    n = 4
    obs = pa.array(
        [[[i, i + 1, i + 2], [i + 3, i + 4, i + 5]] for i in range(n)],
        pa.list_(pa.list_(pa.uint8(), 3), 2),
    )
    reward = pa.array([0.5 * i for i in range(n)], pa.float16())
    done = pa.array([[i == n - 1] for i in range(n)], pa.list_(pa.bool_(), 1))
    # Arrow has no bfloat16: its bits travel as uint16, named in the field metadata
    bf16_bits = [0x3F80, 0x4000]  # 1.0, 2.0
    act = pa.array([bf16_bits for _ in range(n)], pa.list_(pa.uint16(), 2))
    fields = [
        pa.field("obs", obs.type),
        pa.field("next.reward", reward.type),
        pa.field("next.done", done.type),
        pa.field("act", act.type, metadata={"tdreplay.dtype": "bfloat16"}),
    ]
    batch = pa.RecordBatch.from_arrays([obs, reward, done, act], schema=pa.schema(fields))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    headers = {**auth, "Content-Type": "application/vnd.apache.arrow.stream"}
    conn.request("POST", "/v1/tables/foreign/extend", sink.getvalue().to_pybytes(), headers)
    resp = conn.getresponse()
    assert resp.status == 200
    assert json.loads(resp.read()) == {"index": [0, 1, 2, 3], "rows": 4}

    conn.request("POST", "/v1/tables/foreign/sample?batch_size=4", headers=auth)
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "application/vnd.apache.arrow.stream"
    got = pa.ipc.open_stream(resp.read()).read_all()
    conn.close()
    assert got.num_rows == 4
    assert got.column("next.reward").to_pylist() == [0.0, 0.5, 1.0, 1.5]
    assert got.column("index").to_pylist() == [0, 1, 2, 3]  # fifo: in order
    assert got.column("sample_info.times_sampled").to_pylist() == [1, 1, 1, 1]
    assert got.column("sample_info.weight").to_pylist() == [1.0] * 4
    flat_obs = got.column("obs").combine_chunks().flatten().to_pylist()
    assert flat_obs == [v for i in range(n) for v in range(i, i + 6)]
    assert got.column("next.done").combine_chunks().flatten().to_pylist() == [False] * 3 + [True]
    assert got.column("act").combine_chunks().flatten().to_pylist() == bf16_bits * n
    assert got.schema.field("act").metadata[b"tdreplay.dtype"] == b"bfloat16"


def test_collector_to_learner_byte_for_byte(server: Any) -> None:
    """A TorchRL collector pushes TED rollouts while a learner samples them back (fifo): same bytes."""
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    fields = _cartpole_fields()
    _create(
        server,
        {
            "name": "rollouts",
            "capacity": 256,
            "fields": fields,
            "backend": {"kind": "memory"},
            "sampler": {"kind": "fifo"},
        },
    )
    frames, per_batch = 400, 50
    pushed: list[TensorDict] = []
    errors: list[BaseException] = []

    def collect() -> None:
        try:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
            collector = Collector(
                GymEnv("CartPole-v1"), policy=None, frames_per_batch=per_batch, total_frames=frames
            )
            for i, td in enumerate(collector):
                td = td.clone()
                pushed.append(td)
                headers = {**ARROW, protocol.REQUEST_ID: f"rollout-{i}"}
                conn.request(
                    "POST",
                    protocol.table_path("rollouts", "extend") + "?timeout=30",
                    encode(td).to_pybytes(),
                    headers,
                )
                resp = conn.getresponse()
                assert resp.status == 200, resp.read()
                resp.read()
            collector.shutdown()
            conn.close()
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    collector_thread = threading.Thread(target=collect)
    collector_thread.start()
    learned: list[TensorDict] = []
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    got = 0
    while got < frames:
        conn.request(
            "POST",
            protocol.table_path("rollouts", "sample") + "?batch_size=40&timeout=30",
            headers=AUTH,
        )
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, body
        batch = decode(body)
        learned.append(batch)
        got += batch.batch_size[0]
    conn.close()
    collector_thread.join(60)
    assert not errors, errors
    sent = torch.cat(pushed)
    back = torch.cat(learned)
    assert back.batch_size == sent.batch_size == torch.Size([frames])
    for key in fields:
        nested = tuple(key.split("."))
        a, b = sent.get(nested), back.get(nested)
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert (
            a.contiguous().view(torch.uint8).numpy().tobytes()
            == b.contiguous().view(torch.uint8).numpy().tobytes()
        ), key
    assert back["sample_info", "times_sampled"].eq(1).all()


def test_streaming_batch_one(server: Any) -> None:
    n = 3000
    rows = TensorDict(
        {
            k: torch.zeros([512, *f.shape], dtype=f.torch_dtype)
            for k, f in TableSpec.from_file("schemas/cartpole.yaml").fields.items()
        },
        batch_size=[512],
    ).unflatten_keys(".")
    status, _, body = server.request(
        "POST", protocol.table_path("cartpole", "extend"), encode(rows).to_pybytes(), ARROW
    )
    assert status == 200, body
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    start = time.perf_counter()
    conn.request(
        "POST", protocol.table_path("cartpole", "stream") + f"?batch_size=1&count={n}", headers=AUTH
    )
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Transfer-Encoding") == "chunked"
    import pyarrow as pa

    count = sum(1 for rb in pa.ipc.open_stream(resp) if rb.num_rows == 1)
    elapsed = time.perf_counter() - start
    conn.close()
    assert count == n
    print(f"stream batch 1: {n / elapsed:,.0f} items/s")


def test_token_and_limits_on_the_wire(server: Any) -> None:
    assert server.request("GET", "/healthz", headers={"Authorization": ""})[0] == 200
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("GET", protocol.TABLES)
    assert conn.getresponse().status == 401
    conn.close()
    big = b"\0" * ((1 << 20) + 1)
    status, _, body = server.request("POST", protocol.table_path("cartpole", "extend"), big, ARROW)
    assert status == 413 and json.loads(body)["type"] == "PayloadTooLarge"
    # a chunked upload (no Content-Length) is read and limited the same way
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    rows = decode(
        server.request(
            "POST", protocol.table_path("cartpole", "sample") + "?batch_size=8", None, AUTH
        )[2]
    )
    rows = rows.exclude("index", "sample_info")
    chunks = iter([encode(rows).to_pybytes()])
    conn.request(
        "POST",
        protocol.table_path("cartpole", "extend"),
        body=chunks,
        headers=ARROW,
        encode_chunked=True,
    )
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert json.loads(resp.read())["rows"] == 8
    conn.request(
        "POST",
        protocol.table_path("cartpole", "extend"),
        body=iter([big]),
        headers=ARROW,
        encode_chunked=True,
    )
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()
    status, _, body = server.request(
        "POST", protocol.table_path("foreign", "sample") + "?batch_size=99&timeout=0", None, AUTH
    )
    assert status in (400, 404, 429)


def test_restart_restores_checkpoints(live_server: Any, tmp_path_factory: Any) -> None:
    root = tmp_path_factory.mktemp("restart") / "data"
    first = live_server(
        "--schema", "schemas/cartpole.yaml", "--checkpoint-on-shutdown", root=root, backend="memory"
    )
    rows = TensorDict(
        {
            k: torch.arange(20 * f.numel).reshape(20, *f.shape).to(f.torch_dtype)
            for k, f in TableSpec.from_file("schemas/cartpole.yaml").fields.items()
        },
        batch_size=[20],
    ).unflatten_keys(".")
    status, _, _ = first.request(
        "POST",
        protocol.table_path("cartpole", "extend"),
        encode(rows).to_pybytes(),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200
    # SIGTERM: graceful shutdown (uvicorn re-raises the signal once done), checkpoint written
    assert first.stop() in (0, -15)
    assert (root / "checkpoints" / "cartpole" / "metadata.json").exists()
    second = live_server(
        "--schema", "schemas/cartpole.yaml", "--restore", root=root, backend="memory"
    )
    status, _, body = second.request("GET", protocol.table_path("cartpole"))
    assert status == 200 and json.loads(body)["size"] == 20
    status, _, body = second.request(
        "POST", protocol.table_path("cartpole", "sample") + "?batch_size=64"
    )
    batch = decode(body)
    expected = rows[batch["index"]]
    for key in expected.keys(True, True):
        assert torch.equal(batch.get(key), expected.get(key)), key
    assert len(read_batches(body)) == 1

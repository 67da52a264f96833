"""kill -9 of a server under load: every acknowledged row of a memmap table comes back, whole, once.

Four writers extend and two samplers sample a memmap table (the default
backend) of a real ``tdreplay serve`` process, which is killed with SIGKILL at
a random moment, twice; each time the server is started again with the same
command (no ``--restore``, no checkpoint ever written). At the end the table
must hold every row whose extend was answered 200, bit for bit as it was
sent, none twice; rows of extends cut short may be there or not, but whole.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from service_helpers import ARROW, FIELDS, assert_rows_match, body

from tdreplay.codec import protocol
from tdreplay.storage import Table, TableSpec

CHUNK = 16
CAPACITY = 100_000  # never full in this test: nothing acknowledged is evicted


class Load:
    """Writers and samplers against one server until :meth:`stop`; records acknowledged ids."""

    def __init__(self, port: int, next_chunk: itertools.count) -> None:
        self.port = port
        self.next_chunk = next_chunk
        self.lock = threading.Lock()
        self.acked: list[int] = []
        self.samples = 0
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._write) for _ in range(4)]
        self.threads += [threading.Thread(target=self._sample) for _ in range(2)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def _conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def _write(self) -> None:
        conn = self._conn()
        while not self.stopping.is_set():
            with self.lock:
                start = next(self.next_chunk) * CHUNK
            try:
                conn.request("POST", protocol.table_path("t", "extend"), body(start, CHUNK), ARROW)
                resp = conn.getresponse()
                resp.read()
            except OSError:  # the server died: this extend was never acknowledged
                return
            if resp.status == 200:
                with self.lock:
                    self.acked.extend(range(start, start + CHUNK))

    def _sample(self) -> None:
        conn = self._conn()
        path = protocol.table_path("t", "sample") + "?batch_size=32&timeout=0.2"
        while not self.stopping.is_set():
            try:
                conn.request("POST", path)
                resp = conn.getresponse()
                resp.read()
            except OSError:
                return
            if resp.status == 200:
                self.samples += 1


def test_every_acknowledged_row_survives_kill_9(live_server: Any, tmp_path: Path) -> None:
    spec = {"name": "t", "capacity": CAPACITY, "fields": FIELDS}  # memmap: the default
    schema = tmp_path / "t.yaml"
    schema.write_text(yaml.safe_dump(spec))
    root = tmp_path / "data"
    rng = random.Random(1234)
    chunks = itertools.count()
    acked: list[int] = []
    for _ in range(2):
        server = live_server(schema=schema, root=root)
        load = Load(server.port, chunks)
        load.start()
        time.sleep(rng.uniform(0.4, 1.2))
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        load.stop()
        acked += load.acked
        assert load.acked, "no extend was acknowledged before the kill"
    server = live_server(schema=schema, root=root)
    status, _, raw = server.request("GET", protocol.table_path("t"))
    assert status == 200
    size = json.loads(raw)["size"]
    server.stop()  # the lock on the root is released; the table is opened here
    table = Table.open(TableSpec.model_validate(spec), root)
    try:
        held = table.read(table.live_index())
        ids = held["id"]
        assert len(ids) == size == table.size
        assert len(torch.unique(ids)) == len(ids), "a row is stored twice"
        missing = set(acked) - set(ids.tolist())
        assert not missing, f"{len(missing)} acknowledged rows lost, e.g. {sorted(missing)[:5]}"
        assert_rows_match(held)  # every row whole, bit for bit what was sent
        # rows of one extend are written together: a chunk is all there or not at all
        starts = torch.unique(ids // CHUNK)
        assert len(ids) == len(starts) * CHUNK, "an extend is stored in part"
    finally:
        table.close()

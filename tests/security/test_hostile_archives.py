"""A crafted archive on either side of a dump / load: a client loading one into a real
server, and a server answering a dump with one to a real client. Each is refused as a
:class:`CodecError` naming what is wrong, in time; the server answers 400 (not 500) and
keeps serving, the table untouched and its scratch folder emptied; the client leaves
the dump's folder absent and no hidden folder beside it."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_codec_archive_hostile import END, _extended, _member, _record

from tdreplay.client import CodecError, ReplayClient
from tdreplay.codec import protocol

HOSTILE = {
    "negative-extended-size": _extended(b"", size=-600) + _member("f", b"x") + END,
    "nul-in-name": _extended(_record(b"path", b"a\0b")) + _member("f", b"x") + END,
    "under-a-file": _member("a", b"x") + _member("a/b/c", b"y") + END,
    "named-twice": _member("a", b"x") + _member("a", b"y") + END,
    "name-too-long": _member("x" * 300, b"x") + END,
}


def _spec(name: str) -> dict[str, Any]:
    fields = {"observation": {"shape": [4], "dtype": "float32"}}
    return {"name": name, "capacity": 16, "fields": fields, "backend": {"kind": "memory"}}


def _loaded(server: Any, archive: bytes) -> tuple[int, bytes]:
    status, _, body = server.request(
        "POST", protocol.table_path("t", "load"), archive, {"Content-Type": protocol.TAR},
        timeout=15,
    )  # fmt: skip
    return status, body


@pytest.mark.timeout(120)
def test_a_server_refuses_a_crafted_load_with_400_and_keeps_serving(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(_spec("t"))
    client.extend("t", {("observation",): torch.arange(32.0).reshape(8, 4)})
    stored = client.export("t")
    for name, archive in HOSTILE.items():
        status, body = _loaded(server, archive)
        assert status == 400 and b"CodecError" in body, (name, status, body[:300])
        assert client.export("t") == stored
        transfers = server.root / ".transfers"
        assert not transfers.exists() or not any(transfers.iterdir()), name
    # a dump without its end blocks is cut short, even at a member's edge
    whole = client.dump_archives("t")[0]
    cut = whole.rstrip(b"\0")
    cut += b"\0" * (-len(cut) % 512)
    status, body = _loaded(server, cut)
    assert status == 400 and b"ends early" in body, (status, body[:300])


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers every dump with the server's ``archive``, as a tdreplay server would."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body: bytes = self.server.archive  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", protocol.TAR)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hostile_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(60)
def test_a_client_refuses_a_crafted_dump_and_leaves_nothing(
    hostile_server: Any, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{hostile_server.server_address[1]}"
    cases = {**HOSTILE, "no-end-blocks": _member("metadata.json", b"{}")}
    for name, archive in cases.items():
        hostile_server.archive = archive
        client = ReplayClient(url, transport="http", timeout=10)
        with pytest.raises(CodecError):
            client.dump("t", tmp_path / name)
        assert not (tmp_path / name).exists() or not any((tmp_path / name).iterdir()), name
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], name
    hostile_server.archive = _member("metadata.json", b"{}") + END  # the control: taken
    dumped = ReplayClient(url, transport="http").dump("t", tmp_path / "ok")
    assert (dumped / "metadata.json").read_bytes() == b"{}"

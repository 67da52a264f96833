"""A server without a token trusts whoever reaches its port - but not a web page on another site.

A page in a browser on the same host reaches loopback too. A ``no-cors`` POST
needs no CORS answer to run (it only cannot read the answer), so without a
guard a page on another origin clears a table (Chromium asks the user before a
public site reaches loopback, other browsers do not; a page served from this
host - a notebook, a dev server - is not asked about at all); a page on a domain re-pointed at
127.0.0.1 (DNS rebinding) is even same-origin with the server and reads
everything. Here a real Chromium (loopback only: :mod:`browserkit`) runs such a
page against a real server, and raw requests carry what a rebound page sends
(its own ``Host``); each is a 403 that changes nothing, while clients, and
the server's own pages, work as before.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import threading
from typing import Any

import pytest
import testkit
from browserkit import CHROMIUM, host_only_browser
from test_http_framing import fill, size

from tdreplay.codec import encode, protocol
from tdreplay.service import Settings

SPEC = {
    "name": "t",
    "capacity": 32,
    "fields": dict(testkit.FIELDS),
    "backend": {"kind": "memory"},
    "sampler": {"kind": "fifo"},  # a sample takes the item: reading changes it too
}


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    server = live_server()  # loopback, no token: the default
    status, _, body = server.request(
        "POST", protocol.TABLES, json.dumps(SPEC).encode(), {"Content-Type": protocol.JSON}
    )
    assert status == 201, body
    fill(server)
    return server


def send(server: Any, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict]:
    """One request with exactly these headers (``Host`` included, as a browser sends it)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


CLEAR = ("POST", protocol.table_path("t", "clear"))
SAMPLE = ("POST", protocol.table_path("t", "sample") + "?batch_size=1&timeout=0")
LIST = ("GET", protocol.TABLES)


@pytest.mark.parametrize(
    "headers, field",
    [
        ({"Host": "rebound.example:{port}"}, "Host"),
        ({"Host": "rebound.example:{port}", "Origin": "http://rebound.example:{port}"}, "Host"),
        ({"Host": "127.0.0.1.rebound.example"}, "Host"),
        ({"Origin": "http://elsewhere.example"}, "Origin"),
        ({"Origin": "null"}, "Origin"),
        ({"Origin": "http://localhost:1"}, "Origin"),  # another port: another origin
        ({"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"),
        ({"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site"),
    ],
)
@pytest.mark.parametrize("call", [CLEAR, SAMPLE, LIST], ids=["clear", "sample", "list"])
def test_a_web_page_on_another_site_is_refused(
    server: Any, headers: dict[str, str], field: str, call: tuple[str, str]
) -> None:
    headers = {k: v.format(port=server.port) for k, v in headers.items()}
    headers.setdefault("Host", f"127.0.0.1:{server.port}")
    before = size(server)
    status, body = send(server, *call, headers)
    assert status == 403, body
    assert body["type"] == "Forbidden" and body["field"] == field, body
    assert size(server) == before == 8


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a client: no Origin, no Sec-Fetch-Site
        {"Host": "localhost:{port}"},
        {"Host": "[::1]:{port}"},
        {"Host": "app.localhost:{port}"},  # browsers resolve *.localhost themselves
        {"Host": "10.1.2.3:{port}"},  # an IP address: no domain to re-point
        {"Host": socket.gethostname() + ":{port}"},  # this machine's name
        {"Origin": "http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},  # its own page
        {"Sec-Fetch-Site": "none"},  # a URL typed into the address bar
    ],
)
def test_clients_and_the_servers_own_pages_pass(server: Any, headers: dict[str, str]) -> None:
    headers = {k: v.format(port=server.port) for k, v in headers.items()}
    headers.setdefault("Host", f"127.0.0.1:{server.port}")
    status, body = send(server, *LIST, headers)
    assert status == 200, body
    assert [t["name"] for t in body["tables"]] == ["t"]


#: the GET routes, each only a read: what an ``<img>`` or ``<script>`` of another site sends
#: from a browser without ``Sec-Fetch-Site`` (Safari before 16.4, Firefox before 90) carries
#: neither header this guard reads, and must change nothing
READS = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/status",
    "/v1/info",
    "/v1/status",
    protocol.TABLES,
    protocol.table_path("{name}"),
}
#: what an older browser sends for ``<img src>``: a Host naming the server, no Origin
OLD_BROWSER = {
    "Accept": "image/webp,image/png,image/*;q=0.8,*/*;q=0.5",
    "User-Agent": "Mozilla/5.0 (Macintosh) AppleWebKit/605.1.15 Version/15.6 Safari/605.1.15",
}


def gets(server: Any) -> set[str]:
    """The GET routes the server documents (its OpenAPI document, over HTTP)."""
    status, _, body = server.request("GET", "/openapi.json")
    assert status == 200, body
    return {path for path, ops in json.loads(body)["paths"].items() if "get" in ops}


def test_every_get_route_only_reads(server: Any) -> None:
    """A GET that took items (the stream route did: a cross-site ``<img>`` of it drained a
    queue) is no longer served; whatever takes or changes anything is a POST, which
    browsers send with ``Origin``."""
    assert gets(server) <= READS, gets(server) - READS


def test_a_get_without_origin_nor_sec_fetch_changes_nothing(server: Any) -> None:
    stream = protocol.table_path("t", "stream") + "?batch_size=1&count=8&timeout=0"
    status, _, raw = server.request("GET", stream, None, OLD_BROWSER)  # Host: 127.0.0.1:port
    assert size(server) == 8, f"a GET took items ({status})"
    assert status == 405 and json.loads(raw)["detail"].endswith("(it takes POST)"), raw
    for path in sorted(gets(server)):
        path = path.replace("{name}", "t") + "?batch_size=1&count=8&timeout=0"
        status, _, _ = server.request("GET", path, None, OLD_BROWSER)  # Host: 127.0.0.1:port
        assert status == 200, (path, status)
    assert size(server) == 8
    status, _, _ = server.request("POST", stream)  # a client's stream still takes items
    assert status == 200 and size(server) == 0
    status, _, body = server.request(
        "POST",
        protocol.table_path("t", "extend"),
        encode(testkit.rows(0, 8)).to_pybytes(),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200 and size(server) == 8, body


@pytest.mark.parametrize("page", ["/docs", "/status"])
def test_the_servers_pages_cannot_be_framed_by_another_site(server: Any, page: str) -> None:
    """A browser without ``Sec-Fetch-Site`` loads ``/docs`` in another site's frame (a GET
    without ``Origin`` passes); in it, the docs' "Try it out" sends same-origin requests,
    which pass too: a page overlaid on the frame could click a table's clear."""
    status, headers, _ = server.request("GET", page, None, OLD_BROWSER)
    assert status == 200
    assert "frame-ancestors 'none'" in headers.get("content-security-policy", ""), headers
    assert headers.get("x-frame-options") == "DENY", headers
    assert headers.get("x-content-type-options") == "nosniff", headers


def test_allow_host_names_what_a_server_without_a_token_also_answers(live_server: Any) -> None:
    """``--allow-host`` (a proxy on this host forwarding its own ``Host``) adds names; ``*``
    turns the check off (not the Origin one); a value that is no host name is refused."""
    server = live_server("--allow-host", "replay.internal", "Proxy.Example")
    for host, want in [
        ("replay.internal:8080", 200),
        ("proxy.example", 200),  # names compare case-insensitively
        ("rebound.example", 403),
    ]:
        assert send(server, *LIST, {"Host": host})[0] == want, host
    anything = live_server(env={"TDREPLAY_ALLOW_HOST": "*"})
    assert send(anything, *LIST, {"Host": "rebound.example"})[0] == 200
    assert send(anything, *LIST, {"Host": "x", "Origin": "http://elsewhere.example"})[0] == 403
    with pytest.raises(ValueError, match="allow_host 'evil/path' is not a host name"):
        Settings(allow_host=["replay.internal", "evil/path"])


playwright = pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (the test extra)"
)


class _Page(http.server.BaseHTTPRequestHandler):
    """Serves the page of another origin on this host (any path: an empty page)."""

    def do_GET(self) -> None:
        body = b"<!doctype html><title>another origin</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def other_origin() -> Any:
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_port}"
    site.shutdown()
    site.server_close()
    thread.join(5)


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="no chromium here")
def test_a_page_in_chromium_cannot_clear_a_table_nor_read(server: Any, other_origin: str) -> None:
    """A page of another origin on this host posts ``no-cors`` (no preflight, no CORS answer
    needed), loads an image and fetches; the server's own /status page still polls its data."""
    with playwright.sync_playwright() as api, host_only_browser(api) as (browser, proxy):
        page = browser.new_page()
        page.goto(other_origin + "/page.html")
        outcome = page.evaluate(
            """async (base) => {
                await fetch(base + "/v1/tables/t/clear", {method: "POST", mode: "no-cors"});
                await fetch(base + "/v1/tables/t/sample?batch_size=1&timeout=0",
                            {method: "POST", mode: "no-cors"});
                await fetch(base + "/v1/tables/t/stream?batch_size=1&count=8&timeout=0",
                            {method: "POST", mode: "no-cors"});
                await new Promise((done) => {  // a GET any page sends: an image
                    const img = new Image();
                    img.onload = img.onerror = done;
                    img.src = base + "/v1/tables/t/stream?batch_size=1&count=8&timeout=0";
                });
                try { await fetch(base + "/v1/tables"); return "read"; }
                catch (e) { return "blocked"; }
            }""",
            server.url,
        )
        assert outcome == "blocked"  # no CORS answer: the page reads nothing
        assert size(server) == 8  # and changed nothing
        own = browser.new_page()
        own.goto(server.url + "/status")
        polled = own.evaluate("async () => (await fetch('/v1/status')).status")
        assert polled == 200
        assert size(server) == 8
        assert proxy.attempts == []

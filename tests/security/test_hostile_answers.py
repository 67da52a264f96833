"""What a server sends is never written raw to the user's terminal.

Whatever answers at ``--url`` - a proxy's error page, a port another local user
bound first, a server of another kind - its words reach the terminal through
the command's messages. An error page holding an escape sequence
(``ESC ]0;...BEL`` retitles the window; others recolour, move the cursor, erase
lines) was printed as it came; so were table names in ``tdreplay tables``.
Now every control character of what a server sent is shown as its escape.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from testkit import run_cli as tdreplay

from tdreplay.client import ReplayClient, ServerError

ESCAPE = "\x1b]0;owned\x07\x1b[2J"
#: path -> (status, content type, body)
ANSWERS = {
    "/v1/tables/page": (502, "text/html", f"<html>{ESCAPE}Bad Gateway</html>"),
    "/v1/tables/json": (
        409,
        "application/json",
        json.dumps({"type": "TableExists", "detail": f"taken{ESCAPE}\nFORGED line"}),
    ),
    "/v1/tables/bidi": (
        409,
        "application/json",
        json.dumps({"type": "TableExists", "detail": "café \u202egnp.exe\u200b ü 日本"}),
    ),
    "/v1/tables/surrogate": (  # JSON's "\ud800" decodes to a lone surrogate
        409,
        "application/json",
        json.dumps({"type": "TableExists", "detail": "taken \ud800 by \udfff"}),
    ),
    "/v1/tables": (
        200,
        "application/json",
        json.dumps(
            {"tables": [{"name": f"t{ESCAPE}", "backend": "memory", "size": 0, "capacity": 8}]}
        ),
    ),
}


class Answering(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, kind, body = ANSWERS.get(self.path, (404, "text/plain", "no"))
        raw = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("table", ["page", "json"])
def test_an_error_answer_is_shown_with_its_control_characters_escaped(
    url: str, table: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = tdreplay("info", table, "--url", url, capsys=capsys, monkeypatch=monkeypatch)
    assert code == 1, err
    assert "\x1b" not in out + err and "\x07" not in err, repr(err)
    assert "\\x1b]0;owned\\x07" in err, repr(err)
    assert err.count("\n") == 1, repr(err)  # one line: no line of the server's making
    with ReplayClient(url) as client, pytest.raises(ServerError) as caught:
        client.info(table)
    assert "\x1b" not in str(caught.value) and "\\x1b" in str(caught.value)


def test_table_names_from_the_server_are_listed_with_their_escapes_shown(
    url: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = tdreplay("tables", "--url", url, capsys=capsys, monkeypatch=monkeypatch)
    assert code == 0, err
    assert "\x1b" not in out and "t\\x1b]0;owned\\x07" in out, repr(out)


def test_format_characters_are_escaped_and_letters_kept(
    url: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bidi override (U+202E, category Cf) reorders what a terminal or log shows after it
    ("gnp.exe" reads "exe.png"); a zero-width space hides; both are shown as escapes, while
    letters outside ASCII stay as they are."""
    code, _, err = tdreplay("info", "bidi", "--url", url, capsys=capsys, monkeypatch=monkeypatch)
    assert code == 1 and "\u202e" not in err and "\u200b" not in err, repr(err)
    assert "café \\u202egnp.exe\\u200b ü 日本" in err, repr(err)
    with ReplayClient(url) as client, pytest.raises(ServerError) as caught:
        client.info("bidi")
    assert str(caught.value).count("\\u202e") == 1 and "\u202e" not in str(caught.value)


def test_lone_surrogates_are_escaped(
    url: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone surrogate (category Cs: JSON's ``"\\ud800"`` decodes to one) has no UTF-8: kept,
    it failed the command's own error message (``UnicodeEncodeError`` writing it to the
    terminal) and any log line quoting it; it is shown as its escape."""
    code, _, err = tdreplay(
        "info", "surrogate", "--url", url, capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == 1 and "taken \\ud800 by \\udfff" in err, repr(err)
    with ReplayClient(url) as client, pytest.raises(ServerError) as caught:
        client.info("surrogate")
    message = str(caught.value)
    assert "\\ud800" in message and message.encode("utf-8")  # encodes: nothing lone is left

"""A URL carrying ``user:password@`` is refused, and its password is never printed.

A client authenticates with a bearer token only. An operator who wrote the
password into the URL (``--url http://alice:pw@host:port``, ``TDREPLAY_URL``)
had it silently dropped - the request went out without it - and then printed
in full by every message naming the server: ``refused`` (401), ``no answer
from`` (server down), ``not an http(s) URL``. Now such a URL is a usage error
(exit 2) that names the problem and shows the URL as ``http://***@host:port``.
"""

from __future__ import annotations

from typing import Any

import pytest
from testkit import free_port
from testkit import run_cli as tdreplay

from tdreplay.client import AsyncReplayClient, ReplayClient

SECRET = "s3cr3t-pw"
TOKEN = "the-right-token-0123456789"


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    return live_server(token=TOKEN)


def credentialed(url: str) -> str:
    return url.replace("http://", f"http://alice:{SECRET}@")


def test_the_cli_refuses_a_url_with_a_password_and_never_prints_it(
    server: Any, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    for url in (
        credentialed(server.url),  # a server that wants a token (the 401 named the URL)
        credentialed(down),  # a server that is down (the "no answer from" named it)
        f"htp://alice:{SECRET}@127.0.0.1:1",  # not http (the message quoted it)
        f"alice:{SECRET}@127.0.0.1:{server.port}",  # no scheme
    ):
        code, out, err = tdreplay("tables", "--url", url, capsys=capsys, monkeypatch=monkeypatch)
        assert SECRET not in out + err, (url, err)
        assert code == 2, (url, code, err)
        assert "***@127.0.0.1" in err, err
    # the environment's URL too, and with the right token given
    code, out, err = tdreplay(
        "tables",
        capsys=capsys,
        monkeypatch=monkeypatch,
        TDREPLAY_URL=credentialed(server.url),
        TDREPLAY_TOKEN=TOKEN,
    )
    assert (code, SECRET in out + err) == (2, False), err
    assert "user and password" in err and "TDREPLAY_TOKEN" in err, err
    # the same URL without them works
    code, out, err = tdreplay(
        "tables", "--url", server.url, capsys=capsys, monkeypatch=monkeypatch, TDREPLAY_TOKEN=TOKEN
    )
    assert code == 0, err


def test_the_clients_refuse_a_url_with_a_password(server: Any) -> None:
    for make in (ReplayClient, AsyncReplayClient):
        with pytest.raises(ValueError, match="user and password") as caught:
            make(credentialed(server.url), TOKEN)
        assert SECRET not in str(caught.value)

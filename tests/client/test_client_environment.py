"""A client without a URL or token finds them in the environment, as the CLI and the server
do (TDREPLAY_URL, TDREPLAY_TOKEN, TDREPLAY_TOKEN_FILE); what the code gives wins."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import pytest
from testkit import rows

from tdreplay.client import AsyncReplayClient, ReplayClient, Unauthorized
from tdreplay.client.environment import configured
from tdreplay.client.plans import ClientSettings

TOKEN = "env-t0ken-for-tests"


@pytest.fixture(scope="module")
def guarded(live_server: Any) -> Any:
    return live_server(token=TOKEN)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("TDREPLAY_URL", "TDREPLAY_TOKEN", "TDREPLAY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_client_reads_its_server_and_token_from_the_environment(
    guarded: Any, env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env.setenv("TDREPLAY_URL", guarded.url)
    env.setenv("TDREPLAY_TOKEN", TOKEN)
    client = ReplayClient()
    assert client.urls == (guarded.url,)
    client.create_table(
        {"name": "e", "capacity": 8, "fields": {"id": {"shape": [], "dtype": "int64"}},
         "backend": {"kind": "memory"}}
    )  # fmt: skip
    client.extend("e", rows(0, 4).select("id"))
    assert pickle.loads(pickle.dumps(client)).info("e")["size"] == 4  # the token travels
    env.delenv("TDREPLAY_TOKEN")
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")  # as a mounted secret or `echo` leaves it
    env.setenv("TDREPLAY_TOKEN_FILE", str(secret))
    assert ReplayClient().info("e")["size"] == 4

    async def main() -> int:
        async with AsyncReplayClient() as aclient:
            return int((await aclient.info("e"))["size"])

    assert asyncio.run(main()) == 4
    with pytest.raises(Unauthorized):
        ReplayClient(token="wrong-token").info("e")  # the code's token wins
    env.setenv("TDREPLAY_URL", "http://127.0.0.1:9")
    assert ReplayClient(guarded.url).info("e")["size"] == 4  # so does its URL


def test_a_token_given_twice_or_unusable_is_refused_without_quoting_it(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text("file-token")
    env.setenv("TDREPLAY_TOKEN", "env-token")
    env.setenv("TDREPLAY_TOKEN_FILE", str(secret))
    with pytest.raises(ValueError, match="given twice") as err:
        ReplayClient()
    assert "env-token" not in str(err.value) and "file-token" not in str(err.value)
    env.delenv("TDREPLAY_TOKEN_FILE")
    env.setenv("TDREPLAY_TOKEN", "has a space")
    with pytest.raises(ValueError, match="TDREPLAY_TOKEN holds spaces"):
        ReplayClient()
    env.delenv("TDREPLAY_TOKEN")
    env.setenv("TDREPLAY_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="cannot be read"):
        ReplayClient()
    env.delenv("TDREPLAY_TOKEN_FILE")
    assert configured(None, None) == (("http://127.0.0.1:8000",), None)
    env.setenv("TDREPLAY_URL", "http://a:1,http://b:2")
    assert ReplayClient().urls == ("http://a:1", "http://b:2")  # shards


def test_the_torchrl_buffer_reads_the_environment_too(
    guarded: Any, env: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchrl")
    from tdreplay.torchrl import TDReplayBuffer

    env.setenv("TDREPLAY_URL", guarded.url)
    env.setenv("TDREPLAY_TOKEN", TOKEN)
    ReplayClient().create_table(
        {"name": "tb", "capacity": 8, "fields": {"id": {"shape": [], "dtype": "int64"}},
         "backend": {"kind": "memory"}}
    )  # fmt: skip
    rb = TDReplayBuffer(table="tb")
    rb.extend(rows(0, 3).select("id"))
    assert len(rb) == 3
    with pytest.raises(TypeError, match="table's name"):
        TDReplayBuffer()


def test_the_twins_defaults_are_the_settings_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's defaults (timeout, wait, lease slots, ...) are written once, on
    :class:`ClientSettings`: both twins built with none of them get exactly its defaults
    (the constructor and its helper wrote them out again, kept in step by hand)."""
    for var in ("TDREPLAY_URL", "TDREPLAY_TOKEN", "TDREPLAY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    url = "http://127.0.0.1:1"  # nothing is sent: building a client connects nowhere
    expected = ClientSettings(urls=(url,))
    assert ReplayClient(url).settings == expected

    async def built() -> ClientSettings:
        client = AsyncReplayClient(url)
        try:
            return client.settings
        finally:
            await client.aclose()

    assert asyncio.run(built()) == expected

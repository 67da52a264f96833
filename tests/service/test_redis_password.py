"""``--redis-password-file``: the Redis password from a secret file, never in a URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tdreplay.service import Settings


def test_the_password_file_fills_every_url_without_a_password(tmp_path: Path) -> None:
    secret = tmp_path / "redis_password"
    secret.write_text("s3cret\n")
    s = Settings(
        redis=["redis://redis:6379/0", "other=redis://:own@redis:6379/1"],
        redis_password_file=secret,
    )
    conns = s.redis_connections
    assert conns["default"].kwargs()["password"] == "s3cret"  # one trailing newline dropped
    assert conns["other"].kwargs()["password"] == "own"  # a URL's own password wins
    assert "s3cret" not in repr(s) + repr(conns) + conns["default"].describe()


@pytest.mark.parametrize("content", [None, "", "two words"])
def test_a_bad_password_file_stops_the_start(tmp_path: Path, content: str | None) -> None:
    secret = tmp_path / "redis_password"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(ValueError, match="Redis password"):
        Settings(redis=["redis://redis:6379/0"], redis_password_file=secret)

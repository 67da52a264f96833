"""The bearer token: what a valid one is, and reading one from a file - one rule for the
server (``--token-file``, ``TDREPLAY_TOKEN``) and every client (``TDREPLAY_TOKEN``,
``TDREPLAY_TOKEN_FILE``). The messages never quote the token.

    >>> check_token("s3cret", "TDREPLAY_TOKEN")
    >>> check_token("two words", "TDREPLAY_TOKEN")
    Traceback (most recent call last):
    ...
    ValueError: the token from TDREPLAY_TOKEN holds spaces, control or non-ASCII characters; use visible ASCII only (e.g. `openssl rand -hex 32`)
"""

from __future__ import annotations

from pathlib import Path

#: longest token accepted
MAX_TOKEN_BYTES = 4096


def check_token(token: str, source: str) -> None:
    """Refuse a token no client could send as ``Authorization: Bearer <token>``."""
    if not token:
        raise ValueError(f"the token from {source} is empty")
    if len(token) > MAX_TOKEN_BYTES:
        raise ValueError(f"the token from {source} is longer than {MAX_TOKEN_BYTES} bytes")
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(
            f"the token from {source} holds spaces, control or non-ASCII characters; "
            "use visible ASCII only (e.g. `openssl rand -hex 32`)"
        )


def read_token_file(path: Path) -> str:
    """The token in ``path``, less one trailing newline (as ``echo`` and editors leave it)."""
    source = f"token file {str(path)!r}"
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 3)
    except OSError as err:
        raise ValueError(f"{source} cannot be read: {err.strerror or err}") from None
    if raw.endswith(b"\r\n"):
        raw = raw[:-2]
    elif raw.endswith(b"\n"):
        raw = raw[:-1]
    token = raw.decode("latin-1")
    check_token(token, source)
    return token


def read_secret_file(path: Path, what: str) -> str:
    """Another secret (``what``: e.g. Redis's password) in ``path``, read as a token is.

    Raises:
        ValueError: the file cannot be read, or holds nothing or other characters.
    """
    try:
        return read_token_file(path)
    except ValueError as err:
        raise ValueError(f"{what} password: {err}") from None

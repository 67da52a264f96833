"""Bearer-token check and data-root confinement of client-given paths.

* With a token configured, every request but ``/healthz`` and ``/readyz``
  carries ``Authorization: Bearer <token>``; the comparison is constant-time
  (``hmac.compare_digest``). A missing or wrong token gets 401 and nothing runs.
* A path a client names (checkpoint, restore, export, a table's storage) is
  relative to the data root and must stay inside it: ``../`` escapes,
  absolute paths elsewhere and symlinks out of the root are refused with 400,
  and so is the root itself or any path over a live table's storage.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Iterable
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from tdreplay.storage import InvalidRequest, is_checkpoint

from .errors import Unauthorized

#: routes that never need the token (probes of orchestrators carry none)
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})


class BearerAuth:
    """ASGI middleware: 401 unless the request carries the configured bearer token.

    The scheme is matched case-insensitively (RFC 9110), the token in constant
    time. It fails closed: any scope but ``lifespan`` is checked, so a WebSocket
    route added later is guarded too (closed with 1008 without the token).
    """

    def __init__(self, app: ASGIApp, token: bytes) -> None:
        if not token:
            raise ValueError("BearerAuth needs a non-empty token")
        self.app = app
        self.token = token

    def authorized(self, headers: Iterable[tuple[bytes, bytes]]) -> tuple[bool, str]:
        """Whether ``headers`` carry the token, and if not, why (for the 401's detail)."""
        got = b""
        for name, value in headers:
            if name == b"authorization":
                got = value
                break
        scheme, _, given = got.partition(b" ")
        # compare even when the scheme is wrong, so the timing tells nothing
        match = hmac.compare_digest(given, self.token)
        if not got:
            return False, "missing bearer token"
        if scheme.lower() != b"bearer":
            return False, "Authorization is not a Bearer token"
        return match, "wrong bearer token"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        ok, detail = self.authorized(scope["headers"])
        if ok:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(Unauthorized(detail, field="Authorization").to_dict()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


MAX_NAME = 255
MAX_PATH = 1024


def confine_area(root: Path, area: str, given: str, *, field: str = "path") -> Path:
    """The absolute path of ``given`` (relative to ``root``), refused unless strictly inside ``root/area``.

    The data root has server-owned areas: ``tables/`` (table data, never
    reachable by a client path), ``checkpoints/`` and ``exports/``. A
    checkpoint or restore path must lie in ``checkpoints/``, an export path in
    ``exports/`` (``"checkpoints/step-1000"``, ``"exports/run.parquet"``).

    Raises:
        InvalidRequest: see :func:`confine`; or the path is not inside ``area``.
    """
    target = confine(root, given, field=field)
    base = root.resolve() / area
    if base.is_symlink() or not _inside(target, Path(os.path.realpath(base))) or target == base:
        raise InvalidRequest(
            f"{field} {given!r} is not inside the data root's {area}/ folder; give a path "
            f"like '{area}/<name>'",
            field=field,
            expected=f"{area}/<name>",
            got=given,
        )
    return target


def confine(root: Path, given: str, *, field: str = "path") -> Path:
    """The absolute path of ``given`` (relative to ``root``), refused unless strictly inside ``root``.

    Symlinks are resolved before the check, so a link pointing out of the root
    does not get through. Every existing folder on the way must be a folder, and
    none may be a checkpoint (a path inside a checkpoint would corrupt it).

    Raises:
        InvalidRequest: ``given`` is empty, too long, holds a NUL byte, resolves to
            the root itself or outside it, or runs through a file or a checkpoint.
    """
    try:
        encoded = given.encode()
    except UnicodeEncodeError:  # lone surrogates: no file system takes them
        encoded = b""
    if not encoded or b"\x00" in encoded or len(encoded) > MAX_PATH:
        raise InvalidRequest(f"{field} {given[:80]!r} is not a usable path", field=field)
    if Path(given).is_absolute():
        raise InvalidRequest(
            f"{field} {given[:80]!r} is absolute; give a path relative to the data root",
            field=field,
            expected="a path relative to the data root",
            got=given[:80],
        )
    if any(len(part.encode()) > MAX_NAME for part in Path(given).parts):
        raise InvalidRequest(f"{field}: a name in {given[:80]!r} is too long", field=field)
    base = root.resolve()
    target = Path(os.path.realpath(base / given))  # an absolute `given` replaces base here
    if target == base or not _inside(target, base):
        raise InvalidRequest(
            f"{field} {given!r} is outside the data root; give a path relative to it",
            field=field,
            expected="a path inside the data root",
            got=given,
        )
    for parent in target.parents:
        if parent == base or base not in parent.parents:
            break
        if parent.exists() and not parent.is_dir():
            raise InvalidRequest(f"{field} {given!r} runs through a file", field=field, got=given)
        if is_checkpoint(parent):
            raise InvalidRequest(
                f"{field} {given!r} lies inside a checkpoint", field=field, got=given
            )
    return target


def relative(root: Path, path: Path) -> str:
    """``path`` as the client should see it: relative to the data root."""
    return str(path.resolve().relative_to(root.resolve()))

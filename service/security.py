"""Bearer-token check.

With a token configured, every request but ``/healthz``, ``/readyz`` and the
``/status`` page's shell (no data: see :mod:`.status.routes`)
carries ``Authorization: Bearer <token>``; the comparison is constant-time
(``hmac.compare_digest``). A missing or wrong token gets 401 and nothing runs.
(Client-given paths are confined by the core: :mod:`tdreplay.service.core.paths`.)
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import Unauthorized
from .status.routes import PUBLIC_PATHS as STATUS_PAGE

#: routes that never need the token (probes of orchestrators carry none; a browser cannot
#: send one on the page it navigates to, which then asks for it)
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"}) | STATUS_PAGE


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

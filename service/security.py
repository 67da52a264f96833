"""Bearer-token check.

With a token configured, every request but ``/healthz``, ``/readyz`` and the
``/status`` page's shell (no data: see :mod:`.status.routes`)
carries ``Authorization: Bearer <token>``; the comparison is constant-time
(``hmac.compare_digest``). A missing or wrong token gets 401 and nothing runs.
(Client-given paths are confined by the core: :mod:`tdreplay.service.core.paths`.)

Without a token, whoever reaches the port is trusted - but a web page in a
browser on this host reaches loopback too. :class:`BrowserGuard` then answers
403, and runs nothing, to what such a page sends: a request from another site
(its ``Sec-Fetch-Site`` or ``Origin`` says so: a ``no-cors`` POST needs no
CORS answer to clear a table), or, on a loopback connection, a ``Host`` that
another site could stand for (a page on a domain re-pointed at 127.0.0.1, DNS
rebinding, is same-origin with the server it reaches; which names are this
machine's is :class:`~tdreplay.service.hosts.HostNames`'s to say). Clients other than
browsers send neither header, and ``Host`` as they were told to reach it - and so does a
browser without ``Sec-Fetch-Site`` (older ones) loading an ``<img>`` or ``<script>`` of
another site: which is why a GET route only ever reads (the contract's rule,
:mod:`tdreplay.codec.operations`); whatever takes items or changes anything is a POST.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import Forbidden, Unauthorized
from .hosts import HostNames, is_loopback
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
        error = Unauthorized(detail, field="Authorization")
        await _answer(send, error, [(b"www-authenticate", b"Bearer")])


async def _answer(send: Send, error: Unauthorized | Forbidden, extra: list) -> None:
    body = json.dumps(error.to_dict()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers + extra})
    await send({"type": "http.response.body", "body": body})


#: (Host, address) pairs :class:`BrowserGuard` remembers at most
_MAX_ANSWERED = 256


class BrowserGuard:
    """ASGI middleware of a server without a token: 403 for what a web page on another site
    sends (see the module docstring); the public paths stay open, like :class:`BearerAuth`'s.
    """

    def __init__(self, app: ASGIApp, hosts: HostNames) -> None:
        self.app = app
        self.hosts = hosts
        #: (Host header, server address) -> whether that Host may be answered there: parsing
        #: addresses cost 4 us a request; a client sends the same pair every time
        self._answered: dict[tuple[bytes, str], bool] = {}

    def _host_ok(self, host: bytes, scope: Scope) -> bool:
        server = scope.get("server")
        where = str(server[0]) if server else ""
        ok = self._answered.get((host, where))
        if ok is None:
            ok = not is_loopback(where) or self.hosts.allows(host.decode("latin-1"))
            if len(self._answered) >= _MAX_ANSWERED:  # many names tried: start over
                self._answered.clear()
            self._answered[host, where] = ok
        return ok

    def refused(self, scope: Scope) -> Forbidden | None:
        """Why ``scope`` looks like a web page's request to another site, or ``None``."""
        site = origin = None
        raw_host = b""
        for name, value in scope["headers"]:
            if name == b"host":
                raw_host = value
            elif name == b"sec-fetch-site":
                site = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if site is None and origin is None and (not raw_host or self._host_ok(raw_host, scope)):
            return None  # a client's request, as every one but a browser's is
        host = raw_host.decode("latin-1") if raw_host else None
        if site is not None and site not in ("same-origin", "none"):
            return Forbidden(
                f"a request from a web page on another site (Sec-Fetch-Site: {site}); "
                "a server without a token takes none",
                field="Sec-Fetch-Site",
                got=site,
            )
        if origin is not None and origin != f"{scope.get('scheme', 'http')}://{host}":
            return Forbidden(
                f"a request from a web page on another origin ({origin!r}); "
                "a server without a token takes none",
                field="Origin",
                got=origin,
            )
        if raw_host and not self._host_ok(raw_host, scope):
            return Forbidden(
                f"Host {host!r} does not name this loopback server (a web page on a "
                "domain pointed at it?); reach it as localhost or 127.0.0.1, list the "
                "name with --allow-host, or give the server a token",
                field="Host",
                got=host,
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        error = self.refused(scope)
        if error is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await _answer(send, error, [])
        else:
            await send({"type": "websocket.close", "code": 1008})

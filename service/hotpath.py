"""The hot routes' way past the framework: extend and sample straight to their handlers.

A one-item sample's server time was 170 µs, of which the table call took
75 µs and the response 25 µs: the rest went to Starlette's router (every
route's pattern tried in turn, a scope copied per layer), its dependency
solving and its exception middleware. :class:`HotRoutes` - the service's one
way past the framework - sits inside the authentication and metrics
middleware (they still see every request) and hands ``POST
/v1/tables/{name}/sample`` and ``/extend`` to their handlers
(:data:`~tdreplay.service.routes.data.HOT_ROUTES`), setting the scope's
``route`` and ``path_params`` as the router would. Errors become the same
JSON answers through the app's own exception handlers. Every other request
goes through the framework unchanged, and the OpenAPI document still
comes from the routes.

A path ending in a newline is answered 404 here, before any route sees it:
Starlette's route patterns end in ``$``, which also matches before a final
newline, so ``POST /v1/tables/t/extend%0A`` reached the extend route (and a
failure there logged the path, newline and all).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, APIRouter
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]


class HotRoutes:
    """ASGI middleware serving the routes ``handlers`` names without routing.

    Args:
        app: the next ASGI application (the framework's stack).
        fastapi: the app whose exception handlers answer errors.
        router: the router (included in ``fastapi``) that declares the routes.
        handlers: route name (``APIRoute.name``) -> the handler that serves it; each
            route must be a POST route whose path ends in ``/{name}/<operation>``.
    """

    def __init__(
        self, app: ASGIApp, fastapi: FastAPI, router: APIRouter, handlers: Mapping[str, Handler]
    ) -> None:
        self.app = app
        self.fastapi = fastapi
        self.router = router
        self._handlers = dict(handlers)
        self._names = tuple(handlers)
        self._routes: dict[str, tuple[APIRoute, Handler]] | None = None
        self._pattern: re.Pattern[str] | None = None

    def _build(self) -> None:
        """Index the routes (after the router has them all: at the first request)."""
        routes: dict[str, tuple[APIRoute, Handler]] = {}
        prefix = None
        for route in self.router.routes:
            if isinstance(route, APIRoute) and route.name in self._names:
                head, _, tail = route.path.rpartition("/")
                if not head.endswith("/{name}") or route.methods != {"POST"}:
                    raise ValueError(f"route {route.name!r} is not POST .../{{name}}/<op>")
                if prefix not in (None, head):
                    raise ValueError("the hot routes must share their prefix")
                prefix = head
                routes[tail] = (route, self._handlers[route.name])
        if set(r.name for r, _ in routes.values()) != set(self._names) or prefix is None:
            raise ValueError(f"not every hot route exists: {self._names}")
        base = re.escape(prefix[: -len("/{name}")])
        ops = "|".join(re.escape(op) for op in routes)
        self._pattern = re.compile(rf"{base}/([^/]+)/({ops})")
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("\n"):  # no route's, whole
            request = Request(scope, receive)
            response = await self._error(request, HTTPException(404))
            await response(scope, receive, send)
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if self._pattern is None:
            self._build()
        assert self._pattern is not None and self._routes is not None
        match = self._pattern.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        route, handler = self._routes[match.group(2)]
        scope["app"] = self.fastapi
        scope["route"] = route
        scope["path_params"] = {"name": match.group(1)}
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except Exception as exc:
            response = await self._error(request, exc)
        await response(scope, receive, send)

    async def _error(self, request: Request, exc: Exception) -> Response:
        """The app's answer to ``exc`` (its most specific handler), or ``exc`` raised on."""
        handlers: dict[Any, Callable[..., Any]] = self.fastapi.exception_handlers
        for cls in type(exc).__mro__:
            handler = handlers.get(cls)
            if handler is not None:
                return await handler(request, exc)
        raise exc

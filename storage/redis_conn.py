"""Redis connections: operator configuration, never request content.

A table spec names a connection (``backend.connection``, default
``"default"``); the operator maps names to URLs (``tdreplay serve --redis
NAME=URL``, or ``redis={NAME: URL}`` in code). Nothing a client sends can make
the process connect to a host the operator did not name, and every connection
has connect and read timeouts, so a hung Redis fails a call instead of
holding it forever.

    >>> conn = RedisConnection.parse("cache=redis://:secret@10.0.0.5:6380/2")
    >>> conn.name, conn.kwargs()["host"], conn.kwargs()["port"], conn.kwargs()["db"]
    ('cache', '10.0.0.5', 6380, 2)
    >>> conn.describe()
    'redis://10.0.0.5:6380/2'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from . import names
from .errors import SchemaError

#: seconds a Redis connect or command may take before it fails (``--redis-timeout``)
DEFAULT_TIMEOUT = 5.0


@dataclass(frozen=True)
class RedisConnection:
    """A named Redis (or Dragonfly) server the operator configured.

    Args:
        name: what table specs call it (``backend.connection``).
        url: ``redis://[user:password@]host[:port][/db]``, ``rediss://...`` (TLS)
            or ``unix:///path/to/socket?db=N``.
        timeout: connect and per-command timeout in seconds.
        password: the password when the URL carries none (the operator's
            ``--redis-password-file``); never shown by ``repr`` or :meth:`describe`.
    """

    name: str
    url: str
    timeout: float = DEFAULT_TIMEOUT
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        names.check_connection(self.name)
        if self.timeout <= 0:
            raise ValueError(f"redis connection {self.name!r}: timeout must be > 0")
        self.kwargs()  # a malformed URL fails here, at configuration time

    @classmethod
    def parse(
        cls, option: str, *, timeout: float = DEFAULT_TIMEOUT, password: str | None = None
    ) -> RedisConnection:
        """``"NAME=URL"`` (or a bare URL, named ``default``) as given to ``--redis``."""
        name, sep, url = option.partition("=")
        if not sep or "://" in name:
            name, url = "default", option
        return cls(name.strip(), url.strip(), timeout, password)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``redis.Redis`` / ``redis.asyncio.Redis`` for this connection."""
        u = urlparse(self.url)
        query = {k: v[-1] for k, v in parse_qs(u.query).items()}
        out: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
        }
        try:
            if u.scheme in ("redis", "rediss"):
                if not u.hostname:
                    raise ValueError("no host")
                out.update(host=u.hostname, port=u.port or 6379)
                path = u.path.strip("/")
                out["db"] = int(path or query.get("db", "0"))
                if u.scheme == "rediss":
                    out["ssl"] = True
            elif u.scheme == "unix":
                if not u.path:
                    raise ValueError("no socket path")
                out.update(unix_socket_path=u.path, db=int(query.get("db", "0")))
            else:
                raise ValueError(f"scheme {u.scheme!r} is not redis://, rediss:// or unix://")
        except ValueError as err:
            raise ValueError(f"redis connection {self.name!r}: bad URL: {err}") from None
        if out["db"] < 0:
            raise ValueError(f"redis connection {self.name!r}: db must be >= 0")
        if u.username:
            out["username"] = unquote(u.username)
        if u.password:
            out["password"] = unquote(u.password)
        elif self.password is not None:
            out["password"] = self.password
        return out

    def describe(self) -> str:
        """The URL without credentials (for logs and ``info``)."""
        k = self.kwargs()
        if "unix_socket_path" in k:
            return f"unix://{k['unix_socket_path']}?db={k['db']}"
        scheme = "rediss" if k.get("ssl") else "redis"
        return f"{scheme}://{k['host']}:{k['port']}/{k['db']}"

    def client(self) -> Any:
        """A synchronous ``redis.Redis`` client with this connection's timeouts."""
        import redis

        return redis.Redis(**self.kwargs())


Connections = Mapping[str, RedisConnection]


def connections(given: Mapping[str, str | RedisConnection] | None) -> dict[str, RedisConnection]:
    """Normalize ``{name: url or RedisConnection}`` (``None``: no Redis configured)."""
    out = {}
    for name, value in (given or {}).items():
        out[name] = value if isinstance(value, RedisConnection) else RedisConnection(name, value)
    return out


def resolve(table: str, name: str, configured: Connections) -> RedisConnection:
    """The connection table ``table``'s spec names.

    Raises:
        SchemaError: no connection of that name is configured.
    """
    conn = configured.get(name)
    if conn is None:
        have = ", ".join(sorted(configured)) or "none"
        raise SchemaError(
            f"table {table!r}: redis connection {name!r} is not configured on this server "
            f"(configured: {have}; the operator adds one with --redis NAME=URL)",
            table=table,
            field="backend.connection",
            expected=sorted(configured),
            got=name,
        )
    return conn

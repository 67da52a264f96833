"""What the blocking and the asyncio clients share, apart from their I/O.

:class:`ClientBase` holds a client's :class:`~tdreplay.client.core.ClientSettings`,
its plans (:class:`~tdreplay.client.core.Calls`), its cache of generated
tensorclasses and its pickling (a client pickles as its settings, so a copy in
a DataLoader worker or a subprocess opens its own connections).
:class:`~tdreplay.client.ReplayClient` (``sync.py``) and
:class:`~tdreplay.client.AsyncReplayClient` (``aio.py``) both build on it, so
neither twin imports the other for what they share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from .core import Calls, ClientSettings
from .retry import RetryPolicy
from .tensorclass import from_fields

B = TypeVar("B", bound="ClientBase")


def make_settings(
    url: str | Sequence[str],
    token: str | None,
    timeout: float,
    connect_timeout: float,
    wait: float,
    retry: RetryPolicy | None,
    max_connections: int,
    shard_refresh: float,
    transport: str = "auto",
    lease_slots: int = 2,
) -> ClientSettings:
    """The :class:`ClientSettings` of a client built with these constructor arguments."""
    urls = (url,) if isinstance(url, str) else tuple(url)
    return ClientSettings(
        urls=urls,
        token=token,
        timeout=timeout,
        connect_timeout=connect_timeout,
        wait=wait,
        retry=retry if retry is not None else RetryPolicy(),
        max_connections=max_connections,
        shard_refresh=shard_refresh,
        transport=transport,
        lease_slots=lease_slots,
    )


class ClientBase:
    """What both twins share: settings, plans, tensorclass cache, pickling.

    Subclasses extend :meth:`_setup` to open their transports; it runs both on
    construction and on unpickling.
    """

    settings: ClientSettings

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        wait: float = 30.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 16,
        shard_refresh: float = 1.0,
        transport: str = "auto",
        lease_slots: int = 2,
    ) -> None:
        self._setup(
            make_settings(
                url,
                token,
                timeout,
                connect_timeout,
                wait,
                retry,
                max_connections,
                shard_refresh,
                transport,
                lease_slots,
            )
        )

    @classmethod
    def _from_settings(cls: type[B], settings: ClientSettings) -> B:
        """A client of this class with ``settings`` (what unpickling does)."""
        obj = cls.__new__(cls)
        obj._setup(settings)
        return obj

    def _setup(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._calls = Calls(settings)
        self._classes: dict[str, type] = {}

    @property
    def urls(self) -> tuple[str, ...]:
        return self.settings.urls

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.settings))

    def __repr__(self) -> str:
        urls = self.urls[0] if len(self.urls) == 1 else list(self.urls)
        return f"{type(self).__name__}({urls!r})"

    def _tensorclass(self, table: str, info: dict[str, Any]) -> type:
        cls = self._classes.get(table)
        if cls is None:
            cls = self._classes[table] = from_fields(table, info["fields"])
        return cls


def _restore(cls: type[ClientBase], settings: ClientSettings) -> ClientBase:
    """Unpickle a client (the function ``__reduce__`` names)."""
    return cls._from_settings(settings)

"""What the blocking and the asyncio clients share, apart from their I/O.

:class:`ClientBase` holds a client's :class:`~tdreplay.client.plans.ClientSettings`,
its plans (:class:`~tdreplay.client.plans.Plans`), its cache of generated
tensorclasses and its pickling (a client pickles as its settings, so a copy in
a DataLoader worker or a subprocess opens its own connections).
:class:`~tdreplay.client.ReplayClient` (``sync.py``) and
:class:`~tdreplay.client.AsyncReplayClient` (``aio.py``) both build on it, so
neither twin imports the other for what they share.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from .environment import configured
from .plans import Plans
from .retry import RetryPolicy
from .settings import ClientSettings
from .tensorclass import from_fields

B = TypeVar("B", bound="ClientBase")

#: where a pod finds its namespace
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def make_settings(
    url: str | Sequence[str] | None,
    token: str | None,
    timeout: float,
    connect_timeout: float,
    wait: float,
    retry: RetryPolicy | None,
    max_connections: int,
    shard_refresh: float,
    transport: str,
    lease_slots: int,
    shm_poll_us: int,
) -> ClientSettings:
    """The :class:`ClientSettings` of a client built with these constructor arguments (a
    URL or token not given comes from the environment: :mod:`.environment`)."""
    urls, token = configured(url, token)
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
        shm_poll_us=shm_poll_us,
    )


class ClientBase:
    """What both twins share: settings, plans, tensorclass cache, pickling.

    Subclasses extend :meth:`_setup` to open their transports; it runs both on
    construction and on unpickling.
    """

    settings: ClientSettings

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        token: str | None = None,
        *,  # the defaults are the settings' own (one place: ClientSettings)
        timeout: float = ClientSettings.timeout,
        connect_timeout: float = ClientSettings.connect_timeout,
        wait: float = ClientSettings.wait,
        retry: RetryPolicy | None = None,
        max_connections: int = ClientSettings.max_connections,
        shard_refresh: float = ClientSettings.shard_refresh,
        transport: str = ClientSettings.transport,
        lease_slots: int = ClientSettings.lease_slots,
        shm_poll_us: int = ClientSettings.shm_poll_us,
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
                shm_poll_us,
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
        self._plans = Plans(settings)
        self._classes: dict[str, type] = {}

    @property
    def urls(self) -> tuple[str, ...]:
        return self.settings.urls

    @classmethod
    def from_statefulset(
        cls: type[B],
        name: str = "tdreplay",
        replicas: int = 1,
        *,
        namespace: str | None = None,
        port: int = 8000,
        service: str | None = None,
        scheme: str = "http",
        cluster_domain: str = "cluster.local",
        namespace_file: str | Path = SERVICE_ACCOUNT_NAMESPACE,
        **kwargs: Any,
    ) -> B:
        """A client sharded over the pods of a Kubernetes StatefulSet (``deploy/kubernetes``).

        The pods' stable names are ``<name>-<i>.<service>.<namespace>.svc.<domain>``,
        in ordinal order (sharded indices depend on it). Nothing is resolved here:
        pods may not be ready yet, and a server that does not answer is skipped
        until it does (see :mod:`tdreplay.client.shards`).

        Args:
            name: the StatefulSet.
            replicas: its number of pods.
            namespace: default: the pod's own namespace (read from ``namespace_file``,
                inside a cluster), else ``"default"``.
            port: the pods' HTTP port.
            service: the headless Service (default: ``name``).
            kwargs: passed to the constructor (``token``, ``transport``, ...).

        Raises:
            ValueError: ``replicas < 1``, a name that is not a DNS-1123 label, or a bad port.

        >>> from tdreplay.client import ReplayClient
        >>> ReplayClient.from_statefulset("tdreplay", 2, namespace="rl").urls[1]
        'http://tdreplay-1.tdreplay.rl.svc.cluster.local:8000'
        """
        if namespace is None:
            path = Path(namespace_file)
            namespace = path.read_text().strip() if path.is_file() else "default"
        service = service or name
        for what, label in (("name", name), ("service", service), ("namespace", namespace)):
            if not _DNS_LABEL.fullmatch(label):
                raise ValueError(f"{what} {label!r} is not a DNS-1123 label")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"port must be in [1, 65535], got {port!r}")
        if scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, got {scheme!r}")
        host = f"{service}.{namespace}.svc.{cluster_domain}"
        urls = [f"{scheme}://{name}-{i}.{host}:{port}" for i in range(replicas)]
        return cls(urls, **kwargs)

    def shard_status(self) -> list[dict[str, Any]]:
        """Per server, as this client sees it (no request is made): ``url``, ``up``,
        ``seconds`` in that state, ``failovers`` (times it went down) and
        ``last_error``. See :mod:`tdreplay.client.shards`."""
        return self._plans.shards.status()

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

"""What a client is, besides its connections: its servers and settings (a client pickles
as this), checked when made."""

from __future__ import annotations

from dataclasses import dataclass, field

from .retry import RetryPolicy

#: how a client reaches its servers (see :attr:`ClientSettings.transport`)
TRANSPORTS = ("auto", "shm", "http")


@dataclass(frozen=True)
class ClientSettings:
    """Everything a client is, besides its connections; a client pickles as this.

    Attributes:
        urls: the servers' base URLs (several: sharded).
        token: bearer token, if the servers need one.
        timeout: seconds to wait for each read of an answer, beyond ``wait``.
        connect_timeout: seconds to wait for a connection.
        wait: default seconds ``extend`` and ``sample`` may wait on the rate
            limiter (sent to the server as ``?timeout=``); ``inf``: as long as a server
            holds a call (its ``--max-timeout``), as a call's ``timeout=inf``.
        retry: the retry policy for lost connections.
        max_connections: idle keep-alive connections kept per server.
        shard_refresh: seconds a sharded client trusts its view of the servers' sizes.
        transport: ``"auto"`` (shared memory with a server on this host, else HTTP),
            ``"shm"`` (shared memory or an error) or ``"http"``.
        lease_slots: shared-memory slots per table and batch size each thread
            cycles through: a sampled batch stays as it is for that many samples.
        shm_poll_us: microseconds a same-host call polls for its answer before it
            sleeps, when the last answer came that soon (a thread calling in a tight
            loop is not woken for each answer, for the CPU the polling burns); 0: never.
    """

    urls: tuple[str, ...]
    token: str | None = None
    timeout: float = 30.0
    connect_timeout: float = 5.0
    wait: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_connections: int = 16
    shard_refresh: float = 1.0
    transport: str = "auto"
    lease_slots: int = 2
    shm_poll_us: int = 200

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("a client needs at least one server URL")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if not 1 <= self.lease_slots <= 64:
            raise ValueError(f"lease_slots must be in [1, 64], got {self.lease_slots!r}")
        if type(self.shm_poll_us) is not int or not 0 <= self.shm_poll_us <= 100_000:
            raise ValueError(f"shm_poll_us must be an int in [0, 100000], got {self.shm_poll_us!r}")
        for name in ("timeout", "connect_timeout"):  # a silent server is given up on
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if not self.wait > 0:  # the contract's rule (a server caps it), but > 0
            raise ValueError(f"wait must be seconds > 0 (inf: no limit), got {self.wait!r}")

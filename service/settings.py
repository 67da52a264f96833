"""The server's settings: one :class:`Settings`, from flags, environment or code.

Every field has an environment-variable twin, ``TDREPLAY_<FIELD>`` (e.g.
``TDREPLAY_PORT``, ``TDREPLAY_TOKEN``, ``TDREPLAY_SCHEMA``), and but for the
token a flag of ``tdreplay serve`` (``--port``, ``--schema``): the token comes
from the environment, a file (``--token-file``) or code, never from the command
line, where ``ps`` would show it. Flags win over the environment, the
environment over the defaults. A non-loopback ``host`` without a token is
refused unless ``insecure`` is set.

    >>> from tdreplay.service import Settings
    >>> s = Settings(port=9000)
    >>> s.host, s.port, str(s.root)
    ('127.0.0.1', 9000, 'tdreplay-data')
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tdreplay.codec.token import check_token, read_secret_file, read_token_file
from tdreplay.storage import RedisConnection

from .hosts import check_host_names, is_loopback
from .limits import GiB, LimitSettings, MiB

BackendKind = Literal["memory", "memmap", "shared", "h5", "redis"]
ALL_BACKENDS: list[BackendKind] = ["memory", "memmap", "shared", "h5", "redis"]


class Settings(LimitSettings, BaseSettings):
    """How one tdreplay server runs (its limits: :class:`~.limits.LimitSettings`)."""

    model_config = SettingsConfigDict(
        env_prefix="TDREPLAY_",
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,  # a validation error must not print the token
    )

    # -- what to serve ------------------------------------------------------
    schema_path: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        validation_alias="TDREPLAY_SCHEMA",
        description="Schema files or folders, each schema a table on start; env: comma-separated.",
    )
    root: Path = Field(
        default=Path("./tdreplay-data"),
        description="Data root: table storage, checkpoints and exports live under it.",
    )
    restore: bool = Field(
        default=False,
        description="On start, restore every checkpoint under <root>/checkpoints/ "
        "(a checkpoint wins over a schema of the same table). Without it, a schema's table "
        "whose checkpoint this server's own checkpoints (--checkpoint-every, "
        "--checkpoint-on-shutdown) would replace is not served, its checkpoint kept.",
    )
    backend: BackendKind | None = Field(
        default=None,
        description="Store every table loaded from --schema on this backend "
        "(default: as each schema says; memmap when it says nothing).",
    )
    redis: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Redis (or Dragonfly) servers tables may live on, as NAME=URL "
        "(redis://[user:pass@]host:port/db, rediss://..., unix:///path?db=N); a bare URL is "
        "named 'default'. A table's spec names one (backend.connection); no request can make "
        "the server connect anywhere else. Several: space-separated flags, comma-separated env.",
    )
    redis_password_file: Path | None = Field(
        default=None,
        description="File holding the password of every --redis connection whose URL carries "
        "none (a Docker or Kubernetes secret); one trailing newline is dropped. Keeps the "
        "password out of URLs, the command line and the environment.",
    )
    redis_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a Redis connect or command may take before that table's call fails.",
    )
    seed: int | None = Field(default=None, description="Seed of every table's sampler.")

    # -- network and security -----------------------------------------------
    host: str = Field(
        default="127.0.0.1",
        description="Interface to bind (loopback by default; any other address needs a token "
        "or --insecure).",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to listen on.")
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token every route but /healthz and /readyz then requires. From "
        "TDREPLAY_TOKEN or code only: on the command line `ps` would show it.",
    )
    token_file: Path | None = Field(
        default=None,
        description="File holding the bearer token (a Docker or Kubernetes secret); one "
        "trailing newline is dropped. Exclusive with TDREPLAY_TOKEN.",
    )
    allow_host: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names a server without a token answers besides localhost, IP "
        "addresses and this machine's name (a proxy on this host that forwards its own Host); "
        "'*': any. Other names get 403: a web page on a domain pointed at 127.0.0.1 "
        "(DNS rebinding). Several: space-separated flags, comma-separated env.",
    )
    insecure: bool = Field(
        default=False,
        description="Serve a non-loopback host without a token: anyone who reaches the port "
        "may then read, write and delete every table.",
    )
    allowed_backends: list[BackendKind] = Field(
        default_factory=lambda: list(ALL_BACKENDS),
        description="Backends a client may create tables on with POST /v1/tables.",
    )

    # -- same-host shared memory ------------------------------------------------
    shm: bool = Field(
        default=True,
        description="Serve clients on this host over a Unix socket and shared memory too "
        "(rows in memfd buffers, no HTTP); off where the OS has no memfd_create.",
    )
    shm_socket: Path | None = Field(
        default=None,
        description="The Unix socket of the shared-memory transport "
        "(default: <root>/run/tdreplay.sock, in a folder only the server's user may enter).",
    )
    shm_connection_bytes: int = Field(
        default=1 * GiB,
        ge=1,
        description="Shared-memory slots one socket connection may hold, in bytes (a request "
        "that would need more fails with 507).",
    )
    shm_max_connections: int = Field(
        default=64,
        ge=1,
        description="Socket connections served at once (a further one is refused).",
    )
    shm_total_bytes: int = Field(
        default=4 * GiB,
        ge=1,
        description="Shared-memory slots all socket connections may hold together, in bytes "
        "(a request that would need more fails with 507).",
    )
    shm_max_slots: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Shared-memory slots one socket connection may hold.",
    )
    shm_idle_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a socket connection may stay idle before the server ends it "
        "(the client reconnects when it needs to); also how long the memory of a slot the "
        "server let go of stays readable for its client before it is reclaimed (sooner when "
        "--shm-total-bytes needs the room).",
    )
    shm_hello_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a new socket connection may take to say hello (its first frame, "
        "with the token); it counts against --shm-max-connections meanwhile. Past it the "
        "connection is answered 408 and closed.",
    )
    shm_poll_us: int = Field(
        default=100,
        ge=0,
        le=100_000,
        description="Microseconds a socket connection is polled for the next request after "
        "an answer, when its client asked again that soon the last time (a client calling in "
        "a tight loop): the server's CPU stays awake instead of being woken for each call, "
        "for the CPU the polling burns. Polling holds the server's event loop at most "
        "--shm-poll-hold-us at a time and stops while other connections are busy. 0: never poll.",
    )
    shm_poll_hold_us: int = Field(
        default=1000, ge=10, le=1_000_000,
        description="Microseconds one socket connection's polling (--shm-poll-us) may hold "
        "the event loop before other connections and HTTP requests get a turn.",
    )  # fmt: skip

    # -- performance --------------------------------------------------------
    torch_threads: int = Field(
        default=1,
        ge=0,
        description="torch.set_num_threads on start (0: leave torch's default). One thread "
        "holds up best when clients share the server's cores.",
    )
    malloc_mmap_threshold: int = Field(
        default=32 * MiB,
        ge=0,
        description="glibc M_MMAP_THRESHOLD set with mallopt on start (0: leave glibc's "
        "dynamic threshold; ignored when MALLOC_MMAP_THRESHOLD_ is set).",
    )
    malloc_trim_threshold: int = Field(
        default=256 * MiB, ge=0, description="glibc M_TRIM_THRESHOLD set with mallopt on start."
    )
    inline_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        description="Samples of at most this many bytes (and extends, on memory and shared "
        "tables) run on the event loop when no worker thread is using the table: the hop to "
        "a thread costs more than such a copy. 0: always use the threadpool.",
    )
    pooled_buffers: int = Field(
        default=8,
        ge=0,
        description="Reused sample and request-body buffers kept per size.",
    )
    pooled_bytes: int = Field(
        default=2 * GiB, ge=0,
        description="Bytes the reused sample and request bodies (and sample layouts) may hold, "
        "all tables together; past it the least recently used batch sizes are forgotten.",
    )  # fmt: skip
    stream_chunk_bytes: int = Field(
        default=256 * 1024,
        ge=1,
        description="A stream samples small batches in runs of about this many bytes per "
        "thread hop.",
    )

    # -- lifecycle ----------------------------------------------------------
    fsync: Literal["never", "always"] = Field(
        default="never",
        description="memmap tables: 'never' - an acknowledged extend survives a crash of the "
        "server process (its rows and state are in the page cache), the kernel writes them to "
        "disk within seconds; 'always' - every extend and sample is flushed to disk before it "
        "is answered (survives a power loss; costs a disk flush per call).",
    )
    checkpoint_on_shutdown: bool = Field(
        default=False,
        description="Checkpoint the tables to <root>/checkpoints/ on shutdown: memory, shared, "
        "h5 and redis tables; memmap tables too with --checkpoint-durable (a restarted server "
        "reopens them from their own files with every acknowledged row).",
    )
    checkpoint_durable: bool = Field(
        default=False,
        description="Include memmap tables in --checkpoint-on-shutdown and --checkpoint-every "
        "(copies of their files; they need none to survive a restart).",
    )
    preallocate: bool = Field(
        default=False,
        description="Reserve every memmap and h5 table's whole capacity on disk, every shared "
        "table's in /dev/shm and every redis table's in Redis memory when it is created (no room "
        "fails the create) instead of as rows arrive (disk and memory follow the data; a full "
        "one fails the extend that needs more, with 507). A schema can ask the same for its own "
        "table (backend: {kind: memmap, preallocate: true}).",
    )
    checkpoint_every: float | None = Field(
        default=None,
        ge=0,
        description="Checkpoint every memory, shared, h5 and redis table to "
        "<root>/checkpoints/<name> every this many seconds (0 or unset: never): --restore after a "
        "crash loses at most that much. memmap tables are skipped: a restarted server reopens "
        "them from their own files with every acknowledged row. Failures are logged and counted "
        "on /metrics.",
    )
    shutdown_timeout: float = Field(
        default=30.0,
        ge=0,
        description="On shutdown, seconds to let running requests (streams, waits) finish "
        "before they are cancelled and the tables closed.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="info",
        description="The least severe messages the server logs, its own and uvicorn's.",
    )
    _redis_password: SecretStr | None = PrivateAttr(default=None)
    access_log: bool = Field(default=False, description="Log every request (costs throughput).")

    @field_validator("redis", "allow_host", "schema_path", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):  # from the environment: comma-separated
            return [v.strip() for v in value.split(",") if v.strip()]
        return [value] if isinstance(value, Path) else value  # one path, from code

    @field_validator("allow_host")
    @classmethod
    def _check_hosts(cls, value: list[str]) -> list[str]:
        return check_host_names(value)

    @property
    def redis_connections(self) -> dict[str, RedisConnection]:
        """The ``--redis`` connections by name (each with ``redis_timeout``)."""
        out: dict[str, RedisConnection] = {}
        for option in self.redis:
            password = self._redis_password.get_secret_value() if self._redis_password else None
            conn = RedisConnection.parse(option, timeout=self.redis_timeout, password=password)
            if conn.name in out:
                raise ValueError(f"redis connection {conn.name!r} is given twice")
            out[conn.name] = conn
        return out

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.redis_password_file is not None:
            # read once, here, so a bad file stops the start (like the token's)
            self._redis_password = SecretStr(read_secret_file(self.redis_password_file, "Redis"))
        if self.backend == "redis" and "default" not in self.redis_connections:
            raise ValueError("backend 'redis' needs a 'default' Redis connection (--redis URL)")
        if self.token_file is not None:
            if self.token is not None:
                raise ValueError(
                    "the token is given twice: set TDREPLAY_TOKEN or token_file "
                    "(--token-file, TDREPLAY_TOKEN_FILE), not both"
                )
            # read once, here, so a bad file stops the start; the model is frozen after this
            object.__setattr__(self, "token", SecretStr(read_token_file(self.token_file)))
        elif self.token is not None:
            check_token(self.token.get_secret_value(), "TDREPLAY_TOKEN")
        if self.token is None and not self.insecure and not is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is not a loopback address and no token is set: anyone "
                "who reaches the port could read, write and delete every table. Set "
                "TDREPLAY_TOKEN or --token-file PATH (TDREPLAY_TOKEN_FILE), or pass "
                "--insecure (TDREPLAY_INSECURE=true) to serve without a token"
            )
        return self

    @property
    def token_bytes(self) -> bytes | None:
        return self.token.get_secret_value().encode() if self.token else None

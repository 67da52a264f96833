"""The server's settings: one :class:`Settings`, from flags, environment or code.

Every field has an environment-variable twin, ``TDREPLAY_<FIELD>`` (e.g.
``TDREPLAY_PORT``, ``TDREPLAY_TOKEN``, ``TDREPLAY_SCHEMA``), and a flag of
``tdreplay serve`` (``--port``, ``--token``, ``--schema``). Flags win over the
environment, the environment over the defaults.

    >>> from tdreplay.service import Settings
    >>> s = Settings(port=9000)
    >>> s.host, s.port, str(s.root)
    ('127.0.0.1', 9000, 'tdreplay-data')
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

BackendKind = Literal["memory", "memmap", "shared", "h5", "redis"]
ALL_BACKENDS: list[BackendKind] = ["memory", "memmap", "shared", "h5", "redis"]

MiB = 1 << 20
GiB = 1 << 30


class Settings(BaseSettings):
    """How one tdreplay server runs."""

    model_config = SettingsConfigDict(
        env_prefix="TDREPLAY_", populate_by_name=True, extra="ignore", frozen=True
    )

    # -- what to serve ------------------------------------------------------
    schema_path: Path | None = Field(
        default=None,
        validation_alias="TDREPLAY_SCHEMA",
        description="A schema file, or a folder of them; each becomes a table on start.",
    )
    root: Path = Field(
        default=Path("./tdreplay-data"),
        description="Data root: table storage, checkpoints and exports live under it.",
    )
    restore: bool = Field(
        default=False,
        description="On start, restore every checkpoint under <root>/checkpoints/ "
        "(a checkpoint wins over a schema of the same table).",
    )
    backend: BackendKind | None = Field(
        default=None,
        description="Store every table loaded from --schema on this backend "
        "(default: as each schema says; memmap when it says nothing).",
    )
    redis_url: str | None = Field(
        default=None,
        description="redis://host:port/db: with it, tables loaded from --schema live on this "
        "Redis (or Dragonfly) server unless --backend says otherwise.",
    )
    seed: int | None = Field(default=None, description="Seed of every table's sampler.")

    # -- network and security -----------------------------------------------
    host: str = Field(default="127.0.0.1", description="Interface to bind (loopback by default).")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port.")
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token every route but /healthz and /readyz then requires.",
    )
    allowed_backends: list[BackendKind] = Field(
        default_factory=lambda: list(ALL_BACKENDS),
        description="Backends a client may create tables on with POST /v1/tables.",
    )

    # -- limits -------------------------------------------------------------
    max_body_bytes: int = Field(
        default=256 * MiB, ge=1, description="Largest request or sample body, in bytes (413)."
    )
    max_table_bytes: int = Field(
        default=16 * GiB, ge=1, description="Largest table a client may create (capacity x item)."
    )
    default_timeout: float = Field(
        default=30.0,
        ge=0,
        description="Seconds an extend or sample waits for the rate limiter when the client "
        "gives no timeout.",
    )
    max_timeout: float = Field(
        default=600.0, ge=0, description="Upper bound on a client's timeout, in seconds."
    )
    idempotency_size: int = Field(
        default=10_000, ge=0, description="X-Request-Id values remembered per table."
    )
    idempotency_ttl: float = Field(
        default=300.0, ge=0, description="Seconds an X-Request-Id is remembered."
    )

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
    stream_chunk_bytes: int = Field(
        default=256 * 1024,
        ge=1,
        description="A stream samples small batches in runs of about this many bytes per "
        "thread hop.",
    )

    # -- lifecycle ----------------------------------------------------------
    checkpoint_on_shutdown: bool = Field(
        default=False, description="Checkpoint every table to <root>/checkpoints/ on shutdown."
    )
    shutdown_timeout: float = Field(
        default=30.0,
        ge=0,
        description="On shutdown, seconds to let running requests (streams, waits) finish "
        "before they are cancelled and the tables closed.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = Field(default=False, description="Log every request (costs throughput).")

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("backend 'redis' needs redis_url (TDREPLAY_REDIS_URL)")
        return self

    @property
    def token_bytes(self) -> bytes | None:
        return self.token.get_secret_value().encode() if self.token else None

"""The parts of TorchRL's buffer contract that concern state and lifecycle, not rows.

* Checkpoints: ``dumps`` / ``loads`` (and their aliases ``dump`` / ``save`` /
  ``load``) are the server's checkpoint and restore of the table — storage,
  sampler, writer and rate limiter state in one folder on the server.
* Sharing: ``share()`` is a no-op (``shared`` is always ``True``): there is
  nothing in this process to share, each process talks to the server.
* Services: ``service_backend``, ``client()``, ``clients(n)``, ``start()``,
  ``is_alive``, ``shutdown()`` are what TorchRL's ``RayCollector`` asks of a
  remote buffer (it hands each remote collector one client).
* What a server-held table cannot do from here — swap its storage, sampler
  or writer, read or write slots by index, empty it, hand over its state as
  tensors — raises ``NotImplementedError`` naming what to do instead.
"""

from __future__ import annotations

import pickle
from typing import Any

from tdreplay.client import ReplayClient


class ServiceStateMixin:
    """Checkpoint, sharing and service-lifecycle methods of :class:`TDReplayBuffer`."""

    _client: ReplayClient
    _table: str
    _service_shutdown: bool
    shared: bool

    # ---------------------------------------------------------------- checkpoints
    def dumps(self, path: str | None = None) -> str | list[str]:
        """Checkpoint the table on the server; returns the folder written.

        Args:
            path: a folder relative to the server's data root, inside its
                ``checkpoints/`` area (``checkpoints/run-1/cartpole``); default
                ``checkpoints/<table>``, which the server restores on start.

        Returns:
            The folder, relative to the server's data root (a list when sharded).

        Raises:
            InvalidRequest: ``path`` leaves the checkpoints area.
            PathExists: something else is at ``path``.
        """
        return self._client.checkpoint(self._table, path or f"checkpoints/{self._table}")

    def loads(self, path: str | None = None) -> None:
        """Restore the table from a checkpoint written by :meth:`dumps` (same ``path``).

        Raises:
            InvalidCheckpoint: the folder is not a checkpoint of this table's layout.
            TableNotFound: no table of this name.
        """
        self._client.restore(self._table, path or f"checkpoints/{self._table}")

    def dump(self, path: str | None = None) -> str | list[str]:
        """Alias of :meth:`dumps`."""
        return self.dumps(path)

    def save(self, path: str | None = None) -> str | list[str]:
        """Alias of :meth:`dumps`."""
        return self.dumps(path)

    def load(self, path: str | None = None) -> None:
        """Alias of :meth:`loads`."""
        self.loads(path)

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError(
            f"the state of table {self._table!r} is held by the server: checkpoint it with "
            "dumps(path) and restore it with loads(path)"
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError(
            f"the state of table {self._table!r} is held by the server: restore a "
            "checkpoint with loads(path)"
        )

    # ---------------------------------------------------------------- sharing
    def share(self, shared: bool = True) -> Any:
        """Nothing to share: every process opens its own connection (``shared`` stays ``True``)."""
        return self

    def copy(self) -> Any:
        """An independent buffer on the same table, with its own connections."""
        return pickle.loads(pickle.dumps(self))

    # ---------------------------------------------------------------- services (RayCollector)
    @property
    def service_backend(self) -> str:
        """``"ray"``: TorchRL's ``RayCollector`` takes remote buffers that say so.

        It then gives each remote collector :meth:`clients` ``[i]``, which reaches
        the tdreplay server over HTTP from wherever Ray runs it.
        """
        return "ray"

    def client(self) -> Any:
        """A copy for another consumer (TorchRL's remote-buffer protocol); it connects on its own."""
        return self.copy()

    def clients(self, num_clients: int) -> list[Any]:
        """One copy per consumer (``RayCollector`` asks one per remote collector).

        Raises:
            ValueError: ``num_clients`` is not a positive integer.
        """
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
            raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
        return [self.copy() for _ in range(num_clients)]

    def start(self) -> Any:
        """The buffer is served already: returns it."""
        return self

    @property
    def is_alive(self) -> bool:
        """Whether :meth:`shutdown` has not been called (the table outlives it either way)."""
        return not self._service_shutdown

    def shutdown(self, timeout: float | None = None) -> None:
        """Close this buffer's connections; the table stays on the server."""
        self._service_shutdown = True
        self._client.close()

    def synchronize(self) -> None:
        """Every call returns once the server has done it: nothing is pending."""

    # ---------------------------------------------------------------- not from here
    def _not_here(self, what: str, instead: str) -> NotImplementedError:
        return NotImplementedError(
            f"{what} is not available on TDReplayBuffer (table {self._table!r} lives in the "
            f"server): {instead}"
        )

    def empty(self, empty_write_count: bool = True) -> None:
        raise self._not_here(
            "empty()", "delete and create the table (ReplayClient.delete_table / create_table)"
        )

    def set_storage(self, *args: Any, **kwargs: Any) -> None:
        raise self._not_here("set_storage()", "the table's schema declares its storage")

    def set_sampler(self, *args: Any, **kwargs: Any) -> None:
        raise self._not_here("set_sampler()", "the table's schema declares its sampler")

    def set_writer(self, *args: Any, **kwargs: Any) -> None:
        raise self._not_here("set_writer()", "the table's schema declares its writer")

    def __getitem__(self, index: Any) -> Any:
        raise self._not_here("reading slots by index", "sample() or export the table")

    def __setitem__(self, index: Any, value: Any) -> None:
        raise self._not_here("writing slots by index", "extend() inserts rows")

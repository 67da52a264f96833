"""The parts of TorchRL's buffer contract that concern state and lifecycle, not rows.

* Checkpoints: ``dumps`` / ``loads`` (and their aliases ``dump`` / ``save`` /
  ``load``) write and read the table's whole state (storage, sampler, writer
  and rate limiter state) in a local folder, streamed from and to the server,
  as TorchRL's checkpointers expect; ``on_server=True`` checkpoints on the
  server instead. ``state_dict`` / ``load_state_dict`` hold the same in memory.
* Sharing: ``share()`` is a no-op (``shared`` is always ``True``): there is
  nothing in this process to share, each process talks to the server.
* Services: ``service_backend``, ``client()``, ``clients(n)``, ``start()``,
  ``is_alive``, ``shutdown()`` are what TorchRL's ``RayCollector`` asks of a
  remote buffer (it hands each remote collector one client).
* ``empty()`` clears the table on the server; ``close()`` (and ``with``) stops
  prefetching and closes idle connections.
* What a server-held table cannot do from here — swap its storage, sampler
  or writer, write slots by index, seed its sampler (``set_rng``), run a save or
  load hook other than TorchRL's ``TED2Flat`` / ``Flat2TED`` (which the server's
  checkpoints apply when the table asks) — raises ``NotImplementedError`` naming
  what to do instead.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torchrl.data.replay_buffers.utils import Flat2TED, TED2Flat

from tdreplay.client import ReplayClient, TableNotFound


class ServiceStateMixin:
    """Checkpoint, sharing and service-lifecycle methods of :class:`TDReplayBuffer`."""

    _client: ReplayClient
    _table: str
    _service_shutdown: bool
    _create: dict[str, Any] | None
    _lock: threading.Lock
    _prefetcher: Iterator[Any] | None
    shared: bool

    # ---------------------------------------------------------------- checkpoints
    def dumps(self, path: str | Path | None = None, *, on_server: bool = False) -> Any:
        """Save the buffer's whole state into the local folder ``path``, as TorchRL's buffers
        do (and its ``Checkpoint(replay_buffer=rb)`` asks): the table's rows, sampler and
        priorities, writer position and rate-limiter counters, streamed from the server
        (:meth:`~tdreplay.client.ReplayClient.dump`). :meth:`loads` restores it.

        Args:
            path: a new or empty local folder.
            on_server: checkpoint on the server instead; ``path`` is then a folder
                relative to its data root, inside ``checkpoints/`` (default
                ``checkpoints/<table>``, which the server restores on start).

        Returns:
            The folder written (on the server: relative to its data root; a list when sharded).

        Raises:
            FileExistsError: the local ``path`` holds files.
            InvalidRequest: an ``on_server`` path leaves the checkpoints area.
        """
        if on_server:
            return self._client.checkpoint(self._table, str(path or f"checkpoints/{self._table}"))
        if path is None:
            raise TypeError("dumps needs a local folder: dumps(path), or dumps(on_server=True)")
        return self._client.dump(self._table, path)

    def loads(self, path: str | Path | None = None, *, on_server: bool = False) -> None:
        """Restore the table from what :meth:`dumps` wrote (the same ``path`` and ``on_server``).

        Raises:
            FileNotFoundError: no dump in the local ``path``.
            InvalidRequest: the dump or checkpoint is of another table.
            PayloadTooLarge: the dump is over the server's ``--max-load-bytes`` (it goes up
                in parts, each within ``--max-body-bytes``).
        """
        if on_server:
            self._client.restore(self._table, str(path or f"checkpoints/{self._table}"))
        elif path is None:
            raise TypeError("loads needs a local folder: loads(path), or loads(on_server=True)")
        else:
            self._client.load(self._table, path)

    def dump(self, path: str | Path | None = None, *, on_server: bool = False) -> Any:
        """Alias of :meth:`dumps` (what TorchRL's ``Checkpoint`` calls)."""
        return self.dumps(path, on_server=on_server)

    def save(self, path: str | Path | None = None, *, on_server: bool = False) -> Any:
        """Alias of :meth:`dumps`."""
        return self.dumps(path, on_server=on_server)

    def load(self, path: str | Path | None = None, *, on_server: bool = False) -> None:
        """Alias of :meth:`loads` (what TorchRL's ``Checkpoint`` calls)."""
        self.loads(path, on_server=on_server)

    def state_dict(self) -> dict[str, Any]:
        """The buffer's whole state in memory, for ``torch.save`` and TorchRL's state-dict
        checkpointers: the table's name and one archive per server (uint8 tensors; see
        :meth:`dumps`)."""
        archives = self._client.dump_archives(self._table)
        return {
            "table": self._table,
            "archives": [torch.frombuffer(bytearray(a), dtype=torch.uint8) for a in archives],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the table from :meth:`state_dict`'s result.

        Raises:
            ValueError: not such a state (or of another table), or an archive in it is
                not the uint8 tensor :meth:`state_dict` made (named by its index).
        """
        archives = state_dict.get("archives") if isinstance(state_dict, dict) else None
        if not isinstance(archives, list):
            raise ValueError(
                f"not a state_dict() of table {self._table!r}: expected "
                "{'table': ..., 'archives': [...]}"
            )
        if state_dict.get("table") != self._table:
            raise ValueError(
                f"a state_dict() of table {state_dict.get('table')!r:.80}, not of "
                f"{self._table!r}: a buffer loads its own table's state"
            )
        self._client.load_archives(
            self._table, [_archive_bytes(i, a) for i, a in enumerate(archives)]
        )

    # ---------------------------------------------------------------- connections
    def close(self) -> None:
        """Stop prefetching and close idle connections (the buffer stays usable)."""
        with self._lock:
            prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            close = getattr(prefetcher, "close", None)
            if close is not None:
                close()
        self._client.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """Empty the table on the server (``ReplayClient.clear``): its rows, priorities and
        counters go, ``write_count`` included, as TorchRL's ``empty()`` does by default.
        Before the first extend of a ``create=`` buffer there is nothing to empty.

        Raises:
            ValueError: ``empty_write_count=False`` (the server's table starts anew).
        """
        if not empty_write_count:
            raise ValueError(
                f"table {self._table!r} lives in the server, whose clear starts every counter "
                "anew: empty(empty_write_count=False) cannot keep write_count"
            )
        try:
            self._client.clear(self._table)
        except TableNotFound:
            if self._create is None:
                raise  # before create= made it, the table is empty (TorchRL's lazy storage)

    def register_save_hook(self, hook: Any) -> None:
        """TorchRL's ``TED2Flat`` is taken: the server writes the table's checkpoints (and so
        the dumps :meth:`dumps` saves) in TorchRL's flat TED layout when its spec says
        ``checkpoint: {ted2flat: true}``, and reads them back by itself (see
        :meth:`register_load_hook`).

        Raises:
            NotImplementedError: another hook: it would have to run on the rows, in the server.
        """
        self._hook(hook, TED2Flat, "save")

    def register_load_hook(self, hook: Any) -> None:
        """TorchRL's ``Flat2TED`` is taken (the server unflattens what it flattened); see
        :meth:`register_save_hook`.

        Raises:
            NotImplementedError: another hook.
        """
        self._hook(hook, Flat2TED, "load")

    def _hook(self, hook: Any, served: type, when: str) -> None:
        if not isinstance(hook, served):
            raise self._not_here(
                f"a {when} hook ({type(hook).__name__})",
                f"the server writes and reads the table's checkpoints; {served.__name__} is "
                "taken, and the table's checkpoint: {ted2flat: true} turns it on",
            )

    def set_rng(self, generator: Any) -> None:
        raise self._not_here(
            "set_rng()", "the server's samplers draw from its own generator (serve --seed N)"
        )

    def mark_update(self, index: Any) -> None:
        raise self._not_here(
            "mark_update()", "update_priority(index, priority) sets the items' priorities"
        )

    def set_storage(self, *args: Any, **kwargs: Any) -> None:
        raise self._not_here("set_storage()", "the table's schema declares its storage")

    def set_sampler(self, *args: Any, **kwargs: Any) -> None:
        raise self._not_here("set_sampler()", "the table's schema declares its sampler")

    def set_writer(self, *args: Any, **kwargs: Any) -> None:
        raise self._not_here("set_writer()", "the table's schema declares its writer")

    def __setitem__(self, index: Any, value: Any) -> None:
        raise self._not_here("writing slots by index", "extend() inserts rows")


def _archive_bytes(i: int, archive: Any) -> bytes:
    """The bytes of archive ``i`` of a :meth:`ServiceStateMixin.state_dict`: a uint8 tensor
    (a float or int64 one was cast, wrapping its values, into bytes no server could read)."""
    if not isinstance(archive, torch.Tensor) or archive.dtype != torch.uint8 or archive.ndim != 1:
        got = (
            f"a {archive.dtype} tensor of shape {list(archive.shape)}"
            if isinstance(archive, torch.Tensor)
            else f"a {type(archive).__name__}"
        )
        raise ValueError(
            f"archives[{i}] is {got}: a state_dict() holds each archive as a 1-d uint8 tensor"
        )
    return archive.detach().cpu().numpy().tobytes()

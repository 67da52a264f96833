"""A table's ``info`` and ``stats``: what it is made of, its counters, and the figures of
a scan of its live items (:mod:`.stats` computes them outside the table's lock)."""

from __future__ import annotations

from typing import Any

import torch

from .base import TableBase
from .stats import limiter_stats


class Figures(TableBase):
    """``info`` and ``stats`` of a table (see :class:`~.table.Table`)."""

    def info(self) -> dict[str, Any]:
        """A JSON-ready summary: size, capacity, backend, sampler, writer, counters, limiter,
        and ``stats`` (see :meth:`stats`)."""
        with self._cond:
            info = {
                "name": self.name,
                "size": self.slots.n_live,
                "capacity": self.capacity,
                "backend": self.spec.backend.kind,
                "location": self.backend.location,
                "item_nbytes": self.spec.item_nbytes,
                "fields": {k: f.model_dump() for k, f in self.spec.fields.items()},
                "sampler": {**self.spec.sampler.model_dump(), **self.sampler.info()},
                "writer": self.writer.info(),
                "max_times_sampled": self.max_times_sampled,
                "rate_limiter": self.rate_limiter.info(),
                "can_sample": self._sample_ready(1),
                "can_insert": self.rate_limiter.can_insert(1, self.slots.n_live)
                and self.writer.can_claim(1),
                "inserts": self.rate_limiter.inserts,
                "samples": self.rate_limiter.samples,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
            }
        info["stats"] = self.stats()
        return info

    def stats(self, *, wait: float | None = None) -> dict[str, Any]:
        """Reverb ``TableInfo``-grade figures (see :mod:`.stats`): size, capacity, inserts,
        samples, item bytes in and out, ``rate_limiter`` (ratio, band, headroom, blocked
        time), ``checkpoint`` (last good one: when, seconds, bytes; counts), and what a
        scan of the live items gives: ``unique_sampled``, ``times_sampled``, ``priority``,
        ``trajectories``.

        The scan runs on a copy of the per-slot state (it holds the table's lock for
        the copy only). One that took over a millisecond of CPU (a large table) is
        reused for 100 times its cost (a million items: a few seconds); a cheaper one
        is redone at every call.

        Args:
            wait: seconds to wait for the table's lock (``None``: as long as it takes);
                past them (a checkpoint holds it) the counters are read without it and
                the scan's last figures are given (``stale: True``).
        """
        locked = self._cond.acquire(timeout=-1 if wait is None else wait)
        try:
            out = {
                "size": self.slots.n_live,
                "capacity": self.capacity,
                # rows' bytes (and a memmap table's per-slot state files'): held now
                # (reserved on disk, or allocated) and at capacity
                "reserved_bytes": self.backend.reserved_bytes,
                "capacity_bytes": self.backend.capacity_bytes,
                "inserts": self.rate_limiter.inserts,
                "samples": self.rate_limiter.samples,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
                "rate_limiter": limiter_stats(self.rate_limiter, self.slots.n_live),
                "checkpoint": dict(self.checkpoints),
            }
        finally:
            if locked:
                self._cond.release()
        figures, fresh = self._scans.figures(self._cond, self._live_state, wait if locked else 0.0)
        out.update(figures or {"unique_sampled": None, "times_sampled": None})
        out.setdefault("priority", None)
        out.setdefault("trajectories", None)
        out["stale"] = not fresh
        return out

    def _live_state(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The live items' times sampled, priorities and episode ids (copies; lock held)."""
        s, sampler, hi = self.slots, self.sampler, self.slots.hi  # past hi: holes, not read
        live = s.live[:hi].clone()
        prio = getattr(sampler, "priorities", None)
        episode = getattr(sampler, "episode", None)
        return (
            s.times_sampled[:hi][live],
            prio[:hi][live] if isinstance(prio, torch.Tensor) else None,
            episode[:hi][live] if isinstance(episode, torch.Tensor) else None,
        )

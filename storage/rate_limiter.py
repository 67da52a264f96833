"""Reverb's rate limiter: who may insert or sample now.

The limiter sees only counts — items inserted, items sampled, the table's
size — never data. With ``samples_per_insert`` (SPI) set it keeps::

    min_diff <= inserts * SPI - samples <= max_diff
    min_diff = SPI * min_size_to_sample - error_buffer
    max_diff = SPI * min_size_to_sample + error_buffer

An insert of ``n`` items may proceed when the difference stays ``<= max_diff``
after it, or when the table would still hold at most ``min_size_to_sample`` items
(Reverb's rule: inserts are free until the table can be sampled, so items removed
while the difference is high never leave both sides waiting); a sample of ``n`` items when the table holds at least
``min_size_to_sample`` items and the difference stays ``>= min_diff``. Calls
that cannot proceed wait (see ``Table.extend`` / ``Table.sample``).

    >>> rl = RateLimiter(min_size_to_sample=2, samples_per_insert=1.0, error_buffer=4)
    >>> rl.can_sample(1, size=0), rl.can_insert(4, size=0)
    (False, True)
    >>> rl.inserted(4); rl.can_sample(1, size=4), rl.can_insert(4, size=4)
    (True, False)
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from . import statefile as SF
from .errors import EmptyTableError, RateLimitTimeout
from .scalars import Scalars
from .spec import RateLimiterSpec

#: the two sides a rate limiter holds back
Op = Literal["insert", "sample"]


class RateLimiter(Scalars):
    """Counts inserts and samples and says whether either may proceed.

    Args:
        min_size_to_sample: sampling waits until the table holds this many items.
        samples_per_insert: target ratio of sampled items to inserted items;
            ``None`` for no ratio (only the minimum size applies).
        error_buffer: how far from the target ratio, in sampled items, the
            counts may drift before one side waits.
    """

    def __init__(
        self,
        min_size_to_sample: int = 1,
        samples_per_insert: float | None = None,
        error_buffer: float | None = None,
    ) -> None:
        self.min_size_to_sample = min_size_to_sample
        self.samples_per_insert = samples_per_insert
        self.error_buffer = error_buffer
        if samples_per_insert is None:
            self.min_diff, self.max_diff = -math.inf, math.inf
        else:
            eb = error_buffer or 0.0
            self.min_diff = samples_per_insert * min_size_to_sample - eb
            self.max_diff = samples_per_insert * min_size_to_sample + eb
        self.inserts = 0
        self.samples = 0
        #: calls held back (each counted once, however long it waited); kept by checkpoints
        self.insert_waits = 0
        self.sample_waits = 0
        #: calls held back right now
        self.waiting: dict[Op, int] = {"insert": 0, "sample": 0}
        #: calls that gave up (their timeout ran out while held back), since the process started
        self.timeouts: dict[Op, int] = {"insert": 0, "sample": 0}
        #: seconds calls spent held back, since the process started (waits that ended)
        self.blocked_seconds: dict[Op, float] = {"insert": 0.0, "sample": 0.0}
        #: the sum of the start times of the waits under way (see :meth:`blocked`)
        self._began: dict[Op, float] = {"insert": 0.0, "sample": 0.0}

    @classmethod
    def from_spec(cls, spec: RateLimiterSpec) -> RateLimiter:
        return cls(spec.min_size_to_sample, spec.samples_per_insert, spec.error_buffer)

    def _diff(self, inserts: int, samples: int) -> float:
        return inserts * (self.samples_per_insert or 0.0) - samples

    def can_insert(self, n: int, size: int) -> bool:
        if self.samples_per_insert is None or size + n <= self.min_size_to_sample:
            return True
        return self._diff(self.inserts + n, self.samples) <= self.max_diff

    def can_sample(self, n: int, size: int) -> bool:
        if size < self.min_size_to_sample:
            return False
        if self.samples_per_insert is None:
            return True
        return self._diff(self.inserts, self.samples + n) >= self.min_diff

    def insert_never_fits(self, n: int) -> bool:
        """True when an insert of ``n`` items could never proceed, whatever is sampled."""
        if self.samples_per_insert is None:
            return False
        return n * self.samples_per_insert > self.max_diff - min(0.0, self.min_diff)

    def sample_never_fits(self, n: int) -> bool:
        """True when a sample of ``n`` items could never proceed, whatever is inserted."""
        if self.samples_per_insert is None:
            return False
        # inserts stop at max_diff, and the sample must leave at least min_diff
        return n > self.max_diff - self.min_diff

    def held_back(self, table: str, op: Op, n: int, waited: float, size: int) -> RateLimitTimeout:
        """The error of a call on ``table`` (holding ``size`` items) held back ``waited`` seconds:
        :class:`EmptyTableError` for a sample of a table that holds no item, else
        :class:`RateLimitTimeout`; either quotes the counts that held it back.

            >>> RateLimiter().held_back("t", "sample", 2, 0.0, size=0)
            EmptyTableError("table 't' holds no item: sample timed out after 0s: 2 items held back by the rate limiter (size 0, inserts 0, samples 0, min_size_to_sample 1, samples_per_insert None, error_buffer None)")
        """
        empty = op == "sample" and size == 0
        cls = EmptyTableError if empty else RateLimitTimeout
        return cls(
            f"table {table!r}{' holds no item:' if empty else ':'} {op} timed out after "
            f"{waited:g}s: {n} items held back by the rate limiter (size {size}, inserts "
            f"{self.inserts}, samples {self.samples}, min_size_to_sample "
            f"{self.min_size_to_sample}, samples_per_insert {self.samples_per_insert}, "
            f"error_buffer {self.error_buffer})",
            table=table,
        )

    def begin_wait(self, op: Op) -> float:
        """Count a call held back by the limiter; returns when it began (for :meth:`end_wait`).

        Whoever makes a call wait - the table's own blocking wait, or a server
        waiting asynchronously and trying the call again as the table changes -
        calls this once per call, and :meth:`end_wait` once when the call goes
        through or gives up, so every counter means what its name says.
        The caller holds the table's lock.
        """
        if op == "insert":
            self.insert_waits += 1
        else:
            self.sample_waits += 1
        self.waiting[op] += 1
        began = time.monotonic()
        self._began[op] += began
        return began

    def end_wait(self, op: Op, began: float, *, timed_out: bool) -> float:
        """A held-back call went through (or gave up, ``timed_out``); returns the seconds it waited."""
        seconds = time.monotonic() - began
        self.waiting[op] -= 1
        self._began[op] = self._began[op] - began if self.waiting[op] else 0.0
        self.blocked_seconds[op] += seconds
        if timed_out:
            self.timeouts[op] += 1
        return seconds

    def blocked(self, op: Op) -> float:
        """Seconds calls spent held back on ``op``, the waits under way included (so the
        figure grows while a learner starves, not only once it is fed)."""
        ongoing = self.waiting[op] * time.monotonic() - self._began[op]
        return self.blocked_seconds[op] + max(0.0, ongoing)

    def inserted(self, n: int) -> None:
        self.inserts += n

    def sampled(self, n: int) -> None:
        self.samples += n

    SCALARS = {"inserts": int, "samples": int, "insert_waits": int, "sample_waits": int}
    #: counters added after the first checkpoints: absent means 0
    _WAITS = ("insert_waits", "sample_waits")

    def state_dict(self) -> dict[str, Any]:
        return self.scalars()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        where = "rate_limiter"
        top = 1 << 62  # counters stay exact in int64 (and in a durable table's record)
        inserts = SF.integer(state, "inserts", where, hi=top)
        samples = SF.integer(state, "samples", where, hi=top)
        waits = {k: SF.integer(state, k, where, hi=top) if k in state else 0 for k in self._WAITS}
        if self._diff(inserts, samples) < self.min_diff:
            # no sample ever leaves the difference below min_diff: such counters come from
            # no table, and would hold every sample back until that many more inserts
            raise SF.StateError(
                f"rate_limiter: {samples} samples of {inserts} inserts is past what "
                f"samples_per_insert {self.samples_per_insert} and error_buffer "
                f"{self.error_buffer} let a table sample"
            )
        self.inserts, self.samples = inserts, samples
        self.insert_waits, self.sample_waits = waits["insert_waits"], waits["sample_waits"]

    def info(self) -> dict[str, Any]:
        return {
            "min_size_to_sample": self.min_size_to_sample,
            "samples_per_insert": self.samples_per_insert,
            "error_buffer": self.error_buffer,
            **self.state_dict(),
            "waiting": dict(self.waiting),
            "timeouts": dict(self.timeouts),
            "blocked_seconds": {op: self.blocked(op) for op in ("insert", "sample")},
        }

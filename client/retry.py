"""Retries with exponential backoff and jitter, as a small policy object.

The policy only answers two questions — *may this failure be retried?* and
*how long to wait first?* — and the sync and async clients do the waiting
(``time.sleep`` / ``asyncio.sleep``). Only :class:`~tdreplay.client.errors.ConnectionFailed`
is retried: a server that answered, even with an error, is not asked again.

    >>> policy = RetryPolicy(attempts=4, backoff=0.1, max_backoff=1.0, jitter=0.0)
    >>> [policy.delay(n) for n in range(1, 4)]
    [0.1, 0.2, 0.4]
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import ConnectionFailed


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries a call whose connection failed.

    Args:
        attempts: tries in all, the first included (1: never retry).
        backoff: the wait before the first retry, in seconds; doubles with each retry.
        max_backoff: the longest wait between two tries.
        jitter: fraction of each wait drawn at random (0: exact waits; 1: "full
            jitter", anywhere between 0 and the wait), so that many clients that
            lost the same server do not come back in step.
        deadline: give up once this many seconds have passed since the first
            try, whatever ``attempts`` says (``None``: no limit).
    """

    attempts: int = 4
    backoff: float = 0.05
    max_backoff: float = 2.0
    jitter: float = 0.5
    deadline: float | None = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff and max_backoff must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        base = min(self.max_backoff, self.backoff * 2 ** (retry - 1))
        return base * (1.0 - self.jitter * random.random())

    def should_retry(
        self, err: BaseException, attempt: int, elapsed: float, *, idempotent: bool
    ) -> bool:
        """Whether to try again after ``err`` ended try number ``attempt``.

        Args:
            err: what the try raised.
            attempt: the try that failed (1 for the first).
            elapsed: seconds since the first try started.
            idempotent: whether repeating the call is harmless; a call that is
                not is retried only when its request surely never reached the server.
        """
        if not isinstance(err, ConnectionFailed) or attempt >= self.attempts:
            return False
        if err.sent and not idempotent:
            return False
        return self.deadline is None or elapsed < self.deadline


#: a policy that never retries
NO_RETRY = RetryPolicy(attempts=1)

__all__ = ["NO_RETRY", "RetryPolicy"]

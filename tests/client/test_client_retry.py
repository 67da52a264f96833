from __future__ import annotations

import pytest

from tdreplay.client import ConnectionFailed, RetryPolicy, SchemaError, Timeout


def test_backoff_doubles_up_to_the_cap() -> None:
    p = RetryPolicy(attempts=10, backoff=0.1, max_backoff=0.5, jitter=0.0)
    assert [p.delay(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_jitter_stays_within_the_wait() -> None:
    p = RetryPolicy(backoff=1.0, max_backoff=1.0, jitter=1.0)
    delays = [p.delay(1) for _ in range(200)]
    assert all(0.0 <= d <= 1.0 for d in delays) and len(set(delays)) > 1


def test_what_is_retried() -> None:
    p = RetryPolicy(attempts=3, deadline=10.0)
    lost = ConnectionFailed("x", sent=True)
    refused = ConnectionFailed("x", sent=False)
    assert p.should_retry(refused, 1, 0.0, idempotent=False)
    assert p.should_retry(lost, 1, 0.0, idempotent=True)
    assert not p.should_retry(lost, 1, 0.0, idempotent=False)
    assert not p.should_retry(refused, 3, 0.0, idempotent=True)  # out of attempts
    assert not p.should_retry(refused, 1, 11.0, idempotent=True)  # past the deadline
    assert not p.should_retry(Timeout("slow"), 1, 0.0, idempotent=True)
    assert not p.should_retry(SchemaError("bad"), 1, 0.0, idempotent=True)


def test_bad_policies() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2.0)

"""A redis table that Redis refuses to allocate leaves nothing there, and one whose keys it
does not let go says so (a real ``redis-server``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tdreplay.storage import BackendError, InsufficientStorage, Table, TableSpec
from tdreplay.storage.redis_conn import RedisConnection

MiB = 1 << 20


@pytest.fixture
def small_strings(redis_server: dict) -> Iterator[dict]:
    """The session's Redis with its largest string at 1 MiB (``proto-max-bulk-len``, 512 MiB
    by default), and no keys."""
    client = redis_server["client"]
    before = client.config_get("proto-max-bulk-len")["proto-max-bulk-len"]
    client.config_set("proto-max-bulk-len", MiB)
    try:
        yield redis_server
    finally:
        client.config_set("proto-max-bulk-len", before)


def test_a_table_redis_cannot_hold_leaves_no_keys(small_strings: dict, tmp_path: Path) -> None:
    """Each field is one Redis string of capacity x row bytes; one longer than Redis allows
    failed the allocation half way, and the keys written before it (the other fields,
    sized to the capacity, and the table's metadata) stayed in Redis for good."""
    spec = TableSpec.model_validate(
        {
            "name": "toobig",
            "capacity": 4096,
            "backend": {"kind": "redis"},
            "fields": {
                "small": {"shape": [], "dtype": "float32"},  # 16 KiB: fits
                "wide": {"shape": [512], "dtype": "float32"},  # 8 MiB: over the limit
            },
        }
    )
    client = small_strings["client"]
    with pytest.raises(InsufficientStorage) as err:  # 507: for good, not a 503 to retry
        Table.create(spec, tmp_path, redis={"default": small_strings["url"]})
    assert "proto-max-bulk-len" in str(err.value) and err.value.field == "wide"
    assert f"takes {4096 * 512 * 4} bytes" in str(err.value)
    assert list(client.scan_iter(match="tdreplay:toobig:*")) == []


def test_a_failed_allocation_leaves_no_keys(small_strings: dict, tmp_path: Path) -> None:
    """What Redis refuses midway (here past ``maxmemory``, a preallocated table) is cleaned
    up too: Redis applies a pipeline's commands up to the failing one. Out of memory is no
    room (507), not a Redis failure to retry (503)."""
    client = small_strings["client"]
    before = client.config_get("maxmemory")["maxmemory"]
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 256 * 1024)  # room for the small field only
    try:
        spec = TableSpec.model_validate(
            {
                "name": "oom",
                "capacity": 4096,
                "backend": {"kind": "redis"},
                "fields": {
                    "small": {"shape": [], "dtype": "float32"},  # 16 KiB
                    "wide": {"shape": [64], "dtype": "float32"},  # 1 MiB: fits the string cap
                },
            }
        )
        with pytest.raises(InsufficientStorage) as err:
            Table.create(spec, tmp_path, redis={"default": small_strings["url"]}, preallocate=True)
        assert "out of memory" in str(err.value) and "maxmemory" in str(err.value)
    finally:
        client.config_set("maxmemory", before)
    assert list(client.scan_iter(match="tdreplay:oom:*")) == []


def test_a_destroy_redis_does_not_answer_is_a_backend_error_naming_the_keys_left(
    redis_server: dict, tmp_path: Path
) -> None:
    """Deleting a redis table's keys while its Redis did not answer raised redis-py's own
    ``TimeoutError`` (an HTTP 500), naming neither the Redis nor the keys left there."""
    client = redis_server["client"]
    spec = TableSpec.model_validate(
        {
            "name": "gone",
            "capacity": 8,
            "backend": {"kind": "redis"},
            "fields": {"x": {"shape": [], "dtype": "float32"}},
        }
    )
    conn = RedisConnection("default", redis_server["url"], timeout=0.3)
    table = Table.create(spec, tmp_path, redis={"default": conn})
    store = table.backend.storage
    keys = f"{store._namespace}:{{{store._td_id}}}:*"
    client.client_pause(3000, all=False)  # writes wait: the DEL of the keys times out
    try:
        with pytest.raises(BackendError) as err:
            table.destroy()
    finally:
        client.client_unpause()
    assert "'default'" in str(err.value) and keys in str(err.value), err.value
    assert list(client.scan_iter(match=keys))  # left there, as it says
    client.delete(*client.scan_iter(match=keys))

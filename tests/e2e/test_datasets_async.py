"""The async client's exports and imports against a real server: over its own transport
(the export's body poured into the file as it arrives), the file work in worker threads,
never through the blocking twin; the same files and rows as the blocking client's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import minari
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasetkit import FIELDS, hidden, make_table, transitions
from testkit import run_cli as cli

from tdreplay.client import (
    AsyncReplayClient,
    RateLimitTimeout,
    ReplayClient,
    SchemaError,
)
from tdreplay.client.commands import Request

LENGTHS = [3, 5, 2, 4]


def _rows_of(client: ReplayClient, table: str) -> dict[str, Any]:
    return pq.read_table(pa.BufferReader(client.export(table))).to_pydict()


def test_async_exports_and_imports_are_native(
    client: ReplayClient, server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = make_table(client)
    client.extend(name, transitions(LENGTHS))
    root = tmp_path / "datasets"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    copies = [make_table(client) for _ in range(2)]

    def no_blocking_twin(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the async client used the blocking one")

    monkeypatch.setattr(ReplayClient, "_from_settings", no_blocking_twin)
    sent: list[Request] = []

    async def main() -> tuple[Path, Path, Any, int, int]:
        async with AsyncReplayClient(server.url, transport="http") as aio:  # all seen here
            execute = aio._driver.transports[0].execute

            async def spy(req: Request) -> Any:
                sent.append(req)
                return await execute(req)

            aio._driver.transports[0].execute = spy  # type: ignore[method-assign]
            parquet = await aio.export(name, dest=tmp_path / "out" / "rows.parquet")
            csv = await aio.export(name, "csv", dest=tmp_path / "rows.csv")
            folder = await aio.export(name, format="minari", dest=root, dataset_id="aio/run-v0")
            steps = await aio.import_dataset(copies[0], "aio/run-v0", chunk=5)
            with pytest.raises(ValueError, match="reads Minari datasets, not 'd4rl'"):
                await aio.import_dataset(copies[0], "aio/run-v0", format="d4rl")
            rows = await aio.import_parquet(copies[1], parquet, chunk=4)
            return parquet, csv, folder, steps, rows

    parquet, csv, folder, steps, rows = asyncio.run(main())
    assert pq.read_table(parquet).to_pydict() == _rows_of(client, name)
    assert csv.read_bytes() == client.export(name, "csv")
    assert folder == root / "aio" / "run-v0"
    assert [len(e) for e in minari.load_dataset("aio/run-v0").iterate_episodes()] == LENGTHS
    assert steps == rows == sum(LENGTHS)
    assert _rows_of(client, copies[0]) == _rows_of(client, copies[1]) == _rows_of(client, name)
    streamed = [r for r in sent if r.sink is not None]
    assert len(streamed) == 3  # parquet, csv, and the minari export's parquet, into files
    assert sum("/extend" in r.target for r in sent) == 3 + 4  # 14 rows by 5, and by 4
    assert hidden(tmp_path) == []


def _foreign(path: Path, reward: list[Any]) -> Path:
    """A foreign file of 8 rows in row groups of 4, ``next.reward`` as given."""
    n = 8
    table = pa.table(
        {
            "observation": [[float(i), 0.0, 1.0] for i in range(n)],
            "action": pa.array([[i, -i] for i in range(n)], pa.list_(pa.int64())),
            "done": [[False]] * n,
            "next.observation": [[float(i + 1), 0.0, 1.0] for i in range(n)],
            "next.reward": reward,
            "next.done": [[i == n - 1] for i in range(n)],
            "next.terminated": [[i == n - 1] for i in range(n)],
            "next.truncated": [[False]] * n,
            "traj": [0] * n,
        }
    )
    pq.write_table(table, path, row_group_size=4)
    return path


def test_a_null_late_in_a_file_is_found_before_any_row_is_written(
    client: ReplayClient, server: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The file is checked through before the first extend (it was found only once the
    first row group's rows were written): both twins and the CLI write nothing."""
    path = _foreign(tmp_path / "late.parquet", [[1.0]] * 5 + [None] + [[1.0]] * 2)
    first, second, third = (make_table(client, fields=FIELDS) for _ in range(3))
    with pytest.raises(SchemaError, match=r"column 'next\.reward' of '.*' holds 1 null value"):
        client.import_parquet(first, path, chunk=4)

    async def main() -> None:
        async with AsyncReplayClient(server.url) as aio:
            with pytest.raises(SchemaError, match="holds 1 null value"):
                await aio.import_parquet(second, path, chunk=4)

    asyncio.run(main())
    assert client.info(first)["size"] == client.info(second)["size"] == 0
    code, _, err_text = cli(
        "import", third, str(path), "--chunk", "4", "--url", server.url, capsys=capsys
    )
    assert code == 1 and "holds 1 null value" in err_text and "0 rows were written" in err_text
    assert client.info(third)["size"] == 0


def test_a_failed_import_says_how_many_rows_it_wrote(server: Any, tmp_path: Path) -> None:
    """A file every check accepts whose second chunk the table holds back (its rate limiter
    lets 5 items in before a sample; the clients wait 0.3 s): the first chunk stays
    written, and the error says so, through both twins (the CLI prints the note: see the
    null's test). A NaN where the max-value writer ranks items is found before anything is
    written, as a null is."""
    client = ReplayClient(server.url, wait=0.3)
    path = _foreign(tmp_path / "ok.parquet", [[1.0]] * 8)
    limited = {"rate_limiter": {"min_size_to_sample": 1, "samples_per_insert": 1.0,
                                "error_buffer": 4}}  # fmt: skip
    first, second = (make_table(client, fields=FIELDS, **limited) for _ in range(2))
    with pytest.raises(RateLimitTimeout) as err:
        client.import_parquet(first, path, chunk=4)
    assert f"4 rows were written into table {first!r} before it" in err.value.__notes__

    async def main() -> None:
        async with AsyncReplayClient(server.url, wait=0.3) as aio:
            with pytest.raises(RateLimitTimeout) as err:
                await aio.import_parquet(second, path, chunk=4)
            assert f"4 rows were written into table {second!r} before it" in err.value.__notes__

    asyncio.run(main())
    assert client.info(first)["size"] == client.info(second)["size"] == 4

    nan = _foreign(tmp_path / "nan.parquet", [[1.0]] * 5 + [[float("nan")]] + [[1.0]] * 2)
    ranked = make_table(client, fields=FIELDS, writer={"kind": "max_value", "key": "next.reward"})
    with pytest.raises(SchemaError, match="holds NaN in row 5; the max_value writer") as err:
        client.import_parquet(ranked, nan, chunk=4)
    assert err.value.field == "next.reward" and client.info(ranked)["size"] == 0

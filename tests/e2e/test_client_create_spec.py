"""``create_table`` takes the spec a user has at hand: a mapping, a schema file's path, or
the ``TableSpec`` the in-process quickstart builds (which was a ``TypeError`` from pathlib:
``expected str, bytes or os.PathLike object, not TableSpec``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.client import AsyncReplayClient, ReplayClient
from tdreplay.storage import TableSpec

REPO = Path(__file__).resolve().parents[2]


def spec_named(name: str) -> TableSpec:
    spec = TableSpec.from_file(REPO / "schemas" / "cartpole.yaml")
    return spec.model_copy(update={"name": name, "capacity": 64})


def test_a_table_spec_creates_its_table_through_both_clients(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url)
    info = client.create_table(spec_named("from_spec"))
    assert info["capacity"] == 64 and info["name"] == "from_spec"
    assert client.create_table(spec_named("from_spec"), if_absent=True)["capacity"] == 64
    with pytest.raises(Exception, match="missing key 'action'"):  # the spec's fields
        client.extend("from_spec", TensorDict({"observation": torch.ones(3, 4)}, [3]))

    async def use() -> dict[str, Any]:
        async with AsyncReplayClient(server.url) as aclient:
            return await aclient.create_table(spec_named("from_spec_async"))

    assert asyncio.run(use())["capacity"] == 64
    assert {"from_spec", "from_spec_async"} <= {t["name"] for t in client.tables()}


def test_a_spec_of_another_kind_is_refused_before_anything_is_sent() -> None:
    client = ReplayClient("http://127.0.0.1:9")  # nothing listens: nothing may be sent
    for bad in (42, ["name", "t"], b"schemas/cartpole.yaml"):
        with pytest.raises(TypeError, match="a mapping, a TableSpec or a schema file's path"):
            client.create_table(bad)  # type: ignore[arg-type]

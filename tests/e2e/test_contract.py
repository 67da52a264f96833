"""The operations are the contract: the server's routes, its OpenAPI document and the
client's requests all come from :data:`tdreplay.codec.operations.OPERATIONS`, and a
rule of the contract gives the same error on either side."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.routing import APIRoute
from test_shm import spec
from testkit import rows

from tdreplay.client import AsyncReplayClient, InvalidRequest, ReplayClient
from tdreplay.client import commands as C
from tdreplay.client import persistence as P
from tdreplay.codec import operations as ops
from tdreplay.service import Settings, create_app
from tdreplay.torchrl import TDReplayBuffer


def _routes() -> dict[str, APIRoute]:
    """The app's API routes by name (those of the routers it includes too)."""
    app = create_app(Settings(root=Path("unused")))
    found: dict[str, APIRoute] = {}
    todo = list(app.routes)
    while todo:
        route = todo.pop()
        included = getattr(route, "original_router", None)
        if included is not None:
            todo.extend(included.routes)
        elif isinstance(route, APIRoute):
            assert route.name not in found, f"two routes named {route.name!r}"
            found[route.name] = route
    return found


def test_every_operation_is_one_route_and_every_api_route_an_operation() -> None:
    routes = _routes()
    for op in ops.OPERATIONS.values():
        route = routes.get(op.name)
        assert route is not None, f"operation {op.name!r} has no route"
        assert (route.path, route.methods) == (op.route, {op.method}), op.name
    api = {name for name, r in routes.items() if r.path.startswith("/v1")}
    assert api <= set(ops.OPERATIONS), api - set(ops.OPERATIONS)


def test_the_document_declares_each_operations_own_parameters() -> None:
    """A query operation's parameters are its model's fields; a JSON one's body is its model."""
    doc = create_app(Settings(root=Path("unused"))).openapi()
    for op in ops.OPERATIONS.values():
        declared = doc["paths"][op.route][op.method.lower()]
        if op.carrier == "query":
            assert op.params is not None
            query = {p["name"] for p in declared["parameters"] if p["in"] == "query"}
            assert query == set(op.params.model_fields), op.name
        elif op.carrier == "json" and op.params is not None:
            body = declared["requestBody"]["content"]["application/json"]["schema"]
            refs = {s.get("$ref", "") for s in body.get("anyOf", [body])}
            assert f"#/components/schemas/{op.params.__name__}" in refs, op.name


def _commands() -> list[type[C.Command[Any]]]:
    found = []
    for module in (C, P):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, C.Command) and cls is not C.Command and cls not in found:
                found.append(cls)
    return found


ARGS: dict[str, dict[str, Any]] = {
    "create_table": {"spec": {"name": "t"}},
    "extend": {"data": {"x": torch.zeros(2)}},
    "insert": {"into": {"t": None}, "data": {"x": torch.zeros(2)}},
    "sample": {"batch_size": 4},
    "stream": {"batch_size": 4, "count": 2},
    "read": {"index": [0]},
    "remove": {"index": [0]},
    "update_priority": {"index": [0], "priority": [1.0]},
    "load_begin": {"size": 10},
    "load_part": {"upload": "0" * 32, "offset": 0, "part": b"x"},
    "load_commit": {"upload": "0" * 32},
    "load_abort": {"upload": "0" * 32},
    "checkpoint": {"path": "checkpoints/t"},
    "restore": {"path": "checkpoints/t"},
}


@pytest.mark.parametrize("command", _commands(), ids=lambda c: c.__name__)
def test_each_client_command_sends_its_operations_method_and_route(
    command: type[C.Command[Any]],
) -> None:
    op = command.op
    assert ops.OPERATIONS[op.name] is op
    params = inspect.signature(command).parameters
    kw = dict(ARGS.get(op.name, {}))
    if "table" in params:
        kw["table"] = "a b/c"  # quoted into the route
    request = command(**kw).request()
    path = request.target.split("?")[0]
    assert request.method == op.method
    assert path == op.path("a%20b%2Fc" if "table" in params else "")


def test_a_broken_rule_is_the_same_error_on_the_client_and_the_server(live_server: Any) -> None:
    """The client refuses an update whose lengths differ before sending it, with the error
    the server gives for it (one rule: ``check_lengths``), and nothing changes."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("rule", {"kind": "prioritized", "alpha": 1.0}, capacity=8))
    client.extend("rule", rows(0, 4))
    with pytest.raises(InvalidRequest) as on_client:
        client.update_priority("rule", [0, 1], [1.0])
    status, _, body = server.request(
        "POST", "/v1/tables/rule/update_priority", b'{"index": [0, 1], "priority": [1.0]}',
        {"Content-Type": "application/json"},
    )  # fmt: skip
    answer = json.loads(body)
    assert status == 400
    assert (on_client.value.detail, on_client.value.field) == (answer["detail"], answer["field"])
    with pytest.raises(InvalidRequest, match="1 indices but 2 keys") as removing:
        client.remove("rule", [0], key=[1, 2])
    assert removing.value.field == "key"
    assert client.info("rule")["size"] == 4


@pytest.mark.parametrize(
    "op, body",
    [
        ("remove", {"index": [0], "kye": [1]}),  # a misspelt key: the key check would be skipped
        ("update_priority", {"index": [0], "priority": [2.0], "prio": [1.0]}),
        ("read", {"index": [0], "limit": 1}),
        ("checkpoint", {"path": "checkpoints/rule", "overwrite": True}),
    ],
)
def test_a_json_body_with_a_field_it_does_not_know_is_refused(
    live_server: Any, op: str, body: dict[str, Any]
) -> None:
    """A JSON body's unknown field is a 400 naming it, and nothing changes (a remove with
    ``"kye"`` once removed the slot without the key check it asked for)."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("rule", {"kind": "prioritized", "alpha": 1.0}, capacity=8))
    client.extend("rule", rows(0, 4))
    before = client.info("rule")
    status, _, answer = server.request(
        "POST", f"/v1/tables/rule/{op}", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    unknown = (set(body) - {"index", "priority", "path"}).pop()
    assert status == 400 and json.loads(answer)["field"] == unknown, answer
    after = client.info("rule")
    assert after == before
    assert not (server.root / "checkpoints").exists()


@pytest.mark.parametrize("bad", [0, -1, 10**12])
def test_a_batch_size_out_of_range_is_the_servers_error_over_either_transport(
    live_server: Any, bad: int
) -> None:
    """A batch size the contract refuses is refused by the client before anything is sent,
    over HTTP and over the same-host socket alike (whose frame could not even carry a
    negative or huge size: it raised struct's error), with the server's own answer."""
    server = live_server()
    ReplayClient(server.url).create_table(spec("sizes", {"kind": "uniform"}, capacity=8))
    ReplayClient(server.url).extend("sizes", rows(0, 4))
    status, _, body = server.request("POST", f"/v1/tables/sizes/sample?batch_size={bad}")
    answer = json.loads(body)
    assert status == 400 and answer["field"] == "batch_size"
    for transport in ("http", "shm"):
        with pytest.raises(InvalidRequest) as refused:
            ReplayClient(server.url, transport=transport).sample("sizes", bad)
        # the same rule and field; the value as each side got it (the query's is a string)
        rule = answer["detail"].split(" (got ")[0]
        assert (refused.value.detail.split(" (got ")[0], refused.value.field) == (
            rule,
            "batch_size",
        )
    assert ReplayClient(server.url).info("sizes")["sampler"]["kind"] == "uniform"


@pytest.mark.parametrize("bad", [True, False])
def test_a_boolean_batch_size_is_refused_through_every_door(live_server: Any, bad: bool) -> None:
    """A batch size is a number of items: ``True`` is refused as a slot is (it was a batch of
    one through the client, its loader and the TorchRL buffer, over either transport)."""
    server = live_server()
    ReplayClient(server.url).create_table(spec("bools", {"kind": "uniform"}, capacity=8))
    ReplayClient(server.url).extend("bools", rows(0, 4))
    status, _, body = server.request("POST", f"/v1/tables/bools/sample?batch_size={bad}")
    assert status == 400 and json.loads(body)["field"] == "batch_size"
    for transport in ("http", "shm"):
        with ReplayClient(server.url, transport=transport) as client:
            with _refused():
                client.sample("bools", bad)
            with _refused():
                next(iter(client.loader("bools", batch_size=bad, num_batches=1)))
        with _refused():
            asyncio.run(_async_sample(server.url, transport, bad))
        with _refused():
            TDReplayBuffer(server.url, "bools", batch_size=bad, transport=transport)
    assert ReplayClient(server.url).info("bools")["samples"] == 0


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    rule = "a batch size is a number of items, not a boolean"
    with pytest.raises(InvalidRequest, match=rule) as refused:
        yield
    assert refused.value.field == "batch_size"


async def _async_sample(url: str, transport: str, batch_size: bool) -> None:
    async with AsyncReplayClient(url, transport=transport) as client:
        await client.sample("bools", batch_size)

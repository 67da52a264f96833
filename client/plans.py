"""What each client call does, written once for both twins (no I/O here).

A call is a *plan*: a generator that yields the requests it needs — one
:class:`Call` (a command for one server) or a :class:`Gather` (commands for
several servers, run concurrently) — receives their results, and returns the
call's result. :class:`~tdreplay.client.ReplayClient` drives plans with
blocking I/O, :class:`~tdreplay.client.AsyncReplayClient` with ``await``;
sharding, index encoding and merging live here, once.

Sharding (Reverb's model). With several servers, each ``extend`` goes to the
next server in turn (round robin), and a ``sample`` of ``n`` items is
split across the servers in proportion to their sizes (a multinomial draw, in
whole slices for slice samplers: uniform over the union of the servers' items),
fetched concurrently and concatenated; a prioritized table's weights are normalised
over all servers (:mod:`.weights`: by the largest weight of every server holding
items, not each by its own). A server that cannot be reached is
marked down (:mod:`tdreplay.client.shards`): its share of samples and its turn
of extends go to the others, in turn, until it answers again. An extend that may have
reached a server before the connection broke is sent to that same server again
(same request id) until it answers, within the retry policy's ``deadline``:
sending it elsewhere could store it twice. The
``index`` of a sharded sample encodes its server: ``slot * n_servers + server``,
which :meth:`Plans.update_priority` decodes. With one server indices are the
server's slots, unchanged.
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
import time
from typing import Any, TypeVar

import torch
from tensordict import TensorDict

from ..codec import params, protocol
from ..codec.indices import flat_values
from . import commands as C
from . import errors
from .merging import by_shard, merge_infos, split_batch
from .persistence import PersistencePlans
from .settings import ClientSettings
from .shards import ShardHealth
from .steps import Call, Gather, Pause, Plan, Probe
from .tensorclass import to_tensorclass
from .weights import ServerWeights

T = TypeVar("T")


class Plans(PersistencePlans):
    """The plans of every client call, over ``settings.urls`` (shared by both twins).

    Holds the little state sharding needs: the round-robin cursor and a
    short-lived cache of each table's per-server sizes. Thread safe.
    """

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.n = len(settings.urls)
        self._cursor = itertools.count()
        self._lock = threading.Lock()
        #: per table: when read, the servers' sizes, the slice unit, the servers' capacities
        self._sizes: dict[str, tuple[float, list[int], int, list[int]]] = {}
        #: per table (prioritized): each server's largest weight, as it last said it
        self._weights = ServerWeights(self.n)
        self.shards = ShardHealth(list(settings.urls), retry_every=settings.shard_refresh)

    def _wait(self, wait: float | None) -> float:
        """A call's ``timeout``, or the client's ``wait``; checked by the contract's rule
        (the server's) before anything is sent."""
        checked = params.seconds(wait)
        return self.settings.wait if checked is None else checked

    def _all(self, make: Any) -> Gather:
        return Gather([Call(i, make()) for i in range(self.n)])

    # ---------------------------------------------------------------- control
    def health(self) -> Plan[dict[str, Any]]:
        results = yield self._all(C.Health)
        return results[0] if self.n == 1 else {"status": "ok", "shards": results}

    def tables(self) -> Plan[list[dict[str, Any]]]:
        results: list[list[dict[str, Any]]] = yield self._all(C.ListTables)
        by_name: dict[str, list[dict[str, Any]]] = {}
        for shard in results:
            for info in shard:
                by_name.setdefault(str(info.get("name")), []).append(info)
        return [merge_infos(infos) for infos in by_name.values()]

    def create_table(self, spec: dict[str, Any], if_absent: bool = False) -> Plan[dict[str, Any]]:
        results = yield self._all(lambda: C.CreateTable(spec, if_absent))
        return merge_infos(results)

    def clear(self, table: str) -> Plan[dict[str, Any]]:
        results = yield self._all(lambda: C.Clear(table))
        self._forget(table)
        return merge_infos(results)

    def delete_table(self, table: str) -> Plan[None]:
        yield self._all(lambda: C.DeleteTable(table))
        self._forget(table)

    def _forget(self, table: str) -> None:
        with self._lock:
            self._sizes.pop(table, None)
        self._weights.forget(table)

    def info(self, table: str) -> Plan[dict[str, Any]]:
        """The table's info; sharded, of the servers that answer (``down`` names the rest, as
        sampling goes on without them; none answering raises the first one's error)."""
        if self.n == 1:
            return (yield Call(0, C.Info(table)))  # type: ignore[no-any-return]
        infos = yield from self._infos(table)
        status = self.shards.status() if None in infos else []  # its last error, once down
        down = {
            i: {"url": status[i]["url"], "error": str(status[i]["last_error"])}
            for i, info in enumerate(infos)
            if info is None
        }
        return merge_infos([i for i in infos if i is not None], down)

    def _infos(self, table: str) -> Plan[list[dict[str, Any] | None]]:
        """Sharded: the table's info from each server thought up (from all when none is),
        remembered; ``None`` for a server that did not answer, or is down (and tried in the
        background).

        Raises:
            TransportError: no server answered.
        """
        yield from self._probes()
        ask = self.shards.up() or list(range(self.n))
        calls = [Call(i, C.Info(table)) for i in ask]
        results = yield Gather(calls, partial=True)
        infos: list[dict[str, Any] | None] = [None] * self.n
        for call, info in zip(calls, self._answers(calls, results), strict=True):
            infos[call.shard] = info
        self._remember(table, infos)
        return infos

    def _probes(self) -> Plan[None]:
        """Try each server that is down and due (every ``shard_refresh`` seconds) with a
        health call in the background: no caller waits on a server that hangs."""
        for shard in range(self.n):
            if self.shards.due(shard):
                done = functools.partial(self.shards.probed, shard)
                yield Probe(Call(shard, C.Health(), once=True), done)

    def _remember(self, table: str, infos: list[dict[str, Any] | None]) -> None:
        """Cache the servers' sizes of ``table`` (``None``: a server that did not answer)."""
        sampler = next(i for i in infos if i is not None).get("sampler") or {}
        unit = int(sampler.get("slice_len", 1)) if sampler.get("kind") == "slice" else 1
        sizes = [0 if i is None else int(i.get("size", 0)) for i in infos]
        # a server serves at most its capacity a call (in whole slices): more is drawn again
        caps = [0 if i is None else int(i.get("capacity", 0)) // unit * unit for i in infos]
        with self._lock:
            self._sizes[table] = (time.monotonic(), sizes, unit, caps)
        self._weights.heard_infos(table, infos)

    def _forget_size(self, table: str, shard: int) -> None:
        with self._lock:
            cached = self._sizes.get(table)
            if cached is not None:
                cached[1][shard] = 0

    def _answers(self, calls: list[Call], results: list[Any]) -> list[Any]:
        """A partial gather's results, each server marked up or down; ``None`` for a
        server that did not answer.

        Raises:
            TransportError: no server answered.
        """
        out: list[Any] = []
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, errors.TransportError):
                self.shards.down(call.shard, result)
                out.append(None)
            else:
                self.shards.answered(call.shard)
                out.append(result)
        if calls and all(o is None for o in out):
            raise results[0]
        return out

    def _shard_sizes(self, table: str) -> Plan[tuple[list[int], int, list[int]]]:
        with self._lock:
            cached = self._sizes.get(table)
        if cached is None or time.monotonic() - cached[0] > self.settings.shard_refresh:
            yield from self._infos(table)
            with self._lock:
                cached = self._sizes[table]
        return list(cached[1]), cached[2], list(cached[3])

    # ---------------------------------------------------------------- data
    def extend(
        self, table: str, data: Any, wait: float | None = None, request_id: str | None = None
    ) -> Plan[torch.Tensor]:
        return (yield from self._write(self.extend_command(table, data, wait, request_id)))

    def extend_command(
        self, table: str, data: Any, wait: float | None = None, request_id: str | None = None
    ) -> C.Extend:
        """The command of an extend (what :meth:`extend` sends, and a writer posts)."""
        if request_id:  # the caller's own: the contract's rule, before either door
            params.parse(params.ExtendParams, {protocol.REQUEST_ID: request_id})
        command = C.Extend(table, data, wait=self._wait(wait))
        command.request_id = request_id or command.request_id
        return command

    def insert(
        self,
        into: dict[str, float | None],
        data: Any,
        wait: float | None = None,
        request_id: str | None = None,
    ) -> Plan[dict[str, torch.Tensor]]:
        """The same rows into several tables of one server (the next in turn, as an extend
        goes), each with its own initial priority; the slots by table.

        Raises:
            InvalidRequest: not 1 to 16 tables, a priority negative or not finite, or a
                request id the contract refuses (its model, before anything is sent).
        """
        params.parse(
            params.InsertParams, {"into": json.dumps(into), protocol.REQUEST_ID: request_id}
        )
        command = C.Insert(dict(into), data, wait=self._wait(wait))
        command.request_id = request_id or command.request_id
        return (yield from self._write(command))

    def _write(self, command: C.Extend | C.Insert) -> Plan[Any]:
        """Send a write to the next server in turn; on a failure, to the next, or (if it may
        have been stored) to the same one again; its slots encode the server."""
        turn = next(self._cursor)
        # servers thought down are tried in the background, and are a last resort here
        yield from self._probes()
        up = self.shards.up()
        down = [s for s in range(self.n) if s not in up]
        # the turn goes round the servers up (a down server's turn given to the next one
        # in the ring put two of three extends on one server)
        order = _rotated(up, turn) + _rotated(down, turn)
        for k, shard in enumerate(order):
            try:
                index = yield Call(shard, command, once=not self.shards.is_up(shard))
            except errors.TransportError as err:
                if self.n == 1:
                    raise
                self.shards.down(shard, err)
                if errors.may_have_arrived(err):  # it may be stored there: only there again
                    index = yield from self._resend(shard, command, err)
                elif k == len(order) - 1:
                    raise
                else:
                    continue
            self.shards.answered(shard)
            if self.n == 1:
                return index
            if isinstance(index, dict):
                return {k: self._encode(v, shard) for k, v in index.items()}
            return self._encode(index, shard)
        raise AssertionError("unreachable")

    def _encode(self, slots: torch.Tensor, shard: int) -> torch.Tensor:
        """An extend's slots as a sharded client names them (-1, a row a ``max_value``
        table dropped, stays -1)."""
        return torch.where(slots >= 0, slots * self.n + shard, slots)

    def _resend(
        self, shard: int, command: C.Extend | C.Insert, err: errors.TransportError
    ) -> Plan[Any]:
        """Send ``command`` to ``shard`` again until it answers (the server keeps each
        request id's answer, across a crash too: it inserts once), within the retry
        policy's deadline.

        Raises:
            TransportError: the last failure once the deadline passed, saying the call may
                have been sent (as ``err`` does), though the last try was refused.
        """
        policy = self.settings.retry
        limit = policy.deadline if policy.deadline is not None else 30.0
        start, paused, attempt = time.monotonic(), 0.0, 0
        last = err
        while time.monotonic() - start < limit and paused < limit:
            attempt += 1
            pause = min(policy.max_backoff, policy.delay(attempt))
            paused += pause
            yield Pause(pause)
            try:
                return (yield Call(shard, command))
            except errors.TransportError as again:
                last = again
        raise errors.in_doubt(last, err)

    def sample(
        self,
        table: str,
        batch_size: int,
        wait: float | None = None,
        as_cls: type | None = None,
        alloc: C.Alloc = C.fresh,
        lease: bool = False,
    ) -> Plan[Any]:
        wait = self._wait(wait)
        # the contract's rule, before anything is sent (the shm frame could not even carry
        # a negative or huge size): the same error as the server's
        batch_size = params.sample_params(batch_size, wait).batch_size
        if self.n == 1:
            td = yield Call(0, C.Sample(table, batch_size, wait, alloc, lease))
        else:
            sizes, unit, caps = yield from self._shard_sizes(table)
            parts: list[tuple[int, TensorDict]] = []  # by server
            missing = batch_size
            while missing:
                if sum(sizes) <= 0:  # empty (or not answering): wait where servers are up
                    sizes = [int(self.shards.is_up(i)) for i in range(self.n)]
                counts = split_batch(missing, sizes, unit)
                counts = [
                    min(c, cap) if cap > 0 else c for c, cap in zip(counts, caps, strict=True)
                ]
                calls = [
                    Call(i, C.Sample(table, c, wait, alloc)) for i, c in enumerate(counts) if c > 0
                ]
                answers = self._answers(calls, (yield Gather(calls, partial=True)))
                for call, part in zip(calls, answers, strict=True):
                    if part is None:  # down: its share is drawn from the others
                        sizes[call.shard] = 0
                        self._forget_size(table, call.shard)
                        continue
                    missing -= len(part)
                    part.set("index", part.get("index") * self.n + call.shard)
                    parts.append((call.shard, part))
            done = self._weights.normalised(table, parts, sizes)
            td = done[0] if len(done) == 1 else torch.cat(done, 0)
        return to_tensorclass(td, as_cls) if as_cls is not None else td

    def update_priority(self, table: str, index: Any, priority: Any, key: Any = None) -> Plan[int]:
        # the server's rule (the operation's model), before anything is sent
        u = params.parse(
            params.PriorityUpdate,
            {
                "index": flat_values(index),
                "priority": flat_values(priority),
                "key": flat_values(key),
            },
        )
        if self.n == 1:
            updated: int = yield Call(0, C.UpdatePriority(table, u.index, u.priority, u.key))
            return updated
        index = torch.tensor(u.index, dtype=torch.int64)
        priority = torch.tensor(u.priority, dtype=torch.float64)
        key = None if u.key is None else torch.tensor(u.key, dtype=torch.int64)
        # each server gets its own slots back, with their keys (keys are per server)
        calls = [
            Call(s, C.UpdatePriority(table, mine, p, k))
            for s, mine, (p, k) in by_shard(index, self.n, priority, key)
        ]
        # a server that is down keeps its old priorities (a lost update, logged as down)
        results = self._answers(calls, (yield Gather(calls, partial=True)))
        return sum(r for r in results if r is not None)

    def remove(self, table: str, index: Any, key: Any = None) -> Plan[int]:
        r = params.parse(
            params.RemoveParams, {"index": flat_values(index), "key": flat_values(key)}
        )
        index = torch.tensor(r.index, dtype=torch.int64)
        key = None if r.key is None else torch.tensor(r.key, dtype=torch.int64)
        calls = [
            Call(s, C.Remove(table, mine.tolist(), None if k is None else k.tolist()))
            for s, mine, (k,) in by_shard(index, self.n, key)
        ]
        results = yield Gather(calls)
        return sum(results)

    def read(self, table: str, index: Any) -> Plan[TensorDict]:
        """The items in slots ``index`` (as a sample's ``index`` names them: sharded, the
        server is encoded in it), in the order asked."""
        slots = params.parse(params.ReadParams, {"index": flat_values(index)}).index
        if self.n == 1:
            rows: TensorDict = yield Call(0, C.Read(table, slots))
            return rows
        index = torch.tensor(slots, dtype=torch.int64)
        place = torch.arange(len(index))  # where each row goes back
        split = by_shard(index, self.n, place)
        parts: list[TensorDict] = yield Gather(
            [Call(s, C.Read(table, i.tolist())) for s, i, _ in split]
        )
        out: TensorDict = TensorDict.cat(parts)  # rows by server; back in the order asked
        out["index"] = torch.cat(
            [p["index"] * self.n + s for p, (s, _, _) in zip(parts, split, strict=True)]
        )
        return out[torch.argsort(torch.cat([c for _, _, (c,) in split]))]  # type: ignore[misc]


def _rotated(items: list[int], turn: int) -> list[int]:
    """``items`` starting at the one whose turn it is."""
    k = turn % len(items) if items else 0
    return items[k:] + items[:k]

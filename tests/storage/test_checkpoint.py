"""Checkpoints: bit-for-bit restore of data and state, TED flattening, crashes and failures."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from storage_helpers import assert_bitwise_equal, assert_same, bits
from tensordict import TensorDict
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import (
    CheckpointError,
    InvalidCheckpoint,
    RateLimitTimeout,
    Table,
    TableSpec,
    statefile,
)

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
TESTS = Path(__file__).resolve().parents[1]


def leftovers(folder: Path) -> list[str]:
    """Temporary or set-aside checkpoint folders left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def stored(table: Table) -> TensorDict:
    """The row of every live slot, slot by slot: a dead slot's row is not kept by a
    checkpoint (nothing serves it: ``read_items`` refuses a slot holding no item)."""
    return table.read(table.slots.live[: table.slots.hi].nonzero().squeeze(1))


def assert_same_table(a: Table, b: Table) -> None:
    assert a.spec == b.spec
    assert a.slots.hi == b.slots.hi and len(a) == len(b)
    if len(a):
        assert_bitwise_equal(stored(a), stored(b))
    assert_same(a.state_dict(), b.state_dict())
    assert a.live_index().tolist() == b.live_index().tolist()


def assert_same_future(a: Table, b: Table, n: int = 8, steps: int = 3) -> None:
    """Both tables draw the same samples from here on (sampler, priorities and RNG restored)."""
    for _ in range(steps):
        x, y = a.sample(n), b.sample(n)
        assert_bitwise_equal(x, y)


# ---------------------------------------------------------------- bit-for-bit restore
def test_restore_is_bit_for_bit(backend: dict, tables, tmp_path: Path) -> None:
    spec = make_spec(
        capacity=16,
        backend=backend,
        sampler={"kind": "prioritized", "alpha": 0.7, "beta": 0.5},
        rate_limiter={"min_size_to_sample": 2, "samples_per_insert": 1.0, "error_buffer": 100},
        max_times_sampled=5,
    )
    table = tables.create(spec, seed=11)
    with pytest.raises(RateLimitTimeout):  # counted in the limiter's sample_waits
        table.sample(1, timeout=0)
    table.extend(rows(0, 12))
    table.sample(8)
    table.extend(rows(12, 9))  # wraps: cursor 5
    batch = table.sample(8)
    table.update_priority(batch["index"], torch.linspace(0.1, 9.0, 8))
    path = table.checkpoint(tmp_path / "ckpt")
    assert path == (tmp_path / "ckpt").absolute()

    restored = tables.restore(path, root=tmp_path / "restored")
    assert_same_table(table, restored)
    assert restored.writer.cursor == 5
    assert restored.rate_limiter.inserts == 21 and restored.rate_limiter.samples == 16
    assert restored.rate_limiter.sample_waits == table.rate_limiter.sample_waits == 1
    assert torch.equal(restored.sampler.priorities, table.sampler.priorities)
    assert restored.sampler.tree.total() == pytest.approx(table.sampler.tree.total())
    assert_same_future(table, restored)
    # and both go on alike
    assert table.extend(rows(21, 3)).tolist() == restored.extend(rows(21, 3)).tolist()
    assert_same_table(table, restored)


SAMPLER_SPECS = {
    "uniform": {},
    "fifo": {"sampler": {"kind": "fifo"}},
    "lifo": {"sampler": {"kind": "lifo"}},
    "without_replacement": {"sampler": {"kind": "without_replacement"}},
    "slice": {"sampler": {"kind": "slice", "slice_len": 2}},
    "max_value": {
        "fields": {"value": {"shape": [], "dtype": "float32"}},
        "writer": {"kind": "max_value", "key": "value"},
    },
    "max_times_sampled": {"max_times_sampled": 2},
}


@pytest.mark.parametrize("kind", list(SAMPLER_SPECS))
def test_every_sampler_and_writer_state_round_trips(tables, tmp_path: Path, kind: str) -> None:
    spec = make_spec(capacity=16, **SAMPLER_SPECS[kind])

    def batch(start: int, n: int) -> TensorDict:
        data = rows(start, n, episode_len=4)
        if kind == "max_value":
            data["value"] = torch.randn(n, generator=torch.Generator().manual_seed(start))
        return data

    table = tables.create(spec, seed=5)
    table.extend(batch(0, 10))
    table.sample(4)
    table.extend(batch(10, 4))
    table.sample(2)
    restored = tables.restore(table.checkpoint(tmp_path / kind), root=tmp_path / "r")
    assert_same_table(table, restored)
    for start in (14, 17):
        assert torch.equal(table.extend(batch(start, 3)), restored.extend(batch(start, 3)))
        assert_bitwise_equal(table.sample(4), restored.sample(4))
    assert_same_table(table, restored)


def test_empty_table_round_trips(tables, tmp_path: Path) -> None:
    table = tables.create(make_spec(capacity=8))
    restored = tables.restore(table.checkpoint(tmp_path / "empty"), root=tmp_path / "r")
    assert len(restored) == 0 and restored.slots.hi == 0
    restored.extend(rows(0, 2))
    assert restored.sample(2)["id"].max() <= 1


def test_checkpoint_layout_and_replacement(tables, tmp_path: Path) -> None:
    table = tables.create(make_spec(capacity=8))
    path = tmp_path / "ckpt"
    for i in range(3):
        table.extend(rows(10 * i, 3))
        table.checkpoint(path)
        meta = json.loads((path / "metadata.json").read_text())
        assert meta["format_version"] == 3 and meta["size"] == min(8, 3 * (i + 1))
        assert TableSpec.model_validate(meta["spec"]) == table.spec
        assert (path / "state.safetensors").is_file() and (path / "storage").is_dir()
        assert not (path / "state.pt").exists()  # no pickle in a format 2 checkpoint
    # replaced in place: nothing is left beside it
    assert leftovers(tmp_path) == []
    restored = tables.restore(path, root=tmp_path / "r")
    assert restored.read(restored.live_index())["id"].tolist() == [1, 2, 10, 11, 12, 20, 21, 22]


def test_checkpoint_while_writers_and_samplers_run(tables, tmp_path: Path) -> None:
    table = tables.create(make_spec(capacity=32))
    table.extend(rows(0, 32))
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(i: int) -> None:
        while not stop.is_set():
            table.extend(rows(i, 7))
            i += 7

    def sample() -> None:
        while not stop.is_set():
            try:
                assert_consistent(table.sample(8))
            except BaseException as err:
                errors.append(err)

    threads = [
        threading.Thread(target=write, args=(1000,)),
        threading.Thread(target=write, args=(1_000_000,)),
        threading.Thread(target=sample),
    ]
    for t in threads:
        t.start()
    try:
        paths = []
        for i in range(3):
            inserts = table.rate_limiter.inserts
            deadline = time.monotonic() + 10
            while table.rate_limiter.inserts < inserts + 100 and time.monotonic() < deadline:
                time.sleep(0.002)  # checkpoint while the writers are at it
            paths.append(table.checkpoint(tmp_path / f"c{i}"))
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors[0]
    assert table.rate_limiter.inserts > 32 + 300
    for path in paths:
        restored = tables.restore(path, root=tmp_path / "r")
        live = restored.read(restored.live_index())
        assert_consistent(live)
        assert len(live) == len(restored) and restored.slots.busy.sum() == 0
        assert len(set(live["id"].tolist())) == len(live)
        restored.destroy()


# ---------------------------------------------------------------- TED flattening
class TedStream:
    """TED-layout CartPole-like steps, episode after episode, as a collector emits them."""

    def __init__(self, seed: int = 0) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(4, generator=self.g)
        self.traj = 0
        self.t = 0
        self.length = self._length()

    def _length(self) -> int:
        return int(torch.randint(1, 9, (1,), generator=self.g))

    def take(self, n: int) -> TensorDict:
        steps = []
        for _ in range(n):
            nxt = torch.randn(4, generator=self.g)
            self.t += 1
            end = self.t >= self.length
            truncated = end and bool(torch.rand(1, generator=self.g) < 0.3)
            steps.append(
                {
                    "observation": self.obs,
                    "action": torch.nn.functional.one_hot(
                        torch.randint(2, (), generator=self.g), 2
                    ).long(),
                    "done": torch.zeros(1, dtype=torch.bool),
                    "terminated": torch.zeros(1, dtype=torch.bool),
                    "truncated": torch.zeros(1, dtype=torch.bool),
                    "next": {
                        "observation": nxt,
                        "reward": torch.ones(1),
                        "done": torch.tensor([end]),
                        "terminated": torch.tensor([end and not truncated]),
                        "truncated": torch.tensor([truncated]),
                    },
                    "collector": {"traj_ids": torch.tensor(self.traj)},
                }
            )
            if end:
                self.traj += 1
                self.t = 0
                self.length = self._length()
                self.obs = torch.randn(4, generator=self.g)  # reset
            else:
                self.obs = nxt
        return torch.stack([TensorDict(s, []) for s in steps])


def cartpole_spec(capacity: int, **extra) -> TableSpec:
    spec = TableSpec.from_file(SCHEMAS / "cartpole.yaml")
    return TableSpec.model_validate({**spec.model_dump(mode="json"), "capacity": capacity, **extra})


@pytest.mark.parametrize("total", [5, 23, 24, 37, 60], ids=lambda n: f"{n}-steps")
@pytest.mark.parametrize("kind", ["memory", "memmap"])
def test_ted2flat_round_trips_a_ted_table(tables, tmp_path: Path, total: int, kind: str) -> None:
    table = tables.create(
        cartpole_spec(24, backend={"kind": kind}, checkpoint={"ted2flat": True}), seed=1
    )
    stream = TedStream(seed=total)
    left = total
    while left:
        n = min(left, 7)
        table.extend(stream.take(n))
        left -= n
    path = table.checkpoint(tmp_path / "flat")
    assert json.loads((path / "metadata.json").read_text())["ted2flat"] is True
    flat = TensorDict.load_memmap(path / "storage", allow_pickle=False)
    # flattened: next.observation is not stored apart, observations gain one row per episode
    assert ("next", "observation") not in flat.keys(True, True)
    restored = tables.restore(path, root=tmp_path / "r")
    assert_same_table(table, restored)
    assert_same_future(table, restored)


@pytest.mark.parametrize("kind", ["memory", "memmap"])
def test_ted2flat_never_changes_rows_it_cannot_flatten(tables, tmp_path: Path, kind: str) -> None:
    """Two collectors' trajectories interleaved in the table: TED2Flat would give a step
    the next observation of the other collector's row after it; such rows are kept in
    the plain layout, and the restore is bit for bit."""
    spec = cartpole_spec(64, backend={"kind": kind}, checkpoint={"ted2flat": True})
    table = tables.create(spec, seed=1)
    a, b = TedStream(seed=1), TedStream(seed=2)
    b.traj = 1000
    for _ in range(6):
        table.extend(a.take(3))
        table.extend(b.take(3))
    path = table.checkpoint(tmp_path / "flat")
    assert json.loads((path / "metadata.json").read_text())["ted2flat"] is False
    restored = tables.restore(path, root=tmp_path / "r")
    assert_same_table(table, restored)
    assert_same_future(table, restored)
    assert leftovers(tmp_path) == []


def test_ted2flat_on_a_schema_without_ted_keys_checkpoints_plainly(tables, tmp_path: Path) -> None:
    spec = make_spec(
        fields={"next.step": {"shape": [], "dtype": "int64"}}, checkpoint={"ted2flat": True}
    )
    table = tables.create(spec)
    data = rows(0, 10)
    data["next", "step"] = data["id"] + 1
    table.extend(data)
    path = table.checkpoint(tmp_path / "c")  # was CheckpointError: 'NoneType' object has no ...
    assert json.loads((path / "metadata.json").read_text())["ted2flat"] is False
    assert_same_table(table, tables.restore(path, root=tmp_path / "r"))


def test_ted2flat_needs_the_round_robin_writer(tables, tmp_path: Path) -> None:
    spec = cartpole_spec(8, writer={"kind": "max_value", "key": "next.reward"})
    table = tables.create(spec)
    table.extend(TedStream().take(4))
    table.checkpoint(tmp_path / "c")
    with pytest.raises(CheckpointError, match="ted2flat needs the round_robin writer"):
        table.checkpoint(tmp_path / "c", ted2flat=True)
    restored = tables.restore(tmp_path / "c", root=tmp_path / "r")  # the first one is intact
    assert_same_table(table, restored)
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- failures
def test_failed_checkpoint_keeps_the_previous_one(tables, tmp_path: Path) -> None:
    """A checkpoint that cannot be written (here: file size limit) leaves the last good one."""
    spec = make_spec(capacity=4096)
    table = tables.create(spec)
    table.extend(rows(0, 10))
    path = table.checkpoint(tmp_path / "ckpt")
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    table.extend(rows(10, 4000))
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, hard))
    try:
        with pytest.raises(CheckpointError, match=r"checkpoint to .*ckpt failed") as info:
            table.checkpoint(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert info.value.table == "t"
    after = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before
    assert leftovers(tmp_path) == []  # no debris
    restored = tables.restore(path, root=tmp_path / "r")
    assert restored.read(restored.live_index())["id"].tolist() == list(range(10))
    # the table itself is unharmed and checkpoints fine once it can
    assert len(table) == 4010
    table.checkpoint(path)
    assert json.loads((path / "metadata.json").read_text())["size"] == 4010


def test_unwritable_target_fails_cleanly(tables, tmp_path: Path) -> None:
    table = tables.create(make_spec(capacity=8))
    table.extend(rows(0, 4))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="a-file"):
        table.checkpoint(blocker / "ckpt")
    assert blocker.read_text() == "not a folder"


def test_restore_errors(tables, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        Table.restore(tmp_path / "nothing")
    table = tables.create(make_spec(capacity=8))
    table.extend(rows(0, 4))
    path = table.checkpoint(tmp_path / "ckpt")
    meta = json.loads((path / "metadata.json").read_text())
    (path / "metadata.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(CheckpointError, match="checkpoint format 99 not supported"):
        Table.restore(path)
    (path / "metadata.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="unreadable checkpoint metadata"):
        Table.restore(path)
    table.checkpoint(path)
    (path / "state.safetensors").write_bytes(b"garbage")
    with pytest.raises(InvalidCheckpoint, match=r"state\.safetensors is not a valid state file"):
        Table.restore(path, root=tmp_path / "r")


# ---------------------------------------------------------------- the state file
def test_a_format_1_checkpoint_still_restores(tables, tmp_path: Path) -> None:
    """Format 1 (``state.pt``) is read with ``weights_only=True`` and restores bit for bit."""
    spec = make_spec(capacity=16, sampler={"kind": "prioritized", "alpha": 0.7, "beta": 0.5})
    table = tables.create(spec, seed=3)
    table.extend(rows(0, 12))
    table.extend(rows(12, 8))  # wraps
    table.sample(8)
    path = table.checkpoint(tmp_path / "v1")
    meta = json.loads((path / "metadata.json").read_text())
    (path / "metadata.json").write_text(json.dumps({**meta, "format_version": 1}))
    (path / "state.safetensors").unlink()
    torch.save(table.state_dict(), path / "state.pt")  # what format 1 wrote
    restored = tables.restore(path, root=tmp_path / "r")
    assert_same_table(table, restored)
    assert_same_future(table, restored)
    # a checkpoint of it is format 2
    again = restored.checkpoint(tmp_path / "v2")
    assert json.loads((again / "metadata.json").read_text())["format_version"] == 3
    assert not (again / "state.pt").exists()


def _edit_state(path: Path, edit) -> None:
    state = statefile.load_state(path)
    edit(state)
    statefile.save_state(path, state)


def _save_raw(path: Path, tensors: dict, structure: dict) -> None:
    from safetensors.torch import save_file

    header = json.dumps({"format": 1, "state": structure})
    save_file(tensors, str(path / "state.safetensors"), metadata={"tdreplay.state": header})


BAD_STATES = {
    "live of another dtype": (
        lambda s: s["slots"].update(live=s["slots"]["live"].to(torch.uint8)),
        r"slots\.live: expected dtype torch\.bool, got torch\.uint8",
    ),
    "live of another shape": (
        lambda s: s["slots"].update(live=s["slots"]["live"][:1]),
        r"slots\.live: expected shape \[12\] .* or \[16\], got \[1\]",
    ),
    "a part missing": (lambda s: s["slots"].pop("ordinal"), r"slots\.ordinal is missing"),
    "a count as a string": (
        lambda s: s["rate_limiter"].update(inserts="12"),
        r"rate_limiter\.inserts: expected an integer, got '12'",
    ),
    "a count out of range": (
        lambda s: s["writer"].update(cursor=99),
        r"writer\.cursor: expected an integer in \[0, 15\], got 99",
    ),
    "n_live not the live count": (
        lambda s: s["slots"].update(n_live=3),
        r"slots\.n_live is 3 but 12 slots are live",
    ),
    "a generator state of another size": (
        lambda s: s.update(generator=s["generator"][:10]),
        r"generator: expected shape",
    ),
    "hi not the metadata's": (
        lambda s: s["slots"].update(hi=11),
        r"slots\.hi is 11, metadata\.json says 12",
    ),
}


@pytest.mark.parametrize("case", list(BAD_STATES))
def test_a_malformed_state_is_refused(tables, tmp_path: Path, case: str) -> None:
    table = tables.create(make_spec(capacity=16))
    table.extend(rows(0, 12))
    path = table.checkpoint(tmp_path / "ckpt")
    edit, message = BAD_STATES[case]
    _edit_state(path, edit)
    with pytest.raises(InvalidCheckpoint, match=message):
        Table.restore(path, root=tmp_path / "r")
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.memmap"))


def test_a_negative_largest_priority_is_refused(tables, tmp_path: Path) -> None:
    """New items take the largest priority: a negative one made the sum-tree's total NaN,
    and every sample of the restored table then waited out its timeout."""
    spec = make_spec(capacity=16, sampler={"kind": "prioritized", "alpha": 0.6, "beta": 0.4})
    table = tables.create(spec)
    table.extend(rows(0, 10))
    path = table.checkpoint(tmp_path / "ckpt")
    _edit_state(path, lambda s: s["sampler"].update(max_priority=-1.0))
    with pytest.raises(InvalidCheckpoint, match=r"sampler\.max_priority: expected >= 0, got -1"):
        Table.restore(path, root=tmp_path / "r")
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.memmap"))


def test_a_stack_top_below_live_items_is_refused(tables, tmp_path: Path) -> None:
    """A LIFO table pushes at its top: a top below live items would overwrite them
    (restored, the next extend of 4 replaced items 2..5 and stranded 6..9)."""
    table = tables.create(make_spec(capacity=16, sampler={"kind": "lifo"}))
    table.extend(rows(0, 10))
    path = table.checkpoint(tmp_path / "ckpt")
    _edit_state(path, lambda s: s["writer"].update(top=2))
    with pytest.raises(InvalidCheckpoint, match=r"writer\.top is 2, but slot 2 .* is live"):
        Table.restore(path, root=tmp_path / "r")
    _edit_state(path, lambda s: s["writer"].update(top=10))
    restored = tables.restore(path, root=tmp_path / "r")
    restored.extend(rows(10, 4))
    assert restored.read(restored.live_index())["id"].tolist() == list(range(14))


@pytest.mark.parametrize(
    "structure, tensors, message",
    [
        ({"a": {"__tensor__": "b"}}, {}, "refers to tensor 'b', which is missing"),
        ({"a": 1}, {"b": torch.zeros(2)}, "tensor 'b' is not part of the state"),
        ({"a": {"__tensor__": "b"}}, {"b": torch.zeros(2, dtype=torch.complex64)}, "not allowed"),
        ({"a": {"__tensor__": 3}}, {}, "malformed tensor reference"),
        ([1, 2], {}, "the state is a JSON object, got list"),
    ],
)
def test_a_malformed_state_file_is_refused(
    tables, tmp_path: Path, structure, tensors, message
) -> None:
    table = tables.create(make_spec(capacity=16))
    table.extend(rows(0, 4))
    path = table.checkpoint(tmp_path / "ckpt")
    _save_raw(path, tensors, structure)
    with pytest.raises(InvalidCheckpoint, match=message):
        Table.restore(path, root=tmp_path / "r")


def test_state_file_round_trip_keeps_every_kind(tmp_path: Path) -> None:
    state = {
        "t": {"a": torch.arange(6).reshape(2, 3) % 2 == 0, "b": torch.arange(6).to(torch.uint8)},
        "bf16": torch.tensor([1.5, -0.0, float("nan")], dtype=torch.bfloat16),
        "scalars": [None, True, 3, -2.5, float("inf"), "x"],
        "nested": {"empty": torch.empty(0, dtype=torch.int64), "d": {}},
    }
    statefile.save_state(tmp_path, state)
    back = statefile.load_state(tmp_path)
    assert_same(state, back)
    with pytest.raises(statefile.StateError, match="a object cannot be saved"):
        statefile.save_state(tmp_path, {"x": object()})
    assert_same(statefile.load_state(tmp_path), state)  # a failed save leaves the old file


# ---------------------------------------------------------------- crash safety
CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from testkit import make_spec, rows
    from tdreplay.storage import CheckpointError, Table

    path, chunk = sys.argv[2], int(sys.argv[3])
    spec = make_spec(name="big", capacity=4096, fields={"blob": {"shape": [256], "dtype": "float32"}})
    try:
        table = Table.restore(path, root=path + "-data")  # a restarted process goes on
    except CheckpointError:
        table = Table.create(spec, root=path + "-data")
    while True:
        i = table.rate_limiter.inserts
        data = rows(i, chunk)
        data["blob"] = data["id"][:, None].float().expand(chunk, 256).clone()
        table.extend(data)
        table.checkpoint(path)
        print("done", i + chunk, flush=True)
    """
)


def test_sigkill_during_checkpoints_leaves_a_complete_one(tmp_path: Path) -> None:
    """SIGKILL a process that checkpoints (~4 MB) over and over; what is left always restores.

    Each run restores what the last one left and goes on, as a restarted service would.
    """
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path = tmp_path / "ckpt"
    chunk = 500
    rng = random.Random(0)
    last_reported = 0
    for run in range(2):
        child = subprocess.Popen(
            [sys.executable, str(script), str(TESTS), str(path), str(chunk)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        seen = 0
        while seen < 2:  # let it complete a couple of checkpoints in this run
            line = child.stdout.readline()
            if not line:
                pytest.fail(f"child died: {child.stderr.read() if child.stderr else ''}")
            last_reported = int(line.split()[1])
            seen += 1
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        for line in child.stdout:  # what it reported before it died
            if line.endswith("\n"):  # not a line the kill cut short
                last_reported = int(line.split()[1])
        child.stdout.close()
        assert child.stderr is not None
        child.stderr.close()

        table = Table.restore(path, root=tmp_path / f"restored-{run}")
        try:
            inserts = table.rate_limiter.inserts
            # the last checkpoint it reported, or the one after it if that one finished too
            assert inserts in (last_reported, last_reported + chunk), (inserts, last_reported)
            assert inserts % chunk == 0
            live = table.read(table.live_index())
            assert_consistent(live)
            assert live["id"].tolist() == list(range(max(0, inserts - 4096), inserts))
            assert torch.equal(
                bits(live["blob"]), bits(live["id"][:, None].float().expand(-1, 256))
            )
        finally:
            table.destroy()
    # the next good checkpoint clears what the killed ones left behind
    table = Table.restore(path, root=tmp_path / "restored-last")
    try:
        table.checkpoint(path)
    finally:
        table.destroy()
    assert leftovers(tmp_path) == []
    assert Table.restore(path, root=tmp_path / "final").rate_limiter.inserts == inserts


@pytest.mark.parametrize("kind", ["memmap", "h5"])
def test_restore_never_allocates_inside_the_checkpoint(tables, tmp_path: Path, kind: str) -> None:
    """A checkpoint folder where its table's own folder would be, restored with that root."""
    table = tables.create(make_spec(name="t", capacity=8, backend={"kind": kind}))
    table.extend(rows(0, 4))
    path = table.checkpoint(tmp_path / "tables" / "t")
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    with pytest.raises(CheckpointError, match="inside the checkpoint; pass another root"):
        Table.restore(path, root=tmp_path)  # its data would go to tables/t/storage*
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    restored = tables.restore(path, root=tmp_path / "elsewhere")
    assert restored.read(restored.live_index())["id"].tolist() == [0, 1, 2, 3]


def test_restore_with_the_default_root(tables, tmp_path: Path) -> None:
    table = tables.create(make_spec(name="t", capacity=8, backend={"kind": "memmap"}))
    table.extend(rows(0, 4))
    path = table.checkpoint(tmp_path / "checkpoints" / "t-snapshot")
    restored = tables.track(Table.restore(path))
    location = tmp_path / "checkpoints" / "tables" / "t" / "storage"
    assert restored.backend.location == str(location)
    assert restored.read(restored.live_index())["id"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", ["memmap", "h5"])
def test_checkpoint_never_replaces_the_tables_own_data(tables, tmp_path: Path, kind: str) -> None:
    table = tables.create(make_spec(name="t", capacity=8, backend={"kind": kind}))
    table.extend(rows(0, 4))
    own = Path(table.backend.location)
    for target in (own.parent, own.parent.parent, own):
        with pytest.raises(CheckpointError, match="holds the table's own data"):
            table.checkpoint(target)
    assert own.exists()
    table.extend(rows(4, 2))
    table.close()
    # the data on disk is the table's, not a checkpoint's
    if kind == "memmap":
        on_disk = TensorDict.load_memmap(own)
        assert on_disk["id"][:6].tolist() == list(range(6))

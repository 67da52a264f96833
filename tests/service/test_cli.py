"""The ``tdreplay serve`` flags, their environment twins, schema loading and process tuning."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import ValidationError
from service_helpers import spec
from testkit import run_cli as tdreplay_cli

from tdreplay.cli import build_parser, main
from tdreplay.cli.serve import env_var, settings_from_args
from tdreplay.service import Settings
from tdreplay.service.core import load_specs
from tdreplay.service.hosts import is_loopback
from tdreplay.service.tuning import apply, pin_malloc
from tdreplay.storage.errors import SchemaError


def parse(*argv: str) -> Settings:
    args = vars(build_parser().parse_args(["serve", *argv]))
    args.pop("command")
    return settings_from_args(args)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(env_var(name), raising=False)
    s = parse()
    assert (s.host, s.port, s.root, s.token, s.schema_path) == (
        "127.0.0.1",
        8000,
        Path("tdreplay-data"),
        None,
        [],
    )
    assert s.default_timeout == 30.0 and s.torch_threads == 1 and not s.restore


def test_every_flag_has_an_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {a.dest: a for a in serve._actions if a.dest not in ("help", "refused_token")}
    assert set(flags) == set(Settings.model_fields) - {"token"}  # the token has no flag
    for name, action in flags.items():
        assert env_var(name) in action.help
    monkeypatch.setenv("TDREPLAY_PORT", "9123")
    monkeypatch.setenv("TDREPLAY_SCHEMA", "schemas/")
    monkeypatch.setenv("TDREPLAY_TOKEN", "tok")
    monkeypatch.setenv("TDREPLAY_RESTORE", "true")
    monkeypatch.setenv("TDREPLAY_ALLOWED_BACKENDS", '["memory"]')
    s = parse()
    assert s.port == 9123 and s.schema_path == [Path("schemas/")] and s.restore
    assert s.token is not None and s.token.get_secret_value() == "tok"
    assert s.allowed_backends == ["memory"]
    s = parse("--port", "9200", "--no-restore", "--allowed-backends", "memory", "memmap")
    assert s.port == 9200 and not s.restore and s.allowed_backends == ["memory", "memmap"]


def test_bad_settings_and_schemas_exit_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", "not-a-port"])
    assert "port" in str(exc.value.code)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncapacity: -1\nfields: {}\n")
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--schema", str(bad), "--root", str(tmp_path / "d")])
    assert "capacity" in str(exc.value.code)
    with pytest.raises(SystemExit):
        main(["serve", "--backend", "redis"])  # needs a redis url


def test_load_specs(tmp_path: Path) -> None:
    assert load_specs(Settings(root=tmp_path)) == []
    with pytest.raises(SchemaError):
        load_specs(Settings(schema_path=tmp_path / "missing", root=tmp_path))
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "a.yaml").write_text(yaml.safe_dump(spec("a")))
    (folder / "b.json").write_text(json.dumps(spec("a")))  # same table twice
    with pytest.raises(SchemaError, match="several schemas"):
        load_specs(Settings(schema_path=folder, root=tmp_path))
    (folder / "b.json").unlink()
    settings = Settings(
        schema_path=folder, root=tmp_path, backend="redis", redis=["redis://cache:6390/2"]
    )
    redis = load_specs(settings)
    # the spec names the operator's connection, never a host
    assert redis[0].backend.model_dump() == {
        "kind": "redis",
        "connection": "default",
        "prefix": None,
        "preallocate": False,
    }
    assert settings.redis_connections["default"].describe() == "redis://cache:6390/2"
    mm = load_specs(Settings(schema_path=folder, root=tmp_path, backend="memmap"))
    assert mm[0].backend.kind == "memmap"


def test_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert pin_malloc(0, 0) is False
    assert isinstance(pin_malloc(32 << 20, 256 << 20), bool)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1")
    assert pin_malloc(32 << 20, 256 << 20) is False  # the operator's environment wins
    before = torch.get_num_threads()
    try:
        apply(Settings(torch_threads=1, malloc_mmap_threshold=0))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- the token and the bind address
@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(env_var(name), raising=False)


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("127.200.0.9", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("fe80::1", False),
        ("example.com", False),
        ("127.0.0.1.example.com", False),
    ],
)
def test_only_loopback_binds_without_a_token(host: str, local: bool, clean_env: None) -> None:
    assert is_loopback(host) is local
    if local:
        assert parse("--host", host).token is None
    else:
        with pytest.raises(ValidationError, match="TDREPLAY_TOKEN or --token-file"):
            parse("--host", host)
        assert parse("--host", host, "--insecure").insecure
    assert parse("--host", host, "--insecure").token is None
    with_token = Settings(host=host, token="t0k")
    assert with_token.token_bytes == b"t0k"


def test_a_reachable_host_without_a_token_exits_naming_the_fix(clean_env: None) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--host", "0.0.0.0"])
    message = str(exc.value.code)
    assert "TDREPLAY_TOKEN" in message and "--token-file" in message and "--insecure" in message


@pytest.mark.parametrize("argv", [["--token", "s3cret"], ["--token=s3cret"], ["--token"]])
def test_the_token_flag_is_refused(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "TDREPLAY_TOKEN" in err and "--token-file" in err and "s3cret" not in err


def test_abbreviations_do_not_reach_the_token_file(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--tok", "s3cret"])  # not read as --token-file s3cret
    assert "s3cret" not in capsys.readouterr().err


def test_token_from_the_environment(monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    monkeypatch.setenv("TDREPLAY_TOKEN", "from-env")
    s = parse("--host", "0.0.0.0")
    assert s.token_bytes == b"from-env"
    monkeypatch.setenv("TDREPLAY_TOKEN", "")  # set but empty: an error, not "no token"
    with pytest.raises(ValidationError, match="empty"):
        parse()


@pytest.mark.parametrize(
    ("content", "token"),
    [(b"abc", b"abc"), (b"abc\n", b"abc"), (b"abc\r\n", b"abc"), (b"a-b_c.d~9\n", b"a-b_c.d~9")],
)
def test_token_file(content: bytes, token: bytes, tmp_path: Path, clean_env: None) -> None:
    secret = tmp_path / "token"
    secret.write_bytes(content)
    assert parse("--token-file", str(secret), "--host", "0.0.0.0").token_bytes == token
    assert Settings(token_file=secret).token_bytes == token


@pytest.mark.parametrize("content", [None, b"", b"\n", b"abc\n\n", b"two words", b"\xff\xfe"])
def test_a_bad_token_file_stops_the_start(
    content: bytes | None, tmp_path: Path, clean_env: None
) -> None:
    secret = tmp_path / "token"
    if content is not None:
        secret.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--token-file", str(secret), "--root", str(tmp_path / "d")])
    assert "token file" in str(exc.value.code)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--token-file", str(tmp_path), "--root", str(tmp_path / "d")])  # a folder
    assert "cannot be read" in str(exc.value.code)
    assert not (tmp_path / "d").exists()


def test_the_token_is_given_once_and_never_printed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clean_env: None
) -> None:
    secret = tmp_path / "token"
    secret.write_text("file-token\n")
    monkeypatch.setenv("TDREPLAY_TOKEN", "env-token")
    with pytest.raises(ValidationError, match="not both") as exc:
        parse("--token-file", str(secret))
    assert "env-token" not in str(exc.value) and "file-token" not in str(exc.value)
    with pytest.raises(ValidationError) as exc:
        Settings(token="sp ace-token", host="0.0.0.0")
    assert "sp ace-token" not in str(exc.value)
    monkeypatch.delenv("TDREPLAY_TOKEN")
    assert "file-token" not in repr(Settings(token_file=secret))


def test_a_repeated_list_flag_adds_to_the_list() -> None:
    """``--redis a=URL --redis b=URL`` configures both (argparse would keep only the last)."""
    args = build_parser().parse_args(
        ["serve", "--redis", "a=redis://h:1/0", "--redis", "b=redis://h:2/0", "c=redis://h:3/0"]
    )
    assert args.redis == ["a=redis://h:1/0", "b=redis://h:2/0", "c=redis://h:3/0"]
    settings = Settings(redis=args.redis)
    assert sorted(settings.redis_connections) == ["a", "b", "c"]


# ---------------------------------------------------------------- the commands that drive a server
TOKEN = "cli-test-token-0123456789"


def test_the_server_commands(
    live_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensordict import TensorDict
    from testkit import make_rows, schema_fields

    from tdreplay.client import ReplayClient

    server = live_server("--schema", "cartpole", token=TOKEN)  # a shipped schema, by name
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    env = {"TDREPLAY_URL": server.url, "TDREPLAY_TOKEN_FILE": str(secret)}

    def cli(*argv: str, **extra: str) -> tuple[int, str, str]:
        return tdreplay_cli(*argv, capsys=capsys, monkeypatch=monkeypatch, **{**env, **extra})

    # no token: 4, and the message says where a token goes
    code, _, err = tdreplay_cli(
        "tables", "--url", server.url, capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == 4 and "TDREPLAY_TOKEN" in err
    code, out, _ = cli("tables")
    assert code == 0 and out.split("\n")[1].split()[:4] == ["cartpole", "memmap", "0", "100000"]
    code, out, _ = cli("create", "atari", "--backend", "memory")
    assert code == 0 and "created table 'atari'" in out
    code, _, err = cli("create", "atari")
    assert code == 1 and "TableExists" in err and "already exists" in err
    code, _, err = cli("create", str(tmp_path / "missing.yaml"))
    assert code == 1 and "cannot read schema" in err and "cartpole" in err

    rows = make_rows(schema_fields("cartpole"), 300)
    with ReplayClient(server.url, TOKEN) as client:
        client.extend("cartpole", rows)
    code, out, _ = cli("info", "cartpole")
    assert code == 0 and json.loads(out)["size"] == 300

    # export: here (Parquet, CSV) and on the server; each reader loads the Parquet file
    code, out, _ = cli("export", "cartpole", "-o", str(tmp_path / "out" / "cp.parquet"))
    assert code == 0 and "300 rows" in out
    assert cli("export", "cartpole", "-o", str(tmp_path / "cp.csv"))[0] == 0
    code, out, _ = cli("export", "cartpole", "--on-server", "exports/cp.parquet")
    assert code == 0 and (server.root / "exports" / "cp.parquet").is_file()
    import pandas as pd
    import pyarrow.parquet as pq

    parquet = tmp_path / "out" / "cp.parquet"
    frame = pd.read_parquet(parquet)
    assert len(frame) == 300 and "next.reward" in frame.columns
    assert pq.read_table(parquet).num_rows == 300
    td = TensorDict.from_parquet(str(parquet), separator=".")
    assert td.batch_size == (300,)
    assert torch.equal(td["next", "observation"], rows["next", "observation"])
    assert torch.equal(td["collector", "traj_ids"], rows["collector", "traj_ids"])
    assert len(pd.read_csv(tmp_path / "cp.csv")) == 300

    # import into a second table of the same fields: the same rows, in order
    spec2 = yaml.safe_load((Path("schemas") / "cartpole.yaml").read_text())
    spec2.update(name="cartpole2", backend={"kind": "memory"})
    (tmp_path / "cartpole2.yaml").write_text(yaml.safe_dump(spec2))
    assert cli("create", str(tmp_path / "cartpole2.yaml"))[0] == 0
    code, out, _ = cli("import", "cartpole2", str(parquet), "--chunk", "128", "--progress")
    assert code == 0 and "imported 300 rows" in out
    with ReplayClient(server.url, TOKEN) as client:
        assert client.info("cartpole2")["size"] == 300
        again = client.export("cartpole2")
    copied, original = pq.read_table(pa_buffer(again)), pq.read_table(parquet)
    assert sorted(copied.column_names) == sorted(original.column_names)
    assert all(copied.column(c).equals(original.column(c)) for c in original.column_names)
    code, _, err = cli("import", "atari", str(parquet))
    assert code == 1 and "0 rows were written" in err

    # checkpoint, drop, restore
    code, out, _ = cli("checkpoint", "cartpole")
    assert code == 0 and "checkpoints/cartpole" in out
    code, _, err = cli("drop", "cartpole")  # no terminal to ask on: --yes it is
    assert code == 2 and "--yes" in err
    assert cli("drop", "cartpole", "--yes")[0] == 0
    code, _, err = cli("info", "cartpole")
    assert code == 1 and "TableNotFound" in err
    code, out, _ = cli("restore", "cartpole")
    assert code == 0 and "300 rows" in out

    # clear needs --yes; the table stays, empty
    code, _, err = cli("clear", "cartpole2")
    assert code == 2 and "--yes" in err
    code, out, _ = cli("clear", "cartpole2", "--yes")
    assert code == 0 and "emptied table 'cartpole2'" in out
    assert json.loads(cli("info", "cartpole2")[1])["size"] == 0

    # dump to a local folder, drop, load it back; never over an earlier dump
    code, out, _ = cli("dump", "cartpole", str(tmp_path / "dumped"))
    assert code == 0 and "dumped table 'cartpole'" in out
    code, _, err = cli("dump", "cartpole", str(tmp_path / "dumped"))
    assert code == 1 and "not empty" in err
    assert cli("drop", "cartpole", "--yes")[0] == 0
    code, out, _ = cli("load", "cartpole", str(tmp_path / "dumped"))
    assert code == 0 and "300 rows" in out
    code, _, err = cli("load", "cartpole", str(tmp_path / "nowhere"))
    assert code == 1 and "no table dump" in err

    # nobody at the URL: 3
    code, _, err = cli("tables", "--url", "http://127.0.0.1:9")
    assert code == 3 and "Is the server running" in err


def pa_buffer(data: bytes) -> Any:
    import pyarrow as pa

    return pa.BufferReader(data)


def test_offline_export(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a data root no server holds (the table's files, else its checkpoint), and from a checkpoint."""
    import pyarrow.parquet as pq
    from testkit import make_spec, rows

    from tdreplay.storage import Table, lock_root

    root = tmp_path / "data"
    table = Table.open(make_spec("mm", backend={"kind": "memmap"}), root)
    table.extend(rows(0, 40))
    table.checkpoint(root / "checkpoints" / "mm")
    table.extend(rows(40, 5))
    table.close()  # or a crash: the files hold every row
    mem = Table.create(make_spec("mem"), root)
    mem.extend(rows(0, 7))
    mem.checkpoint(root / "checkpoints" / "mem")
    mem.destroy()

    def cli(*argv: str) -> tuple[int, str, str]:
        return tdreplay_cli(*argv, capsys=capsys, monkeypatch=monkeypatch)

    code, out, _ = cli("export", "mm", "--root", str(root), "-o", str(tmp_path / "mm.parquet"))
    assert code == 0 and "45 rows" in out and "tables/mm" in out
    assert pq.read_table(tmp_path / "mm.parquet").column("id").to_pylist() == list(range(45))
    code, out, _ = cli("export", "mem", "--root", str(root), "-o", str(tmp_path / "mem.csv"))
    assert code == 0 and "checkpoints/mem" in out
    code, out, _ = cli(
        "export", "--checkpoint", str(root / "checkpoints" / "mm"), "-o", str(tmp_path / "c.pq")
    )
    assert code == 0 and "table 'mm'" in out
    assert pq.read_table(tmp_path / "c.pq").column("id").to_pylist() == list(range(40))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # scratch gone
    code, _, err = cli("export", "nope", "--root", str(root), "-o", str(tmp_path / "x.parquet"))
    assert code == 1 and "no table 'nope'" in err and "mm" in err
    with lock_root(root):  # as a running server holds it
        code, _, err = cli("export", "mm", "--root", str(root), "-o", str(tmp_path / "y.parquet"))
    assert code == 1 and "in use" in err and "--url" in err
    code, _, err = cli("export", "mm", "--root", str(root))
    assert code == 2 and "-o FILE" in err


def test_version_usage_and_shipped_schemas(tmp_path: Path) -> None:
    import subprocess

    from tdreplay import schemas
    from tdreplay.cli.exits import Exit
    from tdreplay.service.runner import with_shipped_schemas

    for module in ("tdreplay.cli", "tdreplay.service"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stdout.strip() == "tdreplay 0.1.0"
    done = subprocess.run(  # the service's own entry point runs the server only
        [sys.executable, "-m", "tdreplay.service", "tables"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "invalid choice: 'tables'" in done.stderr
    assert int(Exit.UNREACHABLE) == 3 and int(Exit.UNAUTHORIZED) == 4
    assert schemas.names() == ["atari", "cartpole", "robot"]
    assert with_shipped_schemas(Settings(schema_path="cartpole", root=tmp_path)).schema_path == [
        schemas.find("cartpole")
    ]
    assert with_shipped_schemas(
        Settings(schema_path=tmp_path / "schemas", root=tmp_path)
    ).schema_path == [schemas.FOLDER]
    kept = Settings(schema_path=tmp_path / "mine.yaml", root=tmp_path)
    assert with_shipped_schemas(kept) is kept  # a missing path of the user's stays an error


def test_several_schemas_are_all_served(live_server: Any, tmp_path: Path) -> None:
    """``--schema a.yaml --schema b.yaml`` (and ``TDREPLAY_SCHEMA=a.yaml,b.yaml``) serves
    both tables: argparse kept only the last flag, so only b was served."""
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec(name)))
    a, b, c = (str(tmp_path / f"{n}.yaml") for n in "abc")
    server = live_server("--schema", a, "--schema", b, c, backend="memory")
    code, _, body = server.request("GET", "/v1/tables")
    assert code == 200 and sorted(t["name"] for t in json.loads(body)["tables"]) == ["a", "b", "c"]
    server = live_server(backend="memory", env={"TDREPLAY_SCHEMA": f"{a},{b}"})
    listed = json.loads(server.request("GET", "/v1/tables")[2])
    assert sorted(t["name"] for t in listed["tables"]) == ["a", "b"]
    with pytest.raises(SchemaError, match=r"b\.yaml.*several schemas declare table 'b'"):
        load_specs(Settings(schema_path=[a, b, b], root=tmp_path))

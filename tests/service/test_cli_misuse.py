"""The ``tdreplay`` command used carelessly: each mistake is one line on stderr and a
non-zero exit, and each documented command line does what it says."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from testkit import free_port
from testkit import run_cli as tdreplay


def test_a_positional_after_options_is_taken(
    live_server: Any, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tdreplay import TABLE --format minari --dataset-id ID ROOT`` (the README's line) and
    ``checkpoint TABLE --url URL PATH``: the optional positional after the options is the
    one the command uses (argparse left it unrecognized: exit 2)."""
    from tdreplay.cli import build_parser

    args = build_parser().parse_args(
        ["import", "cp2", "--format", "minari", "--dataset-id", "tdreplay/cp-v0", "./datasets"]
    )
    assert (args.table, args.source, args.dataset_id) == ("cp2", "./datasets", "tdreplay/cp-v0")
    server = live_server()
    schema = {"name": "t", "capacity": 8, "fields": {"x": {"shape": [], "dtype": "int64"}}}
    from tdreplay.client import ReplayClient

    with ReplayClient(server.url) as client:
        client.create_table({**schema, "backend": {"kind": "memory"}})
    code, out, err = tdreplay(
        "checkpoint",
        "t",
        "--url",
        server.url,
        "checkpoints/mine/t",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )
    assert code == 0, err
    assert "checkpoints/mine/t" in out and (server.root / "checkpoints" / "mine" / "t").is_dir()
    code, out, err = tdreplay(
        "restore",
        "t",
        "--url",
        server.url,
        "checkpoints/mine/t",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )
    assert code == 0 and "restored table 't' from checkpoints/mine/t" in out, err
    # a stray extra word is still refused, as one usage line
    code, _, err = tdreplay(
        "info", "t", "--url", server.url, "extra", capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == 2 and "unrecognized arguments: extra" in err


class _Terminal(io.StringIO):
    """What a user types at a terminal (``isatty``): ``text``, then the end (Ctrl-D)."""

    def isatty(self) -> bool:
        return True


def test_the_end_of_input_at_a_confirmation_deletes_nothing(
    live_server: Any, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-D (or a closed terminal) at ``drop``'s or ``clear``'s question is a no, in one
    line (it was an ``EOFError`` traceback); "n" is a no, "y" a yes."""
    from tdreplay.client import ReplayClient

    server = live_server()
    schema = {"name": "t", "capacity": 8, "fields": {"x": {"shape": [], "dtype": "int64"}}}
    with ReplayClient(server.url) as client:
        client.create_table({**schema, "backend": {"kind": "memory"}})
        client.extend("t", {"x": torch.arange(4)})
        for command, typed, code, said in [
            ("drop", "", 1, "not deleted"),
            ("clear", "", 1, "not emptied"),
            ("drop", "n\n", 1, "not deleted"),
            ("clear", "y\n", 0, "emptied table 't'"),
        ]:
            monkeypatch.setattr(sys, "stdin", _Terminal(typed))
            got, out, err = tdreplay(
                command, "t", "--url", server.url, capsys=capsys, monkeypatch=monkeypatch
            )
            assert (got, "Traceback" in err) == (code, False), err
            assert said in out + err
            assert len((out + err).strip().splitlines()) <= 2  # the question, the answer
        assert client.info("t")["size"] == 0  # cleared once, by the "y"; never dropped


def test_a_server_that_cannot_start_says_why_in_one_line(live_server: Any, tmp_path: Path) -> None:
    """What stops ``tdreplay serve`` while it starts (a data root another server holds, a
    socket folder others may enter, a root that cannot be made, a port in use) ends it with
    one line naming the cause and exit status 1; it was uvicorn's traceback of the lifespan
    and status 3, which ``tdreplay`` documents as "no server answered at the URL" (a port in
    use: uvicorn's log line and status 3, until fixed)."""
    from testkit import REPO, free_port

    running = live_server()
    held = running.root
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for flags, said in [
        (["--root", str(held)], "is in use by process"),
        (["--root", str(tmp_path / "d"), "--shm-socket", str(shared / "s.sock")], "(mode 1777)"),
        (["--root", str(blocker / "data")], str(blocker / "data")),
        (["--root", str(tmp_path / "e"), "--port", str(running.port)], f"{running.port}"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "tdreplay.cli", "serve", "--port", str(free_port()), *flags],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("TDREPLAY_")},
        )  # fmt: skip
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert last.startswith("tdreplay serve: ") and said in last, last


def test_a_bad_timeout_is_named_as_such(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--timeout`` out of range is a usage error about the timeout: it was reported as a
    bad server URL, and ``--timeout 0`` was silently taken as 600 seconds."""
    for given in ["-1", "nan", "0", "inf"]:
        code, _, err = tdreplay(
            "tables", "--url", "http://127.0.0.1:9", "--timeout", given,
            capsys=capsys, monkeypatch=monkeypatch,
        )  # fmt: skip
        assert code == 2, (given, err)
        assert "timeout" in err and "bad server URL" not in err, err
    code, _, err = tdreplay("tables", "--url", "ftp://x", capsys=capsys, monkeypatch=monkeypatch)
    assert code == 2 and "'ftp://x'" in err


BAD_SCHEMAS = [
    (
        "indented.yaml",
        "name: t\n  capacity: 8\n",
        "not valid YAML at line 2, column 11",
        "not allowed here",
    ),
    (
        "unclosed.yaml",
        "name: t\nfields:\n  x: {shape: [], dtype: int64\n",
        "not valid YAML at line 4, column 1",
        "'}'",
    ),
    ("tab.yml", "name: t\n\tcapacity: 8\n", "not valid YAML at line 2, column 1", "'\\t'"),
    ("comma.json", '{"name": "t",}', "not valid JSON at line 1, column 14", "double quotes"),
    ("latin1.yaml", b"name: caf\xe9\n", "not UTF-8 text", "byte 9"),  # was a traceback
]


@pytest.mark.parametrize(("file", "text", "where", "said"), BAD_SCHEMAS)
def test_a_schema_that_does_not_parse_is_one_line_naming_file_line_and_column(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    file: str,
    text: str | bytes,
    where: str,
    said: str,
) -> None:
    """``tdreplay create bad.yaml``, ``tdreplay serve --schema bad.yaml`` and the client's
    ``create_table("bad.yaml")`` read a schema the same way: a file that does not parse is
    one line naming the file, the line and the column (it was PyYAML's message over five
    lines, with the offending line and a caret)."""
    from tdreplay.client import ReplayClient, SchemaError

    path = tmp_path / file
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for argv in (
        ["create", str(path), "--url", "http://127.0.0.1:9"],  # read before anything is sent
        ["serve", "--schema", str(path), "--root", str(tmp_path / "data")],
    ):
        code, _, err = tdreplay(*argv, capsys=capsys, monkeypatch=monkeypatch)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1, (argv, err)
        assert lines[0].startswith(f"tdreplay {argv[0]}: {path}: {where}"), lines[0]
        assert said in lines[0], lines[0]
    with pytest.raises(SchemaError) as caught:
        ReplayClient("http://127.0.0.1:9").create_table(path)
    assert str(caught.value).startswith(f"{path}: {where}") and "\n" not in str(caught.value)


def test_an_import_says_what_is_wrong_and_exits_with_its_status(
    live_server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tdreplay import`` answers a refused token with exit 4 and no server with exit 3, as
    every command does (both are OSErrors, which it took for a file it could not read: exit 1,
    "cannot read Parquet: missing bearer token"); into a missing table it names the command
    that makes one (``tdreplay create SCHEMA --name TABLE``), which then lets it through."""
    from tdreplay.client import ReplayClient

    token = "cli-import-token-0123456789"
    server = live_server(token=token)
    schema = tmp_path / "t.yaml"
    schema.write_text(
        "name: t\ncapacity: 64\nbackend: {kind: memory}\nfields:\n  x: {shape: [2], dtype: int64}\n"
    )
    parquet = tmp_path / "t.parquet"
    with ReplayClient(server.url, token) as client:
        client.create_table(schema)
        client.extend("t", {"x": torch.arange(16).reshape(8, 2)})
        client.export("t", dest=parquet)

    def run(*argv: str, **env: str) -> tuple[int, str, str]:
        return tdreplay(*argv, capsys=capsys, monkeypatch=monkeypatch, **env)

    code, _, err = run("import", "t2", str(parquet), TDREPLAY_URL=server.url)
    assert code == 4 and "refused: missing bearer token" in err, err
    assert "cannot read Parquet" not in err
    code, _, err = run("import", "t2", str(parquet), TDREPLAY_URL=server.url, TDREPLAY_TOKEN="no")
    assert code == 4 and "refused: wrong bearer token" in err, err
    nobody = f"http://127.0.0.1:{free_port()}"
    code, _, err = run("import", "t2", str(parquet), TDREPLAY_URL=nobody)
    assert code == 3 and f"no answer from {nobody}" in err, err

    auth = {"TDREPLAY_URL": server.url, "TDREPLAY_TOKEN": token}
    code, _, err = run("import", "t2", str(parquet), **auth)
    assert code == 1 and "no table 't2'" in err and "tdreplay create SCHEMA --name t2" in err
    code, _, err = run("create", str(schema), str(schema), "--name", "t2", **auth)
    assert code == 2 and "--name names one table" in err
    code, out, err = run("create", str(schema), "--name", "t2", **auth)
    assert code == 0 and "created table 't2': capacity 64, backend memory" in out, err
    code, out, err = run("import", "t2", str(parquet), **auth)
    assert code == 0 and "imported 8 rows into table 't2'" in out, err
    with ReplayClient(server.url, token) as client:
        assert torch.equal(client.read("t2", torch.arange(8))["x"], torch.arange(16).reshape(8, 2))


def test_every_flag_and_argument_of_every_command_says_what_it_is() -> None:
    """``tdreplay COMMAND --help`` explains every flag and positional: a help text of a few
    words that is not just its own name (``--log-level``'s was "log_level"), for ``serve``'s
    flags (from the settings model's descriptions) and every other command's."""
    import argparse

    from tdreplay.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    bare: list[str] = []
    for command, parser in commands.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue  # -h, and --token (refused with a message of its own)
            name = action.option_strings[-1] if action.option_strings else action.dest
            text = (action.help or "").split(" [env ")[0].strip()
            words = text.replace("_", " ").replace("-", " ").lower().split()
            own = name.strip("-").replace("_", " ").replace("-", " ").lower().split()
            if len(words) < 3 or words == own:
                bare.append(f"{command} {name}: {action.help!r}")
    assert not bare, "\n".join(bare)


def test_a_flag_value_the_contract_refuses_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the contract's rule refuses is a usage error (exit 2) naming the flag that gave
    it, whichever command: offline ``--env-spec`` and ``--dataset-id`` named the request's
    fields (``env_spec``, ``dataset_id``) instead; through a server they were the client's
    or the server's refusal (exit 1, or 3 with no server: the flags were not checked)."""
    nobody = f"http://127.0.0.1:{free_port()}"
    parquet = tmp_path / "t.parquet"
    parquet.write_bytes(b"")
    code, _, err = tdreplay(
        "import", "t", str(parquet), "--chunk", "0", "--url", nobody,
        capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert code == 2 and "--chunk must be an integer >= 1, got 0" in err, err
    minari = ["export", "t", "--format", "minari"]
    for where in (
        ["--root", str(tmp_path), "-o", str(tmp_path / "ds")],  # offline
        ["--url", nobody, "-o", str(tmp_path / "ds")],  # through a server, written here
        ["--url", nobody, "--on-server", "ds"],  # through a server, written there
    ):
        for flags, said in [
            (["--dataset-id", "a/b-v0", "--env-spec", "nope"], "--env-spec 'nope' is neither"),
            (["--dataset-id", "../b-v0"], "--dataset-id"),
        ]:
            code, _, err = tdreplay(*minari, *where, *flags, capsys=capsys, monkeypatch=monkeypatch)
            assert code == 2 and said in err, (where, flags, err)
            assert "env_spec" not in err and "dataset_id" not in err, err
    assert not (tmp_path / "ds").exists()

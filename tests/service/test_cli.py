"""The ``tdreplay serve`` flags, their environment twins, schema loading and process tuning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from service_helpers import spec

from tdreplay.service import Settings
from tdreplay.service.app import load_specs
from tdreplay.service.cli import build_parser, env_var, main, settings_from_args
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
        None,
    )
    assert s.default_timeout == 30.0 and s.torch_threads == 1 and not s.restore


def test_every_flag_has_an_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {a.dest: a for a in serve._actions if a.dest != "help"}
    assert set(flags) == set(Settings.model_fields)
    for name, action in flags.items():
        assert env_var(name) in action.help
    monkeypatch.setenv("TDREPLAY_PORT", "9123")
    monkeypatch.setenv("TDREPLAY_SCHEMA", "schemas/")
    monkeypatch.setenv("TDREPLAY_TOKEN", "tok")
    monkeypatch.setenv("TDREPLAY_RESTORE", "true")
    monkeypatch.setenv("TDREPLAY_ALLOWED_BACKENDS", '["memory"]')
    s = parse()
    assert s.port == 9123 and s.schema_path == Path("schemas/") and s.restore
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

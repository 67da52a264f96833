"""The README's CLI block runs as written, line by line, against a server like ``make serve``'s."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from testkit import run_cli

REPO = Path(__file__).resolve().parents[1]
TOKEN = "readme-cli-token-0123456789"

FILL = """
from torchrl.collectors import Collector
from torchrl.envs import GymEnv
from tdreplay.client import ReplayClient

client = ReplayClient({url!r}, token={token!r})
for td in Collector(GymEnv("CartPole-v1"), policy=None, frames_per_batch=200, total_frames=400):
    client.extend("cartpole", td)
"""


def readme_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The block's ``export`` variables and its ``tdreplay`` commands, one argv each."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(export TDREPLAY_URL=.*?)```", text, re.S)
    assert block, "the README has no CLI block"
    env: dict[str, str] = {}
    commands = []
    for line in block.group(1).splitlines():
        for command in re.sub(r"\s+#.*$", "", line).split(";"):
            words = shlex.split(command)
            if words[:1] == ["export"]:
                env.update(word.split("=", 1) for word in words[1:])
            elif words:
                assert words[0] == "tdreplay", command
                commands.append(words[1:])
    return env, commands


def test_the_cli_block_runs_in_order(live_server, tmp_path: Path, capsys, monkeypatch) -> None:
    """Against the shipped schemas on the default backend (a table ``make serve`` made is
    there already: ``tdreplay create atari`` was a 409), with the block's token file; the
    lines that name no server (``--root``, ``--checkpoint``) once it has stopped."""
    env, commands = readme_commands()
    assert env.get("TDREPLAY_TOKEN_FILE") == "./token", env
    server = live_server("--schema", "schemas/", token=TOKEN)
    filled = subprocess.run(
        [sys.executable, "-c", FILL.format(url=server.url, token=TOKEN)],
        env={k: v for k, v in os.environ.items() if not k.startswith("TDREPLAY_")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert filled.returncode == 0, filled.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "token").write_text(TOKEN + "\n")
    online = [c for c in commands if "--root" not in c and "--checkpoint" not in c]
    offline = [
        [arg.replace("./tdreplay-data", str(server.root)) for arg in c]
        for c in commands
        if c not in online
    ]
    assert len(online) == 14 and len(offline) == 2, commands
    variables = {"TDREPLAY_URL": server.url, "TDREPLAY_TOKEN_FILE": env["TDREPLAY_TOKEN_FILE"]}
    for argv in online:
        code, out, err = run_cli(*argv, capsys=capsys, monkeypatch=monkeypatch, **variables)
        assert code == 0, (argv, out, err)
    server.stop()
    for argv in offline:
        code, out, err = run_cli(*argv, capsys=capsys, monkeypatch=monkeypatch)
        assert code == 0, (argv, out, err)
        # the table was emptied by the block's last line; its checkpoint holds the rows
        rows = 400 if "--checkpoint" in argv else 0
        assert f"; {rows} rows written" in out, (argv, out)
    for made in ("cartpole.parquet", "cp.csv", "cp.parquet", "run-1/buffer"):
        assert (tmp_path / made).exists(), made
    assert (tmp_path / "datasets" / "tdreplay" / "cartpole-v0" / "data").is_dir()

"""Item layouts every benchmark uses (TorchRL's TED layout, as in BASELINES.md)."""

from __future__ import annotations

from typing import Any

CARTPOLE: dict[str, dict[str, Any]] = {
    "observation": {"shape": [4], "dtype": "float32"},
    "action": {"shape": [], "dtype": "int64"},
    "next.observation": {"shape": [4], "dtype": "float32"},
    "next.reward": {"shape": [1], "dtype": "float32"},
    "next.done": {"shape": [1], "dtype": "bool"},
}
ATARI: dict[str, dict[str, Any]] = {
    "observation": {"shape": [84, 84, 4], "dtype": "uint8"},
    "action": {"shape": [], "dtype": "int64"},
    "next.observation": {"shape": [84, 84, 4], "dtype": "uint8"},
    "next.reward": {"shape": [1], "dtype": "float32"},
    "next.done": {"shape": [1], "dtype": "bool"},
}
FIELDS: dict[str, dict[str, dict[str, Any]]] = {"cartpole": CARTPOLE, "atari": ATARI}

"""Item layouts every benchmark uses: the shipped schemas' fields (``schemas/*.yaml``).

cartpole: the 11 fields a TorchRL ``Collector(GymEnv("CartPole-v1"))`` emits
(TED layout, ~70 bytes); atari: 84x84x4 uint8 frame stacks (~56 KB).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def shipped_fields(name: str) -> dict[str, dict[str, Any]]:
    """``{field: {"shape": [...], "dtype": "..."}}`` of ``schemas/{name}.yaml``."""
    spec = yaml.safe_load((SCHEMAS / f"{name}.yaml").read_text())
    return {k: {"shape": list(v["shape"]), "dtype": v["dtype"]} for k, v in spec["fields"].items()}


CARTPOLE: dict[str, dict[str, Any]] = shipped_fields("cartpole")
ATARI: dict[str, dict[str, Any]] = shipped_fields("atari")
FIELDS: dict[str, dict[str, dict[str, Any]]] = {"cartpole": CARTPOLE, "atari": ATARI}

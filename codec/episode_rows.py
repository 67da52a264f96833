"""Episodes -> rows: a Minari episode's steps as the rows of a table, checked.

The reverse of :mod:`tdreplay.codec.episodes` (which defines the layout): an
episode of ``T`` steps (``T`` rewards) must hold ``T + 1`` observations and ``T``
actions, terminations and truncations, and every value must fit its field's
dtype (:func:`~tdreplay.codec.dtypes.first_misfit`: exactly, or a float rounded
into a narrower float field without overflowing it). A dataset that breaks
either is refused with a :class:`~tdreplay.codec.errors.SchemaError` naming the
episode and the field: cast or cut silently, an action ``0.7`` would become
``0`` in an ``int64`` field, ``300`` would become ``44`` in a ``uint8`` one, and
a surplus observation would shift nothing but be dropped unseen.

    >>> import numpy as np
    >>> from types import SimpleNamespace
    >>> fields = {"observation": {"shape": [], "dtype": "float32"},
    ...     "next.observation": {"shape": [], "dtype": "float32"},
    ...     "action": {"shape": [], "dtype": "int64"}, "next.reward": {"shape": [1], "dtype": "float32"}}
    >>> ep = SimpleNamespace(observations=np.arange(3.0), actions=np.array([1, 0]), rewards=np.ones(2),
    ...     terminations=np.array([False, True]), truncations=np.zeros(2, bool), infos={})
    >>> episode_rows(fields, ep, 0)["next.observation"].tolist()
    [1.0, 2.0]
    >>> episode_rows(fields, SimpleNamespace(**{**vars(ep), "actions": np.array([0.5, 1.0])}), 0)
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.SchemaError: table field 'action' (int64) cannot hold 0.5 of episode 0 \
(step 0, float64): a value changes only by rounding a float into a narrower float
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .dtypes import TORCH, first_misfit
from .episodes import ACTION, DONE, OBS, REWARD, ROOT_FLAGS, TERMINATED, TRUNCATED
from .errors import SchemaError

__all__ = ["episode_rows", "lengths_fit", "widths_fit"]


def _flatten(tree: Any, prefix: str) -> dict[str, np.ndarray]:
    if not isinstance(tree, Mapping):
        return {prefix: np.asarray(tree)}
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def lengths_fit(
    episode_id: int, steps: int, parts: Mapping[str, tuple[Mapping[str, int], int]]
) -> None:
    """Refuse an episode of ``steps`` steps whose parts hold other numbers of values.

    Args:
        parts: ``{part: ({dotted key: its length}, the length expected)}``.

    Raises:
        SchemaError: a part's length is not the one expected (names the episode and key).
    """
    for part, (lengths, want) in parts.items():
        for k, n in lengths.items():
            if n != want:
                raise SchemaError(
                    f"episode {episode_id} has {n} {part} ({k}) for its {steps} steps "
                    f"(rewards); expected {want}",
                    field=k,
                    expected=want,
                    got=n,
                )


def widths_fit(
    episode_id: int, shapes: Mapping[str, tuple[int, ...]], fields: Mapping[str, Any]
) -> None:
    """Refuse an episode whose parts hold other numbers of values per step than the table
    reads, before they are read (a file declares any width: ``(T, 10**9)`` is 4 GB a step).

    Args:
        shapes: ``{dotted key: a part's shape per step}`` (an observation's key without
            ``next.``; it feeds ``next.{key}`` too).
        fields: the table's ``{dotted key: {"shape", "dtype"}}``.

    >>> widths_fit(0, {"observation": (2,), "extra": (1,)}, {"next.observation": {"shape": [2]}})
    >>> widths_fit(0, {"extra": (3,)}, {"observation": {"shape": [2]}})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.SchemaError: episode 0's 'extra' holds 3 values per step, which no \
field of the table reads: at most 2 (a row of the table) are read for one

    Raises:
        SchemaError: a part a field reads holds another number of values per step than the
            field, or a part no field reads holds more than a row of the table (all its
            fields' values), so memory follows the table, not the file.
    """
    row = sum(_numel(f) for f in fields.values())
    for key, shape in shapes.items():
        width = math.prod(shape)
        field, spec = next(
            ((k, fields[k]) for k in (key, f"next.{key}") if k in fields), (None, None)
        )
        if spec is not None and width != _numel(spec):
            raise SchemaError(
                f"table field {field!r} has shape {spec.get('shape')}, but episode "
                f"{episode_id} holds {tuple(shape)} per step there",
                field=field,
                expected=spec.get("shape"),
                got=list(shape),
            )
        if spec is None and width > row:
            raise SchemaError(
                f"episode {episode_id}'s {key!r} holds {width} values per step, which no "
                f"field of the table reads: at most {row} (a row of the table) are read for one",
                field=key,
                expected=f"<= {row}",
                got=width,
            )


def _numel(spec: Mapping[str, Any]) -> int:
    return math.prod(spec.get("shape") or ())


def episode_rows(
    fields: Mapping[str, Any],
    episode: Any,
    episode_id: int,
    trajectory_key: str | None = None,
    *,
    first_step: int = 0,
) -> dict[str, np.ndarray]:
    """The rows of one episode (Minari's ``EpisodeData``, or anything with its attributes)
    for a table with ``fields`` (``{dotted key: {"shape", "dtype"}}``): the reverse of
    the export, in TED's layout.

    Each field is filled from, first, the episode's ``infos`` under its dotted key
    (what an export put there; the first ``T`` of ``T + 1``), else: ``observation*`` / ``next.observation*`` from the
    observations' first / last ``T``, ``action*`` from the actions, ``next.reward``,
    ``next.terminated``, ``next.truncated``, ``next.done`` (either), the root flags
    ``done`` / ``terminated`` / ``truncated`` (false), and ``trajectory_key`` (the
    episode's id). Shapes are reshaped to the field's (same number of elements).
    ``episode`` may be a piece of an episode starting at step ``first_step`` (what an
    error counts steps from).

    Raises:
        SchemaError: a field has no source in the episode, or a source holds another
            number of elements per step than the field; the error names the field.
    """
    t = len(episode.rewards)
    infos = _flatten(episode.infos or {}, "")
    obs = _flatten(episode.observations, OBS)
    parts = {"observations": (obs, t + 1), "actions": (_flatten(episode.actions, ACTION), t)}
    parts |= {k: ({k: getattr(episode, k)}, t) for k in ("terminations", "truncations")}
    lengths_fit(
        episode_id, t, {p: ({k: len(v) for k, v in ls.items()}, w) for p, (ls, w) in parts.items()}
    )
    source: dict[str, np.ndarray] = {}
    for k, v in obs.items():
        source[k], source[f"next.{k}"] = v[:t], v[1 : t + 1]
    source.update(_flatten(episode.actions, ACTION))
    term = np.asarray(episode.terminations, dtype=bool)
    trunc = np.asarray(episode.truncations, dtype=bool)
    source.update({REWARD: np.asarray(episode.rewards), TERMINATED: term, TRUNCATED: trunc})
    source[DONE] = term | trunc
    for k in ROOT_FLAGS:
        source[k] = np.zeros(t, dtype=bool)
    if trajectory_key is not None:
        source[trajectory_key] = np.full(t, episode_id, dtype=np.int64)
    source.update({k: v[:t] for k, v in infos.items() if len(v) in (t, t + 1)})
    out = {}
    for key, spec in fields.items():
        if key not in source:
            raise SchemaError(
                f"table field {key!r} has no source in episode {episode_id}: it has "
                f"{', '.join(sorted(source))}",
                field=key,
                got=sorted(source),
            )
        value = source[key]
        widths_fit(episode_id, {key: value.shape[1:]}, fields)
        out[key] = value.reshape(t, *(spec.get("shape") or []))
        _check_fits(key, spec["dtype"], value, episode_id, first_step)
    return out


def _check_fits(key: str, dtype: str, value: np.ndarray, episode_id: int, first: int) -> None:
    """Refuse a value the field's dtype cannot take (:func:`~.dtypes.first_misfit`)."""
    try:
        i = first_misfit(torch.from_numpy(np.ascontiguousarray(value)), TORCH[dtype])
    except TypeError:  # strings, objects: not numbers
        i, value = 0, value.astype(str)
    if i is not None:
        got = value.reshape(-1)[i].item()
        raise SchemaError(
            f"table field {key!r} ({dtype}) cannot hold {got!r} of episode {episode_id} "
            f"(step {first + i // max(value[0].size, 1)}, {value.dtype}): a value changes only by "
            "rounding a float into a narrower float",
            field=key,
            expected=dtype,
            got=got,
        )

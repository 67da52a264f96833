"""Rows <-> episodes: how a table's items (TorchRL's TED layout) become offline-RL episodes, and back.

A table holds transitions, one per row, with the TED keys: ``observation``,
``action``, ``next.observation``, ``next.reward`` and the flags
``next.done`` / ``next.terminated`` / ``next.truncated``. An episode, as
Minari stores it, has ``T`` steps: ``T + 1`` observations (the ``T`` values of
``observation`` and the last ``next.observation``), and ``T`` actions, rewards,
terminations and truncations. ``observation`` and ``action`` may be subtrees
(``observation.pixels``, ``observation.state``): they become dict observations.
Every other field of the table travels per step in the episode's ``infos``
(nested by its dots), so a table exported and imported again gets it back. As
Minari keeps infos, one per observation (``T + 1``; the reset's first), the
info of observation ``t`` is row ``t``'s and the last one repeats row ``T - 1``'s;
an import takes the first ``T`` (an older export's ``T`` infos read too).

Episodes are told apart by the table's trajectory key when it has one
(a key the caller names, else ``sampler.traj_key`` of a slice sampler, else
``collector.traj_ids``, which TorchRL's collectors fill): rows
with one id form one episode even when other trajectories' rows lie between
them. Without one, by the done flags: an episode ends at a row whose
``next.done``, ``next.terminated``, ``next.truncated`` or ``sampler.end_key``
is set. Rows after the last flag (an episode still running when the table was
read) make a last episode whose final step is neither terminated nor truncated.

Rows may be missing inside an episode: removed after ``max_times_sampled``
samples, consumed from a queue, overwritten by the ring. A row follows the one
before it in its episode only if its ``observation`` is the other's
``next.observation`` (bit for bit, every leaf: TED's own invariant); where one
does not, the episode is split there, so no transition is joined to one it did not
follow: each piece is an episode of its own, every piece but the last ending
truncated (an episode cut short, as a time limit cuts it). :attr:`EpisodeSplitter.splits`
counts the splits.

Terminations are ``next.terminated`` (else ``next.done``); truncations are
``next.truncated`` (else, with both ``next.done`` and ``next.terminated``,
done and not terminated; else none).

This module is only arrays, and :mod:`.episode_rows` the way back (checked):
:mod:`tdreplay.codec.minari_files` writes and reads Minari datasets with them; the
storage, the service, the client and the CLI all convert through those modules.

    >>> import numpy as np
    >>> spec = {"fields": {"observation": {"shape": [2], "dtype": "float32"},
    ...     "action": {"shape": [], "dtype": "int64"},
    ...     "next.observation": {"shape": [2], "dtype": "float32"},
    ...     "next.reward": {"shape": [1], "dtype": "float32"},
    ...     "next.done": {"shape": [1], "dtype": "bool"}}}
    >>> layout = EpisodeLayout.of(spec)
    >>> rows = {"observation": np.arange(10.0).reshape(5, 2), "action": np.arange(5),
    ...     "next.observation": np.arange(2.0, 12.0).reshape(5, 2),
    ...     "next.reward": np.ones((5, 1)), "next.done": np.array([[0], [1], [0], [0], [1]], bool)}
    >>> splitter = EpisodeSplitter(layout)
    >>> [len(e.rewards) for e in splitter.feed(rows)], list(splitter.finish())
    ([2, 3], [])
    >>> splitter.feed(rows)[0].observations.shape  # T + 1 observations
    (3, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import SchemaError

__all__ = [
    "Episode",
    "EpisodeLayout",
    "EpisodeSplitter",
    "nest_dotted",
    "trajectory_key_of",
]

OBS, NEXT_OBS, ACTION, REWARD = "observation", "next.observation", "action", "next.reward"
DONE, TERMINATED, TRUNCATED = "next.done", "next.terminated", "next.truncated"
#: TED's root flags: those of the step before; always false inside an episode
ROOT_FLAGS = ("done", "terminated", "truncated")


#: the trajectory ids TorchRL's collectors write: a table's trajectory key when its sampler names none
COLLECTOR_TRAJ = "collector.traj_ids"


def trajectory_key_of(spec: Mapping[str, Any], given: str | None = None) -> str | None:
    """The trajectory key of a table: ``given``, else ``sampler.traj_key``, else
    ``collector.traj_ids`` when the table has that field, else none."""
    if given is not None:
        return given
    traj = (spec.get("sampler") or {}).get("traj_key")
    if traj is not None:
        return str(traj)
    return COLLECTOR_TRAJ if COLLECTOR_TRAJ in (spec.get("fields") or {}) else None


def _under(fields: Mapping[str, Any], top: str) -> list[str]:
    return [k for k in fields if k == top or k.startswith(top + ".")]


@dataclass(frozen=True)
class EpisodeLayout:
    """Which fields of a table make an episode's parts (dotted keys).

    Build it with :meth:`of` from a table's spec (its ``fields`` and ``sampler``,
    as a dict: what ``client.info`` answers, or a Parquet export's ``tdreplay.spec``).
    """

    observation: list[str]  # leaves under "observation", in schema order
    action: list[str]
    reward: str
    terminated: str | None
    truncated: str | None
    done: str | None
    end: str | None  # another done flag the sampler names (sampler.end_key)
    trajectory: str | None
    infos: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, spec: Mapping[str, Any], trajectory_key: str | None = None) -> EpisodeLayout:
        """The layout of a table declared by ``spec``.

        Args:
            spec: ``{"fields": {dotted key: {"shape", "dtype"}}, "sampler": {...}}``.
            trajectory_key: the field of trajectory ids; default: :func:`trajectory_key_of`.

        Raises:
            SchemaError: a key an episode needs is missing (``observation``,
                ``next.observation`` for each of its leaves, ``action``,
                ``next.reward``), the reward holds more than one value per step, or
                there is no way to tell episodes apart (no trajectory key and no done flag).
        """
        fields: Mapping[str, Any] = spec.get("fields") or {}
        sampler = spec.get("sampler") or {}
        obs = _under(fields, OBS)
        missing = [] if obs else [OBS]
        missing += [f"next.{k}" for k in obs if f"next.{k}" not in fields]
        action = _under(fields, ACTION)
        if not action:
            missing.append(ACTION)
        if REWARD not in fields:
            missing.append(REWARD)
        if missing:
            raise SchemaError(
                f"missing keys for episodes: {', '.join(missing)} (the table has "
                f"{', '.join(fields) or 'no fields'}); an episode needs observation, "
                "next.observation, action and next.reward (TorchRL's TED layout)",
                field=missing[0],
                expected="observation, next.observation, action, next.reward",
                got=sorted(fields),
            )
        if _numel(fields[REWARD]) != 1:
            raise SchemaError(
                f"next.reward has shape {fields[REWARD].get('shape')}: an episode's reward is "
                "one value per step",
                field=REWARD,
                expected="shape [] or [1]",
                got=fields[REWARD].get("shape"),
            )
        traj = trajectory_key_of(spec, trajectory_key)
        if traj is not None and traj not in fields:
            raise SchemaError(
                f"trajectory key {traj!r} is not a field of the table",
                field=traj,
                got=sorted(fields),
            )
        end = sampler.get("end_key")
        end = end if end in fields and end not in (DONE, TERMINATED, TRUNCATED) else None
        flags = {k: k if k in fields else None for k in (DONE, TERMINATED, TRUNCATED)}
        if traj is None and end is None and not any(flags.values()):
            raise SchemaError(
                "no episode boundary: the table has no trajectory key (sampler.traj_key) and "
                "none of the done flags next.done, next.terminated, next.truncated",
                field=DONE,
                expected="sampler.traj_key or next.done / next.terminated / next.truncated",
                got=sorted(fields),
            )
        used = {*obs, *(f"next.{k}" for k in obs), *action, REWARD}
        return cls(
            observation=obs,
            action=action,
            reward=REWARD,
            terminated=flags[TERMINATED],
            truncated=flags[TRUNCATED],
            done=flags[DONE],
            end=end,
            trajectory=traj,
            infos=[k for k in fields if k not in used],
        )

    def ends(self, rows: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """Whether each of ``n`` rows ends its episode (by the done flags; all false without)."""
        out = np.zeros(n, dtype=bool)
        for key in (self.done, self.terminated, self.truncated, self.end):
            if key is not None:
                out |= rows[key].reshape(n, -1).any(axis=1)
        return out

    @property
    def has_flags(self) -> bool:
        return any(k is not None for k in (self.done, self.terminated, self.truncated, self.end))


def _numel(f: Mapping[str, Any]) -> int:
    return int(np.prod(f.get("shape") or [], dtype=np.int64))


def nest_dotted(flat: Mapping[str, Any], strip: str = "") -> Any:
    """``{"a.b": x, "a.c": y}`` -> ``{"a": {"b": x, "c": y}}``; with ``strip``, that prefix
    is taken off first, and a lone ``strip`` key is returned as it is."""
    if strip in flat:
        return flat[strip]
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key[len(strip) + 1 :].split(".") if strip else key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


@dataclass
class Episode:
    """One episode in Minari's terms: ``T + 1`` observations, ``T`` of the rest."""

    observations: Any  # an array, or a dict of them (observation subtrees)
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any]


class EpisodeSplitter:
    """Cuts a stream of row chunks into whole episodes (see the module's docstring).

    Feed chunks of rows (``{dotted key: array of [n, *shape]}``) oldest first with
    :meth:`feed`; it returns the episodes they completed. :meth:`finish` returns
    those still open. Only rows of unfinished episodes are held between chunks.
    """

    def __init__(self, layout: EpisodeLayout) -> None:
        self.layout = layout
        self.rows = 0
        self.episodes = 0
        #: where an episode was split because rows were missing inside it
        self.splits = 0
        self._open: dict[Any, list[dict[str, np.ndarray]]] = {}

    def feed(self, rows: Mapping[str, np.ndarray]) -> list[Episode]:
        n = len(next(iter(rows.values())))
        self.rows += n
        ends = self.layout.ends(rows, n)
        if self.layout.trajectory is not None:
            ids = rows[self.layout.trajectory].reshape(n)
        else:
            ids = np.zeros(n, dtype=np.int64)
        gaps = ~self._follows(rows, slice(0, n - 1), rows, slice(1, n))
        cuts = np.flatnonzero((ids[1:] != ids[:-1]) | ends[:-1] | gaps) + 1
        done = []
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), n], strict=True):
            key = ids[lo].item()
            held = self._open.get(key)
            last = slice(-1, None)
            if held is not None and not self._follows(held[-1], last, rows, slice(lo, lo + 1))[0]:
                self.splits += 1
                done.append(self._close(key, split=True))
            self._open.setdefault(key, []).append({k: v[lo:hi] for k, v in rows.items()})
            if ends[hi - 1]:
                done.append(self._close(key))
        return done

    def finish(self) -> list[Episode]:
        """The episodes still open, in the order they began.

        Raises:
            SchemaError: without a trajectory key, no row ended an episode (the
                done flags are all false): no episode boundary was found.
        """
        ended = self.episodes - self.splits  # a split is no boundary: rows were missing
        if self.layout.trajectory is None and ended == 0 and self.rows:
            flags = [
                k
                for k in (self.layout.done, self.layout.terminated, self.layout.truncated)
                if k is not None
            ]
            raise SchemaError(
                f"no episode boundary found in {self.rows} rows: none of "
                f"{', '.join(flags or [str(self.layout.end)])} is set in any row "
                "(give a trajectory key, or set the done flags)",
                field=(flags or [str(self.layout.end)])[0],
            )
        return [self._close(key) for key in list(self._open)]

    def _follows(
        self, before: Mapping[str, np.ndarray], b: slice, after: Mapping[str, np.ndarray], a: slice
    ) -> np.ndarray:
        """Whether each row of ``after[a]`` observes what the row of ``before[b]`` at its
        place ended in (bit for bit, every observation leaf)."""
        same: np.ndarray | None = None
        for key in self.layout.observation:
            x, y = before[f"next.{key}"][b], after[key][a]
            width = int(np.prod(x.shape[1:], dtype=np.int64))
            x = np.ascontiguousarray(x).reshape(len(x), width).view(np.uint8)
            y = np.ascontiguousarray(y).reshape(len(y), width).view(np.uint8)
            eq = (x == y).all(axis=1)
            same = eq if same is None else same & eq
        return same if same is not None else np.ones(0, bool)

    def _close(self, key: Any, split: bool = False) -> Episode:
        parts = self._open.pop(key)
        rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        self.episodes += 1
        episode = _episode(self.layout, rows)
        if split:  # cut short where rows are missing: truncated, as a time limit cuts one
            episode.truncations = episode.truncations.copy()
            episode.truncations[-1] = True
        return episode


def _episode(layout: EpisodeLayout, rows: dict[str, np.ndarray]) -> Episode:
    t = len(rows[layout.reward])
    obs = {k: np.concatenate([rows[k], rows[f"next.{k}"][-1:]]) for k in layout.observation}
    flag: dict[str, np.ndarray] = {
        k: np.asarray(rows[k].reshape(t, -1).any(axis=1)) for k in _flag_keys(layout)
    }
    term: np.ndarray
    trunc: np.ndarray
    if layout.terminated is not None:
        term = flag[layout.terminated]
    elif layout.done is not None:
        term = flag[layout.done]
    else:
        term = flag[layout.end] if layout.end is not None else np.zeros(t, bool)
    if layout.truncated is not None:
        trunc = flag[layout.truncated]
    elif layout.done is not None and layout.terminated is not None:
        trunc = flag[layout.done] & ~term
    else:
        trunc = np.zeros(t, bool)
    return Episode(
        observations=nest_dotted(obs, OBS),
        actions=nest_dotted({k: rows[k] for k in layout.action}, ACTION),
        rewards=rows[layout.reward].reshape(t),
        terminations=term,
        truncations=trunc,
        infos=nest_dotted({k: np.concatenate([rows[k], rows[k][-1:]]) for k in layout.infos}),
    )


def _flag_keys(layout: EpisodeLayout) -> set[str]:
    return {k for k in (layout.done, layout.terminated, layout.truncated, layout.end) if k}

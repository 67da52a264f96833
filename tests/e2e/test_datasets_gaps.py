"""Minari exports of episodes with rows missing inside them (removed, as ``max_times_sampled``
removes them; consumed from a queue; overwritten by the ring): the episode is split at the
gap, each piece its own episode ending truncated but the last, and the export says how many
splits it made. Read back with minari's own reader: every exported transition follows the
one before it (observation ``t + 1`` is what step ``t`` ended in)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import minari
import numpy as np
import pytest
from datasetkit import make_table, transitions

from tdreplay.client import ReplayClient


def episodes(root: Path, dataset_id: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return list(minari.load_dataset(dataset_id).iterate_episodes())


def assert_consecutive(episode: Any) -> None:
    """Step t of episode e observes ``[e, t, 0]`` (:func:`datasetkit.transitions`): within a
    Minari episode the step counter rises by one from observation to observation."""
    obs = np.asarray(episode.observations)
    assert (np.diff(obs[:, 1]) == 1).all() and (obs[:, 0] == obs[0, 0]).all(), obs
    assert np.array_equal(episode.rewards, 10 * obs[:-1, 0] + obs[:-1, 1])


@pytest.mark.parametrize("where", ["here", "server"])
def test_an_episode_with_rows_missing_is_split_at_the_gap(
    client: ReplayClient,
    server: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    name = make_table(client, max_times_sampled=1)
    client.extend(name, transitions([6, 5]))  # slots 0..5: episode 0, 6..10: episode 1
    assert client.remove(name, [2, 8]) == 2  # step 2 of each episode
    dataset_id = f"gaps/{where}-v0"
    if where == "here":
        written = client.export(name, "minari", dest=tmp_path, dataset_id=dataset_id)
        assert written.splits == 2 and written.rows == 9
        read = episodes(tmp_path, dataset_id, monkeypatch)
    else:
        client.export(name, "minari", path="exports/gaps", dataset_id=dataset_id)
        assert "2 episode splits" in server.output()
        read = episodes(server.root / "exports" / "gaps", dataset_id, monkeypatch)
    # joined, episode 0 was steps 0, 1, 3, 4, 5: observation [0, 3, 0] followed step 1,
    # which ended in [0, 2, 0]
    assert [len(e) for e in read] == [2, 3, 2, 2]
    for e in read:
        assert_consecutive(e)
    assert [bool(e.truncations[-1]) for e in read] == [True, False, True, False]
    assert [bool(e.terminations[-1]) for e in read] == [False, True, False, True]
    assert not any(e.truncations[:-1].any() or e.terminations[:-1].any() for e in read)

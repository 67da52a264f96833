"""One place says a full disk is a 507: :func:`tdreplay.storage.diskspace.on_full_disk`.

``/dev/full`` answers every write with ENOSPC, a real full disk's error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tdreplay.storage.diskspace import on_full_disk
from tdreplay.storage.errors import BackendError, InsufficientStorage


def _write_to_a_full_disk() -> None:
    with open("/dev/full", "wb", buffering=0) as f:
        f.write(b"x")


def test_a_full_disk_is_a_507_after_the_cleanup(tmp_path: Path) -> None:
    half = tmp_path / "half"
    half.write_bytes(b"partial")
    with (
        pytest.raises(InsufficientStorage) as err,
        on_full_disk("export of table 't'", tmp_path, table="t", cleanup=half.unlink),
    ):
        _write_to_a_full_disk()
    assert str(err.value).startswith(f"export of table 't': no space left at {tmp_path} (")
    assert "No space left on device" in str(err.value) and err.value.table == "t"
    assert not half.exists()


def test_a_room_of_its_own_says_it_in_its_words(tmp_path: Path) -> None:
    def full(err: Exception) -> InsufficientStorage:
        return InsufficientStorage(f"no room in shared memory: {err}")

    with (
        pytest.raises(InsufficientStorage, match="no room in shared memory"),
        on_full_disk("allocating", tmp_path, error=full),
    ):
        _write_to_a_full_disk()


def test_other_errors_and_answers_go_out_as_they_were(tmp_path: Path) -> None:
    cleaned: list[int] = []
    with (
        pytest.raises(FileNotFoundError),
        on_full_disk("export", tmp_path, cleanup=lambda: cleaned.append(1)),
    ):
        (tmp_path / "missing").read_bytes()
    answer = BackendError("read failed: No space left on device")
    with (
        pytest.raises(BackendError) as err,
        on_full_disk("export", tmp_path, cleanup=lambda: cleaned.append(2)),
    ):
        raise answer
    assert err.value is answer and cleaned == [1, 2]


def test_a_failing_cleanup_hides_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(InsufficientStorage),
        on_full_disk("export", tmp_path, cleanup=(tmp_path / "gone").unlink),
    ):
        _write_to_a_full_disk()


def test_a_full_disk_whose_free_bytes_cannot_be_read_is_still_a_507(tmp_path: Path) -> None:
    # a name longer than the file system takes: measuring the bytes free there fails
    # (ENAMETOOLONG), which must not turn the 507 into that error
    where = tmp_path / ("x" * 300)
    with pytest.raises(InsufficientStorage) as err, on_full_disk("export", where, table="t"):
        _write_to_a_full_disk()
    assert "bytes free unknown: File name too long" in str(err.value)
    assert "No space left on device" in str(err.value) and err.value.table == "t"

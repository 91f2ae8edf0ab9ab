"""fastloop._files: a file written atomically is either the old one or the new one, and a
failed write leaves no temporary file behind."""

from __future__ import annotations

import os

import pytest

from fastloop._files import TEMP_PREFIX, sync_dir, write_atomically


def test_write_atomically_replaces_the_file(tmp_path):
    path = tmp_path / "record.json"
    path.write_bytes(b"old")
    write_atomically(str(path), lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["record.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary_one(tmp_path):
    path = tmp_path / "record.json"
    path.write_bytes(b"old")

    def fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomically(str(path), fail, durable=False)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["record.json"]


def test_the_temporary_file_goes_where_it_is_told(tmp_path):
    seen = []
    (tmp_path / "jobs").mkdir()
    write_atomically(str(tmp_path / "jobs" / "a.npy"), lambda f: seen.append(os.path.basename(f.name)),
                     temp_dir=str(tmp_path))
    assert seen[0].startswith(TEMP_PREFIX) and os.listdir(tmp_path / "jobs") == ["a.npy"]


def test_sync_dir_names_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        sync_dir(str(tmp_path / "absent"))

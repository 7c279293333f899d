"""Every write is whole or raises: the line logs behind ``result.json`` and ``progress.csv``
on a real full tmpfs, and the rollbacks a failed mirror or a short write need (injected at
``os.write``, the one place the kernel can answer short)."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from ftnb.storage import Storage, TrialPaths
from ftnb.storage.faults import StorageFault, storage_fault
from ftnb.storage.result_log import ResultLog


@pytest.fixture
def tiny_tmpfs(tmp_path):
    where = tmp_path / "tiny"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _trial(folder) -> TrialPaths:
    storage = Storage(str(folder))
    paths = TrialPaths(storage, str(folder / "trial"))
    os.makedirs(paths.dir, exist_ok=True)
    return paths


def test_rows_meeting_a_full_disk_are_whole_or_raise_and_go_on_once_there_is_space(tiny_tmpfs):
    log = ResultLog(_trial(tiny_tmpfs))
    acknowledged = 0
    with pytest.raises(StorageFault) as caught:
        for i in range(10_000):  # rows longer than a page: the one that meets the end is cut
            log.append({"i": i, "pad": "x" * 5000})
            acknowledged += 1
    fault = caught.value
    assert fault.errno == errno.ENOSPC and fault.errno_name == "ENOSPC"
    assert "no space left on the device" in str(fault) and "Fix:" in str(fault)
    assert fault.filename.endswith(("result.json", "progress.csv"))
    results = (tiny_tmpfs / "trial" / "result.json").read_bytes()
    assert results.endswith(b"\n")
    lines = results.decode().splitlines()
    assert len(lines) == acknowledged == len(log.rows)
    progress = (tiny_tmpfs / "trial" / "progress.csv").read_text().splitlines()
    assert len(progress) == acknowledged + 1  # the header, then the same rows
    # Space again (the rows past the second given up): the next row follows the last whole one.
    os.truncate(tiny_tmpfs / "trial" / "progress.csv", 0)
    log.rewrite(log.rows[:2])
    log.append({"i": "again", "pad": ""})
    rows = (tiny_tmpfs / "trial" / "result.json").read_text().splitlines()
    assert len(rows) == 3 and '"again"' in rows[-1]


def test_a_row_whose_mirror_fails_is_taken_back_from_result_json(tmp_path, monkeypatch):
    paths = _trial(tmp_path)
    log = ResultLog(paths)
    log.append({"loss": 1.0})
    before = (tmp_path / "trial" / "result.json").read_bytes()
    real_write = os.write

    def refuse_progress(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("progress.csv"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", refuse_progress)
    with pytest.raises(StorageFault, match="progress.csv"):
        log.append({"loss": 0.5})
    monkeypatch.undo()
    assert (tmp_path / "trial" / "result.json").read_bytes() == before
    assert len(log.rows) == 1
    log.append({"loss": 0.25})
    assert [r["loss"] for r in paths.read_results()] == [1.0, 0.25]


def test_a_short_write_is_continued(tmp_path, monkeypatch):
    paths = _trial(tmp_path)
    log = ResultLog(paths)
    real_write = os.write

    def short(fd, data):
        return real_write(fd, bytes(data[: max(1, len(data) // 3)]))

    monkeypatch.setattr(os, "write", short)
    log.append({"loss": 1.0, "note": "y" * 100})
    monkeypatch.undo()
    assert [r["loss"] for r in paths.read_results()] == [1.0]
    assert (tmp_path / "trial" / "result.json").read_bytes().endswith(b"\n")


@pytest.mark.parametrize("err, words", [
    (errno.ENOSPC, "no space left"), (errno.EDQUOT, "quota"), (errno.EROFS, "read-only"),
    (errno.EACCES, "permission denied"), (errno.EIO, "I/O error")])
def test_storage_faults_name_the_path_the_error_and_the_fix(tmp_path, err, words):
    fault = storage_fault(OSError(err, os.strerror(err)), str(tmp_path / "x" / "result.json"))
    assert isinstance(fault, StorageFault) and isinstance(fault, OSError)
    text = str(fault)
    assert words in text and str(tmp_path) in text and "Fix:" in text and "free there" in text
    import pickle

    again = pickle.loads(pickle.dumps(fault))
    assert str(again) == text


def test_other_errors_are_not_storage_faults():
    exc = OSError(errno.ECONNRESET, "reset")
    assert storage_fault(exc, "/x") is exc
    value = ValueError("no")
    assert storage_fault(value, "/x") is value


@pytest.mark.parametrize("value", [0, -5, "soon", float("nan")])
def test_storage_wait_s_is_checked_when_the_config_is_made(value):
    import ftnb

    with pytest.raises(ValueError, match=r"FailureConfig\(storage_wait_s=\.\.\.\)") as caught:
        ftnb.FailureConfig(storage_wait_s=value)
    assert repr(value) in str(caught.value) and "Fix:" in str(caught.value)

"""The storage contract: one suite, run over every place ftnb keeps experiments.

Backends: a local folder, a local folder whose path has spaces, quotes, a newline, ``#``, ``%``
and ``::`` in it (submitit's ``weird_tmp_path``: quoting bugs), fsspec's ``memory://``, and a real
S3-protocol server (moto on loopback, ``-m s3``). A new backend is done when this suite passes on
it (the pattern of fsspec's ``tests/abstract``). Behaviour that differs by nature (a local disk has
locks and cheap ``stat``; object stores have neither) is asserted per backend, from
``Backend.local``.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Callable

import pytest

import ftnb
from ftnb.storage.checkpoint_files import checkpoint_damage
from ftnb.storage.control import ControlInbox, send_request
from ftnb.storage.lease import Fence, Lease, read_lease
from ftnb.storage.result_log import ResultLog
from ftnb.storage import (
    LOCAL_POLL_S,
    REMOTE_POLL_S,
    CorruptFileError,
    ExperimentPaths,
    Storage,
    checkpoint_dir_name,
    read_json_lines,
)
from scripted import report_step, restored_step

WEIRD_NAME = ("a folder with spaces, 'single' and \"double\" quotes,\na newline, #hash, "
              "50% and ::colons")


@dataclass
class Backend:
    """One storage under test: ``storage`` (its root is a fresh, empty folder), whether it is
    this machine's disk, and a storage that cannot be written (None: the backend has none)."""

    name: str
    storage: Storage
    local: bool
    unwritable: Callable[[], Storage]


@pytest.fixture(params=["local", "weird_local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request, tmp_path):
    kind = request.param
    if kind in ("local", "weird_local"):
        root = tmp_path / (WEIRD_NAME if kind == "weird_local" else "plain") / "runs"
        blocker = tmp_path / "a file"
        blocker.write_text("not a folder")
        yield Backend(kind, Storage(str(root)), True, lambda: Storage(str(blocker / "runs")))
    elif kind == "memory":
        import fsspec

        fs = fsspec.filesystem("memory")
        root = f"/ftnb-contract-{uuid.uuid4().hex[:12]}"
        blocker = f"/ftnb-contract-file-{uuid.uuid4().hex[:12]}"
        fs.pipe_file(blocker, b"not a folder")
        try:
            yield Backend(kind, Storage(f"memory://{root}/runs"), False,
                          lambda: Storage(f"memory://{blocker}/runs"))
        finally:
            for path in (root, blocker):
                if fs.exists(path):
                    fs.rm(path, recursive=True)
    else:
        url, fs = request.getfixturevalue("s3_storage")
        missing_bucket = f"s3://ftnb-missing-{uuid.uuid4().hex[:12]}/runs"
        yield Backend(kind, Storage(url, fs), False, lambda: Storage(missing_bucket, fs))


@pytest.fixture
def storage(backend) -> Storage:
    return backend.storage


@pytest.fixture
def paths(storage) -> ExperimentPaths:
    paths = ExperimentPaths.of(storage, "exp")
    storage.makedirs(paths.dir)
    return paths


@pytest.fixture
def trial(paths):
    trial = paths.trial("trial_00000")
    paths.storage.makedirs(trial.dir)
    return trial


def _temporaries(storage: Storage, folder: str) -> list[str]:
    return [n for n in storage.listdir(folder) if n.startswith(".") and "tmp" in n]


# -- paths ----------------------------------------------------------------------------------------
def test_paths_name_every_file_in_the_experiment_format(storage):
    paths = ExperimentPaths.of(storage, "exp")
    trial = paths.trial("trial_00000")
    experiment_files = {
        paths.state: "experiment_state.json", paths.state_backup: "experiment_state.prev.json",
        paths.state_segment("experiment_state.00000003.jsonl"): "experiment_state.00000003.jsonl",
        paths.lease: "owner.json", paths.lease_lock: ".owner.lock", paths.control: "control",
        paths.supervisor: "supervisor.json", paths.supervisor_log: "supervisor.log",
        paths.trial("trial_00000").dir: "trial_00000",
    }
    trial_files = {
        trial.record: "trial.json", trial.params: "params.json", trial.results: "result.json",
        trial.progress: "progress.csv", trial.error: "error.txt", trial.stdout: "stdout",
        trial.stderr: "stderr", trial.checkpoint(checkpoint_dir_name(3)): "checkpoint_000003",
    }
    for files, folder in ((experiment_files, paths.dir), (trial_files, trial.dir)):
        for path, name in files.items():
            assert storage.parent(path) == folder, path
            assert storage.join(folder, name) == path
    marker = trial.checkpoint_marker("checkpoint_000003")
    assert storage.parent(marker) == trial.checkpoint("checkpoint_000003")
    assert storage.join(storage.parent(marker), ".ftnb_checkpoint.json") == marker
    assert storage.parent(paths.control_request("0001-ab")) == paths.control
    assert storage.join(paths.control, "0001-ab.json") == paths.control_request("0001-ab")
    assert len(set(experiment_files) | set(trial_files)) == 17


def test_join_parent_and_uri_lead_back_to_the_same_place(backend, storage):
    paths = ExperimentPaths.of(storage, "exp")
    assert storage.parent(paths.dir) == storage.root
    assert storage.parent(storage.join(paths.dir, "a", "b")) == storage.join(paths.dir, "a")
    assert paths.name == "exp"
    assert paths.parent_uri == storage.uri(storage.root)
    again = ExperimentPaths.at(paths.uri, None if backend.name != "s3" else storage.fs)
    assert again.dir == paths.dir and again.uri == paths.uri
    assert ExperimentPaths.of(storage, "exp", folder=storage.root) == paths
    if backend.local:
        assert paths.uri == paths.dir  # a path, pasted as it is
    else:
        assert paths.uri.startswith(f"{backend.name}://") and paths.uri.endswith("/runs/exp")


def test_how_to_poll_and_what_to_hand_a_user(backend, storage):
    assert storage.poll_interval_s == (LOCAL_POLL_S if backend.local else REMOTE_POLL_S)
    assert storage.user_filesystem is (None if backend.local else storage.fs)


# -- reads of what is not there -------------------------------------------------------------------
def test_what_is_missing_reads_as_missing(storage):
    paths = ExperimentPaths.of(storage, "nothing-here")
    trial = paths.trial("trial_00000")
    assert not storage.exists(paths.dir) and not storage.isdir(paths.dir)
    assert storage.listdir(paths.dir) == []
    assert not paths.has_state()
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(paths.state)
    assert trial.read_results() == [] and trial.checkpoint_dirs() == []
    assert paths.control_request_ids() == []
    assert read_lease(paths) is None
    storage.remove(paths.state)  # removing what is not there is no error
    storage.remove(paths.dir, recursive=True)


# -- writes ----------------------------------------------------------------------------------------
def test_write_atomic_read_back_and_list(storage, paths):
    storage.write_atomic(paths.state, b'{"a": 1}')
    storage.write_atomic(paths.state_backup, "text é\n")
    storage.write_json_atomic(paths.supervisor, {"pid": 1, "when": math.pi})
    storage.makedirs(paths.control)
    storage.write_atomic(paths.control_request("0002-b"), b"{}", durable=False)
    storage.write_atomic(paths.control_request("0001-a"), b"{}")
    assert storage.read_bytes(paths.state) == b'{"a": 1}'
    assert storage.read_text(paths.state_backup) == "text é\n"
    assert json.loads(storage.read_text(paths.supervisor)) == {"pid": 1, "when": math.pi}
    assert paths.has_state() and storage.exists(paths.state) and not storage.isdir(paths.state)
    assert storage.isdir(paths.dir) and storage.isdir(paths.control)
    assert storage.listdir(paths.dir) == sorted(
        ["control", "experiment_state.json", "experiment_state.prev.json", "supervisor.json"])
    assert paths.control_request_ids() == ["0001-a", "0002-b"]
    storage.write_atomic(paths.state, b"second")
    assert storage.read_bytes(paths.state) == b"second"
    assert _temporaries(storage, paths.dir) == []


def test_readers_never_see_half_a_file(storage, paths):
    # Two versions of different sizes, each one byte value throughout: a torn read is one that
    # mixes them, is short, or is empty.
    versions = [b"a" * (1 << 20), b"b" * (700 << 10)]
    storage.write_atomic(paths.state, versions[0])
    reads: list[bytes] = []
    done = threading.Event()

    def read_until_done():
        while True:
            finished = done.is_set()
            reads.append(storage.read_bytes(paths.state))
            if finished:
                return

    reader = threading.Thread(target=read_until_done)
    reader.start()
    try:
        for i in range(1, 13):
            storage.write_atomic(paths.state, versions[i % 2])
    finally:
        done.set()
        reader.join(timeout=120)
    assert not reader.is_alive()
    assert reads and all(data in versions for data in reads)
    assert _temporaries(storage, paths.dir) == []


def test_remove_files_and_folders(storage, paths, trial):
    storage.write_atomic(paths.state, b"x")
    storage.write_atomic(trial.params, b"{}")
    storage.makedirs(storage.join(trial.checkpoint("checkpoint_000000"), "sub"))
    storage.write_atomic(storage.join(trial.checkpoint("checkpoint_000000"), "sub", "w"), b"w")
    storage.remove(paths.state)
    assert not storage.exists(paths.state)
    storage.remove(trial.checkpoint("checkpoint_000000"), recursive=True)
    assert not storage.exists(trial.checkpoint("checkpoint_000000"))
    assert storage.listdir(trial.dir) == ["params.json"]
    storage.remove(paths.dir, recursive=True)
    assert not storage.exists(trial.params) and storage.listdir(paths.dir) == []


def test_makedirs_is_idempotent_and_holds_files(storage, paths):
    folder = storage.join(paths.dir, "a", "b")
    storage.makedirs(folder)
    storage.makedirs(folder)
    storage.write_atomic(storage.join(folder, "f"), b"1")
    assert storage.isdir(folder) and storage.listdir(folder) == ["f"]
    assert storage.listdir(storage.join(paths.dir, "a")) == ["b"]


def test_upload_file_replaces_whole(storage, paths, tmp_path):
    local = tmp_path / "upload.bin"
    for content in (b"first version, longer", b"second"):
        local.write_bytes(content)
        storage.upload_file(str(local), paths.supervisor_log)
        assert storage.read_bytes(paths.supervisor_log) == content
    assert _temporaries(storage, paths.dir) == []


def test_a_staged_file_is_written_locally_and_published(backend, storage, paths, tmp_path):
    staged = storage.staged_file(paths.supervisor_log, staging_dir=str(tmp_path / "staging"))
    assert staged.staged == (not backend.local)
    expected = (paths.supervisor_log if backend.local
                else str(tmp_path / "staging" / "supervisor.log"))
    assert staged.local_path == expected
    with open(staged.local_path, "a") as f:
        f.write("line 1\n")
    with open(staged.local_path, "a") as f:
        f.write("line 2\n")
    staged.publish()
    assert storage.read_text(paths.supervisor_log) == "line 1\nline 2\n"
    chosen = tmp_path / "chosen.log"
    chosen.write_text("mine\n")
    pinned = storage.staged_file(paths.supervisor_log, local_path=str(chosen))
    assert pinned.local_path == (paths.supervisor_log if backend.local else str(chosen))
    pinned.publish()
    if not backend.local:
        assert storage.read_text(paths.supervisor_log) == "mine\n"


def test_check_writable(backend, storage):
    storage.check_writable()
    assert storage.isdir(storage.root) or not backend.local
    assert [n for n in storage.listdir(storage.root) if "probe" in n] == []
    unwritable = backend.unwritable()
    with pytest.raises(ValueError) as info:
        unwritable.check_writable()
    message = str(info.value)
    assert f"storage_path={unwritable.uri(unwritable.root)!r} is not writable" in message
    assert "Fix:" in message


def test_storage_pickles_for_trial_processes(storage, paths):
    storage.write_atomic(paths.state, b"from the driver")
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.read_bytes(paths.state) == b"from the driver"
    copy.write_atomic(paths.state_backup, b"from a trial")
    assert storage.read_bytes(paths.state_backup) == b"from a trial"


# -- the result log --------------------------------------------------------------------------------
ROWS = [
    {"training_iteration": 1, "loss": 0.5, "nested": {"a": 1}},
    {"training_iteration": 2, "loss": float("nan"), "nested": {"a": 2}},
    {"training_iteration": 3, "loss": 0.25, "nested": {"a": 3, "b": float("inf")}},
]


def _same_rows(got: list[dict], expected: list[dict]) -> bool:
    return json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


def _csv_lines(storage, trial) -> list[str]:
    return storage.read_text(trial.progress).splitlines()


def test_result_log_appends_rewrites_and_reads_back(storage, trial):
    log = ResultLog(trial)
    for row in ROWS:
        log.append(row)
    log.sync()
    log.close()
    assert _same_rows(trial.read_results(), ROWS)
    lines = _csv_lines(storage, trial)
    # The third row brought a column: the file was rewritten with the wider header.
    assert lines[0] == "training_iteration,loss,nested/a,nested/b"
    assert len(lines) == 4 and lines[3].endswith(",inf")
    again = ResultLog(trial)  # a later attempt reads what is there
    assert _same_rows(again.rows, ROWS)
    again.rewrite(ROWS[:1])  # between attempts: rows past the checkpoint go
    assert _same_rows(trial.read_results(), ROWS[:1])
    assert _csv_lines(storage, trial) == ["training_iteration,loss,nested/a", "1,0.5,1"]
    again.append({"training_iteration": 2, "loss": 0.4, "nested": {"a": 5}})
    again.close()
    assert [r["loss"] for r in trial.read_results()] == [0.5, 0.4]
    assert _csv_lines(storage, trial)[-1] == "2,0.4,5"
    ResultLog(trial, existing=[]).rewrite([])
    assert trial.read_results() == [] and storage.read_bytes(trial.results) == b""
    assert _temporaries(storage, trial.dir) == []


# What a writer that died mid-line leaves at the end of result.json, and how many of its two
# rows plus the fragment read back.
TORN_ENDS = {
    "cut inside a line": (b'{"training_iteration": 3, "lo', 2),
    "cut before its newline": (b'{"training_iteration": 3, "loss": 0.1}', 3),
    "blocks never written (zeros)": (b"\0" * 512, 2),
}


@pytest.mark.parametrize("end", TORN_ENDS, ids=list(TORN_ENDS))
def test_a_torn_last_line_is_skipped_then_repaired_by_the_next_writer(storage, trial, end):
    fragment, readable = TORN_ENDS[end]
    good = [{"training_iteration": 1, "loss": 0.3}, {"training_iteration": 2, "loss": 0.2}]
    text = b"".join(json.dumps(r).encode() + b"\n" for r in good)
    storage.write_atomic(trial.results, text + fragment)
    storage.write_atomic(trial.progress, b"training_iteration,loss\n1,0.3\n2,0.2\n3,0.")
    rows = trial.read_results()
    assert [r["training_iteration"] for r in rows] == [1, 2, 3][:readable]
    log = ResultLog(trial, existing=rows)  # as the controller hands rows to the next attempt
    log.append({"training_iteration": 4, "loss": 0.05})
    log.close()
    data = storage.read_bytes(trial.results)
    assert data.endswith(b"\n") and len(data.splitlines()) == readable + 1
    assert [r["training_iteration"] for r in trial.read_results()] == [1, 2, 3][:readable] + [4]
    assert _csv_lines(storage, trial)[-1] == "4,0.05"
    assert len(_csv_lines(storage, trial)) == 1 + readable + 1


def test_a_damaged_line_before_the_last_is_reported(storage, trial):
    lines = [b'{"training_iteration": 1}', b'{"training_iteration": 2, "lo{"training_iteration"',
             b'{"training_iteration": 3}']
    storage.write_atomic(trial.results, b"\n".join(lines) + b"\n")
    with pytest.raises(CorruptFileError) as info:
        trial.read_results()
    message = str(info.value)
    assert storage.uri(trial.results) in message and "line 2 of 3" in message
    assert "Fix:" in message
    with pytest.raises(CorruptFileError):
        ResultLog(trial)  # a writer does not append to a damaged file either


# -- checkpoints -----------------------------------------------------------------------------------
def _checkpoint_source(tmp_path, step: int) -> str:
    source = tmp_path / f"source_{step}"
    (source / "sub" / "deeper").mkdir(parents=True)
    (source / "state.json").write_text(json.dumps({"step": step}))
    (source / "sub" / "deeper" / "weights.bin").write_bytes(bytes([step]) * 4096)
    return str(source)


def test_checkpoints_persist_complete_and_read_back(backend, storage, trial, tmp_path):
    first, second = checkpoint_dir_name(0), checkpoint_dir_name(1)
    storage.persist_directory(_checkpoint_source(tmp_path, 0), trial.checkpoint(first), {"i": 0})
    # A folder without its marker is a crash's debris, not a checkpoint.
    storage.makedirs(trial.checkpoint(second))
    storage.write_atomic(storage.join(trial.checkpoint(second), "state.json"), b"{}")
    assert trial.checkpoint_dirs() == [first]
    marker = json.loads(storage.read_text(trial.checkpoint_marker(first)))
    # The marker records what was written, for a restore to tell an intact checkpoint.
    assert marker["i"] == 0
    assert marker["files"] == {"state.json": 11, "sub/deeper/weights.bin": 4096}
    assert checkpoint_damage(storage, trial.checkpoint(first)) is None
    storage.persist_directory(_checkpoint_source(tmp_path, 1), trial.checkpoint(second), {"i": 1})
    assert trial.checkpoint_dirs() == [first, second]
    assert [n for n in storage.listdir(trial.dir) if n.startswith(".")] == []

    ckpt = ftnb.Checkpoint(trial.checkpoint(second), storage.fs)
    assert ckpt.uri == storage.uri(trial.checkpoint(second))
    assert pickle.loads(pickle.dumps(ckpt)) == ckpt
    with ckpt.as_directory() as folder:
        assert json.loads(open(os.path.join(folder, "state.json")).read()) == {"step": 1}
        with open(os.path.join(folder, "sub", "deeper", "weights.bin"), "rb") as f:
            assert f.read() == bytes([1]) * 4096
        if backend.local:
            assert folder == trial.checkpoint(second)  # read in place, no copy
    if not backend.local:
        assert not os.path.exists(folder)  # the download is gone
    target = ckpt.to_directory(str(tmp_path / "copy"))
    with open(os.path.join(target, "sub", "deeper", "weights.bin"), "rb") as f:
        assert f.read() == bytes([1]) * 4096
    if backend.local:
        assert ftnb.Checkpoint.from_directory(ckpt.uri) == ckpt
        with pytest.raises(ValueError, match="no such folder"):
            ftnb.Checkpoint.from_directory(trial.checkpoint(checkpoint_dir_name(7)))


def test_a_checkpoint_moves_whole_to_its_new_name(backend, storage, trial, tmp_path):
    # What a PBT exploit does with the donor's staged copy: it becomes the trial's checkpoint.
    staged, dest = trial.checkpoint("pbt_exploit_3"), trial.checkpoint(checkpoint_dir_name(4))
    storage.persist_directory(_checkpoint_source(tmp_path, 3), staged, {"i": 3})
    storage.move_checkpoint(staged, dest)
    assert checkpoint_dir_name(4) in trial.checkpoint_dirs()
    assert json.loads(storage.read_text(trial.checkpoint_marker(checkpoint_dir_name(4))))["i"] == 3
    assert checkpoint_damage(storage, dest) is None
    with ftnb.Checkpoint(dest, storage.fs).as_directory() as folder:
        with open(os.path.join(folder, "sub", "deeper", "weights.bin"), "rb") as f:
            assert f.read() == bytes([3]) * 4096
    # A rename on a local disk; elsewhere a copy, the staged folder left to its owner.
    assert storage.exists(staged) is (not backend.local)


def test_leftover_temporary_files_of_owner_files_are_removed(backend, storage, paths, trial):
    storage.write_atomic(trial.results, b"")
    names = [".result.json.0123456789ab.tmp", ".params.json.ba9876543210.tmp",
             ".someone-else.json.0123456789ab.tmp", "notes.tmp"]
    for name in names:
        storage.write_atomic(storage.join(trial.dir, name), b"x")
    storage.write_atomic(storage.join(paths.dir, ".experiment_state.json.0123456789ab.tmp"), b"x")
    storage.write_atomic(storage.join(paths.dir, ".owner.json.0123456789ab.tmp"), b"x")
    if backend.local:
        assert sorted(trial.remove_leftover_temps()) == sorted(names[:2])
        assert paths.remove_leftover_temps() == [".experiment_state.json.0123456789ab.tmp"]
        assert ".owner.json.0123456789ab.tmp" in storage.listdir(paths.dir)  # a would-be owner's
    else:
        # Whole-object writes leave no temporary files: nothing is looked for, nothing removed.
        assert trial.remove_leftover_temps() == [] and paths.remove_leftover_temps() == []
    assert set(names[2:]) <= set(storage.listdir(trial.dir))


# -- what the lease and the control inbox need ----------------------------------------------------
_TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(3)
"""


def _other_process_can_lock(path: str) -> bool:
    done = subprocess.run([sys.executable, "-c", _TRY_LOCK, path], timeout=60)
    assert done.returncode in (0, 3), done
    return done.returncode == 0


def test_a_record_journal_reads_what_its_state_committed_and_nothing_more(backend, storage,
                                                                           paths):
    """The journal of trial records (ftnb.storage.record_journal): a reader of a listing reads
    each segment up to its committed length only; what a save wrote past it (a torn append, a
    segment not listed yet) is never read; a new writer never appends to its predecessor's
    segment; retired segments go once no state lists them."""
    from ftnb.storage.record_journal import RecordJournal, Segment, read_segments

    def line(i, status="TERMINATED"):
        return (f"t{i}", (json.dumps({"trial_id": f"t{i}", "status": status}) + "\n").encode())

    def read(listing):
        segments = [Segment.from_json(s) for s in listing]
        return [(r["trial_id"], r["status"])
                for r in read_segments(storage, paths.dir, segments)]

    journal = RecordJournal(storage, paths.dir)
    journal.rewrite([line(i) for i in range(3)], generation=1)
    first = journal.listing()
    journal.committed()
    journal.add([line(3), line(0, "PENDING")], generation=2)
    second = journal.listing()
    journal.committed()
    assert read(first) == [(f"t{i}", "TERMINATED") for i in range(3)]
    assert read(second)[-2:] == [("t3", "TERMINATED"), ("t0", "PENDING")]
    if backend.local:  # one segment, grown by appends; a torn one past the commit is not read
        assert [s["file"] for s in second] == [s["file"] for s in first]
        storage.append_durably(paths.state_segment(second[-1]["file"]),
                               b'{"trial_id": "t9", "sta')
    else:
        with pytest.raises(ValueError, match="cannot append"):
            storage.append_durably(paths.state_segment("x.jsonl"), b"x")
    assert read(second)[-1] == ("t0", "PENDING")
    # A new writer (the next driver) starts over in a new segment: the old ones go once neither
    # the state nor its previous generation lists them.
    successor = RecordJournal(storage, paths.dir, [Segment.from_json(s) for s in second])
    successor.rewrite([line(i) for i in range(4)], generation=3)
    successor.committed()
    assert read(successor.listing()) == [(f"t{i}", "TERMINATED") for i in range(4)]
    successor.add([line(4)], generation=4)
    successor.committed()
    assert {n for n in storage.listdir(paths.dir) if n.endswith(".jsonl")} == {
        s["file"] for s in successor.listing()}


def test_exclusive_lock(backend, storage, paths):
    with storage.exclusive_lock(paths.lease_lock) as serialized:
        assert serialized == backend.local
        if backend.local:
            assert not _other_process_can_lock(paths.lease_lock)
    if backend.local:
        assert _other_process_can_lock(paths.lease_lock)


def test_cheap_version_changes_with_the_file(backend, storage, paths):
    storage.write_atomic(paths.lease, b"one")
    first = storage.cheap_version(paths.lease)
    if not backend.local:
        assert first is None  # it would cost a request: readers poll instead
        return
    storage.write_atomic(paths.lease, b"two")
    assert storage.cheap_version(paths.lease) != first
    storage.remove(paths.lease)
    with pytest.raises(FileNotFoundError):
        storage.cheap_version(paths.lease)


def test_lease_and_control_requests_work_on_it(storage, paths, monkeypatch):
    monkeypatch.setattr(Lease, "SETTLE_S", 0.05)
    lease = Lease.acquire(paths)
    assert read_lease(paths).token == lease.token
    Fence(paths, lease.fence_spec()).check(force=True)
    inbox = ControlInbox(paths, lease.info.epoch, interval_s=0)
    sent = send_request(paths, "stop_trial", "trial_00000", reason="contract")
    taken = inbox.take()
    assert [(r.id, r.action, r.trial_id, r.reason) for r in taken] == [
        (sent.id, "stop_trial", "trial_00000", "contract")]
    assert paths.control_request_ids() == []
    lease.release()
    assert read_lease(paths).released


# -- the JSON Lines reader, on bytes --------------------------------------------------------------
def test_json_lines_reader_skips_only_a_torn_last_line():
    assert read_json_lines(b"") == []
    assert read_json_lines(b'{"a": 1}\n\n{"a": 2}\n\n') == [{"a": 1}, {"a": 2}]
    assert read_json_lines(b'{"a": 1}\n{"a": 2') == [{"a": 1}]
    assert read_json_lines(b'{"a": 1}\n[1, 2]\n') == [{"a": 1}]  # a last line that is no object
    nan = read_json_lines(b'{"a": null, "__ftnb_nonfinite__": {"a": "NaN"}}\n')
    assert math.isnan(nan[0]["a"])
    with pytest.raises(CorruptFileError, match=r"runs/x/result\.json is damaged: line 1 of 2"):
        read_json_lines(b'not json\n{"a": 2}\n', source="runs/x/result.json")


# -- end to end: a trial that dies in the middle of its result line --------------------------------
TORN_AT = 3  # the first attempt dies while writing the line of this step + 1


def dies_mid_line(config: dict) -> None:
    """Reports 6 steps with a checkpoint each; the first attempt, after TORN_AT of them, leaves
    half a line in result.json and is SIGKILLed, as if it died inside that write."""
    ctx = ftnb.get_context()
    for step in range(restored_step() + 1, 7):
        if ctx.attempt == 1 and step == TORN_AT + 1:
            with open(os.path.join(ctx.trial_dir, "result.json"), "ab") as f:
                f.write(b'{"training_iteration": %d, "sco' % step)
            os.kill(os.getpid(), signal.SIGKILL)
        report_step({"score": step}, step, checkpoint=True)


def test_a_trial_that_died_mid_line_resumes_without_losing_a_row(tmp_path):
    grid = ftnb.run(dies_mid_line, name="torn", storage_path=str(tmp_path),
                    run_config=ftnb.RunConfig(
                        verbose=0, failure_config=ftnb.FailureConfig(max_failures=1)))
    assert grid.status == "FINISHED" and grid.num_errors == 0
    trial = ExperimentPaths.at(str(tmp_path / "torn")).trial(grid[0].path.rsplit(os.sep, 1)[-1])
    data = open(trial.results, "rb").read()
    # Every line whole (the fragment is gone, not glued to the next attempt's first line), and
    # every step once.
    assert all(json.loads(line) for line in data.splitlines())
    assert [r["training_iteration"] for r in trial.read_results()] == [1, 2, 3, 4, 5, 6]
    assert [r["attempt"] for r in trial.read_results()] == [1] * TORN_AT + [2] * (6 - TORN_AT)

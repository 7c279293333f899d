"""The index of a storage folder (ftnb/storage/experiment_index.py) and the listings that read
it (ftnb/ui/listing.py: the JupyterLab panel's list, ``ftnb ls``).

Real experiments: an ended one run here (the in-process executor), the same copied in without
an entry (as an older ftnb leaves it), a driver script that keeps running, one SIGKILLed while
its trials ran (its entry still says RUNNING), and one stopped cleanly (INTERRUPTED as stored);
a listing through the index must say exactly what a full read of each says. Drivers that
write their entries concurrently, on a local disk and on the S3 server, lose none; a deleted
experiment leaves no ghost.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from dataclasses import replace

import pytest

import ftnb
from ftnb.cli import main
from ftnb.core.index_upkeep import gone_summaries
from ftnb.lab.listing import EndedExperiments, experiment_entry, list_experiments
from ftnb.storage import ExperimentPaths, Storage
from ftnb.storage.experiment_index import (
    INDEX_DIR,
    SNAPSHOT_FILE,
    IndexEntry,
    IndexEntryWriter,
    compact_index,
    entry_file_name,
    read_index,
)
from ftnb.ui import read_model
from procs import run_script, wait_for

pytestmark = pytest.mark.timeout(180)

DRIVER = """
import os, sys, time
import ftnb

def gated(config):
    while not os.path.exists(config["gate"]):
        ftnb.report({"loss": 1.0})
        time.sleep(0.05)

root, name, gate = sys.argv[1:4]
ftnb.run(gated, name=name, storage_path=root,
         param_space={"x": ftnb.grid_search([1, 2]), "gate": gate},
         run_config=ftnb.RunConfig(verbose=0, executor="inprocess"))
"""


def flaky(config):
    """Three reports; x == 2 fails at the second on its first attempt."""
    for step in range(3):
        if config["x"] == 2 and step == 1 and ftnb.get_context().attempt == 1:
            raise ValueError("injected")
        ftnb.report({"loss": 1.0 / (step + 1)})


def _run_ended(root, name, **config):
    ftnb.run(flaky, name=name, storage_path=str(root),
             param_space={"x": ftnb.grid_search([1, 2])},
             run_config=ftnb.RunConfig(verbose=0, executor="inprocess", **config))


def _entry(root, name):
    path = root / INDEX_DIR / entry_file_name(name)
    return json.loads(path.read_text()) if path.exists() else None


def _running(root, name):
    entry = _entry(root, name)
    return entry is not None and entry["status"] == "RUNNING" and entry["counts"]["RUNNING"] == 2


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A storage folder with every kind of experiment a listing meets; ``live`` keeps running
    until the module ends."""
    work = tmp_path_factory.mktemp("index")
    root = work / "results"
    _run_ended(root, "ended")  # ERRORED: one trial failed
    _run_ended(root, "finished", failure_config=ftnb.FailureConfig(max_failures=1))
    shutil.copytree(root / "ended", root / "old")  # no entry: as an older ftnb left it

    live = run_script(work, DRIVER, str(root), "live", str(work / "gate-live"), name="live.py")
    killed = run_script(work, DRIVER, str(root), "killed", str(work / "gate-killed"),
                        name="killed.py")
    stopped = run_script(work, DRIVER, str(root), "stopped", str(work / "gate-stopped"),
                         name="stopped.py")
    try:
        for name in ("live", "killed", "stopped"):
            wait_for(lambda n=name: _running(root, n), timeout=60,
                     what=f"{name}'s entry to say RUNNING with its two trials")
        killed.send_signal(signal.SIGKILL)
        killed.communicate(timeout=30)
        ftnb.attach(str(root / "stopped")).stop(wait=True, timeout=60)
        stopped.communicate(timeout=60)
        yield root
    finally:
        (work / "gate-live").touch()
        for proc in (live, killed, stopped):
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


def _same(listed, full):
    """``listed`` (through the index) says what ``full`` (a full read) says."""
    assert (listed.summary is None) == (full.summary is None)
    if full.summary is not None:
        running = full.summary.status == "RUNNING"
        # A running driver's entry is rewritten on changes and every few seconds, its state
        # every second: its last activity may lag by that much, nothing else.
        ignore = {"updated": 0.0} if running else {}
        assert replace(listed.summary, **ignore) == replace(full.summary, **ignore)
    assert listed.resume_line == full.resume_line
    assert listed.takeover == full.takeover
    assert (listed.driver is None) == (full.driver is None)
    if full.driver is not None:
        assert listed.driver.alive == full.driver.alive
        # (The same lease; its heartbeat moves on between the two reads.)
        leases = [d.lease and replace(d.lease, heartbeat=0) for d in (listed.driver, full.driver)]
        assert leases[0] == leases[1]


def test_listing_through_the_index_says_what_full_reads_say(root):
    storage = Storage(str(root))
    memory = read_model.ListingMemory()
    for lines in (False, True, True):
        listed = read_model.list_folder(storage, storage.root, lines=lines, memory=memory)
        by_name = {e.paths.name: e for e in listed}
        assert sorted(by_name) == ["ended", "finished", "killed", "live", "old", "stopped"]
        for name, entry in by_name.items():
            _same(entry, read_model.read_experiment(entry.paths, lines=lines))
        status = {n: e.summary.status for n, e in by_name.items()}
        assert status == {"ended": "ERRORED", "finished": "FINISHED", "killed": "INTERRUPTED",
                          "live": "RUNNING", "old": "ERRORED", "stopped": "INTERRUPTED"}
        assert by_name["killed"].summary.counts.get("INTERRUPTED") == 2  # as the read model reads
        indexed = {n for n, e in by_name.items() if e.indexed}
        # The ended and the live ones from their entries; the old one has none. The killed
        # one is read in full once, then remembered while its entry and lease stay the same.
        assert {"ended", "finished", "live"} <= indexed and "old" not in indexed
    assert {"killed", "stopped"} <= indexed
    assert by_name["killed"].resume_line and by_name["stopped"].resume_line


def test_the_panels_list_and_ftnb_ls_are_the_full_reads(root, capsys):
    storage = Storage(str(root))
    memory = EndedExperiments()
    for _ in range(2):  # the second from what the first remembered
        entries = {e["name"]: e for e in list_experiments(storage, storage.root, ended=memory)}
        for name, entry in entries.items():
            full = experiment_entry(ExperimentPaths.of(storage, name))
            if name == "live":
                entry, full = dict(entry, last_activity=0), dict(full, last_activity=0)
            assert entry == full
    assert main(["ls", str(root), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, row in rows.items():
        summary = read_model.read_experiment(ExperimentPaths.of(storage, name)).summary
        assert (row["status"], row["counts"], row["failures"]) == (
            summary.status, summary.counts, summary.failures)
    assert rows["killed"]["status"] == "INTERRUPTED" and rows["live"]["status"] == "RUNNING"


def test_an_entry_that_lies_is_not_believed(root, tmp_path):
    """An entry written by another driver than the lease's (a takeover it did not see), or one
    left by a deleted experiment, says nothing."""
    copy = tmp_path / "results"
    shutil.copytree(root / "ended", copy / "ended")
    shutil.copytree(root / "live", copy / "live")  # owner.json: the live driver's
    (copy / INDEX_DIR).mkdir()
    for name in ("ended", "live", "deleted"):
        source = _entry(root, name if name != "deleted" else "ended")
        data = dict(source, name=name)
        if name == "live":
            data["token"] = "another driver's token"
        if name == "ended":
            data["status"] = "FINISHED"  # its folder is gone: it never shows
        (copy / INDEX_DIR / entry_file_name(name)).write_text(json.dumps(data))
    shutil.rmtree(copy / "ended")
    storage = Storage(str(copy))
    listed = {e.paths.name: e for e in read_model.list_folder(storage, storage.root)}
    assert sorted(listed) == ["live"]
    assert not listed["live"].indexed  # read in full: the entry's token is not the lease's
    _same(listed["live"], read_model.read_experiment(listed["live"].paths))


def test_a_deleted_experiment_disappears(root, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("live", "stopped", "killed"))
    storage = Storage(str(copy))
    memory = read_model.ListingMemory()
    names = [e.paths.name for e in read_model.list_folder(storage, storage.root, memory=memory)]
    assert names == ["ended", "finished", "old"]
    shutil.rmtree(copy / "finished")
    shutil.rmtree(copy / "old")
    names = [e.paths.name for e in read_model.list_folder(storage, storage.root, memory=memory)]
    assert names == ["ended"]
    assert (copy / INDEX_DIR / entry_file_name("finished")).exists()  # readers never write
    # The next driver to end leaves it out of the snapshot.
    _run_ended(copy, "next")
    snapshot = json.loads((copy / INDEX_DIR / SNAPSHOT_FILE).read_text())
    assert sorted(snapshot["entries"]) == ["ended", "next"]


def test_a_dead_drivers_experiment_is_read_by_the_next_driver_to_end(root, tmp_path):
    """The killed driver's entry still says RUNNING; the driver that ended after it (stopped)
    read the experiment as readers do and left that in the snapshot, under the lease it found
    dead. A listing takes it from there (no read of its state); once the lease is another,
    it reads the experiment again."""
    snapshot = json.loads((root / INDEX_DIR / SNAPSHOT_FILE).read_text())
    assert "killed" in snapshot["gone"] and "live" not in snapshot["gone"]
    storage = Storage(str(root))
    for lines in (False, True):
        listed = {e.paths.name: e for e in read_model.list_folder(storage, storage.root,
                                                                  lines=lines)}
        assert listed["killed"].indexed
        _same(listed["killed"], read_model.read_experiment(listed["killed"].paths, lines=lines))

    copy = tmp_path / "results"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("live", "stopped"))
    storage = Storage(str(copy))
    compact_index(storage, storage.root, derive=gone_summaries)
    listed = {e.paths.name: e for e in read_model.list_folder(storage, storage.root)}
    assert listed["killed"].indexed
    lease = json.loads((copy / "killed" / "owner.json").read_text())
    (copy / "killed" / "owner.json").write_text(json.dumps(dict(lease, heartbeat=1.0)))
    listed = {e.paths.name: e for e in read_model.list_folder(storage, storage.root)}
    assert not listed["killed"].indexed and listed["killed"].summary.status == "INTERRUPTED"
    _same(listed["killed"], read_model.read_experiment(listed["killed"].paths))


# -- concurrent drivers --------------------------------------------------------------------------
class _State:
    """What IndexEntryWriter reads of a state (the controller's ExperimentState)."""

    def __init__(self, name, n):
        self.name, self.status, self.created, self.updated = name, "RUNNING", 1.0, 1.0
        self.generation = 0
        self.trials = []
        self.n = n

    def counts(self):
        return {"TERMINATED": self.n}


def _drive_many(storage, folder, drivers=12, saves=15):
    """``drivers`` threads, each the driver of its own experiment under ``folder``, saving
    ``saves`` times (each save changes its counts) and ending, all at once."""
    start = threading.Barrier(drivers)
    errors = []

    def drive(i):
        try:
            name = f"exp [{i}]*?"  # (quoted in the index: never a glob)
            paths = ExperimentPaths.of(storage, name, folder)
            storage.makedirs(paths.dir)
            storage.write_atomic(paths.state, b"{}")  # (its folder exists)
            writer = IndexEntryWriter(paths)
            state = _State(name, 0)
            start.wait()
            for n in range(1, saves + 1):
                state.n = n
                state.generation += 1
                writer.update(state, changed=True, final=n == saves)
                if n == saves - 1:
                    state.status = "FINISHED"
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(drivers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    index = read_index(storage, folder)
    assert sorted(index.entries) == sorted(f"exp [{i}]*?" for i in range(drivers))
    for entry in index.entries.values():
        assert (entry.status, entry.counts, entry.generation) == (
            "FINISHED", {"TERMINATED": saves}, saves)
    return index


def test_concurrent_drivers_lose_no_entry_on_a_local_disk(tmp_path):
    storage = Storage(str(tmp_path / "results"))
    _drive_many(storage, storage.root)
    # The snapshot holds what the drivers that ended last saw; the rest is read one by one.
    # Either way every entry is there (checked above); a driver that ends later folds in all
    # (False: the snapshot had them all already).
    compact_index(storage, storage.root)
    assert read_index(storage, storage.root).read == 0


@pytest.mark.s3
def test_concurrent_drivers_lose_no_entry_on_s3(s3_storage):
    url, fs = s3_storage
    storage = Storage(url, fs)
    _drive_many(storage, storage.root)
    # The snapshot holds what the drivers that ended last saw; the rest is read one by one.
    # Either way every entry is there (checked above); a driver that ends later folds in all
    # (False: the snapshot had them all already).
    compact_index(storage, storage.root)
    assert read_index(storage, storage.root).read == 0


@pytest.mark.s3
def test_an_s3_folder_lists_from_its_index(root, s3_storage, monkeypatch):
    """The experiments copied to S3 with their entries and a snapshot (as drivers there leave
    them): the ended ones come from the snapshot, without a read of their state; the one
    without an entry and the killed one are read in full; all say what full reads say."""
    url, fs = s3_storage
    for name in ("ended", "finished", "old", "killed"):
        fs.put(str(root / name), f"{url}/{name}", recursive=True)
    for name in ("ended", "finished", "killed"):
        fs.pipe(f"{url}/{INDEX_DIR}/{entry_file_name(name)}",
                (root / INDEX_DIR / entry_file_name(name)).read_bytes())
    storage = Storage(url, fs)
    assert compact_index(storage, storage.root)

    reads = []
    batch_read, read = fs._cat_file, fs.cat_file

    async def counted_batch_read(path, *args, **kwargs):
        reads.append(path)
        return await batch_read(path, *args, **kwargs)

    def counted_read(path, *args, **kwargs):
        reads.append(path)
        return read(path, *args, **kwargs)

    memory = read_model.ListingMemory()
    with monkeypatch.context() as patched:
        patched.setattr(fs, "_cat_file", counted_batch_read)
        patched.setattr(fs, "cat_file", counted_read)
        listed = {e.paths.name: e for e in read_model.list_folder(storage, storage.root,
                                                                  lines=True, memory=memory)}
        assert sorted(listed) == ["ended", "finished", "killed", "old"]
        state_reads = {p.split("/")[-2] for p in reads if p.endswith("experiment_state.json")}
        assert state_reads == {"old", "killed"}
        assert listed["ended"].indexed and listed["finished"].indexed
        reads.clear()
        listed = {e.paths.name: e for e in read_model.list_folder(storage, storage.root,
                                                                  lines=True, memory=memory)}
        # Again: the old one is read in full (it has no entry), the killed one only its lease.
        state_reads = {p.split("/")[-2] for p in reads if p.endswith("experiment_state.json")}
        assert state_reads == {"old"}
    for entry in listed.values():
        _same(entry, read_model.read_experiment(entry.paths, lines=True))
    assert listed["killed"].summary.status == "INTERRUPTED"


@pytest.mark.s3
def test_a_driver_on_s3_keeps_its_entry(s3_storage):
    """A real driver on S3 writes its entry from its thread while it runs and the final one
    at its end, then the snapshot: a listing reads one object for it, and it says what a full
    read says."""
    url, fs = s3_storage
    ftnb.run(flaky, name="on_s3", storage_path=url, param_space={"x": ftnb.grid_search([1, 2])},
             run_config=ftnb.RunConfig(verbose=0, executor="inprocess", storage_filesystem=fs,
                                       failure_config=ftnb.FailureConfig(max_failures=1)))
    storage = Storage(url, fs)
    index = read_index(storage, storage.root)
    assert index.read == 0 and index.entries["on_s3"].status == "FINISHED"
    assert index.entries["on_s3"].failures == 1
    [listed] = read_model.list_folder(storage, storage.root)
    assert listed.indexed
    _same(listed, read_model.read_experiment(listed.paths))


def test_a_bad_entry_is_no_entry(tmp_path):
    assert IndexEntry.from_json({"format": "ftnb.index-entry", "format_version": 1}, "x") is None
    assert IndexEntry.from_json([], "x") is None
    good = IndexEntry("x", "FINISHED", 1, {"TERMINATED": 1}, 0, 0, 1.0, 2.0).to_json()
    assert IndexEntry.from_json(good, "x") is not None
    assert IndexEntry.from_json(good, "y") is None  # another experiment's
    assert IndexEntry.from_json(dict(good, format_version=99), "x") is None  # a newer ftnb's
    assert IndexEntry.from_json(dict(good, counts={"TERMINATED": "1"}), "x") is None


def test_the_writer_writes_on_changes_and_when_due(tmp_path, monkeypatch):
    storage = Storage(str(tmp_path / "results"))
    paths = ExperimentPaths.of(storage, "exp")
    writer = IndexEntryWriter(paths)
    state = _State("exp", 1)
    entry = tmp_path / "results" / INDEX_DIR / "exp.json"
    writer.update(state, changed=False)  # the first: written
    state.updated = 5.0
    writer.update(state, changed=True)  # same summary, not due: not written
    assert json.loads(entry.read_text())["updated"] == 1.0
    state.n = 2
    writer.update(state, changed=True)
    assert json.loads(entry.read_text())["counts"] == {"TERMINATED": 2}
    clock = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    state.updated = 9.0
    writer.update(state, changed=False)
    assert json.loads(entry.read_text())["updated"] == 5.0
    clock[0] += 11
    writer.update(state, changed=False)  # due: its last activity
    assert json.loads(entry.read_text())["updated"] == 9.0

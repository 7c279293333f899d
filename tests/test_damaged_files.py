"""Damaged and deleted files of an experiment whose driver was SIGKILLed: a resume costs no more
than the damage (the damaged end of a result.json cut off, the previous state generation read, a
state rebuilt around a lost journal segment, an older checkpoint resumed from), says so and
records it, and never starts a second experiment in the folder. Also the debris a killed driver
leaves (a temporary file of owner.json) and the resume line's counts."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import ftnb
from ftnb.core.records import ExperimentState, TrialStatus
from ftnb.storage import ExperimentPaths
from ftnb.storage.file_names import temporary_file_path
from ftnb.storage.lease import process_name
from killed_driver import kill_when, run_to_end
from procs import processes_named, run_script, wait_for
from scripted import result_rows, scripted

N = 10

DRIVER = """
import sys, ftnb
from scripted import scripted

ftnb.run(
    scripted, name="dmg", storage_path=sys.argv[1],
    param_space={"n": %d, "sleep": 0.12, "ckpt_every": 1, "i": ftnb.grid_search([0, 1, 2, 3])},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
    run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=0)),
)
print("DONE")
""" % N


def _trial_dirs(exp):
    return sorted(d for d in exp.iterdir() if d.is_dir() and (d / "params.json").exists())


def _kill_midway(tmp_path, finished=0):
    """Run the driver, SIGKILL it once a trial has reported 4 to 7 rows (and ``finished``
    trials have ended), wait for its trials to die, and return (the experiment folder, that
    trial's folder)."""
    exp = tmp_path / "dmg"

    def midway():
        if not exp.exists():
            return None
        counts = {d: len(result_rows(str(d))) for d in _trial_dirs(exp)}
        if sum(n == N for n in counts.values()) < finished:
            return None
        for d, n in counts.items():
            if 4 <= n <= 7:
                return d
        return None

    trial = kill_when(tmp_path, DRIVER, [str(tmp_path)], midway, "a trial halfway")
    token = json.loads((exp / "owner.json").read_text())["token"]
    wait_for(lambda: not processes_named(process_name(token)), timeout=30,
             what="the killed driver's trials to die")
    return exp, trial


def _assert_every_iteration_once(exp):
    dirs = _trial_dirs(exp)
    assert len(dirs) == 4
    for d in dirs:
        steps = [r["training_iteration"] for r in result_rows(str(d))]
        assert steps == list(range(1, N + 1)), (d.name, steps)
    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert [t.status for t in state.trials] == [TrialStatus.TERMINATED.value] * 4
    # And the experiment reads as a whole: every trial's metrics as a DataFrame.
    grid = ftnb.Tuner.restore(str(exp), scripted).get_results()
    assert [len(result.metrics_dataframe) for result in grid] == [N] * 4
    return state


def _recoveries(state, what):
    return [r for r in state.recoveries if r["what"] == what]


# -- result.json --------------------------------------------------------------------------------
@pytest.mark.parametrize("tail", [
    b"this is not a result row\n",
    b"\x00" * 64 + b"\n",
    b"\x00" * 4096,
    b'{"training_iteration": 99, "torn\n%%% garbage %%%\n',
], ids=["garbage-line", "nul-line", "nul-bytes", "two-bad-lines"])
def test_a_bad_end_of_result_json_is_cut_off_said_and_recorded(tmp_path, tail):
    exp, trial = _kill_midway(tmp_path)
    rows_before = result_rows(str(trial))
    with open(trial / "result.json", "ab") as f:
        f.write(tail)
    out = run_to_end(tmp_path, DRIVER, [str(tmp_path)])
    assert "DONE" in out
    assert f"trial {trial.name}: cut {len(tail)} bytes that are not result rows" in out, out
    state = _assert_every_iteration_once(exp)
    cut = _recoveries(state, "results_tail_cut")
    assert [r["trial_id"] for r in cut] == [trial.name]
    assert f"its {len(rows_before)} rows are kept" in cut[0]["message"]


def test_damage_inside_result_json_is_refused_not_guessed(tmp_path):
    """A bad line followed by rows is not a torn or crashed end: the resume refuses, naming
    the file and the line, and changes nothing."""
    exp, trial = _kill_midway(tmp_path)
    data = (trial / "result.json").read_bytes().split(b"\n")
    data[1] = b"%%% damaged %%%"
    (trial / "result.json").write_bytes(b"\n".join(data))
    proc = run_script(tmp_path, DRIVER, str(tmp_path))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "is damaged: line 2" in out, out
    assert b"%%% damaged %%%" in (trial / "result.json").read_bytes()


# -- the state ----------------------------------------------------------------------------------
def test_a_deleted_latest_state_falls_back_to_the_previous_generation_and_says_so(tmp_path):
    exp, _ = _kill_midway(tmp_path)
    (exp / "experiment_state.json").unlink()
    out = run_to_end(tmp_path, DRIVER, [str(tmp_path)])
    assert "read its previous generation (experiment_state.prev.json) instead" in out, out
    state = _assert_every_iteration_once(exp)
    assert len(_recoveries(state, "previous_state")) == 1


def test_both_state_generations_deleted_are_refused_and_nothing_starts_beside(tmp_path):
    exp, _ = _kill_midway(tmp_path)
    (exp / "experiment_state.json").unlink()
    (exp / "experiment_state.prev.json").unlink()
    before = sorted(os.listdir(exp))
    proc = run_script(tmp_path, DRIVER, str(tmp_path))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "both generations of its experiment state" in out, out
    assert "will not start a second experiment" in out
    assert "delete that folder" not in out
    assert "experiment_state.json" not in os.listdir(exp)
    assert sorted(n for n in os.listdir(exp) if not n.startswith(".")) == \
        sorted(n for n in before if not n.startswith("."))
    # Tuner(...).fit() with that name is refused the same way.
    with pytest.raises(ftnb.RestoreError, match="both generations"):
        ftnb.Tuner(scripted, param_space={"n": 1},
                   run_config=ftnb.RunConfig(name="dmg", storage_path=str(tmp_path),
                                             verbose=0)).fit()


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_lost_journal_segment_is_rebuilt_from_the_trials_files(tmp_path, damage):
    # Two trials ended, two run: the state and its previous generation both list the segment
    # that holds the ended trials' records (at two lengths).
    exp, _ = _kill_midway(tmp_path, finished=2)
    listed = json.loads((exp / "experiment_state.json").read_text())["journal"]
    previous = json.loads((exp / "experiment_state.prev.json").read_text()).get("journal")
    shared = {s["file"] for s in listed} & {s["file"] for s in previous or []}
    assert shared, (listed, previous)
    segment = exp / sorted(shared)[0]
    if damage == "deleted":
        segment.unlink()
    else:
        segment.write_bytes(b"#" * segment.stat().st_size)
    paths = ExperimentPaths.at(str(exp))
    with pytest.raises(Exception):
        ExperimentState.load(paths)  # neither generation reads: both list that segment
    out = run_to_end(tmp_path, DRIVER, [str(tmp_path)])
    assert "rebuilt the experiment state from its other records and the trials' own files" \
        in out, out
    state = _assert_every_iteration_once(exp)
    assert len(_recoveries(state, "journal_rebuilt")) == 1


# -- checkpoints --------------------------------------------------------------------------------
def _latest_checkpoint(trial):
    rows = result_rows(str(trial))
    named = [r for r in rows if r.get("checkpoint_dir_name")]
    return trial / named[-1]["checkpoint_dir_name"], named[-1]["training_iteration"]


def _damage(folder, how):
    state = folder / "state.json"
    size = state.stat().st_size
    if how == "truncated":
        with open(state, "r+b") as f:
            f.truncate(size // 2)
    elif how == "corrupted":
        state.write_bytes(b"#" * size)  # the same size: only its CRC-32 tells
    elif how == "deleted-file":
        state.unlink()
    elif how == "marker-deleted":
        (folder / ".ftnb_checkpoint.json").unlink()


@pytest.mark.parametrize("how", ["truncated", "corrupted", "deleted-file", "marker-deleted"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, how):
    exp, trial = _kill_midway(tmp_path)
    folder, iteration = _latest_checkpoint(trial)
    _damage(folder, how)
    out = run_to_end(tmp_path, DRIVER, [str(tmp_path)])
    older = f"checkpoint_{iteration - 2:06d}"  # (numbered from 0, one per iteration)
    assert (f"trial {trial.name} resumes from its checkpoint {older} "
            f"(iteration {iteration - 1}), the newest intact one: {folder.name}") in out, out
    state = _assert_every_iteration_once(exp)
    entries = _recoveries(state, "checkpoint_passed_over")
    assert [e["trial_id"] for e in entries] == [trial.name]
    # The resumed attempt started from the older checkpoint: its first row says so.
    rows = result_rows(str(trial))
    first = next(r for r in rows if r["attempt"] == 2)
    assert first["training_iteration"] == iteration and first["resumed_from"] == iteration - 1


def test_a_trial_with_no_intact_checkpoint_starts_over_and_says_why(tmp_path):
    exp, trial = _kill_midway(tmp_path)
    for name in os.listdir(trial):
        if name.startswith("checkpoint_"):
            _damage(trial / name, "corrupted")
    out = run_to_end(tmp_path, DRIVER, [str(tmp_path)])
    assert f"trial {trial.name} starts over from scratch, as none of its checkpoints is intact" \
        in out, out
    state = _assert_every_iteration_once(exp)
    assert [e["trial_id"] for e in _recoveries(state, "started_over")] == [trial.name]
    rows = result_rows(str(trial))
    assert all(r["resumed_from"] == 0 for r in rows)


def test_a_deleted_trial_folder_starts_over_and_says_why(tmp_path):
    exp, trial = _kill_midway(tmp_path)
    shutil.rmtree(trial)
    out = run_to_end(tmp_path, DRIVER.replace("verbose=0", "verbose=1"), [str(tmp_path)])
    assert (f"trial {trial.name} starts over from scratch: its folder {trial} is missing "
            "(deleted?), and its results and checkpoints with it.") in out, out
    assert f"trial {trial.name} (attempt 2) from scratch (its folder was missing)" in out, out
    assert "none of its checkpoints is intact" not in out
    # The resumed run reads as the same experiment going on, not a new one, and says so once.
    assert out.count("ftnb: resuming experiment") == 1, out
    assert f"ftnb: resuming experiment 'dmg' at {exp} (" in out and "experiment dmg with" not in out
    state = _assert_every_iteration_once(exp)
    assert [e["trial_id"] for e in _recoveries(state, "started_over")] == [trial.name]


def test_the_marker_records_every_files_size_and_crc(tmp_path):
    from ftnb.storage import Storage
    from ftnb.storage.checkpoint_files import DIGEST_FILE_LIMIT, checkpoint_damage

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "small.json").write_text('{"step": 3}')
    (src / "sub" / "big.bin").write_bytes(b"x" * (DIGEST_FILE_LIMIT + 1))
    storage = Storage(str(tmp_path))
    dest = str(tmp_path / "checkpoint_000000")
    storage.persist_directory(str(src), dest, {"training_iteration": 1})
    marker = json.loads((tmp_path / "checkpoint_000000" / ".ftnb_checkpoint.json").read_text())
    assert marker["files"] == {"small.json": 11, "sub/big.bin": DIGEST_FILE_LIMIT + 1}
    # (the big file summed while it was copied)
    assert set(marker["crc32"]) == {"small.json", "sub/big.bin"}
    assert checkpoint_damage(storage, dest) is None
    with open(os.path.join(dest, "sub", "big.bin"), "r+b") as f:  # damaged at the same size
        f.seek(DIGEST_FILE_LIMIT // 2)
        f.write(b"y")
    assert "sub/big.bin does not hold what was written" in checkpoint_damage(storage, dest)
    with open(os.path.join(dest, "sub", "big.bin"), "r+b") as f:
        f.truncate(10)
    assert "sub/big.bin has 10 bytes" in checkpoint_damage(storage, dest)
    # A marker of an older ftnb, with small files' CRC-32 alone, is checked for what it has.
    marker["crc32"] = {"small.json": marker["crc32"]["small.json"]}
    marker["files"]["sub/big.bin"] = 10
    (tmp_path / "checkpoint_000000" / ".ftnb_checkpoint.json").write_text(json.dumps(marker))
    assert checkpoint_damage(storage, dest) is None


# -- debris and counts --------------------------------------------------------------------------
def test_temporary_files_of_a_killed_driver_are_swept_by_the_next_run(tmp_path):
    from ftnb.storage.experiment_index import INDEX_DIR, entry_file_name

    exp, _ = _kill_midway(tmp_path)
    # What a driver killed between writing a file's temporary copy and renaming it leaves: the
    # very names its writers make, for owner.json and for its entry in the storage's index.
    leftovers = [temporary_file_path(str(exp / "owner.json")),
                 temporary_file_path(str(tmp_path / INDEX_DIR / entry_file_name("dmg")))]
    for leftover in leftovers:
        with open(leftover, "w") as f:
            f.write('{"token": "half')
    assert os.path.basename(leftovers[0]).startswith(".owner.json.")
    run_to_end(tmp_path, DRIVER, [str(tmp_path)])
    assert [p for p in leftovers if os.path.exists(p)] == []
    assert not [n for n in os.listdir(exp) if n.endswith(".tmp")]


def test_the_resume_line_counts_trials_finished_by_their_own_records(tmp_path):
    """A driver killed after its trials ended but before its state said so: their own
    trial.json records are newer, and the resume line counts them as finished."""
    from ftnb.tuner import start_or_resume

    ftnb.run(scripted, name="counts", storage_path=str(tmp_path),
             param_space={"n": 2, "i": ftnb.grid_search([0, 1, 2, 3])},
             run_config=ftnb.RunConfig(verbose=0))
    paths = ExperimentPaths.at(str(tmp_path / "counts"))
    state = ExperimentState.load(paths)
    for trial in state.trials[:2]:  # the state as saved before these two ended
        trial.status = TrialStatus.RUNNING.value
        trial.seq -= 1
    state.status = "RUNNING"
    state.save(paths, final=True)
    _, line = start_or_resume(scripted, name="counts", param_space=None,
                              storage_path=str(tmp_path), tune_config=None, run_config=None,
                              resources_per_trial=None, caller="ftnb.run")
    assert "(4 of 4 trials finished, 0 errored)" in line, line


KEEP_TWO = DRIVER.replace(
    "verbose=0,", "verbose=0, checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2),")


def test_a_retention_cut_short_by_the_drivers_death_is_finished_by_the_next_run(tmp_path):
    """The driver deletes the checkpoints num_to_keep no longer keeps; SIGKILLed in the middle
    of one, it leaves a folder whose marker went first: nothing lists it, so no retention would
    ever delete it (test_examples saw one of three folders so left under load). The next run
    deletes it, and keeps two checkpoints a trial."""
    assert KEEP_TWO != DRIVER
    exp = tmp_path / "dmg"
    kill_when(tmp_path, KEEP_TWO, [str(tmp_path)],
              lambda: exp.exists() and any(len(result_rows(str(d))) >= 4
                                           for d in _trial_dirs(exp)) and exp,
              "a trial's fourth report")
    token = json.loads((exp / "owner.json").read_text())["token"]
    wait_for(lambda: not processes_named(process_name(token)), timeout=30,
             what="the killed driver's trials to die")
    trial = next(d for d in _trial_dirs(exp) if len(result_rows(str(d))) >= 4)
    kept = sorted(n for n in os.listdir(trial) if n.startswith("checkpoint_"))
    assert "checkpoint_000000" not in kept  # retention deleted it while the driver ran
    # What a recursive delete cut short leaves: the files, not the marker.
    half = trial / "checkpoint_000000"
    shutil.copytree(trial / kept[-1], half)
    (half / ".ftnb_checkpoint.json").unlink()
    run_to_end(tmp_path, KEEP_TWO, [str(tmp_path)])
    for d in _trial_dirs(exp):
        names = sorted(n for n in os.listdir(d) if n.startswith("checkpoint_"))
        assert names == [f"checkpoint_{N - 2:06d}", f"checkpoint_{N - 1:06d}"], (d.name, names)

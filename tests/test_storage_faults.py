"""Storage faults are not crashes: a full disk (bytes and inodes), a filesystem turned read-only
and a trial folder made unwritable, each mid-run, under a real driver process.

Each test asserts the promise, not merely that nothing crashed: every report acknowledged to the
trainable (``report()`` returned) is a whole row in ``result.json`` and its checkpoint is whole
and kept; the driver ends INTERRUPTED with a message naming the path, the error and the fix and
the line that resumes it, and no traceback of its own; re-running the same script once the
storage is fixed finishes with every iteration exactly once, the acknowledged checkpoints not
redone, and no failure counted (``max_failures=0``).

They need root (mounts, a loop device, dropping capabilities): the CI machine gives it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from procs import run_script, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount filesystems")

N = 10

# Fills the filesystem holding ``where`` (both scripts' trainables call it).
FILL = r'''
def fill(where, how):
    """Fill the filesystem holding ``where`` to its last byte (or inode)."""
    if how == "bytes":
        fd = os.open(os.path.join(where, "filler"), os.O_WRONLY | os.O_CREAT, 0o644)
        for chunk in (1 << 16, 4096, 1):
            try:
                while True:
                    os.write(fd, b"f" * chunk)
            except OSError:
                pass
        os.close(fd)
    else:
        os.makedirs(os.path.join(where, "fill"), exist_ok=True)
        i = 0
        try:
            while True:
                open(os.path.join(where, "fill", str(i)), "w").close()
                i += 1
        except OSError:
            pass
'''

DRIVER = r'''
import json, os, sys, time
import ftnb

store, acks, mode = sys.argv[1], sys.argv[2], sys.argv[3]
PAD = "x" * 6000  # a row longer than a page: a row that meets a full tmpfs is cut at the page


%(fill)s

def train(config):
    ctx = ftnb.get_context()
    start = 0
    ckpt = ftnb.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["step"]
    for step in range(start + 1, %(n)d + 1):
        time.sleep(0.1)
        marker = os.path.join(acks, "faulted")
        if config["faulty"] and step == 4 and not os.path.exists(marker):
            open(marker, "w").close()
            if mode in ("bytes", "inodes"):
                fill(store, mode)
            else:  # the test makes the fault, then lets the trial go on
                open(os.path.join(acks, "ready"), "w").close()
                while not os.path.exists(os.path.join(acks, "go")):
                    time.sleep(0.02)
        with_ckpt = step %% 2 == 0 or mode == "inodes"
        metrics = {"step": step, "pad": PAD}
        if with_ckpt:
            import tempfile
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"step": step, "blob": "b" * 3000}, f)
                ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))
        else:
            ftnb.report(metrics)
        with open(os.path.join(acks, ctx.trial_id + ".acks"), "a") as f:
            f.write(f"{step} {ctx.attempt} {int(with_ckpt)}\n")


ftnb.run(
    train, name="exp", storage_path=store,
    param_space={"faulty": ftnb.grid_search([True, False])},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
    run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=0)),
)
print("ENDED")
''' % {"n": N, "fill": FILL}


def _mount_tmpfs(where, options: str) -> None:
    os.makedirs(where, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def _umount(where) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _state(exp) -> dict:
    for name in ("experiment_state.json", "experiment_state.prev.json"):
        try:
            return json.loads((exp / name).read_text())
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no readable state in {exp}")


def _trial_dirs(exp) -> list:
    return sorted(p.parent for p in exp.glob("*/params.json"))


def _rows(trial_dir) -> list[dict]:
    data = (trial_dir / "result.json").read_bytes()
    assert data == b"" or data.endswith(b"\n"), f"result.json ends in a torn row: {data[-80:]!r}"
    return [json.loads(line) for line in data.decode().splitlines()]


def _acks(acks) -> dict[str, list[tuple[int, int, int]]]:
    out = {}
    for path in acks.glob("*.acks"):
        out[path.stem] = [tuple(map(int, line.split())) for line in path.read_text().split("\n")
                          if line]
    return out


def _check_acknowledged(exp, acks, redone_allowed: bool = False) -> None:
    """Every acknowledged report is a whole row, and its checkpoint is whole. After a rerun
    (``redone_allowed``) the reports past a trial's last acknowledged checkpoint may have been
    done again (a restart resumes from the checkpoint); those up to it may not."""
    acked = _acks(acks)
    assert acked, "no report was acknowledged"
    for trial_dir in _trial_dirs(exp):
        rows = _rows(trial_dir)
        by_step = {(r["training_iteration"], r["attempt"]): r for r in rows}
        for tid, entries in acked.items():
            if tid not in trial_dir.name:
                continue
            first = [e for e in entries if e[1] == min(a for _, a, _ in entries)]
            last_ckpt = max((s for s, _, c in first if c), default=0)
            for step, attempt, with_ckpt in entries:
                if redone_allowed and step > last_ckpt:
                    continue
                row = by_step.get((step, attempt))
                assert row is not None, (
                    f"{trial_dir.name}: acknowledged step {step} of attempt {attempt} lost; "
                    f"rows: {sorted(by_step)}")
                if with_ckpt:
                    ckpt = trial_dir / row["checkpoint_dir_name"]
                    assert (ckpt / ".ftnb_checkpoint.json").exists(), ckpt
                    assert json.loads((ckpt / "state.json").read_text())["step"] == step


def _first_run(tmp_path, store, acks, mode, during=None):
    proc = run_script(tmp_path, DRIVER, str(store), str(acks), mode)
    if during is not None:
        wait_for(lambda: (acks / "ready").exists() or proc.poll() is not None, timeout=120,
                 what="the faulty trial to reach its fault")
        during()
        (acks / "go").touch()
    out, _ = proc.communicate(timeout=180)
    return proc.returncode, out


def _assert_stopped_cleanly(code, out, words: str, exp, recorded: bool = True) -> None:
    """The driver ended cleanly, saying why and how to resume; ``recorded``: the storage could
    still take the record of it (not a read-only one), which ``ftnb status`` shows."""
    assert code == 0, out[-3000:]
    assert words in out, out[-3000:]
    assert "Once the storage is fixed, resume it with:" in out, out[-3000:]
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    shown = subprocess.run([sys.executable, "-m", "ftnb", "status", str(exp)],
                           capture_output=True, text=True, timeout=120)
    assert "INTERRUPTED" in shown.stdout, shown.stdout + shown.stderr
    assert "Resume it with:" in shown.stdout or "Resume with" in shown.stdout, shown.stdout
    if not recorded:
        return
    # What the views read (the driver's space reserve let it record this on a full disk too).
    state = _state(exp)
    assert state["status"] == "INTERRUPTED", state["status"]
    assert words in state["storage_fault"]["message"], state["storage_fault"]
    # A trial's own write met it first (either trial's: both write to the same full disk).
    assert state["storage_fault"]["trial_id"] in [t["trial_id"] for t in state["trials"]], state
    assert [t["status"] for t in state["trials"]] == ["PAUSED", "PAUSED"], state["trials"]
    assert "Stopped: its storage refused a write" in shown.stdout, shown.stdout + shown.stderr
    assert words in shown.stdout, shown.stdout
    # The read model every view renders (the widget, the lab panel) carries the same line.
    as_json = subprocess.run([sys.executable, "-m", "ftnb", "status", str(exp), "--json"],
                             capture_output=True, text=True, timeout=120)
    line = json.loads(as_json.stdout)["storage_fault"]
    assert line.startswith("Stopped: its storage refused a write") and words in line, line


def _rerun_and_check(tmp_path, store, acks, exp) -> None:
    before = _acks(acks)
    code, out = _first_run(tmp_path, store, acks, "none")
    assert code == 0, out[-3000:]
    state = _state(exp)
    assert state["status"] == "FINISHED", out[-3000:]
    statuses = [t["status"] for t in state["trials"]]
    assert statuses == ["TERMINATED", "TERMINATED"], (statuses, out)
    for trial_dir in _trial_dirs(exp):
        steps = [r["training_iteration"] for r in _rows(trial_dir)]
        assert steps == list(range(1, N + 1)), (trial_dir.name, steps)
    # The acknowledged checkpoints were kept, their steps not redone.
    for tid, entries in before.items():
        last_ckpt = max((s for s, _, c in entries if c), default=0)
        redone = [s for s, a, _ in _acks(acks)[tid] if a > 1 and s <= last_ckpt]
        assert not redone, f"{tid} redid acknowledged checkpointed steps {redone}"
    _check_acknowledged(exp, acks, redone_allowed=True)
    for trial in state["trials"]:
        assert all(not f.get("counted", True) for f in trial.get("failures", [])), trial


@pytest.mark.parametrize("mode", ["bytes", "inodes"])
def test_a_full_disk_mid_run_stops_the_experiment_cleanly_and_a_rerun_completes_it(
        tmp_path, mode):
    store = tmp_path / "store"
    acks = tmp_path / "acks"
    acks.mkdir()
    _mount_tmpfs(store, "size=8m,nr_inodes=200" if mode == "inodes" else "size=3m")
    try:
        code, out = _first_run(tmp_path, store, acks, mode)
        exp = store / "exp"
        _assert_stopped_cleanly(code, out, "no space left on the device (ENOSPC)", exp)
        if mode == "inodes":
            assert "no inodes" in out, out[-3000:]
        _check_acknowledged(exp, acks)
        assert not list(exp.glob("*/.tmp-checkpoint*")), "a half-copied checkpoint was left"
        # Space again: the filler goes, and the same script finishes the experiment.
        shutil.rmtree(store / "fill", ignore_errors=True)
        if (store / "filler").exists():
            (store / "filler").unlink()
        _rerun_and_check(tmp_path, store, acks, exp)
    finally:
        _umount(store)


def test_a_filesystem_turned_read_only_mid_run_stops_cleanly_and_resumes(tmp_path):
    image = tmp_path / "disk.img"
    store = tmp_path / "store"
    store.mkdir()
    acks = tmp_path / "acks"
    acks.mkdir()
    subprocess.run(["truncate", "-s", "48M", str(image)], check=True)
    made = subprocess.run(["mkfs.ext4", "-q", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no mkfs.ext4: {made.stderr}")
    mounted = subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(store)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a loop device here: {mounted.stderr.strip()}")
    try:
        device = os.path.basename(subprocess.run(
            ["findmnt", "-no", "SOURCE", str(store)], capture_output=True, text=True,
            check=True).stdout.strip())

        def turn_read_only():
            with open(f"/sys/fs/ext4/{device}/trigger_fs_error", "w") as f:
                f.write("1")
            options = subprocess.run(["findmnt", "-no", "OPTIONS", str(store)],
                                     capture_output=True, text=True).stdout
            assert {"ro", "emergency_ro"} & set(options.strip().split(",")), options

        code, out = _first_run(tmp_path, store, acks, "external", during=turn_read_only)
        exp = store / "exp"
        _assert_stopped_cleanly(code, out, "the filesystem is read-only (EROFS)", exp,
                                recorded=False)
        _check_acknowledged(exp, acks)
        # Repaired: unmounted, checked, mounted again read-write.
        subprocess.run(["umount", str(store)], check=True)
        subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(store)], check=True)
        _rerun_and_check(tmp_path, store, acks, exp)
    finally:
        _umount(store)


def test_a_trial_folder_made_unwritable_mid_run_stops_cleanly_and_resumes(tmp_path):
    # Root writes anywhere: the driver runs as root without the capabilities that override
    # permissions, as an ordinary user would be.
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv")
    store = tmp_path / "store"
    acks = tmp_path / "acks"
    acks.mkdir()
    folder = {}

    def take_write_permission():
        exp = store / "exp"
        faulty = next(d for d in _trial_dirs(exp)
                      if json.loads((d / "params.json").read_text())["faulty"])
        folder["path"] = faulty
        os.chmod(faulty, 0o555)

    script = tmp_path / "unprivileged.py"
    script.write_text(
        "import os, sys\n"
        "os.execvp('setpriv', ['setpriv', '--inh-caps=-all', '--bounding-set=-all', "
        "sys.executable, *sys.argv[1:]])\n")
    driver = tmp_path / "driver_body.py"
    driver.write_text(DRIVER)
    proc = run_script(tmp_path, script.read_text(), str(driver), str(store), str(acks),
                      "external", name="launch.py")
    wait_for(lambda: (acks / "ready").exists() or proc.poll() is not None, timeout=120,
             what="the faulty trial to reach its fault")
    take_write_permission()
    (acks / "go").touch()
    out, _ = proc.communicate(timeout=180)
    exp = store / "exp"
    _assert_stopped_cleanly(proc.returncode, out, "permission denied (EACCES)", exp)
    assert str(folder["path"]) in out, out
    _check_acknowledged(exp, acks)
    os.chmod(folder["path"], 0o755)
    _rerun_and_check(tmp_path, store, acks, exp)


WAITING_DRIVER = r'''
import json, os, sys, time
import ftnb

store, acks = sys.argv[1], sys.argv[2]
%(fill)s

def train(config):
    for step in range(1, 9):
        if step == 4 and not os.path.exists(os.path.join(acks, "filled")):
            fill(store, "bytes")
            open(os.path.join(acks, "filled"), "w").close()
        ftnb.report({"step": step, "pad": "x" * 6000})


ftnb.run(train, name="exp", storage_path=store,
         run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(
             max_failures=0, storage_wait_s=120)))
print("ENDED")
''' % {"fill": FILL}


def test_with_storage_wait_a_full_disk_waits_for_space_and_loses_nothing(tmp_path):
    store = tmp_path / "store"
    acks = tmp_path / "acks"
    acks.mkdir()
    _mount_tmpfs(store, "size=3m")
    try:
        proc = run_script(tmp_path, WAITING_DRIVER, str(store), str(acks))
        lines = []

        def saw_waiting():
            line = proc.stdout.readline()
            lines.append(line)
            return "waits up to 120 s" in line or (not line and proc.poll() is not None)

        wait_for(saw_waiting, timeout=120, what="the trial to say it waits for space")
        assert "waits up to 120 s" in lines[-1], "".join(lines)
        assert proc.poll() is None, "".join(lines)
        (store / "filler").unlink()  # space again
        out, _ = proc.communicate(timeout=120)
        out = "".join(lines) + out
        assert proc.returncode == 0, out[-3000:]
        assert "the storage took the write again" in out, out[-3000:]
        state = _state(store / "exp")
        assert state["status"] == "FINISHED", out[-3000:]
        (trial,) = state["trials"]
        assert trial["status"] == "TERMINATED" and not trial.get("failures"), trial
        (trial_dir,) = _trial_dirs(store / "exp")
        rows = _rows(trial_dir)
        assert [r["training_iteration"] for r in rows] == list(range(1, 9))
        assert {r["attempt"] for r in rows} == {1}  # nothing redone
    finally:
        _umount(store)

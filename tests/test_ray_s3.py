"""The Ray executor with its storage on S3 (the moto server), on the real multi-node cluster
(``ray_cluster``): a trial whose rank is SIGKILLed restarts from its S3 checkpoint, and what the
killed rank printed is on S3 (published while it ran: nothing publishes for a killed actor).
Also, without Ray: the bound on what one such publish uploads."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import tempfile

import pytest
from procs import run_script, wait_for

from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths, Storage, growing_files

STEPS = 5
#: Attempt 1 waits after the report of this step (its checkpoint on S3) until it is killed.
KILLED_AT = 2

DRIVER = """
import json, os, sys
import s3fs
import ftnb
from ftnb.execution.ray import RayExecutor

args = json.loads(sys.argv[1])


def printer(config):
    import pathlib, tempfile, time
    ctx = ftnb.get_context()
    pathlib.Path(config["dir"], f"pid.{ctx.attempt}").write_text(str(os.getpid()))
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start + 1, config["steps"] + 1):
        print(f"attempt {ctx.attempt} step {step}")
        print(f"attempt {ctx.attempt} warns at step {step}", file=sys.stderr)
        saved = tempfile.mkdtemp()
        open(os.path.join(saved, "step"), "w").write(str(step))
        ftnb.report({"step": step}, checkpoint=ftnb.Checkpoint.from_directory(saved))
        if ctx.attempt == 1 and step == config["killed_at"]:
            print("attempt 1 waits to be killed")
            pathlib.Path(config["dir"], "pid").write_text(str(os.getpid()))
            while True:
                time.sleep(0.1)


# The credentials travel to the actors inside the pickled filesystem (the storage's).
fs = s3fs.S3FileSystem(endpoint_url=args["endpoint"], key=os.environ["AWS_ACCESS_KEY_ID"],
                       secret=os.environ["AWS_SECRET_ACCESS_KEY"],
                       use_listings_cache=False, skip_instance_cache=True)
run_config = ftnb.RunConfig(
    name="run", storage_path=args["storage"], storage_filesystem=fs, verbose=0,
    executor=RayExecutor(args["address"]),
    failure_config=ftnb.FailureConfig(max_failures=2))
grid = ftnb.run(printer, name="run", run_config=run_config, param_space={
    "dir": args["dir"], "steps": args["steps"], "killed_at": args["killed_at"]})
print("DONE", grid[0].metrics["training_iteration"], flush=True)
"""


def _stored_text(fs, path: str) -> str:
    try:
        return fs.cat_file(path).decode()
    except FileNotFoundError:
        return ""


@pytest.mark.ray
@pytest.mark.s3
@pytest.mark.slow
def test_a_killed_rank_on_s3_keeps_its_output_and_restarts_from_its_s3_checkpoint(
        tmp_path, ray_cluster, s3_storage, s3_endpoint):
    url, fs = s3_storage
    marks = tmp_path / "marks"
    marks.mkdir()
    args = {"address": ray_cluster.address, "endpoint": s3_endpoint, "storage": url,
            "dir": str(marks), "steps": STEPS, "killed_at": KILLED_AT}
    # AWS_* come from s3_endpoint's environment; the driver passes the interval on to the actors.
    driver = run_script(tmp_path, DRIVER, json.dumps(args),
                        env={growing_files.PUBLISH_INTERVAL_ENV: "1"})

    pid_file = pathlib.Path(marks, "pid")
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 300,
                       "attempt 1 to wait after its checkpoint"))
    experiment = ExperimentPaths.at(f"{url}/run", fs)
    (trial,) = ExperimentState.load(experiment).trials
    files = experiment.trial(trial.dir_name)
    stdout, stderr = files.stdout, files.stderr
    # Published while the rank runs (every second here): nothing publishes a killed actor's.
    # (Both files: one publish puts them one after the other, so a kill between the two would
    # leave the last second's stderr unpublished, as it would any killed rank's.)
    wait_for(lambda: "attempt 1 waits to be killed" in _stored_text(fs, stdout)
             and f"attempt 1 warns at step {KILLED_AT}" in _stored_text(fs, stderr), 60,
             "attempt 1's stdout and stderr on S3 while it runs")
    os.kill(pid, signal.SIGKILL)

    out, _ = driver.communicate(timeout=180)
    assert driver.returncode == 0, out
    assert f"DONE {STEPS}" in out
    (trial,) = ExperimentState.load(experiment).trials
    assert trial.status == "TERMINATED"
    (failure,) = trial.failures
    assert (failure.kind, failure.signal) == ("signal", "SIGKILL")
    assert trial.attempts[1].restored_from is not None  # from its S3 checkpoint
    rows = [json.loads(line) for line in _stored_text(fs, files.results)
            .splitlines() if line.strip()]
    assert [row["training_iteration"] for row in rows] == list(range(1, STEPS + 1))
    # The killed attempt's output, then the retry's, in the same files on S3.
    printed = _stored_text(fs, stdout).splitlines()
    assert printed == [*(f"attempt 1 step {step}" for step in range(1, KILLED_AT + 1)),
                       "attempt 1 waits to be killed",
                       *(f"attempt 2 step {step}" for step in range(KILLED_AT + 1, STEPS + 1))]
    warned = [line for line in _stored_text(fs, stderr).splitlines() if " warns " in line]
    assert warned == [*(f"attempt 1 warns at step {step}" for step in range(1, KILLED_AT + 1)),
                      *(f"attempt 2 warns at step {step}"
                        for step in range(KILLED_AT + 1, STEPS + 1))]
    # Each actor's local copies of the output are gone from its node: the second attempt's,
    # published whole, at its end; the killed first one's, swept by the second actor.
    actors = {pathlib.Path(marks, f"pid.{n}").read_text() for n in (1, 2)}
    owners = [re.match(r"ftnb-staged-[0-9a-f]{8}-(\d+)-", name)
              for name in os.listdir(tempfile.gettempdir())]
    left = [found.string for found in owners if found is not None and found.group(1) in actors]
    assert left == []


def test_a_large_output_is_published_as_its_tail_while_written_and_whole_at_the_end(
        monkeypatch, tmp_path):
    """The bound on what one publish uploads (RUNNING_TAIL_BYTES, 8 MiB; 64 bytes here), on an
    object store (``memory://``): the stored copy is the tail from a line's start after a line
    saying how much is left out; ``close`` publishes the whole file; a later process resumes
    from the stored copy's tail. The local copies are kept while not published whole, and
    leave no folder behind once discarded."""
    monkeypatch.setattr(growing_files, "RUNNING_TAIL_BYTES", 64)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (only this test's folders)
    storage = Storage("memory://ftnb-tail-test/run")
    output = storage.staged_file("/ftnb-tail-test/run/stdout")
    lines = [f"line {index:03d}\n".encode() for index in range(20)]  # 9 bytes each
    publisher = growing_files.PeriodicPublisher([output], interval=0.05)
    with open(output.local_path, "ab") as f:
        f.write(b"".join(lines))
    tail = b"[ftnb: the first 117 bytes of this output are left out]\n" + b"".join(lines[13:])
    wait_for(lambda: storage.exists(output.path) and storage.read_bytes(output.path) == tail,
             10, "the tail published")
    assert not output.pending() and output.pending(whole=True)
    assert not output.discard() and os.path.exists(output.local_path)  # not published whole
    publisher.close()
    assert storage.read_bytes(output.path) == b"".join(lines)
    assert publisher.discard()
    assert not os.path.exists(os.path.dirname(output.local_path))

    later = storage.staged_file(output.path)
    later.resume(keep_bytes=20)
    with open(later.local_path, "rb") as f:
        resumed = f.read()
    assert resumed == b"[ftnb: the first 162 bytes of this output are left out]\n" + \
        b"".join(lines[-2:])
    assert later.discard()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ftnb-staged-")] == []

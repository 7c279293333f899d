"""``ftnb.Callback`` with Ray Tune's hooks and ``TBXLoggerCallback`` (issue 18), on real trials in
their own processes: the hooks run in the driver, one that raises is logged and the experiment
goes on; TensorBoard event files have exactly one point per iteration after a retry from a
checkpoint and after a SIGKILLed driver's restore."""

from __future__ import annotations

import glob
import logging
import os
import struct

from killed_driver import kill_when, run_to_end, trial_with_reports
from scripted import result_rows

import ftnb
from ftnb.logger import TBXLoggerCallback


def _counting(config):
    """Reports ``score`` = iteration for config["n"] iterations, a checkpoint every 3; raises
    once at config["fail_at"] on the first attempt; config["sleep"] s between reports."""
    import tempfile
    import time

    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "it")) as f:
                start = int(f.read())
    for it in range(start + 1, config["n"] + 1):
        if it == config.get("fail_at") and ftnb.get_context().attempt == 1:
            raise RuntimeError("fail once")
        metrics = {"score": it, "nested": {"half": it / 2}}
        if it % 3 == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "it"), "w") as f:
                    f.write(str(it))
                ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))
        else:
            ftnb.report(metrics)
        time.sleep(config.get("sleep", 0.0))


class Recorder(ftnb.Callback):
    def __init__(self):
        self.calls = []

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.calls.append(("setup", total_num_samples))

    def on_trial_start(self, iteration, trials, trial, **info):
        self.calls.append(("start", trial.trial_id))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.calls.append(("result", result["training_iteration"]))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "it")) as f:
                self.calls.append(("checkpoint", int(f.read())))

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.calls.append(("recover", trial.trial_id))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.calls.append(("complete", trial.status))

    def on_experiment_end(self, trials, **info):
        self.calls.append(("end", len(trials)))


class Broken(ftnb.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        raise ValueError("a broken callback")


def _scalars(folder, tag):
    """(step, value) of every ``tag`` point in the TensorBoard event files of ``folder``, read
    as TFRecords of tensorboardX's Event protos."""
    from tensorboardX.proto.event_pb2 import Event

    points = []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                if value.tag == tag:
                    points.append((event.step, value.simple_value))
    return sorted(points)


def test_hooks_run_in_the_driver_and_tensorboard_has_each_iteration_once(tmp_path, caplog):
    recorder = Recorder()
    with caplog.at_level(logging.ERROR, logger="ftnb"):
        results = ftnb.Tuner(
            _counting,
            param_space={"n": 8, "fail_at": 5},
            run_config=ftnb.RunConfig(
                storage_path=str(tmp_path), name="cb", verbose=0,
                failure_config=ftnb.FailureConfig(max_failures=1),
                callbacks=[Broken(), recorder, TBXLoggerCallback()]),
        ).fit()
    (result,) = results
    assert not results.errors
    trial_id = result.trial_id
    calls = recorder.calls
    assert calls[0] == ("setup", 1) and calls[-1] == ("end", 1)
    assert [c for c in calls if c[0] == "start"] == [("start", trial_id)] * 2
    assert ("recover", trial_id) in calls
    assert [c[1] for c in calls if c[0] == "result"] == [1, 2, 3, 4, 4, 5, 6, 7, 8]
    assert [c[1] for c in calls if c[0] == "checkpoint"] == [3, 6]
    assert calls[-2] == ("complete", "TERMINATED")
    assert "Broken.on_trial_result raised" in caplog.text  # logged, and the run went on
    folder = os.path.join(str(tmp_path), "cb", result.path.rsplit("/", 1)[-1])
    assert _scalars(folder, "ray/tune/score") == [(i, float(i)) for i in range(1, 9)]
    assert _scalars(folder, "ray/tune/nested/half") == [(i, i / 2) for i in range(1, 9)]


TBX_DRIVER = """
import sys, ftnb
from ftnb.logger import TBXLoggerCallback
from test_tune_api_callbacks import _counting

ftnb.run(_counting, name="tbx", storage_path=sys.argv[1],
         param_space={"n": 16, "sleep": 0.05},
         run_config=ftnb.RunConfig(verbose=0, callbacks=[TBXLoggerCallback()]))
print("DONE")
"""


def test_tensorboard_points_stay_once_per_iteration_after_a_sigkilled_driver(tmp_path):
    exp = tmp_path / "tbx"
    # Killed between checkpoints: the iterations after the last one are done again.
    kill_when(tmp_path, TBX_DRIVER, [str(tmp_path)],
              lambda: trial_with_reports(exp, (7, 8)), "seven reports")
    assert "DONE" in run_to_end(tmp_path, TBX_DRIVER, [str(tmp_path)])
    (trial_dir,) = [d.parent for d in exp.glob("*/result.json")]
    assert len({r["attempt"] for r in result_rows(str(trial_dir))}) == 2
    assert _scalars(str(trial_dir), "ray/tune/score") == [(i, float(i)) for i in range(1, 17)]

"""``Tuner(...).fit()`` run again under the name of a stored experiment (issue 31, item 8): a
finished one is set aside whole to ``<name>-<when it started>`` and a new run starts, as Ray
starts a new run; ``ftnb.run`` still resumes by name. (An unfinished one is refused, as before:
test_restore's ``test_fit_again_on_existing_experiment_points_to_restore``; a live one gets the
lock error: test_racing_drivers.)"""

from __future__ import annotations

import json
import os
import re
import tempfile
import uuid

import fsspec
import pytest

import ftnb
from ftnb.lifecycle.plan_new import ExperimentExistsError
from ftnb.storage import Storage
from ftnb.storage.experiment_index import read_index


def _train(config):
    for step in range(2):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "step.txt"), "w") as f:
                f.write(str(step))
            ftnb.report({"y": config["x"] * 10 + step},
                        checkpoint=ftnb.Checkpoint.from_directory(folder))


def _fit(tmp_path, xs, verbose=1):
    return ftnb.Tuner(_train, param_space={"x": ftnb.grid_search(xs)},
                      run_config=ftnb.RunConfig(name="sweep", storage_path=str(tmp_path),
                                                verbose=verbose)).fit()


def _files(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, files in os.walk(folder) for f in files
                  if f not in ("owner.json", ".owner.lock"))


def test_a_finished_experiment_fitted_again_starts_a_new_run_and_keeps_the_first(
        tmp_path, capsys):
    first = _fit(tmp_path, [1, 2], verbose=0)
    kept = _files(tmp_path / "sweep")
    capsys.readouterr()

    second = _fit(tmp_path, [3])
    said = capsys.readouterr().out
    line = next(x for x in said.splitlines() if "had finished" in x)
    where = re.search(r"kept at (\S+) \(experiment", line).group(1)
    assert os.path.dirname(where) == str(tmp_path)
    assert re.fullmatch(r"sweep-\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", os.path.basename(where))

    # The new run is the one under the name: its own trial only, from the start.
    assert second.experiment_path == str(tmp_path / "sweep")
    assert [r.metrics["y"] for r in second] == [31]
    # The earlier run: every file where the line says, as it was, readable as before.
    assert _files(where) == kept
    earlier = ftnb.Tuner.restore(where, _train).get_results()
    assert sorted(r.metrics["y"] for r in earlier) == sorted(r.metrics["y"] for r in first)
    for result in earlier:
        with result.checkpoint.as_directory() as folder:
            assert open(os.path.join(folder, "step.txt")).read() == "1"
    # Its lease moved with it, released: no view takes it for a running experiment.
    assert json.loads(open(os.path.join(where, "owner.json")).read())["released"] is True
    # Both are listed, each with its own trials.
    index = read_index(Storage(str(tmp_path)), str(tmp_path)).entries
    assert index[os.path.basename(where)].trials == 2
    assert index["sweep"].trials == 1 and index["sweep"].status == "FINISHED"


def test_a_third_fit_keeps_both_earlier_runs(tmp_path):
    for x in (1, 2, 3):
        _fit(tmp_path, [x], verbose=0)
    runs = sorted(p for p in os.listdir(tmp_path) if p.startswith("sweep"))
    assert len(runs) == 3
    ys = sorted(ftnb.Tuner.restore(str(tmp_path / p), _train).get_results()[0].metrics["y"]
                for p in runs)
    assert ys == [11, 21, 31]


def test_ftnb_run_of_a_finished_experiment_still_resumes_it(tmp_path):
    # ftnb.run starts *or resumes* by name: a finished experiment's results, nothing run again.
    space = {"x": ftnb.grid_search([1])}
    ftnb.run(_train, name="sweep", storage_path=str(tmp_path), param_space=space,
             run_config=ftnb.RunConfig(verbose=0))
    again = ftnb.run(_train, name="sweep", storage_path=str(tmp_path), param_space=space,
                     run_config=ftnb.RunConfig(verbose=0))
    assert [r.metrics["y"] for r in again] == [11]
    assert os.listdir(tmp_path).count("sweep") == 1
    assert not [p for p in os.listdir(tmp_path) if p.startswith("sweep-")]


def _reports(config):
    ftnb.report({"y": config["x"]})


def test_on_storage_without_a_rename_a_finished_experiment_is_refused_as_before():
    base = f"memory://ftnb-{uuid.uuid4().hex}"

    def fit():
        return ftnb.Tuner(_reports, param_space={"x": 1}, run_config=ftnb.RunConfig(
            name="mem", storage_path=base, verbose=0, executor="inprocess")).fit()

    fit()
    before = sorted(fsspec.filesystem("memory").find(base))
    with pytest.raises(ExperimentExistsError,
                       match=r"\(finished; a finished one is set aside for a new run only on "
                             r"a local disk\)"):
        fit()
    assert sorted(fsspec.filesystem("memory").find(base)) == before

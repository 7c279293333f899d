"""What the per-trial path imports: the fork server preloads the executor contract and the attempt
body once per driver, before the first trial starts, so every module they pull in is paid by
every experiment. The trial schedulers are imported only when one is used, and a driver's resume
line imports of the read model only what words it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ftnb import schedulers


def _modules_after(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_fork_servers_preload_imports_no_scheduler():
    from ftnb.execution.fork_server import ALWAYS_PRELOAD

    loaded = _modules_after(f"for m in {ALWAYS_PRELOAD!r}: __import__(m)")
    assert "ftnb.execution.contract" in loaded
    assert {m for m in loaded if m.startswith("ftnb.schedulers")} == {
        "ftnb.schedulers", "ftnb.schedulers.decision_points",
        "ftnb.schedulers.stop_criterion"}  # (RunConfig(stop={...}) and done, no scheduler)
    assert "statistics" not in loaded  # (the median stopping rule's and PBT's)


def test_a_scheduler_is_imported_on_first_use():
    loaded = _modules_after("import ftnb.schedulers\n"
                            "from ftnb.schedulers import MedianStoppingRule")
    assert "ftnb.schedulers.median_stopping_rule" in loaded
    assert "ftnb.schedulers.pbt" not in loaded


def test_every_public_name_of_ftnb_schedulers_resolves():
    for name in schedulers.__all__:
        assert getattr(schedulers, name) is not None, name
        assert name in dir(schedulers)
    assert schedulers.PopulationBasedTraining.__module__ == "ftnb.schedulers.pbt"
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchScheduler'"):
        schedulers.NoSuchScheduler  # noqa: B018


@pytest.mark.parametrize("build", [
    lambda s: s.FIFOScheduler(),
    lambda s: s.ASHAScheduler(metric="loss", mode="min", max_t=9),
    lambda s: s.AsyncHyperBandScheduler(metric="loss", mode="min", max_t=9),
    lambda s: s.HyperBandScheduler(metric="loss", mode="min", max_t=9),
    lambda s: s.MedianStoppingRule(metric="loss", mode="min", grace_period=2),
    lambda s: s.PopulationBasedTraining(metric="loss", mode="min",
                                        hyperparam_mutations={"lr": [0.1, 0.2]}),
])
def test_each_of_ftnbs_schedulers_is_rebuilt_from_its_description(build):
    scheduler = build(schedulers)
    description = json.loads(json.dumps(schedulers.describe_scheduler(scheduler)))
    rebuilt = schedulers.scheduler_from_description(description)
    assert type(rebuilt) is type(scheduler)
    assert rebuilt._ftnb_settings() == scheduler._ftnb_settings()


def test_a_description_that_names_no_scheduler_of_ftnbs_rebuilds_none():
    for name in ("TrialScheduler", "SchedulerController", "pbt_history", "MyScheduler", None):
        assert schedulers.scheduler_from_description({"class": name, "settings": {}}) is None


def test_a_subclass_of_one_of_ftnbs_schedulers_compares_trials():
    class MyASHA(schedulers.ASHAScheduler):
        pass

    with pytest.raises(ValueError, match="MyASHA compares trials by a metric"):
        schedulers.check_scheduler(MyASHA(), None, None)
    schedulers.check_scheduler(schedulers.FIFOScheduler(), None, None)  # FIFO compares none


def test_a_drivers_resume_line_imports_no_listing_snapshot_or_status():
    """A driver imports the read model for its resume line alone (ftnb.tuner); the rest of
    the read model is imported on first use, and every public name still resolves."""
    from ftnb.ui import read_model

    loaded = _modules_after("import ftnb\n"
                            "from ftnb.ui.read_model import resume_line, tuner_restore_line")
    assert "ftnb.ui.resume_lines" in loaded
    assert not loaded & {"ftnb.ui.listing", "ftnb.ui.snapshot", "ftnb.ui.status",
                         "ftnb.storage.experiment_index", "ftnb.core.exploits"}
    for name in read_model.__all__:
        assert getattr(read_model, name) is not None, name
        assert name in dir(read_model)
    assert read_model.list_folder.__module__ == "ftnb.ui.listing"

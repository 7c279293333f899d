"""Two drivers of one experiment started at the same moment (two `ftnb.run` of the same name):
one runs it, the other is told that a live driver runs it (its host, pid and since when), never
to delete the folder. And a folder whose state is unreadable gets the restore's own error."""

from __future__ import annotations

import pytest

import ftnb
from procs import run_script, wait_for
from scripted import result_rows, scripted

PAIRS = 20
AT_ONCE = 4  # pairs started together at a time, on a machine of two cores
N = 3

RACER = """
import sys, ftnb
from scripted import scripted

ftnb.run(
    scripted, name=sys.argv[2], storage_path=sys.argv[1],
    param_space={"n": %d, "gate": sys.argv[3], "i": ftnb.grid_search([0, 1])},
    run_config=ftnb.RunConfig(verbose=0),
)
print("DONE")
""" % N


def test_twenty_pairs_of_simultaneous_drivers(tmp_path):
    storage = tmp_path / "runs"
    storage.mkdir()
    outcomes = []
    for first in range(0, PAIRS, AT_ONCE):
        started = []
        for pair in range(first, min(first + AT_ONCE, PAIRS)):
            name = f"race{pair}"
            # The trials finish only once the gate opens (after the loser has answered): the
            # winner is live while the loser decides, as a real experiment would be.
            gate = str(tmp_path / f"gate{pair}")
            procs = [run_script(tmp_path, RACER, str(storage), name, gate, name=f"racer{pair}.py")
                     for _ in range(2)]
            started.append((name, gate, procs))
        for name, gate, procs in started:
            loser = wait_for(lambda: next((p for p in procs if p.poll() is not None), None),
                             timeout=120, what=f"one driver of {name} to give up")
            winner = procs[1] if loser is procs[0] else procs[0]
            loser_out, _ = loser.communicate()
            open(gate, "w").close()
            winner_out, _ = winner.communicate(timeout=120)
            outcomes.append((name, winner, winner_out, loser, loser_out))
    for name, winner, winner_out, loser, loser_out in outcomes:
        assert winner.returncode == 0 and "DONE" in winner_out, (name, winner_out)
        assert loser.returncode != 0, (name, loser_out)
        assert "ExperimentLockedError" in loser_out, (name, loser_out)
        assert f"is being run by another driver (pid {winner.pid} on " in loser_out, \
            (name, loser_out)
        assert ", since " in loser_out
        assert "delete that folder" not in loser_out, (name, loser_out)
        assert "already exists" not in loser_out, (name, loser_out)
        trials = sorted(d for d in (storage / name).iterdir()
                        if d.is_dir() and (d / "params.json").exists())
        assert len(trials) == 2
        for d in trials:
            assert [r["training_iteration"] for r in result_rows(str(d))] == \
                list(range(1, N + 1)), (name, d.name)


def test_an_unreadable_state_gets_the_restores_error_not_advice_to_delete(tmp_path):
    run = dict(name="broken", storage_path=str(tmp_path), param_space={"n": 1},
               run_config=ftnb.RunConfig(verbose=0))
    ftnb.run(scripted, **run)
    for state in ("experiment_state.json", "experiment_state.prev.json"):
        (tmp_path / "broken" / state).write_text("{not json")
    for attempt in (lambda: ftnb.run(scripted, **run),
                    lambda: ftnb.Tuner(scripted, param_space={"n": 1},
                                       run_config=ftnb.RunConfig(
                                           name="broken", storage_path=str(tmp_path),
                                           verbose=0)).fit()):
        with pytest.raises(ftnb.RestoreError) as caught:
            attempt()
        text = str(caught.value)
        assert "both unreadable" in text and "not valid JSON" in text, text
        assert "delete that folder" not in text


def test_a_driver_that_looked_before_the_other_finished_resumes_it_as_a_rerun_does(tmp_path,
                                                                                   capsys):
    """The race's other end, made deterministic: the second ``ftnb.run`` looked (no state yet:
    a new experiment), then the first one finished, then the second one fits. It ends as the
    same ``ftnb.run`` run again after the first one does: the finished experiment resumed,
    nothing run twice, not "already exists"."""
    from ftnb.tuner import start_or_resume

    call = dict(name="raced", storage_path=str(tmp_path),
                param_space={"n": N, "i": ftnb.grid_search([0, 1])},
                run_config=ftnb.RunConfig(verbose=1))
    second, resuming = start_or_resume(
        scripted, tune_config=None, resources_per_trial=None, caller="ftnb.run", **call)
    assert resuming is None  # it looked before the experiment existed
    first = ftnb.run(scripted, **call)
    assert first.num_terminated == 2
    capsys.readouterr()

    raced = second.fit()
    said = capsys.readouterr().out
    rerun = ftnb.run(scripted, **call)  # what the same call does after the first one
    rerun_said = capsys.readouterr().out
    assert "already exists" not in said
    assert "Resuming" in said or "resum" in said.lower(), said
    for results in (raced, rerun):
        assert results.num_terminated == 2 and results.num_errors == 0
        for result in results:
            assert [r["training_iteration"] for r in result.rows] == list(range(1, N + 1))
    from ftnb.core.records import ExperimentState
    from ftnb.storage import ExperimentPaths

    state = ExperimentState.load(ExperimentPaths.at(str(tmp_path / "raced")))
    assert [len(t.attempts) for t in state.trials] == [1, 1]  # nothing ran again
    assert said.splitlines()[0] == rerun_said.splitlines()[0]  # the same resume line

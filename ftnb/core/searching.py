"""A search algorithm whose every suggestion and every told outcome is kept in the experiment's
folder: :class:`PersistedSearcher`, what the controller asks for new trials.

The rules that make a driver killed at any instant lose nothing and repeat nothing:

1. *A suggestion is written before its trial is.* ``searcher_state.json`` (the searcher's JSON
   state, the suggestions whose trials the state on disk may not list yet, with their folders,
   the trials not yet told complete) is written when a config is suggested, before anything of
   its trial is (:meth:`PersistedSearcher.hold`); the searcher's own storage (Optuna's journal)
   is made durable before that file (:meth:`~ftnb.search.Searcher.flush`). The suggestion is
   kept there until a save of the state lists the trial (:meth:`PersistedSearcher.recorded`),
   so the state is not saved once per trial. A restore records the trials of the suggestions
   the state does not list (:meth:`PersistedSearcher.unlisted`), with their ids and folders,
   from the trial's own record when it got that far (it may have run). A suggestion the
   searcher made durable in its own storage but that the file does not list yet is asked for
   again with the same trial id, and the searcher answers with the same config (``suggest`` is
   idempotent by trial id: OptunaSearch finds the Optuna trial that carries that id).
2. *An outcome is told after the trial's record says it.* A trial's final record (TERMINATED,
   ERRORED) is written first, then the searcher is told and the file written; a restore tells
   the searcher of every trial that ended without being told (the file still lists it as live).
   A searcher that was told just before the driver died and is told again (its own storage
   made durable, the file not yet) recognizes it (OptunaSearch: the Optuna trial is finished).
3. *Each result once.* The file records, per live trial, the last ``training_iteration`` told;
   results at or before it (a step redone after a restart from a checkpoint, the rows a restore
   replays) are not told again. A restore replays the rows of ``result.json`` past it.

The controller calls it: :meth:`~PersistedSearcher.suggest` when a trial can start,
:meth:`~PersistedSearcher.hold` before it writes the trial's folder and record,
:meth:`~PersistedSearcher.recorded` once a saved state lists the trial,
:meth:`~PersistedSearcher.on_result`, :meth:`~PersistedSearcher.on_complete`.
"""

from __future__ import annotations

import importlib
import json
import random
from typing import Any, Callable, Iterable, Optional

from ..search.libraries import LIBRARIES
from ..search.searcher import Searcher
from ..storage import ExperimentPaths
from .records import FINISHED_STATUSES, TrialRecord, TrialStatus, encode_value

__all__ = ["FINISHED", "PersistedSearcher", "rebuild_searcher",
           "searcher_settings"]

FINISHED = Searcher.FINISHED
FORMAT = "ftnb.searcher"
FORMAT_VERSION = 1

#: The searchers a restore may build from their description (ftnb's own: no user code): the
#: two of the search package, and those over a library (:data:`ftnb.search.libraries.LIBRARIES`).
_REBUILDABLE = {
    "ftnb.search.BasicVariantGenerator": ("ftnb.search.searcher", "BasicVariantGenerator"),
    "ftnb.search.ConcurrencyLimiter": ("ftnb.search.concurrency", "ConcurrencyLimiter"),
    **{lib.class_name: (lib.module, lib.searcher) for lib in LIBRARIES},
}



def searcher_settings(searcher: Searcher) -> dict:
    """What the experiment's settings record of its searcher: its name, and its description
    when ftnb can build it again at a restore (:meth:`~ftnb.search.Searcher.describe`)."""
    return {"name": repr(searcher), "class": f"{type(searcher).__module__}."
            f"{type(searcher).__qualname__}", "description": searcher.describe()}


def rebuild_searcher(description: dict) -> Searcher:
    """The searcher that ``description`` (:meth:`~ftnb.search.Searcher.describe`) describes."""
    name = description.get("class")
    if name not in _REBUILDABLE:
        raise ValueError(f"no searcher of ftnb named {name!r}")
    module_name, attr = _REBUILDABLE[name]
    module = importlib.import_module(module_name)
    if hasattr(module, "from_description"):  # (a description that is not just arguments)
        return module.from_description(description)
    cls = getattr(module, attr)
    arguments = {k: v for k, v in description.items() if k != "class"}
    if attr == "ConcurrencyLimiter":
        arguments["searcher"] = rebuild_searcher(arguments["searcher"])
    return cls(**arguments)


class PersistedSearcher:
    """A :class:`~ftnb.search.Searcher` and its state in ``searcher_state.json`` (see the
    module's docstring for the rules). Build it with :meth:`start` (a new experiment) or
    :meth:`resume` (a restore)."""

    def __init__(self, searcher: Searcher, paths: ExperimentPaths, space: Any,
                 num_samples: int, id_prefix: str, seed: Optional[int]) -> None:
        self.searcher = searcher
        self.paths = paths
        self.space = space
        #: How many trials it may make in all (-1: no limit). A BasicVariantGenerator counts
        #: ``num_samples`` in repetitions of the grid and ends by itself.
        self.num_samples = -1 if _generates_variants(searcher) else num_samples
        self.id_prefix = id_prefix
        self.path = paths.searcher_state
        #: Called before every write: the owner lease's check.
        self.guard: Optional[Callable[[], None]] = None
        self.made = 0  # configs suggested so far
        self.pending: dict[str, Any] = {}  # suggested, not yet known to be recorded (JSON)
        self.live: dict[str, int] = {}  # trial id -> the last training_iteration told
        self.finished = False
        self._seed = seed
        self._asked: Optional[tuple[str, Any]] = None  # suggested, not held yet

    # -- building it -------------------------------------------------------------------------
    @staticmethod
    def prepare(searcher: Searcher, space: Any, *, metric: Optional[str], mode: Optional[str],
                num_samples: int, seed: Optional[int], check_space: bool) -> None:
        """Give ``searcher`` the Tuner's metric, mode and space (before anything is written):
        its errors (a space it cannot search) come out here. ``check_space``: refuse a space
        with domains when the searcher has a space of its own, as Ray Tune does."""
        taken = searcher.set_search_properties(metric, mode, space or {},
                                               num_samples=num_samples, seed=seed)
        from ..search.domains import holds_domain

        if not taken and check_space and holds_domain(space):
            raise ValueError(
                f"Tuner(param_space=...) has search-space domains, but the search algorithm "
                f"{searcher!r} has a search space of its own, so they would never be searched. "
                "Fix: put every domain in one of the two: the searcher's space, or the "
                "param_space (leave the searcher's space out); constant values may stay in the "
                "param_space.")

    @classmethod
    def start(cls, searcher: Searcher, paths: ExperimentPaths, space: Any, *,
              num_samples: int, id_prefix: str, seed: Optional[int],
              guard: Optional[Callable[[], None]] = None) -> "PersistedSearcher":
        """A new experiment's searcher (already :meth:`prepare`d), its storage opened in the
        experiment's folder and its first state written."""
        keeper = cls(searcher, paths, space, num_samples, id_prefix, seed)
        keeper.guard = guard
        searcher.attach_storage(paths, resuming=False)
        _set_guard(searcher, guard)
        keeper.commit()
        return keeper

    @classmethod
    def resume(cls, searcher: Searcher, paths: ExperimentPaths, space: Any, *,
               num_samples: int, id_prefix: str, seed: Optional[int],
               guard: Optional[Callable[[], None]] = None) -> "PersistedSearcher":
        """A restored experiment's searcher (already :meth:`prepare`d): its storage and its
        state read back. Call :meth:`recover` with the trials' records next."""
        keeper = cls(searcher, paths, space, num_samples, id_prefix, seed)
        keeper.guard = guard
        searcher.attach_storage(paths, resuming=True)
        _set_guard(searcher, guard)
        try:
            data = json.loads(paths.storage.read_bytes(keeper.path))
        except FileNotFoundError:
            data = None  # killed before its first write: nothing was suggested
        if data is not None:
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"{paths.storage.uri(keeper.path)} is not a searcher state")
            if int(data.get("format_version", 0)) > FORMAT_VERSION:
                raise ValueError(f"{paths.storage.uri(keeper.path)} was written by a newer "
                                 "ftnb. Fix: upgrade ftnb.")
            searcher.set_state(data.get("state") or {})
            keeper.made = int(data.get("made", 0))
            keeper.pending = dict(data.get("pending") or {})
            keeper.live = {k: int(v) for k, v in (data.get("live") or {}).items()}
            keeper.finished = bool(data.get("finished"))
        return keeper

    # -- what the controller asks ------------------------------------------------------------
    def trial_id(self, index: int) -> str:
        """The id of the experiment's trial number ``index`` (the same at every restore)."""
        return f"{self.id_prefix}_{index:05d}"

    @property
    def may_suggest(self) -> bool:
        """Whether it may still make trials."""
        return not self.finished and (self.num_samples < 0 or self.made < self.num_samples)

    def suggest(self, trial_id: str) -> Any:
        """The config of the new trial ``trial_id``, None for "not now", or :data:`FINISHED`.
        A config is made durable by :meth:`hold`, which the caller calls before it writes
        anything of the trial."""
        if not self.may_suggest:
            if not self.finished:
                self.finished = True
                self.commit()
            return FINISHED
        answer = self.searcher.suggest(trial_id)
        if answer is None:
            return None
        if answer == FINISHED:
            self.finished = True
            self.commit()
            return FINISHED
        if not isinstance(answer, dict):
            raise TypeError(f"{self.searcher!r}.suggest({trial_id!r}) returned {answer!r}: a "
                            "searcher returns a config (dict), None or Searcher.FINISHED.")
        config = self._config(answer, trial_id)
        self._asked = (trial_id, config)
        return config

    def hold(self, trial_id: str, dir_name: str) -> None:
        """Make the suggestion for ``trial_id`` durable (the searcher's own storage, then the
        file), with the folder its trial gets: kept until the state lists the trial
        (:meth:`recorded`), so that a restore records it from here."""
        asked_id, config = self._asked or (None, None)
        if asked_id != trial_id:
            raise RuntimeError(f"hold({trial_id!r}) without suggest({trial_id!r}) before it")
        self._asked = None
        self.made += 1
        self.pending[trial_id] = {"config": encode_value(config), "dir_name": dir_name}
        self.live[trial_id] = 0
        self.commit()

    def recorded(self, trial_id: str) -> None:
        """The state on disk lists the trial ``trial_id`` (its suggestion needs no keeping)."""
        self.pending.pop(trial_id, None)

    def unlisted(self, listed: Iterable[str]) -> list[tuple[str, Any, str]]:
        """``(trial id, config, folder name)`` of the suggestions whose trials the state does
        not list (``listed``: the ids it lists), in the order they were made: a restore records
        them first. The others need no keeping."""
        listed = set(listed)
        out = [(trial_id, entry["config"], entry["dir_name"])
               for trial_id, entry in sorted(self.pending.items()) if trial_id not in listed]
        self.pending = {k: v for k, v in self.pending.items() if k not in listed}
        return out

    def on_result(self, trial_id: str, row: dict) -> None:
        """Tell the searcher a result, once per ``training_iteration`` (kept in memory: the
        next commit writes it; a restore replays what it lost)."""
        told = self.live.get(trial_id)
        iteration = row.get("training_iteration")
        if told is None or not isinstance(iteration, int) or iteration <= told:
            return
        self.searcher.on_trial_result(trial_id, row)
        self.live[trial_id] = iteration

    def on_complete(self, trial: TrialRecord) -> None:
        """Tell the searcher that ``trial`` ended (its final record is written), once."""
        if self._tell_complete(trial):
            self.commit()

    def _tell_complete(self, trial: TrialRecord) -> bool:
        if trial.trial_id not in self.live or trial.status not in FINISHED_STATUSES:
            return False
        self.searcher.on_trial_complete(trial.trial_id, trial.last_result,
                                        error=trial.status == TrialStatus.ERRORED)
        del self.live[trial.trial_id]
        return True

    def recover(self, trials: Iterable[TrialRecord],
                rows_of: Callable[[TrialRecord], list]) -> None:
        """After a restore (the trials of :meth:`unlisted` recorded): tell the searcher the
        results and outcomes it missed."""
        known = {t.trial_id: t for t in trials}
        for trial_id in list(self.live):
            trial = known.get(trial_id)
            if trial is None:
                continue
            for row in rows_of(trial):
                self.on_result(trial_id, row)
            self._tell_complete(trial)
        self.commit()

    def close(self, recorded: set) -> None:
        """The experiment makes no more trials (``recorded``: the ids of its trials): the
        searcher closes what it asked for and no trial recorded (:meth:`Searcher.end_search`)."""
        self.searcher.end_search(recorded)
        self.commit()

    def commit(self) -> None:
        """Make the searcher's state durable: its own storage first, then the file."""
        if self.guard is not None:
            self.guard()
        self.searcher.flush()
        data = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "searcher": repr(self.searcher), "made": self.made, "finished": self.finished,
                "pending": self.pending, "live": self.live, "state": self.searcher.get_state()}
        # durable=False as the trial records: it survives the death of any process; a machine
        # crash falls back on what the trials' records and the searcher's storage hold.
        self.paths.storage.write_atomic(
            self.path, json.dumps(data, default=str, allow_nan=True), durable=False)

    def _config(self, suggestion: dict, trial_id: str) -> dict:
        """The trial's config: the suggestion laid over the space, its other domains drawn (as
        Ray Tune merges a searcher's config into ``param_space``)."""
        from ..search import generate_variants
        from ..search.variants import with_point

        merged = with_point(self.space, suggestion)
        # Seeded by the trial: the same config again when the same trial is asked for again.
        seed = random.Random(f"{self._seed}/{trial_id}").getrandbits(63)
        variants = generate_variants(merged, 1, seed)
        if len(variants) != 1:
            raise ValueError(
                f"param_space has a grid_search that {self.searcher!r} does not set: with a "
                "search algorithm each suggestion is one trial. Fix: search that key with the "
                "searcher (e.g. ftnb.choice([...])) or give it a constant.")
        return variants[0]


def _generates_variants(searcher: Searcher) -> bool:
    from ..search.searcher import BasicVariantGenerator

    inner = getattr(searcher, "searcher", None)  # a ConcurrencyLimiter's
    return isinstance(inner if isinstance(inner, Searcher) else searcher, BasicVariantGenerator)


def _set_guard(searcher: Searcher, guard: Optional[Callable[[], None]]) -> None:
    inner = getattr(searcher, "searcher", None)  # a ConcurrencyLimiter's
    set_guard = getattr(inner if isinstance(inner, Searcher) else searcher, "set_guard", None)
    if set_guard is not None:
        set_guard(guard)

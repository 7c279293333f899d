"""``OptunaSearch``: Optuna's samplers (TPE by default) as an ftnb searcher, its study kept in
the experiment's folder (``pip install 'ftnb[optuna]'``).

The study lives in Optuna's journal format in ``optuna_journal.jsonl`` beside the experiment's
state (on an object store: in commit-numbered pieces of it), written through ftnb's storage
(:class:`StorageJournalBackend`), so it is on the same disk, NFS share or object store (S3
through fsspec) as the rest of the experiment and a restore finds it there. Why a journal over ftnb's storage rather than Optuna's
``JournalFileBackend`` or SQLite: both need a local file system (locks, in-place appends), and
an experiment may live on S3; the experiment's owner lease already makes its driver the only
writer, so the backend needs no lock of its own, and it can hold the study in memory (Optuna
reads its journal before most calls: from memory, a suggestion costs no storage round trip).

Durability: what the study records is written at the points where ftnb commits the search
(:meth:`OptunaSearch.flush`, before a suggested trial is recorded and after a trial's outcome
was told), every log since the last commit at once, the last one marked as the commit: a
driver killed mid-write leaves logs without their mark, which a restore drops, so the study is
the one of a commit point, never half of one. The file stays in Optuna's own journal format. Intermediate results (``trial.report``) ride along with the next commit; a
restore reports the missing ones again from the trials' ``result.json`` (each step once).
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .libraries import missing_library, no_objective_error, no_space_error, step_seed

try:
    import optuna
except ImportError:  # pragma: no cover - depends on the environment
    raise missing_library(__name__) from None
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import TrialState

from ..config import metric_value
from .domains import Categorical, Domain, searched_domains
from .flatten import flatten_dict, unflatten_dict
from .numeric import LogRandInt, LogUniform, QLogRandInt, QRandInt, RandInt, Uniform
from .searcher import Searcher, Suggestion

if TYPE_CHECKING:
    from ..storage import ExperimentPaths, Storage

__all__ = ["OptunaSearch", "StorageJournalBackend", "convert_search_space"]

logger = logging.getLogger(__name__)

#: The user attribute of an Optuna trial that names the ftnb trial it is.
TRIAL_ID_ATTR = "ftnb_trial_id"
#: The key of the last log of each flush of :class:`StorageJournalBackend` (its commit mark).
COMMIT_KEY = "ftnb_commit"
#: The study's name in the experiment's journal (unless ``study_name`` is given).
DEFAULT_STUDY_NAME = "ftnb"


class StorageJournalBackend(BaseJournalBackend):
    """Optuna's journal backend (``read_logs``/``append_logs``) over an ftnb
    :class:`~ftnb.storage.Storage`, for one writer (the experiment's owner).

    Logs are kept in memory (``read_logs`` never touches storage) and written by :meth:`flush`,
    all the logs since the last flush at once (a *commit*), each log one line of Optuna's
    journal format, the last of a commit marked ``"ftnb_commit": 1``.

    * On a local disk (and NFS) the journal is one file, ``path``, grown by one ``write()`` in
      append mode per commit: Optuna's ``JournalFileBackend`` (and so ``optuna-dashboard``)
      reads it as it is. A reader here takes the logs up to the last mark: a commit that a dying
      writer left half-written (lines without their mark, a torn line) is dropped whole, and
      removed before anything is appended.
    * On an object store (no appends) each commit is a new object beside ``path``,
      ``<name>.<first>-<last>.jsonl`` naming the commits it holds (one PUT: atomic); the newest
      are merged as they pile up, two of the same size into one (a binary counter: about
      log2(commits) objects to read, each log rewritten about log2(commits) times), and the
      pieces of a merge are deleted after it: a reader takes the longest run from the first
      commit on and ignores (then deletes) what it covers.

    >>> import optuna, tempfile  # doctest: +SKIP
    >>> from ftnb.storage import Storage
    >>> storage = Storage(tempfile.mkdtemp())
    >>> backend = StorageJournalBackend(storage, storage.join(storage.root, "study.jsonl"))
    >>> study = optuna.create_study(storage=optuna.storages.JournalStorage(backend))
    >>> backend.flush()
    """

    def __init__(self, storage: "Storage", path: str) -> None:
        self.storage = storage
        self.path = path
        self._logs: list[dict] = []
        self._pending: list[dict] = []
        self.guard: Optional[Callable[[], None]] = None  # the owner's check before a write
        #: Object stores: the segments of the chain, oldest first: (first, last, bytes).
        self._chain: list[tuple[int, int, bytes]] = []
        if storage.is_local:
            self._open_file()
        else:
            self._open_segments()

    # -- one file (a local disk) ----------------------------------------------------------------
    def _open_file(self) -> None:
        try:
            data = self.storage.read_bytes(self.path)
        except FileNotFoundError:
            data = None
        logs, committed = _committed_logs(data or b"", self.storage.uri(self.path))
        self._logs = logs
        whole = (data or b"")[:committed]
        if data is not None and len(data) != committed:
            # What a dying writer left after its last commit must not be built upon.
            self.storage.write_atomic(self.path, whole)
        self._log = self.storage.line_log(self.path, lambda: whole)

    # -- segments (an object store) ---------------------------------------------------------------
    def _segment_path(self, first: int, last: int) -> str:
        folder, name = self.path.rsplit("/", 1)
        stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
        return f"{folder}/{stem}.{first:08d}-{last:08d}.jsonl"

    def _open_segments(self) -> None:
        folder, name = self.path.rsplit("/", 1)
        stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
        pattern = re.compile(re.escape(stem) + r"\.(\d{8})-(\d{8})\.jsonl$")
        found = sorted(((int(m.group(1)), int(m.group(2))) for m in
                        map(pattern.match, self.storage.listdir(folder)) if m),
                       key=lambda r: (r[0], -r[1]))
        expected, chain, unused = 1, [], []
        for first, last in found:
            if first == expected:
                chain.append((first, last))
                expected = last + 1
            else:
                unused.append((first, last))  # covered by a merge (or after a gap: none)
        for first, last in chain:
            path = self._segment_path(first, last)
            data = self.storage.read_bytes(path)
            logs, committed = _committed_logs(data, self.storage.uri(path))
            if committed != len(data):
                raise ValueError(f"{self.storage.uri(path)}: a segment of the Optuna journal "
                                 "does not end with a commit: it is damaged")
            self._logs.extend(logs)
            self._chain.append((first, last, data))
        for first, last in unused:
            self.storage.remove(self._segment_path(first, last))

    def _commit_segment(self, data: bytes) -> None:
        number = self._chain[-1][1] + 1 if self._chain else 1
        self.storage.write_atomic(self._segment_path(number, number), data)
        self._chain.append((number, number, data))
        while len(self._chain) >= 2:
            (a1, b1, d1), (a2, b2, d2) = self._chain[-2], self._chain[-1]
            if b1 - a1 != b2 - a2:
                break
            self.storage.write_atomic(self._segment_path(a1, b2), d1 + d2)
            self._chain[-2:] = [(a1, b2, d1 + d2)]
            self.storage.remove(self._segment_path(a1, b1))
            self.storage.remove(self._segment_path(a2, b2))

    # -- Optuna's interface -------------------------------------------------------------------------
    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        return self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._logs.extend(logs)
        self._pending.extend(logs)

    @property
    def unflushed(self) -> int:
        """Logs appended since the last :meth:`flush`."""
        return len(self._pending)

    def flush(self) -> None:
        """Write the logs appended since the last flush: one commit."""
        if not self._pending:
            return
        if self.guard is not None:
            self.guard()
        *head, last = self._pending
        lines = [json.dumps(log, separators=(",", ":"), allow_nan=True) for log in head]
        lines.append(json.dumps({**last, COMMIT_KEY: 1}, separators=(",", ":"),
                                allow_nan=True))
        data = ("\n".join(lines) + "\n").encode("utf-8")
        if self.storage.is_local:
            self._log.append(data)
        else:
            self._commit_segment(data)
        self._pending = []

    def close(self) -> None:
        if self.storage.is_local:
            self._log.close()


def _committed_logs(data: bytes, where: str) -> tuple[list[dict], int]:
    """The logs of ``data`` up to its last commit mark, and that many bytes."""
    logs: list[dict] = []
    batch: list[dict] = []
    committed = offset = 0
    for number, line in enumerate(data.split(b"\n")[:-1]):  # no newline at the end: torn
        offset += len(line) + 1
        try:
            log = json.loads(line)
        except ValueError:
            raise ValueError(f"{where}: line {number + 1} is not JSON: the Optuna journal is "
                             "damaged") from None
        batch.append(log)
        if log.get(COMMIT_KEY):
            logs.extend(batch)
            batch = []
            committed = offset
    return logs, committed


def convert_search_space(space: dict) -> dict[str, BaseDistribution]:
    """Optuna distributions for the domains of an ftnb space, by ``"a/b"`` name (nested keys
    joined by ``/``, as in Ray Tune); Optuna distributions are taken as they are; plain values
    are left out (they stay the config's).

    Raises ValueError for what Optuna cannot sample: a ``grid_search``, ``randn``, a
    ``sample_from``, ``qlograndint``, a domain inside a list.
    """
    found = searched_domains(space, "OptunaSearch", leaves=(BaseDistribution,))
    return {name: value if isinstance(value, BaseDistribution) else _distribution(value, name)
            for name, value in found.items()}


def _distribution(domain: Domain, name: str) -> BaseDistribution:
    where = f"param_space[{name!r}] = {domain!r}"
    if isinstance(domain, Uniform):
        return FloatDistribution(domain.lower, domain.upper, step=domain.q)
    if isinstance(domain, LogUniform):
        if domain.q is not None:
            warnings.warn(f"OptunaSearch: {where}: Optuna cannot quantize a log-uniform "
                          "float; its q is dropped.", UserWarning, stacklevel=4)
        return FloatDistribution(domain.lower, domain.upper, log=True)
    if isinstance(domain, QLogRandInt):
        raise ValueError(f"OptunaSearch cannot sample {where}: Optuna has no quantized "
                         "log-uniform integers. Fix: use lograndint or qrandint.")
    if isinstance(domain, LogRandInt):
        return IntDistribution(domain.lower, domain.upper - 1, log=True)
    if isinstance(domain, QRandInt):
        return IntDistribution(domain.lower, domain.upper, step=domain.q)
    if isinstance(domain, RandInt):
        return IntDistribution(domain.lower, domain.upper - 1)
    if isinstance(domain, Categorical):
        bad = [c for c in domain.categories
               if c is not None and not isinstance(c, (bool, int, float, str))]
        if bad:
            raise ValueError(f"OptunaSearch cannot sample {where}: Optuna's categories must "
                             f"be None, bool, int, float or str (got {bad[0]!r}). Fix: choose "
                             "among names and build the objects in the trainable.")
        return CategoricalDistribution(domain.categories)
    raise ValueError(f"OptunaSearch cannot sample {where} ({domain.kind}): Optuna has no such "
                     "distribution. Fix: use uniform, loguniform, quniform, randint, qrandint, "
                     "lograndint or choice there.")


Space = Union[None, dict, Callable[[Any], Optional[dict]]]


class OptunaSearch(Searcher):
    """Optuna's samplers as a searcher (Ray Tune's ``ray.tune.search.optuna.OptunaSearch``).

    Args:
        space: what to search: None (the Tuner's ``param_space``: ftnb domains), a dict of ftnb
            domains or of Optuna distributions (``"a/b"`` names for nested keys), or a
            define-by-run function ``space(trial)`` that calls ``trial.suggest_*`` and may
            return a dict of constants to add to the config.
        metric, mode: what to optimize (default: ``TuneConfig(metric=..., mode=...)``); lists
            for a multi-objective study.
        points_to_evaluate: configs (whole or partial) to run first.
        sampler: an Optuna sampler (default ``TPESampler(seed=seed)``).
        study_name: the study's name in the journal (default ``"ftnb"``).
        storage: an Optuna storage of your own (default: the journal in the experiment's
            folder; with your own, its durability is its own).
        seed: the default sampler's seed.
        evaluated_rewards: the values of ``points_to_evaluate`` when they were evaluated
            already: they are added to the study as done, not run.

    Example::

        from ftnb.search.optuna import OptunaSearch

        tuner = ftnb.Tuner(train, param_space={"lr": ftnb.loguniform(1e-4, 1e-1)},
                           tune_config=ftnb.TuneConfig(metric="loss", mode="min",
                                                       search_alg=OptunaSearch(), num_samples=20))

    The study (``optuna_journal.jsonl`` in the experiment's folder) can be read with Optuna
    itself: ``optuna.load_study(study_name="ftnb", storage=JournalStorage(
    JournalFileBackend(path)))`` on a local disk; each Optuna trial carries the ftnb trial's id
    as its user attribute ``ftnb_trial_id``.
    """

    def __init__(self, space: Space = None, metric: Union[None, str, list] = None,
                 mode: Union[None, str, list] = None,
                 points_to_evaluate: Optional[list] = None, sampler: Any = None,
                 study_name: Optional[str] = None, storage: Any = None,
                 seed: Optional[int] = None, evaluated_rewards: Optional[list] = None) -> None:
        multi = isinstance(metric, list) or isinstance(mode, list)
        super().__init__(metric=None if multi else metric, mode=None if multi else mode)
        if multi:
            if not (isinstance(metric, list) and isinstance(mode, list)
                    and len(metric) == len(mode) and all(m in ("min", "max") for m in mode)):
                raise ValueError(
                    f"OptunaSearch(metric={metric!r}, mode={mode!r}): a multi-objective study "
                    "needs a list of metrics and a list of as many modes ('min'/'max').")
            self._metric, self._mode = list(metric), list(mode)
        if space is not None and not (isinstance(space, dict) or callable(space)):
            raise TypeError(f"OptunaSearch(space={space!r}) must be a dict of domains or Optuna "
                            "distributions, a define-by-run function, or None.")
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler):
            raise TypeError(f"OptunaSearch(sampler={sampler!r}) must be an optuna sampler "
                            "(optuna.samplers.TPESampler(), ...).")
        if sampler is not None and seed is not None:
            warnings.warn("OptunaSearch(sampler=..., seed=...): the seed goes to the default "
                          "sampler only; pass it to your sampler instead.", UserWarning,
                          stacklevel=2)
        if storage is not None and not isinstance(storage, optuna.storages.BaseStorage):
            raise TypeError(f"OptunaSearch(storage={storage!r}) must be an optuna storage.")
        if points_to_evaluate is not None and (
                not isinstance(points_to_evaluate, list)
                or not all(isinstance(p, dict) for p in points_to_evaluate)):
            raise TypeError("OptunaSearch(points_to_evaluate=...) must be a list of dicts "
                            "(partial configs), e.g. [{'lr': 0.01}].")
        if evaluated_rewards is not None and len(evaluated_rewards) != len(
                points_to_evaluate or []):
            raise ValueError("OptunaSearch(evaluated_rewards=...) needs one value per point of "
                             "points_to_evaluate.")
        self._given_space = space
        self._space: Optional[dict] = None  # name -> distribution (a dict space)
        self._define_by_run: Optional[Callable] = space if callable(space) else None
        if isinstance(space, dict) and space:
            self._space = _as_distributions(space)
        self._points = [dict(p) for p in points_to_evaluate or []]
        self._evaluated_rewards = evaluated_rewards
        self._sampler = sampler
        self._seed = seed
        self._study_name = study_name or DEFAULT_STUDY_NAME
        self._storage = storage
        self._user_storage = storage
        self._backend: Optional[StorageJournalBackend] = None
        self._study: Optional[optuna.Study] = None
        self._ot_trials: dict[str, optuna.Trial] = {}
        self._reported: dict[str, set] = {}  # steps already reported, by ftnb trial
        self._completed: set = set()

    # -- set-up --------------------------------------------------------------------------------
    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              config: dict, **spec: Any) -> bool:
        super().set_search_properties(metric, mode, config)
        if self._given_space:  # a space of its own (given again when prepared again: launch)
            self._check_ready()
            return False
        self._space = convert_search_space(config)
        self._check_ready()  # before the experiment's folder is written
        return True

    def attach_storage(self, paths: "ExperimentPaths", resuming: bool) -> None:
        if self._user_storage is None:  # (a searcher used again: this experiment's journal)
            self._backend = StorageJournalBackend(paths.storage, paths.optuna_journal)
            self._storage = optuna.storages.JournalStorage(self._backend)
        self._ot_trials, self._reported, self._completed = {}, {}, set()
        self._open_study()

    @property
    def study(self) -> optuna.Study:
        """The Optuna study (opened in memory when used outside an experiment)."""
        if self._study is None:
            self._open_study()
        assert self._study is not None
        return self._study

    def _check_ready(self) -> None:
        if self._space is None and self._define_by_run is None:
            raise no_space_error("OptunaSearch")
        if not self._metric or not self._mode:
            raise no_objective_error("OptunaSearch", self._metric, self._mode)

    def _open_study(self) -> None:
        self._check_ready()
        modes = self._mode if isinstance(self._mode, list) else [self._mode]
        directions = ["minimize" if m == "min" else "maximize" for m in modes]
        sampler = self._sampler or optuna.samplers.TPESampler(seed=self._seed)
        study = optuna.create_study(storage=self._storage, sampler=sampler,
                                    pruner=optuna.pruners.NopPruner(),
                                    study_name=self._study_name, load_if_exists=True,
                                    directions=directions)
        self._study = study
        trials = study.get_trials(deepcopy=False)
        if not trials:
            self._add_points(study)
        elif self._sampler is None:
            # A restored study: a sampler seeded as at the start would draw its first values
            # again (TPE's random start-up), suggesting configs twice. Seeded by the seed and
            # the trials so far: reproducible, and new.
            seed = None if self._seed is None else step_seed(self._seed, len(trials))
            study.sampler = optuna.samplers.TPESampler(seed=seed)
        else:
            study.sampler.reseed_rng()
        for frozen in trials:  # a restored study: its trials by ftnb trial id
            trial_id = frozen.user_attrs.get(TRIAL_ID_ATTR)
            if trial_id is None:
                continue
            if frozen.state.is_finished():
                self._completed.add(trial_id)
            else:
                self._ot_trials[trial_id] = optuna.Trial(study, frozen._trial_id)
            self._reported[trial_id] = set(frozen.intermediate_values)

    def _add_points(self, study: optuna.Study) -> None:
        for index, point in enumerate(self._points):
            params = flatten_dict(point)
            if self._space is not None:
                unknown = sorted(set(params) - set(self._space))
                if unknown:
                    raise ValueError(
                        f"OptunaSearch(points_to_evaluate=...): point {index} sets {unknown}, "
                        f"which the search space does not have (it has {sorted(self._space)}). "
                        "Fix: name the space's keys (nested keys as in the space).")
            if self._evaluated_rewards is not None:
                reward = self._evaluated_rewards[index]
                values = reward if isinstance(reward, list) else None
                study.add_trial(optuna.trial.create_trial(
                    params=params, distributions={k: self._space[k] for k in params}
                    if self._space else {}, value=None if values else reward, values=values))
            else:
                study.enqueue_trial(params)

    # -- searching -----------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> Suggestion:
        study = self.study
        trial = self._ot_trials.get(trial_id)
        if trial is None:
            if trial_id in self._completed:
                raise RuntimeError(f"OptunaSearch.suggest({trial_id!r}): that trial ended.")
            trial = study.ask(fixed_distributions=self._space) if self._define_by_run is None \
                else study.ask()
            trial.set_user_attr(TRIAL_ID_ATTR, trial_id)
            self._ot_trials[trial_id] = trial
            self._reported[trial_id] = set()
        # A trial suggested before (a restore that asks for it again) gets the same config:
        # Optuna returns the values a trial already has.
        if self._define_by_run is None:
            return unflatten_dict(dict(trial.params))
        returned = self._define_by_run(trial)
        if returned is not None and not isinstance(returned, dict):
            raise TypeError(f"OptunaSearch's define-by-run function returned {returned!r}: it "
                            "must return None or a dict of constants to add to the config.")
        return {**unflatten_dict(dict(trial.params)), **(returned or {})}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if isinstance(self._metric, list) or trial_id in self._completed:
            return
        trial = self._ot_trials.get(trial_id)
        value = metric_value(result, self._metric) if self._metric else None
        step = result.get("training_iteration")
        if trial is None or value is None or step is None:
            return
        reported = self._reported.setdefault(trial_id, set())
        if step in reported:  # a step redone after a restart from a checkpoint
            return
        trial.report(float(value), int(step))
        reported.add(step)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                          error: bool = False) -> None:
        if trial_id in self._completed:
            return  # told already (Optuna's record says so, after a restore)
        trial = self._ot_trials.pop(trial_id, None)
        self._completed.add(trial_id)
        if trial is None:
            return
        metrics = self._metric if isinstance(self._metric, list) else [self._metric]
        values = [metric_value(result, m) if result else None for m in metrics]
        state = TrialState.COMPLETE
        if any(v is None for v in values):
            state, values = (TrialState.FAIL if error else TrialState.PRUNED), None
        told: Any = values if values is None or len(values) > 1 else values[0]
        try:
            self.study.tell(trial, told, state=state)
        except Exception as exc:  # a NaN, a non-number: the trial fails in the study
            logger.warning("OptunaSearch: trial %s: %s; told Optuna it failed", trial_id, exc)
            self.study.tell(trial, state=TrialState.FAIL)

    def add_evaluated_point(self, parameters: dict, value: float, error: bool = False,
                            pruned: bool = False,
                            intermediate_values: Optional[list] = None) -> None:
        """Ray's ``add_evaluated_point``: a config evaluated elsewhere, added to the study."""
        if self._space is None:
            raise RuntimeError("OptunaSearch.add_evaluated_point needs a dict search space.")
        params = flatten_dict(parameters)
        state = TrialState.FAIL if error else TrialState.PRUNED if pruned else \
            TrialState.COMPLETE
        self.study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: self._space[k] for k in params},
            value=value if state == TrialState.COMPLETE else None, state=state,
            intermediate_values=dict(enumerate(intermediate_values or [], start=1))))

    def end_search(self, recorded: set) -> None:
        """Fail the Optuna trials asked for trial ids that never became ftnb trials (the
        driver died between Optuna's write and ftnb's, and the experiment ended before asking
        for that trial id again), so the study's trials are the experiment's."""
        if self._study is None:
            return
        for frozen in self._study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial_id = frozen.user_attrs.get(TRIAL_ID_ATTR)
            if trial_id is None or trial_id in recorded:
                continue
            self._study._storage.set_trial_user_attr(
                frozen._trial_id, "ftnb_note", "suggested, never run: the driver died before "
                "the trial was recorded, and the experiment ended before it was asked for again")
            self._study.tell(frozen.number, state=TrialState.FAIL)
            self._ot_trials.pop(trial_id, None)
            self._completed.add(trial_id)

    # -- state ---------------------------------------------------------------------------------
    def flush(self) -> None:
        if self._backend is not None:
            self._backend.flush()

    def set_guard(self, guard: Optional[Callable[[], None]]) -> None:
        """The owner's check (the lease) before each write of the journal."""
        if self._backend is not None:
            self._backend.guard = guard

    def get_state(self) -> dict:
        # The study itself is the state (in the journal); this says where it is.
        return {"study_name": self._study_name, "live": sorted(self._ot_trials),
                "completed": len(self._completed)}

    def set_state(self, state: dict) -> None:
        pass  # the study, read back from the journal by attach_storage, is the state

    def describe(self) -> Optional[dict]:
        if self._define_by_run is not None or self._sampler is not None or (
                self._user_storage is not None):
            return None  # code or objects: given again at a restore
        return {"class": "ftnb.search.optuna.OptunaSearch",
                "space": {k: optuna.distributions.distribution_to_json(v)
                          for k, v in (self._space or {}).items()}
                if isinstance(self._given_space, dict) else None,
                "metric": self._metric, "mode": self._mode,
                "points_to_evaluate": self._points, "study_name": self._study_name,
                "seed": self._seed, "evaluated_rewards": self._evaluated_rewards}

    def __repr__(self) -> str:
        return f"OptunaSearch(metric={self._metric!r}, mode={self._mode!r})"


def _as_distributions(space: dict) -> dict[str, BaseDistribution]:
    """A dict ``space``: Optuna distributions as they are, ftnb domains converted, nested keys
    as ``"a/b"`` names."""
    return convert_search_space(space)


def from_description(data: dict) -> OptunaSearch:
    """The OptunaSearch that :meth:`OptunaSearch.describe` described."""
    space = data.get("space")
    if space is not None:
        space = {k: optuna.distributions.json_to_distribution(v) for k, v in space.items()}
    metric, mode = data.get("metric"), data.get("mode")
    return OptunaSearch(space=space or None, metric=metric, mode=mode,
                        points_to_evaluate=data.get("points_to_evaluate") or None,
                        study_name=data.get("study_name"), seed=data.get("seed"),
                        evaluated_rewards=data.get("evaluated_rewards"))


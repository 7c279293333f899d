"""``HyperOptSearch``: HyperOpt's Tree-structured Parzen Estimator (TPE) as an ftnb searcher
(Ray Tune's ``ray.tune.search.hyperopt.HyperOptSearch``; ``pip install 'ftnb[hyperopt]'``).

It searches a Tune space (the Tuner's ``param_space`` or ``space=``) or HyperOpt's own ``hp.*``
space, conditional ones included (``hp.choice`` among dicts holding further ``hp.*``). Its state
is the points HyperOpt suggested (HyperOpt's ``vals``) and their outcomes, as JSON: a restore
builds HyperOpt's ``Trials`` again from them (:mod:`ftnb.search.observing`), so the study goes
on after a driver's death.

Example::

    from hyperopt import hp
    from ftnb.search import ConcurrencyLimiter
    from ftnb.search.hyperopt import HyperOptSearch

    space = {"lr": hp.loguniform("lr", -10, -1),
             "model": hp.choice("model", [{"kind": "mlp", "width": hp.quniform("width", 8, 64, 8)},
                                          {"kind": "linear"}])}
    search_alg = ConcurrencyLimiter(HyperOptSearch(space, metric="loss", mode="min"), 2)
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Optional

from .libraries import encoded_space, missing_library, plain, step_seed

try:
    import hyperopt as hpo
    from hyperopt.pyll import Apply
except ImportError:  # pragma: no cover - depends on the environment
    raise missing_library(__name__) from None

from .domains import Categorical, Domain, is_grid_search
from .flatten import flatten_dict
from .numeric import LogRandInt, LogUniform, Normal, QLogRandInt, QRandInt, RandInt, Uniform
from .observing import ObservingSearcher, grid_error
from .searcher import Suggestion
from .space_json import decode_space

__all__ = ["HyperOptSearch", "convert_search_space"]


class HyperOptSearch(ObservingSearcher):
    """HyperOpt's TPE (Ray Tune's ``HyperOptSearch``, the same arguments).

    Args:
        space: a dict of ``hp.*`` expressions (or of ftnb domains), or one HyperOpt expression;
            None: the Tuner's ``param_space``.
        metric, mode: what to optimize (default: ``TuneConfig(metric=..., mode=...)``).
        points_to_evaluate: configs to run first, by key (nested keys as ``"a/b"`` or nested
            dicts; for ``hp.*`` spaces, by HyperOpt label); a choice's value is given as the
            value (or, for a choice among dicts, as its index).
        n_initial_points: random points before TPE's model takes over (HyperOpt's
            ``n_startup_jobs``).
        random_state_seed: the seed of HyperOpt's draws (one drawn and kept when None).
        gamma: TPE's quantile that splits good points from the others.
    """

    @staticmethod
    def convert_search_space(spec: dict) -> Any:
        """Ray's ``HyperOptSearch.convert_search_space``: :func:`convert_search_space`."""
        return convert_search_space(spec)

    def __init__(self, space: Any = None, metric: Optional[str] = None,
                 mode: Optional[str] = None, points_to_evaluate: Optional[list] = None,
                 n_initial_points: Optional[int] = 20, random_state_seed: Optional[int] = None,
                 gamma: Optional[float] = 0.25) -> None:
        super().__init__(metric, mode, points_to_evaluate, random_state_seed,
                         "random_state_seed")
        if space is not None and not isinstance(space, (dict, Apply)):
            raise TypeError(f"HyperOptSearch(space={space!r}) must be a dict of hp.* "
                            "expressions or ftnb domains, a HyperOpt expression, or None.")
        algo: Any = hpo.tpe.suggest
        if n_initial_points is not None:
            algo = partial(algo, n_startup_jobs=n_initial_points)
        if gamma is not None:
            algo = partial(algo, gamma=gamma)
        self._algo = algo
        self._given_space = space
        self._n_initial_points, self._gamma = n_initial_points, gamma
        self._space: Any = None
        if isinstance(space, Apply) or space:
            self._space = convert_search_space(space)
        self._domain: Any = None
        self._trials: Any = None
        self._tids: dict[str, int] = {}
        self._checked: Optional[tuple] = None  # (the point _ask made, its config)

    def _has_space(self) -> bool:
        return self._space is not None

    def _take_space(self, config: dict) -> None:
        self._space = convert_search_space(config)

    def _new_optimizer(self) -> None:
        self._domain = hpo.Domain(lambda spc: spc, self._space)
        self._trials = hpo.Trials()
        self._tids = {}

    # -- points --------------------------------------------------------------------------------
    def _ask(self, trial_id: str, point: Optional[dict]) -> Suggestion:
        trials = self._trials
        tid = len(self._tids)
        if point is not None:
            doc = self._new_doc(tid, self._vals_of(point))
        else:
            trials.refresh()
            doc = self._algo([tid], self._domain, trials,
                             step_seed(self._seed, self.num_suggested))[0]
        vals = plain(doc["misc"]["vals"])
        # A point that does not fit the space fails here, before it runs; its config is kept
        # for the suggest that asked (evaluating HyperOpt's space is most of a suggestion).
        self._checked = (vals, self._config(vals))
        trials.insert_trial_docs([doc])
        trials.refresh()
        self._tids[trial_id] = tid
        return vals

    def _replay_ask(self, trial_id: str, point: Any) -> None:
        tid = len(self._tids)
        self._trials.insert_trial_docs([self._new_doc(tid, point)])
        self._trials.refresh()
        self._tids[trial_id] = tid

    def _new_doc(self, tid: int, vals: dict) -> dict:
        misc = {"tid": tid, "cmd": self._domain.cmd, "workdir": self._domain.workdir,
                "idxs": {label: [tid] if v else [] for label, v in vals.items()},
                "vals": {label: list(v) for label, v in vals.items()}}
        return self._trials.new_trial_docs([tid], [None], [{"status": hpo.STATUS_NEW}],
                                           [misc])[0]

    def _vals_of(self, point: dict) -> dict:
        """HyperOpt's ``vals`` of a point of ``points_to_evaluate``: every label, the given ones
        set (a choice's value as its index), the others inactive."""
        params = self._domain.params
        flat = flatten_dict(point)
        unknown = sorted(set(flat) - set(params))
        if unknown:
            raise ValueError(
                f"HyperOptSearch(points_to_evaluate=...): {point!r} sets {unknown}, which the "
                f"search space does not have (its HyperOpt labels are {sorted(params)}). Fix: "
                "name the space's labels (nested Tune keys as 'a/b').")
        choices = _choices(self._domain.expr)
        vals: dict[str, list] = {label: [] for label in params}
        for label, value in flat.items():
            if label in choices:
                value = _choice_index(label, choices[label], value)
            vals[label] = [value]
        return vals

    def _config(self, point: Any) -> dict:
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is point:
            return checked[1]
        spec = hpo.base.spec_from_misc({"vals": point})
        memo = self._domain.memo_from_config(spec)
        try:
            config = hpo.pyll.rec_eval(self._domain.expr, memo=memo,
                                       print_node_on_error=False)
        except (AssertionError, TypeError, KeyError) as exc:
            raise ValueError(
                f"HyperOptSearch: the point {spec!r} does not give the search space all it "
                "needs (a config in points_to_evaluate missing a key the space has, or one of "
                f"a choice's branch): {exc!r}. Fix: give every key the chosen branch uses."
            ) from None
        config = plain(config)
        if not isinstance(config, dict):
            raise TypeError(f"HyperOptSearch: the search space gave {config!r}, not a dict: "
                            "a space for ftnb is a dict (of hp.* expressions).")
        return config

    # -- outcomes ------------------------------------------------------------------------------
    def _tell(self, trial_id: str, value: Optional[float], error: bool) -> None:
        tid = self._tids.get(trial_id)
        doc = next((d for d in self._trials.trials if d["tid"] == tid), None)
        if doc is None:
            return
        now = hpo.utils.coarse_utcnow()
        doc["refresh_time"] = now
        if value is None:
            # An error, or no finite value of the metric: TPE leaves it out of its model.
            doc["state"] = hpo.JOB_STATE_ERROR
            doc["result"] = {"status": hpo.STATUS_FAIL}
            doc["misc"]["error"] = ("ftnb", "the trial errored" if error
                                    else "the trial reported no finite value of the metric")
        else:
            doc["state"] = hpo.JOB_STATE_DONE
            doc["result"] = {"loss": self.metric_op() * value, "status": hpo.STATUS_OK}
        self._trials.refresh()

    def _arguments(self) -> Optional[dict]:
        given = self._given_space  # (None, a dict of ftnb domains, or HyperOpt's hp.* space)
        space = encoded_space(given) if isinstance(given, dict) and given else None
        if (given is not None and not isinstance(given, dict)) or (given and space is None):
            return None  # (HyperOpt's own expressions: given again at a restore)
        return {"space": space, "n_initial_points": self._n_initial_points,
                "random_state_seed": self._seed, "gamma": self._gamma}

    @property
    def trials(self) -> Any:
        """HyperOpt's ``Trials`` (the points suggested and their outcomes)."""
        self._ensure_started()
        return self._trials


def from_description(data: dict) -> HyperOptSearch:
    """The HyperOptSearch that :meth:`HyperOptSearch.describe` described."""
    space = data.get("space")
    return HyperOptSearch(space=decode_space(space) if space else None,
                          metric=data.get("metric"), mode=data.get("mode"),
                          points_to_evaluate=data.get("points_to_evaluate") or None,
                          n_initial_points=data.get("n_initial_points"),
                          random_state_seed=data.get("random_state_seed"),
                          gamma=data.get("gamma"))


def _choices(expr: Any) -> dict[str, list]:
    """The options of each ``hp.choice`` of ``expr``, by label."""
    out = {}
    for node in hpo.pyll.dfs(expr):
        if node.name == "switch" and node.pos_args and \
                node.pos_args[0].name == "hyperopt_param":
            out[node.pos_args[0].arg["label"].obj] = list(node.pos_args[1:])
    return out


def _choice_index(label: str, options: list, value: Any) -> int:
    literals = [o.obj if o.name == "literal" else _NOT_LITERAL for o in options]
    for index, option in enumerate(literals):
        if option is not _NOT_LITERAL and option == value and type(option) is type(value):
            return index
    if value in literals:
        return literals.index(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(options) \
            and _NOT_LITERAL in literals:
        return value  # an index into a choice among dicts (conditional branches)
    shown = [o if o is not _NOT_LITERAL else "<a branch>" for o in literals]
    raise ValueError(f"HyperOptSearch(points_to_evaluate=...): {value!r} is not one of the "
                     f"choice {label!r}'s values {shown}. Fix: give one of them (for a choice "
                     "among dicts, its index).")


_NOT_LITERAL = object()


def convert_search_space(space: Any) -> Any:
    """A HyperOpt space for an ftnb space (Ray's ``HyperOptSearch.convert_search_space``): each
    domain becomes an ``hp.*`` expression labelled by its key path (``"a/b"``); ``hp.*``
    expressions and plain values stay as they are. Raises ValueError for a ``grid_search`` and
    what HyperOpt cannot sample (``sample_from``)."""
    if isinstance(space, Apply):
        return space

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, Domain):
            return _hp(value, path, walk)
        if is_grid_search(value):
            raise grid_error("HyperOptSearch", path)
        if isinstance(value, dict):
            return {key: walk(item, f"{path}/{key}" if path else str(key))
                    for key, item in value.items()}
        return value

    return walk(space or {}, "")


def _hp(domain: Domain, label: str, walk: Any) -> Any:
    hp, scope = hpo.hp, hpo.pyll.scope
    q = getattr(domain, "q", None)
    if isinstance(domain, Uniform):
        return hp.quniform(label, domain.lower, domain.upper, q) if q else \
            hp.uniform(label, domain.lower, domain.upper)
    if isinstance(domain, LogUniform):
        low, high = math.log(domain.lower), math.log(domain.upper)
        return hp.qloguniform(label, low, high, q) if q else hp.loguniform(label, low, high)
    if isinstance(domain, Normal):
        return hp.qnormal(label, domain.mean, domain.sd, q) if q else \
            hp.normal(label, domain.mean, domain.sd)
    if isinstance(domain, QRandInt):  # upper inclusive
        return scope.int(hp.quniform(label, domain.lower, domain.upper, domain.q))
    if isinstance(domain, QLogRandInt):  # upper inclusive
        return scope.int(hp.qloguniform(label, math.log(domain.lower),
                                        math.log(domain.upper), domain.q))
    if isinstance(domain, LogRandInt):  # upper exclusive
        return scope.int(hp.qloguniform(label, math.log(domain.lower),
                                        math.log(domain.upper - 1), 1.0))
    if isinstance(domain, RandInt):  # upper exclusive
        return hp.uniformint(label, domain.lower, domain.upper - 1)
    if isinstance(domain, Categorical):
        return hp.choice(label, [walk(c, f"{label}/{i}") if isinstance(c, (dict, Domain))
                                 else c for i, c in enumerate(domain.categories)])
    raise ValueError(f"HyperOptSearch cannot sample param_space[{label!r}] = {domain!r} "
                     f"({domain.kind}): HyperOpt has no such distribution. Fix: use uniform, "
                     "loguniform, randn, randint, qrandint, lograndint or choice there.")

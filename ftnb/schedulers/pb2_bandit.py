"""PB2's bandit: a GP-UCB over the bounded hyperparameters, with the time-varying kernel of
Population Based Bandits (Parker-Holder et al., 2020), fitted on the population's recent
reward changes. Pure functions over plain data; numpy, scipy and scikit-learn are imported
only here, when :func:`suggest` is first called (``pip install 'ftnb[pb2]'``).

The data (one row per trial and perturbation point, as :class:`ftnb.schedulers.PB2` records
it): ``{"trial": id, "time": t, "reward": r, "values": [x1, x2, ...]}`` with ``r`` signed
(higher is better) and ``values`` in the order of the bounds. A *change* is two consecutive rows
of one trial with the same values: the GP's input is where the interval started (time,
reward, values) and its target the reward gained per unit of time over it.

    >>> rows = [{"trial": "a", "time": t, "reward": 0.9 * t, "values": [0.9]} for t in (1, 2)]
    >>> rows += [{"trial": "b", "time": t, "reward": 0.1 * t, "values": [0.1]} for t in (1, 2)]
    >>> 0.0 <= suggest(rows, [(0.0, 1.0)], time=2, reward=1.8, seed=0)[0] <= 1.0
    True
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Optional, Sequence

__all__ = ["WINDOW", "reward_changes", "suggest", "time_varying_kernel"]

logger = logging.getLogger(__name__)

#: How many of the latest changes the GP is fitted on (Ray's ``select_length`` keeps at least
#: 200, choosing a longer window by likelihood; the time-varying kernel already discounts the
#: old ones, and a fit in the driver's loop must stay cheap).
WINDOW = 200

#: GP-UCB's exploration weight, as in the PB2 paper: beta = C1 + max(0, log(C2 * n)).
C1, C2 = 0.2, 0.4


def reward_changes(rows: Sequence[dict]) -> list[tuple[float, float, list, float]]:
    """The changes in ``rows`` (see the module), oldest first (by start time): ``(start_time,
    start_reward, values, reward gained per unit of time)``. Rows of one trial pair with that
    trial's previous row only when both have the same values (an exploit starts a new run of
    rows) and time went forward."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["time"], i))
    last: dict[str, dict] = {}
    changes = []
    for i in order:
        row = rows[i]
        before = last.get(row["trial"])
        last[row["trial"]] = row
        if before is None or list(before["values"]) != list(row["values"]):
            continue
        elapsed = row["time"] - before["time"]
        if elapsed <= 0:
            continue
        rate = (row["reward"] - before["reward"]) / elapsed
        if not all(math.isfinite(v) for v in (before["time"], before["reward"], rate)):
            continue  # (a score of inf or -inf says nothing a GP can fit)
        changes.append((float(before["time"]), float(before["reward"]), list(row["values"]),
                        rate))
    changes.sort(key=lambda c: c[0])
    return changes


def _imports() -> Any:
    try:
        import numpy as np
        from sklearn.gaussian_process import GaussianProcessRegressor  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"ftnb.schedulers.PB2 fits a Gaussian process with scikit-learn, which is not "
            f"installed ({exc}). Fix: pip install 'ftnb[pb2]' (or pip install scikit-learn).",
        ) from exc
    return np


def time_varying_kernel(variance: float = 1.0, lengthscale: float = 0.5,
                        epsilon: float = 0.1, noise: float = 0.1) -> Any:
    """The PB2 paper's kernel, as a scikit-learn kernel: ``(1 - epsilon) ** (|t - t'| / 2)``
    on the first column (time) times a squared exponential on the others, plus white noise.
    ``epsilon`` (how fast old data loses weight) is fitted with the other hyperparameters."""
    _imports()
    from sklearn.gaussian_process.kernels import WhiteKernel

    return _kernel_class()(variance, lengthscale, epsilon) + WhiteKernel(
        noise_level=noise, noise_level_bounds=(1e-6, 1.0))


_KERNEL: Any = None


def _kernel_class() -> Any:
    """The scikit-learn ``Kernel`` subclass (made on first use: sklearn is imported lazily)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import numpy as np
    from scipy.spatial.distance import cdist
    from sklearn.gaussian_process.kernels import Hyperparameter, Kernel

    class TimeVaryingSquaredExp(Kernel):
        """``variance * exp(-|z - z'|^2 / (2 lengthscale^2)) * (1 - epsilon) ** (|t - t'| / 2)``
        over rows ``(t, z...)``. Hyperparameters in scikit-learn's (alphabetical) order:
        epsilon, lengthscale, variance."""

        def __init__(self, variance: float = 1.0, lengthscale: float = 0.5,
                     epsilon: float = 0.1, variance_bounds: tuple = (1e-3, 1e3),
                     lengthscale_bounds: tuple = (1e-2, 1.0),
                     epsilon_bounds: tuple = (1e-5, 0.5)) -> None:
            self.variance = variance
            self.lengthscale = lengthscale
            self.epsilon = epsilon
            self.variance_bounds = variance_bounds
            self.lengthscale_bounds = lengthscale_bounds
            self.epsilon_bounds = epsilon_bounds

        @property
        def hyperparameter_epsilon(self) -> Any:
            return Hyperparameter("epsilon", "numeric", self.epsilon_bounds)

        @property
        def hyperparameter_lengthscale(self) -> Any:
            return Hyperparameter("lengthscale", "numeric", self.lengthscale_bounds)

        @property
        def hyperparameter_variance(self) -> Any:
            return Hyperparameter("variance", "numeric", self.variance_bounds)

        def __call__(self, X: Any, Y: Any = None, eval_gradient: bool = False) -> Any:
            X = np.atleast_2d(X)
            if Y is not None and eval_gradient:
                raise ValueError("Gradient can only be evaluated when Y is None.")
            Y = X if Y is None else np.atleast_2d(Y)
            elapsed = np.abs(X[:, :1] - Y[:, :1].T)
            squared = cdist(X[:, 1:], Y[:, 1:], "sqeuclidean")
            decay = (1.0 - self.epsilon) ** (elapsed / 2.0)
            K = self.variance * np.exp(-squared / (2.0 * self.lengthscale ** 2)) * decay
            if not eval_gradient:
                return K
            # d K / d log(theta), in the order of the hyperparameters (epsilon, lengthscale,
            # variance), for the fixed ones nothing.
            gradients = []
            if not self.hyperparameter_epsilon.fixed:
                gradients.append(-K * (elapsed / 2.0) * self.epsilon / (1.0 - self.epsilon))
            if not self.hyperparameter_lengthscale.fixed:
                gradients.append(K * squared / self.lengthscale ** 2)
            if not self.hyperparameter_variance.fixed:
                gradients.append(K)
            return K, np.stack(gradients, axis=2) if gradients else np.empty(K.shape + (0,))

        def diag(self, X: Any) -> Any:
            return np.full(np.atleast_2d(X).shape[0], float(self.variance))

        def is_stationary(self) -> bool:
            return False

    _KERNEL = TimeVaryingSquaredExp
    return _KERNEL


def _scaled(values: Any, low: Any, high: Any) -> Any:
    return (values - low) / (high - low + 1e-8)


def suggest(rows: Sequence[dict], bounds: Sequence[tuple[float, float]], *, time: float,
            reward: float, pending: Optional[Sequence[Sequence[float]]] = None,
            seed: Optional[int] = None) -> Optional[list[float]]:
    """The values (one per bound, within it) GP-UCB picks for a trial that continues from
    ``time`` at ``reward`` (the donor's), given the population's ``rows``; None when there is
    no change to learn from yet.

    ``pending``: values already picked at this point for other trials (not yet observed); they
    lower the variance around themselves (GP-BUCB, as Ray's PB2), so one batch spreads out.
    ``seed`` makes it deterministic.
    """
    _imports()
    from threadpoolctl import threadpool_limits  # (a dependency of scikit-learn)

    # One BLAS thread: the fits are small, and the driver shares the machine with the trials
    # (OpenBLAS's threads on a busy machine made a 200-point fit 10 times slower).
    with threadpool_limits(limits=1):
        return _suggest(rows, bounds, time, reward, pending, seed)


def _suggest(rows: Sequence[dict], bounds: Sequence[tuple[float, float]], time: float,
             reward: float, pending: Optional[Sequence[Sequence[float]]],
             seed: Optional[int]) -> Optional[list[float]]:
    import numpy as np
    from scipy.optimize import minimize
    from sklearn.gaussian_process import GaussianProcessRegressor

    changes = reward_changes(rows)[-WINDOW:]
    if not changes:
        return None
    low = np.array([float(b[0]) for b in bounds])
    high = np.array([float(b[1]) for b in bounds])
    fixed = np.array([[c[0], c[1]] for c in changes])
    # Time and reward scaled to [0, 1] over the data and the new interval's start (which is
    # usually later than every start in the data).
    start = np.array([time, reward], dtype=float)
    fixed_low = np.minimum(fixed.min(axis=0), start)
    fixed_high = np.maximum(fixed.max(axis=0), start)
    X = np.hstack([_scaled(fixed, fixed_low, fixed_high),
                   _scaled(np.array([c[2] for c in changes], dtype=float), low, high)])
    y = np.array([c[3] for c in changes])
    y = np.clip((y - y.mean()) / (y.std() + 1e-8), -2.0, 2.0)
    here = _scaled(start, fixed_low, fixed_high)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (scikit-learn's convergence warnings at bounds)
            model = GaussianProcessRegressor(kernel=time_varying_kernel(), normalize_y=False)
            model.fit(X, y)
            spread = model
            if pending:
                extra = np.hstack([np.tile(here, (len(pending), 1)),
                                   _scaled(np.array(pending, dtype=float), low, high)])
                # The variance does not depend on the targets: zeros stand in for the unknown.
                spread = GaussianProcessRegressor(kernel=model.kernel_, optimizer=None)
                spread.fit(np.vstack([X, extra]), np.concatenate([y, np.zeros(len(extra))]))
    except (np.linalg.LinAlgError, ValueError) as exc:  # (a kernel matrix it cannot factor)
        logger.warning("[pb2]: the Gaussian process could not be fitted on %d score changes "
                       "(%s); no suggestion this time", len(X), exc)
        return None

    kappa = math.sqrt(C1 + max(0.0, math.log(C2 * len(X))))

    def ucb(points: Any) -> Any:
        points = np.atleast_2d(points)
        inputs = np.hstack([np.tile(here, (len(points), 1)), points])
        mean = model.predict(inputs)
        _, std = spread.predict(inputs, return_std=True)
        return mean + kappa * std ** 2

    rng = np.random.default_rng(seed)
    dims = len(bounds)
    candidates = rng.uniform(0.0, 1.0, (512, dims))
    scores = ucb(candidates)
    best, best_score = candidates[int(np.argmax(scores))], float(scores.max())
    for start in candidates[np.argsort(scores)[-5:]]:
        found = minimize(lambda x: -float(ucb(x)[0]), start, method="L-BFGS-B",
                         bounds=[(0.0, 1.0)] * dims, options={"maxiter": 50})
        value = float(ucb(np.clip(found.x, 0.0, 1.0))[0])
        if value > best_score:
            best, best_score = np.clip(found.x, 0.0, 1.0), value
    return [float(v) for v in np.clip(low + best * (high - low), low, high)]

"""Ray Tune's example trainable (``ray.tune.utils.mock_trainable``), for scripts and docs that
use it::

    from ftnb.utils.mock_trainable import MyTrainableClass

    ftnb.Tuner(MyTrainableClass, param_space={"width": ftnb.randint(10, 100),
                                              "height": ftnb.randint(0, 100)}).fit()

Its learning curve is ``height * tanh(timestep / width)``, reported as ``episode_reward_mean``;
``sleep`` (seconds per step), ``mock_error`` (fail after the first step, until restored from a
checkpoint) and ``persistent_error`` (fail after every restore too) come from the config.
"""

from __future__ import annotations

import json
import math
import os
import time

from ..trainable_class import Trainable

__all__ = ["MOCK_ERROR_KEY", "MOCK_TRAINABLE_NAME", "MyTrainableClass"]

MOCK_TRAINABLE_NAME = "mock_trainable"
MOCK_ERROR_KEY = "mock_error"


class MyTrainableClass(Trainable):
    """Example agent whose learning curve is a random sigmoid: the hyperparameters ``width``
    and ``height`` set its slope and the reward it reaches (Ray's ``MyTrainableClass``)."""

    def setup(self, config: dict) -> None:
        self._sleep_time = config.get("sleep", 0)
        self._mock_error = config.get(MOCK_ERROR_KEY, False)
        self._persistent_error = config.get("persistent_error", False)
        self.timestep = 0
        self.restored = False

    def step(self) -> dict:
        if self._mock_error and self.timestep > 0 and (
                self._persistent_error or not self.restored):
            raise RuntimeError(f"Failing on purpose! {self.timestep=}")
        if self._sleep_time > 0:
            time.sleep(self._sleep_time)
        self.timestep += 1
        value = math.tanh(float(self.timestep) / self.config.get("width", 1))
        return {"episode_reward_mean": value * self.config.get("height", 1)}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "checkpoint"), "w") as f:
            f.write(json.dumps({"timestep": self.timestep}))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "checkpoint")) as f:
            self.timestep = json.loads(f.read())["timestep"]
        self.restored = True

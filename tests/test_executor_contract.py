"""The executor contract (ftnb/execution/contract.py): the suite of
:mod:`ftnb.testing.executor_contract`, run over every executor of ftnb.

Each test gets a fresh executor ("local": real processes killed with real signals; "inprocess":
threads of this process; "ray": actors of a local Ray of 2 CPUs) with a pool of two CPUs, and an
experiment folder in tmp_path. A new executor is done when this suite passes on it.
"""

from __future__ import annotations

import pytest

from ftnb.testing.executor_contract import ExecutorContract


class TestLocalProcessExecutor(ExecutorContract):
    executor_name = "local"


class TestInProcessExecutor(ExecutorContract):
    executor_name = "inprocess"
    killed_attempts_run_on = True  # a thread cannot be killed outright


@pytest.mark.ray
class TestRayExecutor(ExecutorContract):
    executor_name = "ray"

    @pytest.fixture(autouse=True)
    def _local_ray(self, ray_instance):
        """A local Ray of 2 CPUs (skipped when ray is not installed)."""

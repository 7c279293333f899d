"""Test suites a third party runs on its own backends (these modules import pytest; ``import
ftnb`` never imports them).

* :mod:`ftnb.testing.executor_contract`: :class:`~ftnb.testing.executor_contract.ExecutorContract`,
  the executor contract (:mod:`ftnb.execution.contract`) as tests. An executor is done when the
  suite passes on it.
"""

"""Ray's gradient-boosting callbacks (issue 31, item 3), in Ray's example scripts with only the
imports changed, on real trial processes: ``TuneReportCheckpointCallback`` of
``ftnb.integration.xgboost`` / ``.lightgbm`` (metrics as a list or a renaming dict, filename,
frequency, checkpoint_at_end, results_postprocessing_fn for ``cv``, ``get_model``) and
``RayTrainReportCallback`` of ``ftnb.train.xgboost`` / ``.lightgbm``; bad arguments and a
missing library are clear errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ftnb

xgb = pytest.importorskip("xgboost")
lgb = pytest.importorskip("lightgbm")


def _data():
    from sklearn.datasets import load_breast_cancer

    data, labels = load_breast_cancer(return_X_y=True)
    return data[:400], labels[:400], data[400:], labels[400:]


def train_breast_cancer(config):
    """Ray's tune/examples/xgboost_example.py, imports changed."""
    from ftnb.integration.xgboost import TuneReportCheckpointCallback

    train_x, train_y, test_x, test_y = _data()
    train_set = xgb.DMatrix(train_x, label=train_y)
    test_set = xgb.DMatrix(test_x, label=test_y)
    xgb.train(config["params"], train_set, num_boost_round=5, evals=[(test_set, "eval")],
              verbose_eval=False,
              callbacks=[TuneReportCheckpointCallback(
                  metrics={"loss": "eval-logloss", "error": "eval-error"}, frequency=2)])


def _fit(tmp_path, name, trainable, space, **tune):
    return ftnb.Tuner(trainable, param_space=space, tune_config=ftnb.TuneConfig(**tune),
                      run_config=ftnb.RunConfig(storage_path=str(tmp_path), name=name,
                                                verbose=0)).fit()


def _checkpointed(result):
    rows = result.metrics_dataframe
    return list(rows["training_iteration"][rows["checkpoint_dir_name"].notna()])


def test_rays_xgboost_example(tmp_path):
    from ftnb.integration.xgboost import TuneReportCheckpointCallback

    space = {"params": {"objective": "binary:logistic", "eval_metric": ["logloss", "error"],
                        "max_depth": ftnb.grid_search([2, 4]), "eta": 0.3}}
    results = _fit(tmp_path, "xgb", train_breast_cancer, space, metric="loss", mode="min")
    assert not results.errors
    for result in results:
        # As in Ray: a report per round, every 2nd with a checkpoint, and one more at the end
        # (the last round's metrics with the final model) since round 5 had none.
        assert list(result.metrics_dataframe["training_iteration"]) == [1, 2, 3, 4, 5, 6]
        assert _checkpointed(result) == [2, 4, 6]
        assert set(result.metrics) >= {"loss", "error"}
    best = results.get_best_result()
    booster = TuneReportCheckpointCallback.get_model(best.checkpoint)
    assert booster.num_boosted_rounds() == 5
    _, _, test_x, test_y = _data()
    predictions = booster.predict(xgb.DMatrix(test_x))
    logloss = -np.mean(test_y * np.log(predictions) + (1 - test_y) * np.log(1 - predictions))
    assert logloss == pytest.approx(best.metrics["loss"], rel=1e-3)


def xgb_cv(config):
    from ftnb.integration.xgboost import TuneReportCheckpointCallback

    train_x, train_y, _, _ = _data()
    xgb.cv({"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 2},
           xgb.DMatrix(train_x, label=train_y), num_boost_round=3, nfold=2, seed=0,
           callbacks=[TuneReportCheckpointCallback(
               metrics=["test-logloss"], checkpoint_at_end=False,
               results_postprocessing_fn=lambda r: {k: v[0] for k, v in r.items()})])


def test_xgboost_cv_with_results_postprocessing(tmp_path):
    (result,) = _fit(tmp_path, "cv", xgb_cv, {})
    rows = result.metrics_dataframe
    assert list(rows["training_iteration"]) == [1, 2, 3]
    assert rows["test-logloss"].is_monotonic_decreasing  # the folds' mean, a number
    assert result.checkpoint is None


def train_lightgbm(config):
    """Ray's tune/examples/lightgbm_example.py, imports changed."""
    from ftnb.integration.lightgbm import TuneReportCheckpointCallback

    train_x, train_y, test_x, test_y = _data()
    lgb.train({"objective": "binary", "metric": ["binary_error", "binary_logloss"],
               "verbose": -1, "num_leaves": config["num_leaves"]},
              lgb.Dataset(train_x, label=train_y), num_boost_round=4,
              valid_sets=[lgb.Dataset(test_x, label=test_y)], valid_names=["eval"],
              callbacks=[TuneReportCheckpointCallback(
                  metrics={"binary_error": "eval-binary_error",
                           "binary_logloss": "eval-binary_logloss"},
                  filename="booster.txt", frequency=3)])


def test_rays_lightgbm_example(tmp_path):
    from ftnb.integration.lightgbm import TuneReportCheckpointCallback

    results = _fit(tmp_path, "lgb", train_lightgbm, {"num_leaves": ftnb.grid_search([3, 7])},
                   metric="binary_error", mode="min")
    assert not results.errors
    for result in results:
        assert list(result.metrics_dataframe["training_iteration"]) == [1, 2, 3, 4]
        assert _checkpointed(result) == [3, 4]
    best = results.get_best_result()
    booster = TuneReportCheckpointCallback.get_model(best.checkpoint, filename="booster.txt")
    assert booster.current_iteration() == 4


def train_with_train_names(config):
    from ftnb.train.lightgbm import RayTrainReportCallback as LightGBMCallback
    from ftnb.train.xgboost import RayTrainReportCallback as XGBoostCallback

    train_x, train_y, _, _ = _data()
    if config["library"] == "xgboost":
        dtrain = xgb.DMatrix(train_x, label=train_y)
        xgb.train({"objective": "binary:logistic"}, dtrain, num_boost_round=2,
                  evals=[(dtrain, "train")], verbose_eval=False,
                  callbacks=[XGBoostCallback(metrics="train-logloss")])
    else:
        dtrain = lgb.Dataset(train_x, label=train_y)
        lgb.train({"objective": "binary", "verbose": -1}, dtrain, num_boost_round=2,
                  valid_sets=[dtrain], valid_names=["train"],
                  callbacks=[LightGBMCallback(metrics="train-binary_logloss")])


def test_the_train_names_report_and_checkpoint_at_the_end(tmp_path):
    from ftnb.train.lightgbm import RayTrainReportCallback as LightGBMCallback
    from ftnb.train.xgboost import RayTrainReportCallback as XGBoostCallback

    results = _fit(tmp_path, "train", train_with_train_names,
                   {"library": ftnb.grid_search(["xgboost", "lightgbm"])})
    assert not results.errors
    by_library = {r.config["library"]: r for r in results}
    assert XGBoostCallback.get_model(by_library["xgboost"].checkpoint).num_boosted_rounds() == 2
    assert LightGBMCallback.get_model(by_library["lightgbm"].checkpoint).current_iteration() == 2
    assert "train-logloss" in by_library["xgboost"].metrics


def test_bad_arguments_are_named():
    from ftnb.integration.xgboost import TuneReportCheckpointCallback

    with pytest.raises(TypeError, match=r"TuneReportCheckpointCallback\(metrics=3\)"):
        TuneReportCheckpointCallback(metrics=3)
    with pytest.raises(ValueError, match=r"frequency=-1"):
        TuneReportCheckpointCallback(frequency=-1)
    with pytest.raises(ValueError, match=r"filename='a/b'"):
        TuneReportCheckpointCallback(filename="a/b")


def test_a_metric_the_library_does_not_log_is_named():
    from ftnb.integration.lightgbm import TuneReportCheckpointCallback
    from ftnb.session import UsageError

    callback = TuneReportCheckpointCallback(metrics={"loss": "eval-logloss"})
    with pytest.raises(UsageError, match=r"'eval-logloss'.*it logs: eval-binary_logloss"):
        callback._settings.report_dict({"eval": {"binary_logloss": 0.3}}, last_only=False)


@pytest.mark.parametrize("module, extra", [("ftnb.integration.xgboost", "xgboost"),
                                           ("ftnb.train.lightgbm", "lightgbm")])
def test_a_missing_library_names_the_extra(module, extra):
    code = (f"import sys; sys.modules[{extra!r}] = None\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert f"pip install 'ftnb[{extra}]'" in out

"""Bad input to TorchTrainer and ScalingConfig: a clear error naming the argument, the value and
the fix, raised before anything is written."""

from __future__ import annotations

import pytest

import ftnb


def loop(config):
    ftnb.report({"x": 1})


def _nothing_written(tmp_path):
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("kwargs, words", [
    ({"num_workers": -1}, ["ScalingConfig(num_workers=-1)", "Fix: ScalingConfig(num_workers=2)"]),
    ({"num_workers": 2.0}, ["ScalingConfig(num_workers=2.0)", "whole number"]),
    ({"use_gpu": "yes"}, ["ScalingConfig(use_gpu='yes')", "True or False"]),
    ({"collective_timeout_s": 0}, ["collective_timeout_s=0", "Fix:"]),
    ({"resources_per_worker": {"GPU": 1}}, ["asks for GPUs but use_gpu=False",
                                             "Fix: ScalingConfig(use_gpu=True"]),
    ({"use_gpu": True, "resources_per_worker": {"GPU": 0}}, ["gives each rank no GPU"]),
    ({"num_workers": 2, "use_gpu": True, "resources_per_worker": {"GPU": 0.5}},
     ["cannot share a GPU", "Fix: give each rank a whole GPU"]),
    ({"resources_per_worker": {"TPU": 1}}, ["unknown key 'TPU'", "resources_per_worker"]),
    ({"placement_strategy": "SPRED"}, ["placement_strategy='SPRED'"]),
    ({"num_workers": (0, 2)}, ["ScalingConfig(num_workers=(0, 2)) is not an elastic range",
                               "1 <= min <= max", "Fix: ScalingConfig(num_workers=(2, 4))"]),
    ({"num_workers": (4, 2)}, ["ScalingConfig(num_workers=(4, 2))", "1 <= min <= max"]),
    ({"num_workers": (1.5, 2)}, ["ScalingConfig(num_workers=(1.5, 2))", "two whole numbers"]),
    ({"num_workers": (True, 2)}, ["ScalingConfig(num_workers=(True, 2))", "two whole numbers"]),
    ({"num_workers": (1, 2, 3)}, ["ScalingConfig(num_workers=(1, 2, 3))", "two whole numbers"]),
    ({"num_workers": "2:4"}, ["ScalingConfig(num_workers='2:4')", "elastic range (min, max)"]),
    ({"num_workers": (1, 2), "use_gpu": True, "resources_per_worker": {"GPU": 0.5}},
     ["an elastic group cannot give its ranks fractional GPUs", "Fix: 'GPU': 1 per rank"]),
    ({"num_workers": (1, 2), "elastic_resize_monitor_interval_s": 0},
     ["elastic_resize_monitor_interval_s=0", "number of seconds > 0", "Fix:"]),
    ({"num_workers": (1, 2), "elastic_resize_monitor_interval_s": float("inf")},
     ["elastic_resize_monitor_interval_s=inf"]),
])
def test_scaling_config_refuses_bad_values(kwargs, words):
    with pytest.raises((TypeError, ValueError)) as info:
        ftnb.ScalingConfig(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_scaling_config_takes_rays_elastic_range_and_local_mode():
    elastic = ftnb.ScalingConfig(num_workers=[2, 4], elastic_resize_monitor_interval_s=5)
    assert elastic.num_workers == (2, 4) and elastic.elastic
    assert (elastic.min_workers, elastic.max_workers) == (2, 4)
    assert elastic.total_resources == {"CPU": 4.0, "GPU": 0.0}  # what it asks for: max
    fixed = ftnb.ScalingConfig(num_workers=(3, 3))
    assert not fixed.elastic and fixed.max_workers == 3
    local = ftnb.ScalingConfig(num_workers=0)
    assert local.local_mode and not local.elastic and local.total_resources["CPU"] == 1.0
    assert ftnb.ScalingConfig().elastic_resize_monitor_interval_s == 60.0  # Ray's default


def test_scaling_config_resources():
    assert ftnb.ScalingConfig(num_workers=3).total_resources == {"CPU": 3.0, "GPU": 0.0}
    gpu = ftnb.ScalingConfig(num_workers=2, use_gpu=True)
    assert gpu.worker_resources().gpu == 1 and gpu.total_resources["GPU"] == 2


def test_trainer_refuses_what_cannot_run(tmp_path):
    with pytest.raises(TypeError, match=r"train_loop_per_worker=\.\.\.\) must be a function"):
        ftnb.TorchTrainer(42)  # not a function
    with pytest.raises(TypeError, match=r"must take one argument .* or none.*Fix: define"):
        ftnb.TorchTrainer(lambda a, b: None)
    with pytest.raises(TypeError, match=r"train_loop_config=\.\.\.\) must be a dict"):
        ftnb.TorchTrainer(loop, train_loop_config=[1])
    with pytest.raises(TypeError, match=r"scaling_config=\.\.\.\) must be an ftnb.ScalingConfig"):
        ftnb.TorchTrainer(loop, scaling_config={"num_workers": 2})
    with pytest.raises(TypeError, match=r"datasets=\.\.\.\) must be a dict of names"):
        ftnb.TorchTrainer(loop, datasets=[1, 2])
    trainer = ftnb.TorchTrainer(loop, run_config=ftnb.RunConfig(
        name="x", storage_path=str(tmp_path / "runs")))
    with pytest.raises(ValueError, match=r"resources_per_trial.*Fix: leave resources_per_trial"):
        ftnb.Tuner(trainer, resources_per_trial={"cpu": 2})
    with pytest.raises(ValueError, match=r"has the key 'lr'.*Fix: param_space=\{'train_loop_config'"):
        ftnb.Tuner(trainer, param_space={"lr": 0.1})
    _nothing_written(tmp_path)


def test_a_group_bigger_than_the_machine_is_refused_before_anything_is_written(tmp_path):
    trainer = ftnb.TorchTrainer(
        loop, scaling_config=ftnb.ScalingConfig(num_workers=64, resources_per_worker={"CPU": 1}),
        run_config=ftnb.RunConfig(name="big", storage_path=str(tmp_path / "runs"), verbose=0))
    with pytest.raises(ValueError) as info:
        trainer.fit()
    message = str(info.value)
    assert "ScalingConfig(num_workers=64" in message and "Fix: fewer workers" in message
    _nothing_written(tmp_path)


@pytest.mark.parametrize("scaling, words", [
    ({"num_workers": 1, "use_gpu": True},
     ["TorchTrainer(scaling_config=ScalingConfig(num_workers=1, use_gpu=True)) cannot run on "
      "this machine: use_gpu=True gives each rank a GPU, and this machine has no GPU",
      "Fix: ScalingConfig(use_gpu=False) to train on the CPUs", "set CUDA_VISIBLE_DEVICES (or "
      "FTNB_NUM_GPUS)", "or run on a Ray cluster with GPUs"]),
    ({"num_workers": 2, "use_gpu": True, "resources_per_worker": {"CPU": 0.5}},
     ["ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={'cpu': 0.5, 'gpu': 1})",
      "this machine has no GPU"]),
])
def test_gpus_on_a_machine_without_one_are_refused_in_the_scaling_configs_words(
        tmp_path, monkeypatch, scaling, words):
    monkeypatch.setenv("FTNB_NUM_GPUS", "0")  # this machine has no GPU, whatever it has
    trainer = ftnb.TorchTrainer(
        loop, scaling_config=ftnb.ScalingConfig(**scaling),
        run_config=ftnb.RunConfig(name="gpu", storage_path=str(tmp_path / "runs"), verbose=0))
    for run in (trainer.fit, ftnb.Tuner(trainer).fit):
        with pytest.raises(ValueError) as info:
            run()
        for word in words:
            assert word in str(info.value)
        assert "resources_per_trial" not in str(info.value)
        _nothing_written(tmp_path)


def test_settings_given_by_position_name_their_keyword():
    with pytest.raises(TypeError, match=r"Fix: TorchTrainer\(train_loop_per_worker, "
                                        r"train_loop_config=\{'lr': 0.1\}\)"):
        ftnb.TorchTrainer(loop, {"lr": 0.1})
    with pytest.raises(TypeError, match=r"scaling_config=ScalingConfig\(\.\.\.\)"):
        ftnb.TorchTrainer(loop, ftnb.ScalingConfig(num_workers=2))


def test_ray_style_names_are_importable():
    from ftnb import ScalingConfig, TorchConfig, TorchTrainer, TrainingFailedError  # noqa: F401

    assert ftnb.get_dataset_shard is ftnb.session.get_dataset_shard
    with pytest.raises(RuntimeError, match="outside a trial"):
        ftnb.get_dataset_shard("train")
    with pytest.raises(ValueError, match="backend='mpi'"):
        ftnb.TorchConfig(backend="mpi")

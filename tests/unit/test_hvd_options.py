"""Horovod's options without a launcher: what the fit loop refuses (read from the bindings'
tables), what the seam refuses from this stack's table, and what a world size or controller
refuses (the HOROVOD_* variables they set: test_rank_env.py)."""
from __future__ import annotations

import dataclasses

import pytest

from hvdtrain import cli, config
from hvdtrain.training import preflight
from hvdtrain.config import capabilities, overrides, presets
from hvdtrain.config import HorovodConfig
from hvdtrain.errors import UserError
from stack import keras3


@pytest.mark.parametrize("size, controller, fragment", [
    (3, "mpi", "power-of-two number of ranks, got 3: launch 2 or 4 ranks"),
    (6, "mpi", "got 6: launch 4 or 8 ranks"),
    (2, "gloo", "needs Horovod's MPI controller"),
])
def test_adasum_refuses_worlds_it_cannot_run(size, controller, fragment):
    problem = preflight.world_problem(HorovodConfig(op="adasum"), size, controller)
    assert problem and fragment in problem


@pytest.mark.parametrize("size, controller", [(1, "gloo"), (2, "mpi"), (4, "mpi"), (8, "mpi")])
def test_adasum_accepts_powers_of_two_over_mpi(size, controller):
    assert preflight.world_problem(HorovodConfig(op="adasum"), size, controller) is None


def test_average_runs_anywhere():
    assert preflight.world_problem(HorovodConfig(), 3, "gloo") is None


def test_tensorboard_logs_without_the_package_are_refused_with_one_line(monkeypatch):
    on, off = presets.build_config("digits"), presets.build_config(
        "digits", None, ["run.tensorboard=false"])
    assert preflight.tensorboard_problem(on) is None  # installed here (a dependency)
    monkeypatch.setattr(preflight.importlib.util, "find_spec",
                        lambda name: None if name == "tensorboard" else object())
    assert preflight.tensorboard_problem(on).startswith("run.tensorboard is on but the "
                                                        "tensorboard package is not installed")
    assert preflight.tensorboard_problem(off) is None  # control: logs off, nothing needed


@pytest.mark.parametrize("assignment, fragment", [
    ("horovod.backward_passes_per_step=2", "backward_passes_per_step>1 needs the custom loop"),
    ("horovod.join_uneven=true", "join_uneven=true needs the custom loop"),
])
def test_fit_refuses_what_only_the_custom_loop_does(assignment, fragment):
    with pytest.raises(UserError, match="pass --loop custom") as err:
        presets.build_config("digits", None, [assignment])
    assert fragment in str(err.value)
    cfg = presets.build_config("digits", None, [assignment, "train.loop=custom"])
    assert cfg.train.loop == "custom"


def test_fit_refuses_what_either_bindings_table_refuses_there(monkeypatch):
    # Both tables run Adasum in fit (both optimizers reduce through the one reducer): taken.
    assert config.Config(horovod=HorovodConfig(op="adasum")).train.loop == "fit"
    # Control: a table that refuses it makes the config refuse it on both stacks (a config
    # means the same on either), naming the one that cannot and its reason.
    refusing = dataclasses.replace(capabilities.KERAS2, adasum_in_fit="a reason of Keras 2's")
    monkeypatch.setattr(capabilities, "BINDINGS", (refusing, capabilities.KERAS3))
    with pytest.raises(UserError) as err:
        config.Config(horovod=HorovodConfig(op="adasum"))
    assert str(err.value) == ("horovod.op=adasum needs the custom loop: on Keras 2 a reason of "
                              "Keras 2's, and a config means the same on both stacks; pass "
                              "--loop custom")
    # Both refusing, each for its own reason: both named.
    monkeypatch.setattr(capabilities, "BINDINGS", (refusing, dataclasses.replace(
        capabilities.KERAS3, adasum_in_fit="a reason of its own")))
    assert capabilities.refused_by_any("adasum_in_fit") == (
        "on Keras 2 a reason of Keras 2's; on Keras 3 a reason of its own")


def test_the_seam_refuses_what_this_stacks_table_refuses(monkeypatch):
    import tensorflow as tf
    from hvdtrain import distributed as dist
    binding = dist.binding.active()
    table = dist.binding.capabilities()
    assert table is (capabilities.KERAS2 if not keras3()
                     else capabilities.KERAS3) is binding.CAPABILITIES
    optimizer = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1))
    gradients = [tf.constant([3.0])]
    if table.unscale_gradients:   # Keras 3: one line, the table's reason
        with pytest.raises(UserError) as err:
            dist.unscale_gradients(optimizer, gradients)
        assert str(err.value) == (f"unscale_gradients() does not exist on Keras 3: "
                                  f"{table.unscale_gradients}")
    else:                         # Keras 2: divided by the loss scale (2**15 to start)
        unscaled = dist.unscale_gradients(optimizer, gradients)
        assert float(unscaled[0][0]) == 3.0 / 2**15
    # Control: this binding given a table that refuses both, the seam refuses both, its reasons.
    monkeypatch.setattr(binding, "CAPABILITIES", dataclasses.replace(
        table, unscale_gradients="reason u", bucket_mb="reason b"))
    with pytest.raises(UserError, match=f"^unscale_gradients\\(\\) does not exist on "
                                        f"{table.keras}: reason u$"):
        dist.unscale_gradients(optimizer, gradients)
    with pytest.raises(UserError, match=f"^horovod.bucket_mb is not applied on {table.keras}: "
                                        f"reason b; leave it at 0$"):
        dist.distributed_tape(tf.GradientTape(), HorovodConfig(bucket_mb=1.0))


def test_fit_takes_mixed_float16():
    # dist.distributed_optimizer reduces the scaled gradients before the loss scale checks them
    # (test_mixed_precision.py trains it at 2 ranks against the custom loop).
    cfg = presets.build_config("digits", None, ["train.precision=mixed_float16"])
    assert (cfg.train.loop, cfg.train.precision) == ("fit", "mixed_float16")


@pytest.mark.parametrize("assignment, fragment", [
    ("horovod.compression=gzip", "is not one of none, fp16"),
    ("horovod.op=sum", "is not one of average, adasum"),
    ("horovod.backward_passes_per_step=0", "must be > 0"),
    ("horovod.fusion_threshold_mb=-2", "must be >= 0 (or -1"),
    ("horovod.cycle_time_ms=0", "must be > 0 (or -1"),
    ("train.loop=keras", "is not one of fit, custom"),
    ("train.precision=float16", "is not one of float32, mixed_float16"),
])
def test_bad_horovod_values_are_user_errors(assignment, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        presets.build_config("digits", None, [assignment])


def test_loop_and_timeline_flags_are_config_shortcuts():
    args = cli._parser().parse_args(["train", "--loop", "custom", "--timeline", "tl.json"])
    cfg = cli._train_config(args)
    assert (cfg.train.loop, cfg.horovod.timeline) == ("custom", "tl.json")


def test_a_saved_config_with_horovod_options_loads_back():
    cfg = presets.build_config("digits", None, ["train.loop=custom", "horovod.op=adasum",
                                                "horovod.compression=fp16"])
    assert overrides.from_dict(config.to_dict(cfg)) == cfg

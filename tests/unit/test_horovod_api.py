"""hvdtrain.horovod without a launcher: Horovod's learning rate formulas, the XLA default, the
options Horovod's optimizer and tape take, and the refused names. The same names at 2 ranks,
as scripts use them: tests/horovod_api_cases.py and horovod_api_calls.py (docs/horovod-api.md)."""
from __future__ import annotations

import pytest

from hvdtrain.errors import UserError
from hvdtrain.distributed import horovod_schedules as schedules


def test_warmup_goes_from_a_size_th_to_the_whole_rate_as_horovod_computes_it():
    # Horovod's docs: lr = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1), the
    # epoch fractional, shifted by one batch. 4 ranks, 5 warmup epochs, 10 steps per epoch.
    multiplier = schedules.warmup(4, 5, 10)
    assert multiplier(0.0) == pytest.approx(0.25 * (0.1 * 3 / 5 + 1))
    assert multiplier(4.9) == pytest.approx(1.0)     # the last batch of the warmup: all of it
    assert multiplier(2.0) == pytest.approx(0.25 * (2.1 * 3 / 5 + 1))
    assert schedules.warmup(1, 5, 10)(0.0) == 1.0    # one rank: nothing to warm up


def test_a_constant_multiplier_decays_exponentially_from_the_start_epoch():
    decay = schedules.exponential(0.5, start_epoch=2)
    assert [decay(e) for e in (2, 3, 4)] == [1.0, 0.5, 0.25]


def test_the_rate_is_set_inside_the_epochs_and_batches_horovod_sets_it():
    def at(epoch, batch, staircase=True):
        return schedules.adjusted_epoch(epoch, batch, start_epoch=1, end_epoch=3,
                                        staircase=staircase, steps_per_epoch=4)
    assert at(0, 0) is None and at(3, 0) is None           # outside [start, end)
    assert at(1, 0) == 1.0 and at(1, 1) is None            # staircase: each epoch's first batch
    assert at(2, 3, staircase=False) == pytest.approx(2.75)  # else before every batch
    assert schedules.steps_per_epoch({"steps": 7}) == 7
    assert schedules.steps_per_epoch({"samples": 100, "batch_size": 32}) == 3
    assert schedules.steps_per_epoch({}) is None


@pytest.mark.keras3_only
def test_jit_compile_left_at_keras_default_runs_without_xla_where_keras_would_use_it(capsys):
    import tensorflow as tf
    from hvdtrain.distributed import xla_default

    class OnAGpu(tf.keras.Sequential):
        """Keras' choice on a machine with a GPU, where this test has none."""
        def _resolve_auto_jit_compile(self):
            return True

    class Patched(OnAGpu):
        pass

    def compiled(cls, **kwargs):
        model = cls([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse", **kwargs)
        return model.jit_compile

    assert compiled(OnAGpu) is True   # the control: Keras would compile the step with XLA
    xla_default.leave_xla_off_by_default(trainer=Patched, chief=True)
    assert compiled(Patched) is False
    assert compiled(Patched) is False
    assert capsys.readouterr().err.count("jit_compile left at Keras' default") == 1
    assert compiled(Patched, jit_compile=True) is True   # asked for: the fit refuses it
    assert compiled(Patched, jit_compile=False) is False


def test_options_horovod_names_map_to_hvdtrain_and_the_rest_are_refused_in_one_line():
    import hvdtrain.horovod.tensorflow as hvd
    from hvdtrain.distributed.horovod_api import options
    config = options("DistributedOptimizer", compression=hvd.Compression.fp16, op=hvd.Adasum,
                     sparse_as_dense=True, backward_passes_per_step=3)
    assert (config.compression, config.op, config.sparse_as_dense,
            config.backward_passes_per_step) == ("fp16", "adasum", True, 3)
    assert options("DistributedGradientTape", op=hvd.Average).op == "average"
    for bad, said in [({"op": hvd.Sum}, "op="), ({"device_dense": "/gpu:0"}, "device_dense"),
                      ({"compression": object()}, "compression="),
                      ({"process_set": hvd.ProcessSet([0])}, "process_set"),
                      ({"backward_passes_per_step": 0}, "backward_passes_per_step")]:
        with pytest.raises(UserError, match=said) as refused:
            options("DistributedOptimizer", **bad)
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["broadcast_global_variables", "PartialDistributedOptimizer",
                                  "allreduce_"])
def test_a_name_hvdtrain_does_not_serve_imports_and_refuses_in_one_line(name):
    import hvdtrain.horovod.tensorflow.keras as hvd
    refused = getattr(hvd, name)   # importable, as the script's line expects
    with pytest.raises(UserError, match=f"hvdtrain.horovod: {name}"):
        refused(0)
    with pytest.raises(AttributeError):
        hvd.no_such_name  # noqa: B018  (a name Horovod does not have stays an AttributeError)

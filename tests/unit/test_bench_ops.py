"""bench ops' arithmetic: an op's own time, the groups, the ratios per round."""
from __future__ import annotations

import pytest

from hvdtrain.bench import ops

def test_an_ops_own_time_leaves_out_the_events_nested_in_it():
    # One thread: the executor's event around a convolution that encloses a relu that encloses
    # a mul, then an add after them; events arrive in any order.
    events = [(12.0, 2.0, "s/add:AddV2"), (2.5, 1.0, "s/mul:Mul#id=7#"),
              (0.0, 15.0, "ExecutorState::Process"), (2.0, 3.0, "s/relu:Relu"),
              (0.0, 10.0, "s/conv:_MklNativeConv2D")]
    own = ops.self_times(events)
    assert own == {"ExecutorState::Process": 3.0, "s/conv:_MklNativeConv2D": 7.0,
                   "s/relu:Relu": 2.0, "s/mul:Mul#id=7#": 1.0, "s/add:AddV2": 2.0}
    assert sum(own.values()) == 15.0   # the thread's busy time, each moment counted once
    # Control: durations summed as they come count the mul three times and the relu twice.
    assert sum(d for _, d, _ in events) == 31.0
    # Per op type, over threads; the runtime's own events are not ops.
    per_type = ops.op_seconds([events, [(1.0, 4.0, "t/conv2:_MklNativeConv2D")]])
    assert per_type == {"_MklNativeConv2D": 11.0, "Relu": 2.0, "Mul": 1.0, "AddV2": 2.0}
    for runtime in ("ExecutorState::Process", "MemoryAllocation",
                    "StatefulPartitionedCall: __inference_train_function_12",
                    "Iterator::Root::Prefetch"):
        assert ops.op_type(runtime) is None, runtime
    grouped = ops.groups(per_type, step_ms=20.0)
    assert grouped == {"profiled step": 20.0, "all ops": 16.0,
                       "oneDNN kernels (_Mkl*)": 11.0, "other ops": 5.0,
                       "beyond the ops (runtime)": 4.0}


def test_the_ops_ratios_are_per_round_and_wide_spreads_are_noise():
    def job(step: float, conv: float, relu: float) -> dict:
        return {"step_ms": step, "profiled_step_ms": step + 1,
                "ops_ms": {"_MklNativeConv2D": conv, "Relu": relu}}
    # Round 2 ran on a slower machine for both stacks: the per-round ratio cancels it.
    rounds = [{"this": job(10, 6, 2), "other": job(10, 5, 2)},
              {"this": job(20, 12, 4), "other": job(20, 10, 4)},
              {"this": job(10, 6, 2), "other": job(10, 5, 2)}]
    r = ops.summarize_model("m", rounds, [0.1, 0.2, 0.3])
    assert r["this_over_other"]["oneDNN kernels (_Mkl*)"]["median"] == pytest.approx(1.2)
    assert r["this_over_other"]["other ops"]["median"] == pytest.approx(1.0)
    assert not r["this_over_other"]["step"]["noise"]
    assert r["medians"]["this"]["ops_ms"] == {"_MklNativeConv2D": 6, "Relu": 2}
    rounds[1]["this"]["ops_ms"]["_MklNativeConv2D"] = 18   # one round 50% off: noise
    assert ops.summarize_model("m", rounds, [0.1] * 3)["this_over_other"][
        "oneDNN kernels (_Mkl*)"]["noise"]

"""bench stacks' ratios per round and each stack's efficiency against its target."""
from __future__ import annotations

import pytest

from hvdtrain.bench import stacks
from hvdtrain.bench.shared import stats, steps

def test_stack_ratios_are_per_round_medians_and_wide_spreads_are_noise():
    row = lambda rate: {"batch_size_per_rank": 32, "per_rank_samples_per_sec": {"median": rate}}
    assert stacks.step_ms(row(3200.0)) == pytest.approx(10.0)
    assert stacks.allreduce_cost_ms(row(3200.0), row(1600.0)) == pytest.approx(10.0)
    figures = lambda a, b, c: {"samples_per_sec_1": a, "samples_per_sec_2": b,
                               "allreduce_ms_per_step": c,
                               "efficiency_2": steps.weak_scaling_efficiency(b, 2, a)}
    # Round 2 ran on a slower machine for both stacks: the per-round ratio cancels it.
    rounds = [{"this": figures(100, 190, 2.0), "other": figures(100, 200, 1.0)},
              {"this": figures(50, 95, 4.0), "other": figures(50, 100, 2.0)},
              {"this": figures(99, 188, 2.0), "other": figures(100, 200, 1.0)}]
    r = stacks.ratios(rounds, "this", "other")
    assert r["samples_per_sec_2"]["median"] == pytest.approx(0.95)
    assert not r["samples_per_sec_2"]["noise"]
    assert r["allreduce_ms_per_step"]["median"] == pytest.approx(2.0)
    rounds[1]["this"]["samples_per_sec_1"] = 80  # one round 60% off: flagged, not a result
    assert stacks.ratios(rounds, "this", "other")["samples_per_sec_1"]["noise"]


def test_each_stacks_efficiency_is_a_median_over_rounds_against_the_target():
    efficiency = lambda *per_round: stats.ratio_summary(per_round)
    assert stacks.efficiency_cell(efficiency(0.95, 0.96, 0.955), True) == \
        "0.9550 (spread 1.0%): meets >= 0.95"
    # Control: a median just under the target misses, and prints so.
    assert stacks.efficiency_cell(efficiency(0.94, 0.96, 0.9495), True).endswith(
        "misses >= 0.95")
    assert stacks.efficiency_cell(efficiency(0.80, 0.96, 0.90), True).endswith(
        "noise: does not count")
    assert stacks.efficiency_cell(efficiency(1.06, 1.07, 1.06), True).endswith(
        "above 1.05, noise")
    assert stacks.efficiency_cell(efficiency(0.90, 0.91, 0.90), False) == "0.9000 (spread 1.1%)"

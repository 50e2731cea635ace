"""bench tax's arithmetic: the wrapper's tax as a median of per-round ratios, and
its tables."""
from __future__ import annotations

import pytest

from bench_helpers import MACHINE
from hvdtrain.bench import tax
from hvdtrain.bench.shared import check_cost

def test_the_tax_is_a_per_round_median_and_wide_spreads_are_noise():
    # Round 2 ran on a slower machine for both sides: the per-round ratio cancels it.
    rounds = [{"plain": 100.0, "hvdtrain": 98.0}, {"plain": 50.0, "hvdtrain": 49.0},
              {"plain": 100.0, "hvdtrain": 99.0}]
    ratio = tax.ratio_summary(rounds)
    assert ratio["median"] == pytest.approx(0.98) and not ratio["noise"]
    rounds[1]["hvdtrain"] = 30.0  # one round 40% off: flagged, not a result
    assert tax.ratio_summary(rounds)["noise"]
    assert tax.stack_name("tensorflow 2.15.1, keras 2.15.0, horovod 0.28.1") == "keras2"


def test_the_tax_table_prints_the_verdict_and_the_step_breakdown():
    machine = MACHINE
    rounds = [{"plain": 100.0, "hvdtrain": 97.9}, {"plain": 100.0, "hvdtrain": 98.2},
              {"plain": 90.0, "hvdtrain": 88.0}]
    assert "Where a step's time goes" not in tax.markdown(tax_result(machine, rounds))
    for i, r in enumerate(rounds):   # each side's step breakdown, 50 + i ms and 0.0i ms
        for side in ("plain", "hvdtrain"):
            r[f"{side}_step"] = {"step_seconds_median": (50 + i) / 1e3,
                                 "between_steps_seconds_median": i / 1e5}
    rounds[2]["hvdtrain_step"]["step_seconds_median"] = 0.0612   # the median, not the mean
    assert "| m | keras3 | 51.00 | 51.00 | 0.010 | 0.010 |" in tax.markdown(
        tax_result(machine, rounds))
    taxed = tax_result(machine, rounds)
    assert "| 0.9790 (spread 0.4%): misses >= 0.98 |" in tax.markdown(taxed)
    assert "TensorFlow 2.20.0, Keras 3.15.1" in tax.markdown(taxed)


def test_the_consistency_checks_cost_is_the_slowest_ranks_share_of_a_training_at_its_cadence():
    # Rank 1's full comparison took 20 ms, whose median timed epoch took 1 s (2%); rank 0's
    # cadence compares every 5 epochs, and each epoch's start costs rank 1 1 ms: 0.5% of a
    # training. The record: 2 ms of a 100 ms step.
    ranks = [{"check_start_seconds": 0.0005, "check_full_seconds": 0.01,
              "check_epochs_between": 5, "seconds": [0.8, 1.0, 3.0],
              "record_seconds_per_batch": 0.002, "step_seconds_median": 0.1},
             {"check_start_seconds": 0.001, "check_full_seconds": 0.02,
              "check_epochs_between": 9, "seconds": [1.0, 1.0, 1.2],
              "record_seconds_per_batch": 0.001, "step_seconds_median": 0.1}]
    shares = check_cost.round_shares(ranks)
    assert shares == pytest.approx({"full_seconds": 0.02, "full_share": 0.02,
                                    "epochs_between": 5, "epoch_share": 0.005,
                                    "first_epoch_step_share": 0.02})
    rounds = [{"plain": 100.0, "hvdtrain": 98.0, "check": shares}] * 3
    taxed = tax_result(MACHINE, rounds)
    taxed["results"][0]["consistency_check"] = tax.check_summary(rounds)
    assert ("| m | keras3 | 20.0 (20.0 to 20.0) | 2.0% (2.0% to 2.0%) | 5 (5 to 5) "
            "| 0.50% (0.50% to 0.50%) | 2.00% (2.00% to 2.00%) |") in tax.markdown(taxed)
    assert "its share of a 9-step epoch" in tax.markdown(taxed)
    # Control: with rank 1's check ten times cheaper, rank 0's is the slowest.
    for key in ("check_start_seconds", "check_full_seconds"):
        ranks[1][key] /= 10
    rounds = [{"plain": 100.0, "hvdtrain": 98.0, "check": check_cost.round_shares(ranks)}] * 3
    taxed["results"][0]["consistency_check"] = tax.check_summary(rounds)
    assert ("| m | keras3 | 10.0 (10.0 to 10.0) | 1.0% (1.0% to 1.0%) | 5 (5 to 5) "
            "| 0.25% (0.25% to 0.25%) | 2.00% (2.00% to 2.00%) |") in tax.markdown(taxed)


def tax_result(machine: dict, rounds: list[dict]) -> dict:
    return {"machine": machine, "plan": {"rounds": len(rounds), "steps_per_repeat": 8},
            "target": tax.TARGET,
            "results": [{"model": "m", "stack": "keras3", "stack_line": "tf 2.20",
                         "batch_size": 16, "rounds": rounds,
                         "load_average_before_each_round": [1, 2, 3],
                         "hvdtrain_over_plain": tax.ratio_summary(rounds)}],
            "stack_comparisons": []}

"""bench scaling's arithmetic (no MPI): the total rate over ranks, the step breakdown, the slow-rank
hook, weak-scaling efficiency and its noise ceiling, and the comparison with Horovod's script."""
from __future__ import annotations

import statistics

import pytest

from hvdtrain.bench import scaling
from hvdtrain.bench.shared import horovod_synthetic, plans, stats, steps

def test_total_rate_counts_every_rank_at_the_slowest_ranks_time():
    per_rank = [{"samples": [100, 100], "seconds": [1.0, 2.0]},
                {"samples": [100, 100], "seconds": [2.0, 1.0]}]
    assert steps.repeat_rates(per_rank) == [100.0, 100.0]  # 200 samples / 2 s, each repeat
    with pytest.raises(ValueError):
        steps.repeat_rates([{"samples": [1], "seconds": [1.0]},
                              {"samples": [1, 1], "seconds": [1.0, 1.0]}])


def test_total_rate_is_the_sum_of_every_ranks_samples_over_the_slowest_time():
    # Ranks that counted other numbers of samples in other times: 100 in 1 s and 320 in 2 s.
    per_rank = [{"samples": [100], "seconds": [1.0]}, {"samples": [320], "seconds": [2.0]}]
    (total,) = steps.repeat_rates(per_rank)
    assert total == 210.0                            # (100 + 320) / 2 s
    # Controls: the wrong totals this check tells apart.
    assert total != 2 * 100 / 1.0                    # rank 0's rate times the world size
    assert total != 100 / 1.0 + 320 / 2.0            # the per-rank rates summed
    assert total != (100 + 320) / 1.5                # over the mean time, not the slowest


def test_the_step_breakdown_splits_each_step_at_its_start():
    # Warmup epoch, then two timed epochs of steps 10 s apart; between steps 1 s, then 3 s.
    starts = [[0.0, 5.0], [100.0, 109.0, 119.0], [200.0, 213.0]]
    ends = [[1.0, 6.0], [108.0, 118.0, 128.0], [210.0, 220.0]]
    figures = steps.step_breakdown(starts, ends, warmup=1)
    assert figures["step_seconds_median"] == pytest.approx(10.0)
    assert figures["between_steps_seconds_median"] == pytest.approx(1.0)   # 1, 1, 3
    # Controls: a step's own time (end - start) and gaps across an epoch's boundary are not it.
    assert figures["step_seconds_median"] != statistics.median([8, 9, 9, 10, 7])
    assert figures["between_steps_seconds_median"] != statistics.median([1, 1, 72, 3])
    with pytest.raises(ValueError):
        steps.step_breakdown([[0.0]], [[1.0]], warmup=0)


def test_only_the_named_rank_is_slowed():
    assert steps.slow_rank_delay("1:0.2", 1) == 0.2
    assert steps.slow_rank_delay("1:0.2", 0) == 0.0 and steps.slow_rank_delay("", 1) == 0.0


def test_weak_scaling_efficiency_and_synthetic_sizes():
    assert steps.weak_scaling_efficiency(190.0, 2, 100.0) == pytest.approx(0.95)
    num_samples, eval_fraction = plans.synthetic_sizes(ranks=2, batch_size=16,
                                                         steps_per_epoch=9)
    train = round(num_samples * (1 - eval_fraction))
    assert train == 2 * 16 * 9 and num_samples - train == 2 * 16


def test_an_efficiency_above_the_ceiling_is_flagged_as_noise():
    rows = [{"model": "m", "ranks": 1, "total_samples_per_sec": {"median": 100.0}},
            {"model": "m", "ranks": 2, "total_samples_per_sec": {"median": 200.0}},
            {"model": "m", "ranks": 4, "total_samples_per_sec": {"median": 440.0}}]
    scaling.add_efficiency(rows)
    assert [r["efficiency_above_ceiling"] for r in rows] == [False, False, True]
    assert scaling.efficiency_cell(rows[1]) == "1.0000: meets >= 0.95"
    assert scaling.efficiency_cell(rows[2]) == "1.1000 (above 1.05: noise)"
    rows[1]["total_samples_per_sec"]["median"] = 189.9  # 0.9495: a miss, printed as one
    scaling.add_efficiency(rows, {"m": 102.0})
    assert scaling.efficiency_cell(rows[1]) == "0.9495: misses >= 0.95"
    assert rows[0]["over_plain_fit"] == pytest.approx(100 / 102)
    assert "over_plain_fit" not in rows[1]


def test_horovods_script_is_read_and_set_against_its_targets():
    output = "Iter #0: 15.2 img/sec per CPU\nIter #1: 15.8 img/sec per CPU\n"
    assert horovod_synthetic.horovod_rates(output) == [15.2, 15.8]
    measured = {1: [{"horovod": 10.0, "hvdtrain": 9.9, "ratio": 0.99}],
                2: [{"horovod": 15.0, "hvdtrain": 24.0, "ratio": 1.6}]}
    rows = horovod_synthetic.summarize_rounds(measured)
    assert stats.ratio_cell(rows[0]["ratio"], rows[0]["target"]).endswith("misses >= 1")
    assert stats.ratio_cell(rows[1]["ratio"], rows[1]["target"]).endswith("meets >= 1.5")
    assert rows[1]["hvdtrain_efficiency"]["median"] == pytest.approx(24.0 / (2 * 9.9))

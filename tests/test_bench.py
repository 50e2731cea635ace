"""The benchmarks: their arithmetic (no MPI), and `hvdtrain bench all --quick` for real, with
its figures checked for sense (not for speed: speed targets are figures in the output)."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import hvdtrain, launcher_env
from hvdtrain.bench import allreduce, peers, project, scaling, stacks, suite, versus_horovod


def test_total_rate_counts_every_rank_at_the_slowest_ranks_time():
    per_rank = [{"samples": [100, 100], "seconds": [1.0, 2.0]},
                {"samples": [100, 100], "seconds": [2.0, 1.0]}]
    assert scaling.repeat_rates(per_rank) == [100.0, 100.0]  # 200 samples / 2 s, each repeat
    with pytest.raises(ValueError):
        scaling.repeat_rates([{"samples": [1], "seconds": [1.0]},
                              {"samples": [1, 1], "seconds": [1.0, 1.0]}])


def test_weak_scaling_efficiency_and_synthetic_sizes():
    assert scaling.weak_scaling_efficiency(190.0, 2, 100.0) == pytest.approx(0.95)
    num_samples, eval_fraction = scaling.synthetic_sizes(ranks=2, batch_size=16,
                                                         steps_per_epoch=9)
    train = round(num_samples * (1 - eval_fraction))
    assert train == 2 * 16 * 9 and num_samples - train == 2 * 16


def test_bus_bandwidth_follows_nccl_tests():
    algbw, busbw = allreduce.bandwidths(nbytes=1 << 20, seconds=1e-3, ranks=4)
    assert algbw == pytest.approx((1 << 20) / 1e-3)
    assert busbw == pytest.approx(algbw * 2 * 3 / 4)
    assert allreduce.bandwidths(1000, 1.0, 1)[1] == 0.0   # one rank moves nothing


def test_ring_model():
    assert project.ring_allreduce_seconds(1, 1e6, 1e-5, 1e-9) == 0.0
    assert project.ring_allreduce_seconds(4, 1e6, 1e-5, 1e-9) == pytest.approx(
        6 * 1e-5 + 1.5 * 1e6 * 1e-9)
    efficiencies = [project.efficiency(0.1, n, 4e7, 1e-5, 8 / 25e9) for n in (2, 8, 64, 512)]
    assert all(0 < e <= 1 for e in efficiencies)
    assert efficiencies == sorted(efficiencies, reverse=True)


def test_summaries_and_parsers():
    s = scaling.common.summarize([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == pytest.approx(1.0)
    assert peers.epoch_rates([1.0, 2.0, 2.5], 100) == [100.0, 200.0]
    assert peers.time_to_accuracy([1.0, 2.0, 3.0], [0.9, 0.96, 0.97]) == 2.0
    assert peers.time_to_accuracy([1.0], [0.5]) is None
    output = "Iter #0: 15.2 img/sec per CPU\nIter #1: 15.8 img/sec per CPU\n"
    assert versus_horovod.horovod_rates(output) == [15.2, 15.8]


def test_stack_ratios_are_per_round_medians_and_wide_spreads_are_noise():
    row = lambda rate: {"batch_size_per_rank": 32, "per_rank_samples_per_sec": {"median": rate}}
    assert stacks.step_ms(row(3200.0)) == pytest.approx(10.0)
    assert stacks.allreduce_cost_ms(row(3200.0), row(1600.0)) == pytest.approx(10.0)
    figures = lambda a, b, c: {"samples_per_sec_1": a, "samples_per_sec_2": b,
                               "allreduce_ms_per_step": c}
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


def test_readme_block_is_replaced_and_a_missing_block_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{suite.BEGIN}\nold\n{suite.END}\nafter\n")
    text = readme.read_text()
    pattern_block = f"{suite.BEGIN}\nnew\n{suite.END}"
    suite.replace_block(readme, pattern_block)
    assert readme.read_text() == text.replace("\nold\n", "\nnew\n")
    (tmp_path / "plain.md").write_text("no markers\n")
    with pytest.raises(suite.UserError):
        suite.replace_block(tmp_path / "plain.md", pattern_block)


@pytest.mark.multirank
def test_quick_benchmarks_run_and_make_sense(tmp_path):
    out = tmp_path / "results"
    done = subprocess.run(hvdtrain("bench", "all", "--quick", "--out", str(out)),
                          env=launcher_env(), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("scaling", "allreduce", "peers", "project"):
        for suffix in (".json", ".md", ".png"):
            assert (out / f"{name}{suffix}").stat().st_size > 0, f"{name}{suffix}"

    scaled = json.loads((out / "scaling.json").read_text())
    rows = {r["ranks"]: r for r in scaled["results"]}
    assert set(rows) == {1, 2}
    for ranks, row in rows.items():
        assert len(row["raw"]) == ranks                     # every rank reported its own count
        assert row["total_samples_per_sec"]["median"] > 0
        # The same budget at every N: one core and one intra-op thread per rank, recorded.
        assert all(len(b["cores"]) == 1 and b["intra_op_threads"] == 1
                   for b in row["core_budget"])
    assert 0 < rows[2]["weak_scaling_efficiency"] <= 1.5
    assert rows[1]["rank_env"]["OMPI_MCA_mpi_yield_when_idle"] == "1"  # hvdtrain's default

    reduced = json.loads((out / "allreduce.json").read_text())
    labels = {p["label"] for p in reduced["paths"]}
    assert {allreduce.RAW_MPI.label, allreduce.HOROVOD_MPI.label,
            allreduce.HOROVOD_GLOO.label} <= labels
    for path in reduced["paths"]:
        for r in path["rows"]:
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2 ranks: 2(N-1)/N = 1
            assert r["busbw_GBps"] > 0
    assert all(r["GBps"] > 0 for r in reduced["memcpy"])

    compared = {r["system"]: r for r in json.loads((out / "peers.json").read_text())["results"]}
    assert set(compared) == {"single", "hvdtrain", "mwms", "ps"}
    for r in compared.values():
        if peers.unavailable(r["system"]):  # tf.distribute's multi-worker fit on Keras 3
            assert r["unavailable"] == peers.unavailable(r["system"]), r
            continue
        assert r["samples_per_sec"]["median"] > 0 and r["final_eval_accuracy"] > 0.5, r

    projected = json.loads((out / "project.json").read_text())
    for row in projected["rows"]:
        e = [row["efficiency"][str(n)] for n in projected["ranks"]]
        assert all(0 < x <= 1 for x in e) and e == sorted(e, reverse=True), row

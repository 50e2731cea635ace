"""The benchmarks: their arithmetic (no MPI), and `hvdtrain bench all --quick` for real, with
its figures checked for sense (not for speed: speed targets are figures in the output)."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import hvdtrain, launcher_env
from hvdtrain.bench import allreduce, peers, project, scaling, suite, versus_horovod
from hvdtrain.bench import input as input_bench


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


def test_input_rows_pair_each_model_with_the_sources_of_its_input():
    raw = {"steps": [{"model": "mlp", "preset": "digits-mlp", "shape": [8, 8, 1],
                      "batch_size": 32, "rates": [100.0, 110.0, 90.0]}],
           "pipelines": [{"source": "npz", "shape": [8, 8, 1], "batch_size": 32,
                          "rates": [250.0, 150.0]},
                         {"source": "images", "shape": [8, 8, 1], "batch_size": 32,
                          "rates": [150.0]},
                         {"source": "npz", "shape": [32, 32, 3], "batch_size": 64,
                          "rates": [1.0]}]}   # another model's input: not paired with mlp
    rows = {r["source"]: r for r in input_bench.compare(raw)}
    assert set(rows) == {"npz", "images"}
    assert rows["npz"]["ratio"] == pytest.approx(2.0) and rows["npz"]["meets_goal"]
    assert rows["images"]["ratio"] == pytest.approx(1.5) and not rows["images"]["meets_goal"]


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
    for name in ("scaling", "allreduce", "peers", "project", "input"):
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
        assert r["samples_per_sec"]["median"] > 0 and r["final_eval_accuracy"] > 0.5, r

    projected = json.loads((out / "project.json").read_text())
    for row in projected["rows"]:
        e = [row["efficiency"][str(n)] for n in projected["ranks"]]
        assert all(0 < x <= 1 for x in e) and e == sorted(e, reverse=True), row


@pytest.mark.multirank
def test_quick_input_benchmark_measures_every_source(tmp_path):
    done = subprocess.run(hvdtrain("bench", "input", "--quick", "--out", str(tmp_path)),
                          env=launcher_env(), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "input.json").read_text())
    rows = result["results"]
    assert {r["source"] for r in rows} == set(input_bench.SOURCES)
    assert {r["model"] for r in rows} == {"mlp"} and len(rows) == len(input_bench.SOURCES)
    for r in rows:
        assert r["pipeline_samples_per_sec"]["min"] > 0 and r["step_samples_per_sec"]["min"] > 0
        assert r["ratio"] > 0 and r["meets_goal"] == (r["ratio"] >= input_bench.GOAL)
    assert result["threads"] == 1 and len(result["cores"]) == 1   # one rank's budget
    assert (tmp_path / "input.png").stat().st_size > 0
    assert "| mlp | 8x8x1, 32 | images |" in (tmp_path / "input.md").read_text()

"""What the benchmarks share: bench all's README block, the statistics and verdicts, the stacks'
versions, the registry."""
from __future__ import annotations

import json

import pytest

from bench_helpers import MACHINE
from hvdtrain.errors import UserError
from hvdtrain.bench import registry, suite
from hvdtrain.bench.shared import host, stats

def test_readme_block_is_replaced_and_a_missing_block_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{suite.BEGIN}\nold\n{suite.END}\nafter\n")
    text = readme.read_text()
    pattern_block = f"{suite.BEGIN}\nnew\n{suite.END}"
    suite.replace_block(readme, pattern_block)
    assert readme.read_text() == text.replace("\nold\n", "\nnew\n")
    (tmp_path / "plain.md").write_text("no markers\n")
    with pytest.raises(UserError):
        suite.replace_block(tmp_path / "plain.md", pattern_block)


def test_the_results_block_comes_from_the_result_files_alone(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "tax.json").write_text(json.dumps({"machine": MACHINE}))
    (out / "tax.md").write_text("| the tax table |\n")
    (out / "all.md").write_text("bench all took 1.0 min.\n")
    block = suite.results_block(out, tmp_path / "README.md", "make bench")
    assert "bench all took 1.0 min." in block and "| the tax table |" in block
    assert "TensorFlow 2.20.0, Keras 3.15.1" in block and "load 0.12 at start" in block
    assert "Not run (no `scaling.md`" in block   # control: a missing result says so
    assert "![tax](results/tax.png)" not in block   # no plot written, none linked


def test_a_summary_is_the_median_and_the_spread():
    s = stats.summarize([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == pytest.approx(1.0)
    # A median below zero (a step's time beyond another's, both noisy) spreads as widely: the
    # figure is noise, not a result (bench stacks printed "-0.1774 (spread -496.6%)" unflagged).
    below = stats.ratio_summary([-0.5, -0.1774, 0.7])
    assert below["spread"] == pytest.approx(1.2 / 0.1774) and below["noise"]
    assert not stats.ratio_summary([-1.0, -1.02, -0.99])["noise"]   # control: a tight one


def test_a_per_round_figure_prints_every_round_beside_its_median_and_spread():
    assert stats.rounds_text([0.69, 1.01, 1.05]) == "1.01 (0.69, 1.01, 1.05; spread 36%)"
    assert stats.rounds_text([0.9, 0.9]) == "0.90 (0.90, 0.90; spread 0%)"   # control: no spread


def test_a_ratio_just_under_its_target_prints_as_a_miss():
    # tax.md printed 0.9796 as "0.980" and a 9.8% spread as "10%": a miss of 0.98 hidden.
    close = stats.ratio_summary([0.9796, 0.93, 1.026])
    assert close["spread"] == pytest.approx(0.098, abs=1e-4) and not close["noise"]
    assert stats.ratio_cell(close, 0.98) == "0.9796 (spread 9.8%): misses >= 0.98"
    # Control: the same spread around a median at the target meets it.
    met = stats.ratio_summary([0.98, 0.93, 1.026])
    assert stats.ratio_cell(met, 0.98).endswith(": meets >= 0.98")
    # Past the spread limit the verdict is noise, whatever the median.
    wide = stats.ratio_summary([0.99, 0.80, 1.02])
    assert stats.ratio_cell(wide, 0.98).endswith(": noise: does not count")
    assert stats.ratio_cell(wide) == "0.9900 (spread 22.2%) noise"
    assert stats.verdict(3.5, 3.0, at_least=False) == "misses <= 3"


def test_the_stack_versions_are_the_measured_interpreters(tmp_path):
    import sys
    versions = host.stack_versions(sys.executable)
    assert versions["python_executable"] == sys.executable
    assert host.stack_line(versions).startswith("TensorFlow ")
    fake = tmp_path / "python"   # another venv: what its own interpreter reports
    fake.write_text('#!/bin/sh\necho \'{"tensorflow-cpu": "2.15.1", "keras": "2.15.0"}\'\n')
    fake.chmod(0o755)
    assert host.stack_line(host.stack_versions(str(fake))) == \
        "TensorFlow 2.15.1, Keras 2.15.0, Horovod none"
    assert host.machine(str(fake))["versions"]["keras"] == "2.15.0"


def test_bench_all_runs_the_benchmarks_its_registry_field_names():
    in_all = [b.name for b in registry.in_all()]
    assert in_all == ["scaling", "tax", "allreduce", "peers", "project", "input", "stacks",
                      "phases"]
    # The field decides, not the title: ops and cluster (run under the user's launcher) have
    # none, migration (it needs Horovod's script), network (root, an hour) and bench all
    # itself neither.
    assert {b.name for b in registry.benchmarks()} - set(in_all) == {"all", "ops", "cluster",
                                                                      "migration", "network"}
    titled = registry.Benchmark(name="x", help="x", main=print, title="A title")
    assert not titled.in_all   # control: a title alone does not put it in bench all
    with pytest.raises(ValueError, match="without a title"):
        registry.Benchmark(name="x", help="x", main=print, in_all=True)

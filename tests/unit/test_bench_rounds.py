"""The training rounds bench scaling, tax and stacks read: their order, and bench all's one set
of rounds for the three (each job launched once), through the benchmarks' own mains with the
launches counted instead of run."""
from __future__ import annotations

import argparse
import inspect
import itertools
import json
import statistics
import sys

from bench_helpers import MACHINE
from hvdtrain.bench import registry, scaling, suite
from hvdtrain.bench.shared import host, plain_job, plans, stats, trainer_job, training_rounds
from hvdtrain.bench.shared.training_rounds import PLAIN


def test_the_rounds_interleave_every_side_of_every_stack():
    sides = (PLAIN, 1, 2)
    assert training_rounds.round_order(0, ["this", "other"], sides) == [
        ("this", PLAIN), ("this", 1), ("this", 2), ("other", PLAIN), ("other", 1), ("other", 2)]
    assert training_rounds.round_order(1, ["this", "other"], sides) == \
        training_rounds.round_order(0, ["this", "other"], sides)[::-1]
    assert training_rounds.round_order(1, ["this"], (PLAIN, 1)) == [("this", 1), ("this", PLAIN)]


def request(**changes) -> training_rounds.Request:
    fields = {"models": ("mlp",), "pythons": (("this", "a"), ("other", "b")),
              "plan": plans.FULL, "rounds": 3, "sides": (PLAIN, 1, 2), **changes}
    return training_rounds.Request(**fields)


def test_rounds_hold_another_requests_jobs_only_to_the_same_plan():
    shared = request()
    assert shared.holds(request(pythons=(("this", "a"),), sides=(1, 2), rounds=1))
    # The world sizes a plan names are the sides': tax's plan of one rank is the same plan.
    assert shared.holds(request(plan=plans.Plan(world_sizes=(1,)), sides=(PLAIN, 1)))
    # Controls: another plan, stack, side, model or more rounds are other jobs.
    assert not shared.holds(request(plan=plans.QUICK))
    assert not shared.holds(request(pythons=(("this", "c"),)))
    assert not shared.holds(request(sides=(4,)))
    assert not shared.holds(request(models=("resnet_small",)))
    assert not shared.holds(request(rounds=5))


def test_a_scaling_row_is_the_job_of_median_rate():
    jobs = [{"total_samples_per_sec": {"median": rate}} for rate in (3.0, 1.0, 2.0, 9.0)]
    assert scaling.median_job(jobs[:3]) is jobs[2]
    assert scaling.median_job(jobs) is jobs[2]   # an even count: the lower middle one


def test_only_the_training_rounds_time_the_consistency_check(monkeypatch, tmp_path):
    """bench tax reads the check's cost from the rounds' hvdtrain jobs, which ask for it; the
    other benchmarks' jobs (phases, network, Horovod's comparison) keep measure's default."""
    asked: dict = {}
    default = inspect.signature(trainer_job.measure).parameters["check_cost"].default
    monkeypatch.setattr(trainer_job, "measure", lambda *a, **k: asked.update(k) or {})
    training_rounds.measure_job("mlp", 2, plans.QUICK, tmp_path, sys.executable)
    assert asked["check_cost"] is True
    # Control: a job launched without asking does not time it.
    assert trainer_job.job_options(training_rounds.WORKLOADS["mlp"], 2, plans.QUICK,
                                   tmp_path).get("check_cost") is None
    assert default is False


# ---------------------------------------------------------------------------------------------
# bench all: one set of rounds for scaling, tax and stacks

def fake_launches(monkeypatch) -> list[tuple[str, str, object]]:
    """Every job ``training_rounds`` would launch, recorded instead, each with a rate of its
    own; the other stack's interpreter reports Keras 2."""
    launched: list[tuple[str, str, object]] = []
    rates = itertools.count(100)

    def measure_job(name, side, plan, work_dir, python):
        launched.append((name, python, side))
        rate = float(next(rates))
        raw = {"params": 10, "step_seconds_median": 0.1, "between_steps_seconds_median": 0.01,
               "check_start_seconds": 0.0001, "check_full_seconds": 0.001,
               "check_epochs_between": 1, "seconds": [0.9, 1.0, 1.1],
               "record_seconds_per_batch": 0.001}
        if side == PLAIN:
            return {"samples_per_sec": rate, "raw": raw}
        keras = "3.15.1" if python == sys.executable else "2.15.0"
        budget = [{"rank": r, "cores": [r], "intra_op_threads": 1, "inter_op_threads": 1}
                  for r in range(side)]
        return {"model": name, "ranks": side, "stack": f"tensorflow x, keras {keras}, horovod y",
                "batch_size_per_rank": 32, "total_samples_per_sec": stats.summarize([rate]),
                "per_rank_samples_per_sec": stats.summarize([rate / side]), "core_budget": budget,
                "rank_env": {}, "raw": [raw] * side}

    monkeypatch.setattr(training_rounds, "measure_job", measure_job)
    monkeypatch.setattr(training_rounds, "_MEASURED", {})
    monkeypatch.setattr(plain_job, "measure_plain", lambda *a, **k: (50.0, {}))
    monkeypatch.setattr(host, "machine", lambda *a: MACHINE)
    monkeypatch.setattr(host, "stack_versions", lambda *a: {})
    return launched


def run_three(tmp_path, in_all: bool) -> dict[str, dict]:
    """bench scaling, tax and stacks with bench all's options (``--other-venv``), as bench all
    runs them or, with ``in_all`` False, as each runs alone; their JSON results."""
    venv = tmp_path / "other-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/bin/true")
    parser = argparse.ArgumentParser()
    registry.add_common_arguments(parser, registry.find("all"))
    args = parser.parse_args(["--out", str(tmp_path / "out"), "--other-venv", str(venv)])
    for name in ("scaling", "tax", "stacks"):
        bench = registry.find(name)
        options = suite.options_in_all(bench, args)
        options.in_all = in_all
        bench.main(options)
    return {name: json.loads((tmp_path / "out" / f"{name}.json").read_text())
            for name in ("scaling", "tax", "stacks")}


def test_bench_all_launches_scalings_taxs_and_stacks_jobs_once(tmp_path, monkeypatch):
    launched = fake_launches(monkeypatch)
    results = run_three(tmp_path, in_all=True)
    models, stacks, sides = 2, 2, 3
    rounds = results["stacks"]["plan"]["rounds"]
    assert rounds == results["tax"]["plan"]["rounds"] == 3
    assert len(launched) == models * stacks * sides * rounds
    assert all(launched.count(job) == rounds for job in set(launched)), launched
    # tax's 1-rank hvdtrain of each round is stacks' 1-rank job of the same round ...
    for taxed, stacked in zip(results["tax"]["results"][::2], results["stacks"]["results"]):
        assert taxed["model"] == stacked["model"] and taxed["which"] == "this"
        assert [r["hvdtrain"] for r in taxed["rounds"]] == \
            [r["this"]["samples_per_sec_1"] for r in stacked["rounds"]]
        # ... and scaling's row at each world size is its median round.
        rows = {r["ranks"]: r for r in results["scaling"]["results"]
                if r["model"] == stacked["model"]}
        for ranks in (1, 2):
            assert rows[ranks]["total_samples_per_sec"]["median"] == statistics.median(
                r["this"][f"samples_per_sec_{ranks}"] for r in stacked["rounds"])


def test_alone_each_benchmark_launches_its_own_jobs(tmp_path, monkeypatch):
    """The control: the same three run alone launch their jobs each (scaling one round of
    hvdtrain at 1 and 2 ranks on this stack), and tax's figures are not stacks'."""
    launched = fake_launches(monkeypatch)
    results = run_three(tmp_path, in_all=False)
    rounds = 3
    # (tax: plain fit, 1 rank, and 2 ranks for the consistency check's cost)
    assert len(launched) == 2 * 2 + 2 * 2 * 3 * rounds + 2 * 2 * 2 * rounds
    taxed, stacked = results["tax"]["results"][0], results["stacks"]["results"][0]
    assert [r["hvdtrain"] for r in taxed["rounds"]] != \
        [r["this"]["samples_per_sec_1"] for r in stacked["rounds"]]

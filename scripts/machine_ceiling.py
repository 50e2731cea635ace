"""The 2-rank weak-scaling efficiency this machine allows before any communication: two
independent 1-rank jobs side by side, one per core, against one alone, in interleaved rounds.

    .venv/bin/python scripts/machine_ceiling.py [--models mobilenetv2,resnet_small]
        [--rounds 3] [--out benchmarks/results]

Both sides run bench scaling's 1-rank job (hvdtrain's Trainer under `mpirun -np 1 --bind-to
core`, timed over its repeats): alone on core 0, and two of them at once on cores 0 and 1,
which share nothing but the machine (its memory, caches and clocks). Per round, the ceiling is
the pair's samples/s summed over twice the lone job's: what a 2-rank job's efficiency (bench
stacks) could reach if its all-reduce, Horovod and the wait for the slower rank cost nothing.
bench scaling's 2-rank job runs in the same rounds, for its efficiency against the same lone
job. Writes ceiling.json and ceiling.md. Needs a quiet machine: the load is recorded before
each round.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hvdtrain.bench.shared import host, plans, report, stats, trainer_job  # noqa: E402
from hvdtrain.bench.shared.workloads import WORKLOADS  # noqa: E402

ALONE, PAIR, TOGETHER = "alone", "side by side", "2-rank job"


def one_job(name: str, core: int, work_dir: Path) -> dict[str, Any]:
    """bench scaling's 1-rank job of model ``name`` on ``core``: its samples/s (median repeat)
    and the cores its rank ran on."""
    job = trainer_job.measure(WORKLOADS[name], 1, plans.FULL, work_dir, core=core)
    return {"samples_per_sec": job["total_samples_per_sec"]["median"],
            "cores": job["core_budget"][0]["cores"]}


def one_round(name: str, index: int, work_dir: Path) -> dict[str, Any]:
    """The lone job, the pair and bench scaling's 2-rank job (mpirun -np 2, one core per rank),
    in the reverse order every other round."""
    rates: dict[str, Any] = {}
    for side in ((ALONE, PAIR, TOGETHER) if index % 2 == 0 else (TOGETHER, PAIR, ALONE)):
        report.say(f"ceiling: {name}, round {index + 1}, {side}...")
        if side == ALONE:
            rates[ALONE] = one_job(name, 0, work_dir)
        elif side == TOGETHER:
            job = trainer_job.measure(WORKLOADS[name], 2, plans.FULL, work_dir)
            rates[TOGETHER] = {"samples_per_sec": job["total_samples_per_sec"]["median"],
                               "cores": [r["cores"] for r in job["core_budget"]]}
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                rates[PAIR] = list(pool.map(lambda core: one_job(name, core, work_dir), (0, 1)))
    pair = sum(job["samples_per_sec"] for job in rates[PAIR])
    alone = rates[ALONE]["samples_per_sec"]
    together = rates[TOGETHER]["samples_per_sec"]
    return {**rates, "ceiling": pair / (2 * alone), "efficiency": together / (2 * alone),
            "together_over_pair": together / pair}


def markdown(result: dict[str, Any]) -> str:
    rows = [[m["model"],
             " / ".join(f"{r[ALONE]['samples_per_sec']:.1f}" for r in m["rounds"]),
             " / ".join(f"{sum(j['samples_per_sec'] for j in r[PAIR]):.1f}"
                        for r in m["rounds"]),
             stats.ratio_cell(m["ceiling"]),
             " / ".join(f"{r[TOGETHER]['samples_per_sec']:.1f}" for r in m["rounds"]),
             stats.ratio_cell(m["efficiency"]), stats.ratio_cell(m["together_over_pair"]),
             ", ".join(f"{x:.2f}" for x in m["load_average_before_each_round"])]
            for m in result["models"]]
    return "\n".join([
        f"Two independent 1-rank jobs side by side (cores 0 and 1) against one alone (core 0), "
        f"bench scaling's 1-rank job, and its 2-rank job (one core per rank) in the same "
        f"{result['rounds']} interleaved rounds; "
        f"{host.machine_line(result['machine'])}. Ceiling: per round, the pair's samples/s "
        f"summed over twice the lone job's; median over rounds (spread = (max - min) / "
        f"median; 'noise' past 10%; above 1 is noise too). A 2-rank job's weak-scaling "
        f"efficiency (the 2-rank job's samples/s over twice the lone job's, per round) cannot "
        f"exceed it: what it loses beyond is the cost of training together (its all-reduce, "
        f"Horovod's background thread, each step's wait for the slower rank), which the last "
        f"ratio, the 2-rank job over the pair in the same round, measures.", "",
        report.markdown_table(["model", "alone, samples/s (per round)",
                               "side by side, samples/s summed (per round)",
                               "ceiling (2-rank efficiency before communication)",
                               "2-rank job, samples/s (per round)", "its efficiency",
                               "2-rank job / side by side",
                               "load before each round"], rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mobilenetv2,resnet_small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    machine = host.machine()
    models = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-ceiling-") as tmp:
        for name in args.models.split(","):
            loads, rounds = [], []
            for i in range(args.rounds):
                loads.append(host.load_average())
                rounds.append(one_round(name, i, Path(tmp)))
            models.append({"model": name, "rounds": rounds,
                           "load_average_before_each_round": loads,
                           **{key: stats.ratio_summary([r[key] for r in rounds])
                              for key in ("ceiling", "efficiency", "together_over_pair")}})
    result = {"benchmark": "ceiling", "machine": machine, "rounds": args.rounds,
              "models": models}
    report.write_outputs(Path(args.out), "ceiling", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()

"""Per bucket size, from run.sh's network.json files: the buckets' rate on the link and on one
host per round, the step over max(compute, transfer), the cost model's error, and the rate over
the same round's 2 MB rate (median and spread).

    .venv/bin/python benchmarks/results/network-bucket-size/summary.py DIR
"""
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository's hvdtrain
from hvdtrain.bench.shared import stats   # noqa: E402

SYSTEM = "hvdtrain-gloo-overlap"
REFERENCE_MB = 2

def read_runs(directory):
    """Every run's figures in ``directory``, by (bucket_mb, round); the steps are seconds."""
    runs = {}
    for path in Path(directory).glob("mb*-round*/network.json"):
        mb, r = map(int, re.fullmatch(r"mb(\d+)-round(\d+)", path.parent.name).groups())
        result = json.loads(path.read_text())
        link = result["links"][0]
        model = {k: v["median"] for k, v in link["projection"][SYSTEM].items()}
        runs[(mb, r)] = {
            "link": link["systems"][SYSTEM]["samples_per_sec"]["median"],
            "one_host": result["one_host"][SYSTEM]["samples_per_sec"]["median"],
            "achieved": link["achieved_gbit_per_s"]["median"],
            "both_ways": link["both_ways_gbit_per_s"]["median"],
            "one_host_step": model["one_host_step_s"], "measured_step": model["measured_step_s"],
            "predicted_step": model["predicted_step_s"], "error": model["error"],
            "overlap": model["measured_step_s"]
            / max(model["one_host_step_s"], model["transfer_s"]),
            "load": result["load_average_before_each_round"][0],
        }
    return runs


def main(directory):
    runs = read_runs(directory)
    rounds = sorted({r for _, r in runs})
    for mb in sorted({mb for mb, _ in runs}):
        print(f"bucket_mb {mb}:")
        for r in rounds:
            if (mb, r) in runs:
                got = runs[(mb, r)]
                print(f"  round {r}: {got['link']:.1f} samples/s on the link "
                      f"({got['achieved']:.3g} Gbit/s), {got['one_host']:.1f} on one host; "
                      f"step / max(compute, transfer) {got['overlap']:.2f}; "
                      f"model {got['error']:+.1%}; load {got['load']:.2f}")
        per = [runs[(mb, r)]["link"] / runs[(REFERENCE_MB, r)]["link"] for r in rounds
               if (mb, r) in runs and (REFERENCE_MB, r) in runs]
        if per and mb != REFERENCE_MB:
            print(f"  over {REFERENCE_MB} MB, per round: {stats.rounds_text(per)}")
        overlap = [runs[(mb, r)]["overlap"] for r in rounds if (mb, r) in runs]
        print(f"  step / max(compute, transfer): {stats.rounds_text(overlap)}")


if __name__ == "__main__":
    main(sys.argv[1])

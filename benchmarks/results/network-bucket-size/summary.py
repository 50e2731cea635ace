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

runs = {}
for path in Path(sys.argv[1]).glob("mb*-round*/network.json"):
    mb, r = map(int, re.fullmatch(r"mb(\d+)-round(\d+)", path.parent.name).groups())
    result = json.loads(path.read_text())
    link = result["links"][0]
    model = link["projection"][SYSTEM]
    runs[(mb, r)] = {
        "link": link["systems"][SYSTEM]["samples_per_sec"]["median"],
        "one_host": result["one_host"][SYSTEM]["samples_per_sec"]["median"],
        "achieved": link["achieved_gbit_per_s"]["median"],
        "overlap": model["measured_step_s"]["median"]
        / max(model["one_host_step_s"]["median"], model["transfer_s"]["median"]),
        "error": model["error"]["median"],
        "load": result["load_average_before_each_round"][0],
    }


def summary(values):
    got = stats.ratio_summary(values)
    each = ", ".join(f"{v:.2f}" for v in values)
    return f"{got['median']:.2f} ({each}; spread {got['spread']:.0%})"


rounds = sorted({r for _, r in runs})
for mb in sorted({mb for mb, _ in runs}):
    print(f"bucket_mb {mb}:")
    for r in rounds:
        if (mb, r) in runs:
            got = runs[(mb, r)]
            print(f"  round {r}: {got['link']:.1f} samples/s on the link ({got['achieved']:.3g} "
                  f"Gbit/s), {got['one_host']:.1f} on one host; step / max(compute, transfer) "
                  f"{got['overlap']:.2f}; model {got['error']:+.1%}; load {got['load']:.2f}")
    per = [runs[(mb, r)]["link"] / runs[(REFERENCE_MB, r)]["link"] for r in rounds
           if (mb, r) in runs and (REFERENCE_MB, r) in runs]
    if per and mb != REFERENCE_MB:
        print(f"  over {REFERENCE_MB} MB, per round: {summary(per)}")
    overlap = [runs[(mb, r)]["overlap"] for r in rounds if (mb, r) in runs]
    print(f"  step / max(compute, transfer): {summary(overlap)}")

"""From run.py's runs.json: per bucket size, the link rate with 2 inter-op threads over 1 in the
same round; the one-host rate likewise; the step over max(compute, transfer) and over the part
no bucket can hide (the time before the step's first bucket is asked for, plus the transfer);
and when each bucket was asked for, by inter-op threads.

    .venv/bin/python benchmarks/results/network-inter-op/summary.py DIR
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository's hvdtrain
from hvdtrain.bench.shared import stats   # noqa: E402

SAMPLES_PER_STEP = 32   # 2 ranks at batch 16


def step_s(run):
    return SAMPLES_PER_STEP / run["samples_per_sec"]


def main(directory):
    result = json.loads((Path(directory) / "runs.json").read_text())
    runs = {(r["round"], r["where"], r["bucket_mb"], r["inter_op"]): r for r in result["runs"]}
    rounds = sorted({r["round"] for r in result["runs"]})
    print(f"load at each run's start: {min(r['load'] for r in result['runs']):.2f} to "
          f"{max(r['load'] for r in result['runs']):.2f}")
    pairs = sorted({(w, mb) for _, w, mb, _ in runs})
    for where, mb in pairs:
        both = [r for r in rounds if (r, where, mb, 1) in runs and (r, where, mb, 2) in runs]
        print(f"{where}, bucket_mb {mb}:")
        for inter in (1, 2):
            rates = [runs[(r, where, mb, inter)]["samples_per_sec"] for r in both]
            print(f"  inter-op {inter}: {', '.join(f'{v:.1f}' for v in rates)} samples/s")
        ratios = [runs[(r, where, mb, 2)]["samples_per_sec"]
                  / runs[(r, where, mb, 1)]["samples_per_sec"] for r in both]
        print(f"  inter-op 2 over 1, per round: {stats.rounds_text(ratios)}")
        if where != "link":
            continue
        for inter in (1, 2):
            ideal, floor, before = [], [], []
            for r in both:
                run = runs[(r, where, mb, inter)]
                compute = step_s(runs[(r, "one host", 0, inter)])
                sent = sum(b["mb"] for b in run["timeline"]["buckets"])   # the buckets' bytes
                transfer = sent * 8e-3 / run["link"]["both_ways_gbit_per_s"]
                first = run["timeline"]["before_first_request_ms"] / 1e3
                ideal.append(step_s(run) / max(compute, transfer))
                floor.append(step_s(run) / (first + transfer))
                before.append(first)
            print(f"  inter-op {inter}: step / max(compute, transfer) "
                  f"{', '.join(f'{v:.2f}' for v in ideal)}; step / (before the first request + "
                  f"transfer) {', '.join(f'{v:.2f}' for v in floor)}; before the first request "
                  f"{', '.join(f'{v:.2f}' for v in before)} s")
            order = {}
            for r in both:
                for b in runs[(r, where, mb, inter)]["timeline"]["buckets"]:
                    order.setdefault(b["name"], []).append(b)
            print("    asked for (ms after the first; median over rounds), and all-reduced:")
            for name, seen in sorted(order.items(),
                                     key=lambda i: statistics.median(b["request_ms"]
                                                                     for b in i[1])):
                req = statistics.median(b["request_ms"] for b in seen)
                ar = [statistics.median(b["allreduce_ms"][i] for b in seen) for i in (0, 1)]
                print(f"      {name:28s} {seen[0]['mb']:5.2f} MB  asked {req:5.0f}  "
                      f"all-reduced {ar[0]:5.0f} to {ar[1]:5.0f}")


if __name__ == "__main__":
    main(sys.argv[1])

"""A finished 2-rank job's exit: Python's usual one against hvdtrain's
(launching.exit_after_success), in interleaved rounds (usual, fast, usual, ...) on each stack.

    python3 scripts/exit_overhead.py [--rounds 5] [--out benchmarks/results]

Both sides run the same training, `mpirun -np 2 ... train --preset synthetic-mlp --epochs 1`:
the `hvdtrain` entry point (fast exit) against `python -c "... sys.exit(cli.run())"` (the usual
exit after the same work). Needs a quiet machine; the load average is recorded before each
round.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_overhead import ROOT, STACKS, compared, seconds  # noqa: E402

USUAL_EXIT = "import sys; from hvdtrain import cli; sys.exit(cli.run())"
TRAIN = ["train", "--preset", "synthetic-mlp", "--epochs", "1", "--set", "run.export=false",
         "--set", "run.tensorboard=false"]


def measure(venv: Path, rounds: int) -> dict:
    mpirun = ["mpirun", "-np", "2", "--oversubscribe"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-exit-") as tmp:
        for i in range(rounds):
            row = {"load": os.getloadavg()[0]}
            for name, entry in (("usual", ["python", "-c", USUAL_EXIT]), ("fast", ["hvdtrain"])):
                run_dir = ["--run-dir", f"{tmp}/{name}-{i}"]
                row[name] = seconds([*mpirun, *entry, *TRAIN, *run_dir], venv)
            rows.append(row)
    return compared(rows, "usual", "fast")


def markdown(results: dict) -> str:
    lines = ["`mpirun -np 2 hvdtrain train --preset synthetic-mlp --epochs 1`, seconds from "
             "launch to the launcher's exit, median of interleaved rounds: Python's usual exit "
             "against hvdtrain's (`launching.exit_after_success`); ratio: median over rounds of "
             "usual / fast, spread = (max - min) / median. `scripts/exit_overhead.py`.", "",
             "| stack | usual exit s | fast exit s | saved s (min..max) | ratio (spread) | "
             "load before each round |", "|---|---|---|---|---|---|"]
    for stack, r in results["stacks"].items():
        m, saved = r["median_s"], r["saved_s"]
        loads = ", ".join(f"{row['load']:.2f}" for row in r["rounds"])
        noise = " noise" if r["spread"] > 0.10 else ""
        lines.append(f"| {stack} | {m['usual']:.2f} | {m['fast']:.2f} | {saved['median']:.1f} "
                     f"({saved['min']:.1f}..{saved['max']:.1f}) | {r['ratio']:.2f}x "
                     f"({r['spread']:.0%}{noise}) | {loads} |")
    lines += ["", f"{len(next(iter(results['stacks'].values()))['rounds'])} rounds per stack, "
              f"{results['date_utc']}, {os.cpu_count()} cores."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    results = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "stacks": {s: measure(v, args.rounds) for s, v in STACKS.items() if v.is_dir()}}
    (args.out / "exit.json").write_text(json.dumps(results, indent=1))
    (args.out / "exit.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()

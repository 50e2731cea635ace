"""A finished 2-rank job's exit: Python's usual one against hvdtrain's
(launching.exit_after_success), in interleaved rounds (usual, fast, usual, ...) on each stack.

    python3 scripts/exit_overhead.py [--rounds 5] [--out benchmarks/results]

Both sides run the same training, `mpirun -np 2 ... train --preset synthetic-mlp --epochs 1`:
the `hvdtrain` entry point (fast exit) against `python -c "... sys.exit(cli.run())"` (the usual
exit after the same work). Needs a quiet machine; the load average is recorded before each
round.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_overhead import compared, footer, measure_and_write, noise, seconds  # noqa: E402

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
        lines.append(f"| {stack} | {m['usual']:.2f} | {m['fast']:.2f} | {saved['median']:.1f} "
                     f"({saved['min']:.1f}..{saved['max']:.1f}) | {r['ratio']:.2f}x "
                     f"({r['spread']:.0%}{noise(r)}) | {loads} |")
    lines += ["", footer(results)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    measure_and_write("exit", __doc__, measure, markdown, rounds=5)

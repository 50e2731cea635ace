"""A 2-rank job's start, first step or exit: how Python, TensorFlow and Horovod do it by default
against how hvdtrain does it, in interleaved rounds (usual, hvdtrain, usual, ...) on each stack.

    python3 scripts/rank_overhead.py exit|start|gc|autograph [--rounds 7] [--out benchmarks/results]

Both sides run the same training under `mpirun -np 2`; hvdtrain's side is the `hvdtrain` entry
point, the usual side the same work through `python -c`:
  exit   `... train --preset synthetic-mlp --epochs 1`: Python's usual exit after cli.run()
         against rank_process.end_rank (the entry point's).
  start  `... train --preset digits-mlp --epochs 1`: TensorFlow and scikit-learn's datasets
         imported the usual way first (what a digits rank did before rank_process.load_tensorflow
         and hvdtrain.data.sklearn_data) against hvdtrain's start; both exit the fast way.
  gc     `... train --preset digits-mlp --epochs 1`: the garbage collector left on while
         TensorFlow loads against load_tensorflow's (off, then gc.freeze).
  autograph  `... train --preset digits-mlp --loop custom --epochs 1`: autograph converting
         Horovod's Python wherever a traced step reaches it (dist.autograph_leaves_horovod_alone
         made a no-op) against hvdtrain's rule that leaves Horovod alone.
Writes NAME.json and NAME.md. Needs a quiet machine; the load average is recorded before each
round.
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_overhead import compared, footer, measure_and_write, noise, seconds  # noqa: E402

NO_FILES = ["--set", "run.export=false", "--set", "run.tensorboard=false"]


@dataclass(frozen=True)
class Comparison:
    train: str             # what `hvdtrain train` is given, besides --epochs 1
    usual_entry: str       # Python code run with the training's argv
    usual_says: str        # the table's words for each side
    hvdtrain_says: str


COMPARISONS = {
    "exit": Comparison("--preset synthetic-mlp",
                       "import sys; from hvdtrain import cli; sys.exit(cli.run())",
                       "Python's usual exit", "hvdtrain's (`rank_process.end_rank`)"),
    "start": Comparison("--preset digits-mlp",
                        "import tensorflow, sklearn.datasets; from hvdtrain import cli; cli.main()",
                        "TensorFlow and scikit-learn's datasets imported the usual way",
                        "hvdtrain's start (`rank_process.load_tensorflow`, `sklearn_data`)"),
    "gc": Comparison("--preset digits-mlp",
                     "import gc; gc.disable = gc.freeze = lambda: None; "
                     "from hvdtrain import cli; cli.main()",
                     "Python's garbage collector on while TensorFlow loads",
                     "off, then what the import made frozen (`rank_process.load_tensorflow`)"),
    "autograph": Comparison("--preset digits-mlp --loop custom",
                            "from hvdtrain import cli, dist; "
                            "dist.autograph_leaves_horovod_alone = lambda: None; cli.main()",
                            "autograph converting Horovod's Python",
                            "hvdtrain's rule that leaves it alone "
                            "(`dist.autograph_leaves_horovod_alone`)"),
}


def measurer(comparison: Comparison):
    def measure(venv: Path, rounds: int) -> dict:
        mpirun = ["mpirun", "-np", "2", "--oversubscribe"]
        train = ["train", *comparison.train.split(), "--epochs", "1", *NO_FILES]
        rows = []
        with tempfile.TemporaryDirectory(prefix="hvdtrain-overhead-") as tmp:
            for i in range(rounds):
                row = {"load": os.getloadavg()[0]}
                for name, entry in (("usual", ["python", "-c", comparison.usual_entry]),
                                    ("fast", ["hvdtrain"])):
                    run_dir = ["--run-dir", f"{tmp}/{name}-{i}"]
                    row[name] = seconds([*mpirun, *entry, *train, *run_dir], venv)
                rows.append(row)
        return compared(rows, "usual", "fast")
    return measure


def markdowner(comparison: Comparison):
    def markdown(results: dict) -> str:
        lines = [f"`mpirun -np 2 hvdtrain train {comparison.train} --epochs 1`, "
                 f"seconds from launch to the launcher's exit, median of interleaved rounds: "
                 f"{comparison.usual_says} against {comparison.hvdtrain_says}; ratio: median "
                 f"over rounds of usual / hvdtrain, spread = (max - min) / median. "
                 f"`scripts/rank_overhead.py`.", "",
                 "| stack | usual s | hvdtrain s | saved s (min..max) | ratio (spread) | "
                 "load before each round |", "|---|---|---|---|---|---|"]
        for stack, r in results["stacks"].items():
            m, saved = r["median_s"], r["saved_s"]
            loads = ", ".join(f"{row['load']:.2f}" for row in r["rounds"])
            lines.append(f"| {stack} | {m['usual']:.2f} | {m['fast']:.2f} | "
                         f"{saved['median']:.1f} ({saved['min']:.1f}..{saved['max']:.1f}) | "
                         f"{r['ratio']:.2f}x ({r['spread']:.0%}{noise(r)}) | {loads} |")
        lines += ["", footer(results)]
        return "\n".join(lines) + "\n"
    return markdown


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMPARISONS:
        sys.exit(f"usage: python3 scripts/rank_overhead.py {'|'.join(COMPARISONS)} "
                 f"[--rounds N] [--out DIR]")
    what = COMPARISONS[sys.argv[1]]
    name = sys.argv.pop(1)
    measure_and_write(name, __doc__, measurer(what), markdowner(what), rounds=7)

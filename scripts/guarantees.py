"""docs/guarantees.md from runs (`make guarantees`): the Keras usage patterns of
tests/guarantees_worker.py at 2 ranks on each stack's venv, one job per stack, rendered as one
table (tests/guarantees_table.py holds the verdicts, the page and its reading); and from the
same runs the generated part of docs/horovod-api.md (tests/horovod_api_page.py).

    scripts/guarantees.py --venv .venv --venv .venv-keras2 [--results DIR] [--reuse]
                          [--out docs/guarantees.md]

Each venv's results go to DIR/<venv>.json (default runs/guarantees); --reuse renders from the
results already there instead of running a venv again. The ranks run this checkout's hvdtrain
(PYTHONPATH), whatever the venvs have installed; the page names its commit.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import guarantees_table  # noqa: E402  (tests/, put on the path above)
import horovod_api_page  # noqa: E402


def code() -> str:
    """This checkout's commit, and whether hvdtrain/ differs from it."""
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,
                                    text=True).stdout.strip()
    changed = git("status", "--porcelain", "--", "hvdtrain")
    return (f"hvdtrain at {git('rev-parse', '--short', 'HEAD') or 'an unknown commit'}"
            + (" with uncommitted changes" if changed else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", action="append", required=True, type=Path,
                        help="a stack's virtualenv (repeat: one column each)")
    parser.add_argument("--results", type=Path, default=ROOT / "runs" / "guarantees")
    parser.add_argument("--reuse", action="store_true",
                        help="render from DIR/<venv>.json where it exists")
    parser.add_argument("--out", type=Path, default=guarantees_table.DOC)
    parser.add_argument("--horovod-out", type=Path, default=horovod_api_page.DOC,
                        help="the page of Horovod's API, whose generated part is rewritten")
    args = parser.parse_args()
    runs = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for venv in map(Path.absolute, args.venv):
        results = args.results / f"{venv.name.lstrip('.')}.json"
        if not (args.reuse and results.exists()):
            print(f"== {venv}: the cases at 2 ranks", flush=True)
            table = ROOT / "tests" / "guarantees_table.py"
            done = subprocess.run([str(venv / "bin" / "python"), str(table), "--json",
                                   str(results)], cwd=ROOT, env=env)
            if done.returncode != 0:
                print(f"scripts/guarantees.py: error: the cases failed to run on {venv}",
                      file=sys.stderr)
                return 1
        runs.append(json.loads(results.read_text()))
    command = "make guarantees" if len(runs) == 2 else " ".join(
        ["scripts/guarantees.py", *map(shlex.quote, sys.argv[1:])])
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    stamp = {"command": command, "date": date, "code": code()}
    args.out.write_text(guarantees_table.render(runs, **stamp))
    print(f"wrote {args.out}")
    runs = sorted(runs, key=lambda run: list(guarantees_table.STACKS).index(run["key"]))
    rows = {run["key"]: guarantees_table.verdicts(run) for run in runs}
    page = args.horovod_out.read_text()
    args.horovod_out.write_text(horovod_api_page.render(runs, rows, page, **stamp))
    print(f"wrote {args.horovod_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""horovodrun's start-up with and without scripts/patches/horovod-0.28.1-fast-build-check.patch,
in interleaved rounds (unpatched, patched, unpatched, ...) on each stack's virtualenv.

    python3 scripts/launch_overhead.py [--rounds 7] [--out benchmarks/results]

Times `horovodrun -np 2 -H localhost:2 --gloo python -c pass` (nothing but the launch) and,
for reference, `mpirun -np 2 python -c pass`. The patch is taken off and put back between
rounds with `patch -R` / `patch`, so the installed Horovod ends patched as it began. Needs a
quiet machine (the load average is recorded before each round), and nothing else launching
horovodrun meanwhile: between rounds the installed Horovod is unpatched for a moment.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "scripts" / "patches" / "horovod-0.28.1-fast-build-check.patch"
STACKS = {"keras3": ROOT / ".venv", "keras2": ROOT / ".venv-keras2"}
sys.path.insert(0, str(ROOT))
from hvdtrain.launch.launchers import launch_env  # noqa: E402  (the run-as-root settings)


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def set_patched(venv: Path, on: bool) -> None:
    util = site_packages(venv) / "horovod" / "common" / "util.py"
    if ("_library_only" in util.read_text()) != on:
        subprocess.run(["patch", "-s", "-p1", *([] if on else ["-R"]), "-d",
                        str(site_packages(venv))], input=PATCH.read_bytes(), check=True)


def seconds(command: list[str], venv: Path) -> float:
    env = {**launch_env(), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - start


def measure(venv: Path, rounds: int) -> dict:
    gloo = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "python", "-c", "pass"]
    mpi = ["mpirun", "-np", "2", "--oversubscribe", "python", "-c", "pass"]
    rows = []
    try:
        for _ in range(rounds):
            row = {"load": os.getloadavg()[0]}
            for name, on in (("unpatched", False), ("patched", True)):
                set_patched(venv, on)
                row[name] = seconds(gloo, venv)
            row["mpirun"] = seconds(mpi, venv)
            rows.append(row)
    finally:
        set_patched(venv, True)
    return compared(rows, "unpatched", "patched", "mpirun")


def compared(rows: list[dict], slow: str, fast: str, *others: str) -> dict:
    """Interleaved rounds of ``slow`` and ``fast`` (seconds): the median of each, the seconds
    saved, and the median ratio over rounds with its spread, (max - min) / median."""
    ratios = [r[slow] / r[fast] for r in rows]
    ratio = statistics.median(ratios)
    saved = [r[slow] - r[fast] for r in rows]
    return {"rounds": rows, "saved_s": {"median": statistics.median(saved), "min": min(saved),
                                        "max": max(saved)},
            "median_s": {k: statistics.median(r[k] for r in rows) for k in (slow, fast, *others)},
            "ratio": ratio, "spread": (max(ratios) - min(ratios)) / ratio}


def markdown(results: dict) -> str:
    lines = ["`horovodrun -np 2 -H localhost:2 --gloo python -c pass`, seconds, median of "
             "interleaved rounds (unpatched, patched); ratio: median over rounds of unpatched / "
             "patched, spread = (max - min) / median. `scripts/launch_overhead.py`.", "",
             "| stack | unpatched s | patched s | saved s (min..max) | mpirun -np 2 s | "
             "ratio (spread) | load before each round |", "|---|---|---|---|---|---|---|"]
    for stack, r in results["stacks"].items():
        m = r["median_s"]
        loads = ", ".join(f"{row['load']:.2f}" for row in r["rounds"])
        saved = r["saved_s"]
        lines.append(f"| {stack} | {m['unpatched']:.2f} | {m['patched']:.2f} | "
                     f"{saved['median']:.1f} ({saved['min']:.1f}..{saved['max']:.1f}) | "
                     f"{m['mpirun']:.2f} | {r['ratio']:.1f}x ({r['spread']:.0%}{noise(r)}) | "
                     f"{loads} |")
    lines += ["", footer(results) + " A ratio whose spread exceeds 10% is marked noise; the "
              "seconds saved per launch are the finding."]
    return "\n".join(lines) + "\n"


def noise(compared_rounds: dict) -> str:
    """The flag a ratio carries in a table when its spread exceeds 10%."""
    return " noise" if compared_rounds["spread"] > 0.10 else ""


def footer(results: dict) -> str:
    return (f"{len(next(iter(results['stacks'].values()))['rounds'])} rounds per stack, "
            f"{results['date_utc']}, {os.cpu_count()} cores.")


def measure_and_write(name: str, doc: str, measure: Callable[[Path, int], dict],
                      markdown: Callable[[dict], str], rounds: int) -> None:
    """The command line of a script here: ``measure`` on each stack's virtualenv, then
    ``NAME.json`` and ``NAME.md`` (``markdown``) written to --out and the table printed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    results = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "stacks": {s: measure(v, args.rounds) for s, v in STACKS.items() if v.is_dir()}}
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    measure_and_write("launch", __doc__, measure, markdown, rounds=7)

"""docs/guarantees.md from runs: the cases of tests/guarantees_worker.py run at 2 ranks on the
installed stack (one job; one more after each case that hangs, for the cases after it), each
case's verdict from what every rank recorded, the page rendered for one or more stacks, and
read back (tests/multirank/test_guarantees.py compares a run's verdicts with the page's).

    python tests/guarantees_table.py --json RESULTS.json    # this stack's run, as JSON

scripts/guarantees.py (``make guarantees``) runs that on each stack's venv and renders the page.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from guarantees_registry import EXACT, RANKS, STALL_ABORT_S
from guarantees_worker import CASES   # every case module imported: all the cases, in order

WORKER = Path(__file__).parent / "guarantees_worker.py"
DOC = Path(__file__).parent.parent / "docs" / "guarantees.md"
TOLERANCE = 1e-5   # relative to the reference's largest weight (1 at least)
JOB_TIMEOUT_S = 480

SAME_AS_2B, NOT_2B = "identical, = 1 rank at 2B", "identical, ≠ 1 rank at 2B"
IDENTICAL, WRONG, DIFFERS, REFUSED, HANG, ERROR, NOT_OFFERED = (
    "identical", "wrong", "differs", "refused", "hang", "error", "not offered")
VERDICTS = {
    SAME_AS_2B: "every rank's final weights bitwise equal, and within 1e-5 (relative to the "
                "largest weight) of 1 rank trained at twice the batch on the same global "
                "batches with a plain optimizer",
    NOT_2B: "every rank's weights equal, but more than 1e-5 from 1 rank at twice the batch, "
            "which is the contract: a silent wrong result",
    IDENTICAL: "every rank's weights equal, where 1 rank at twice the batch is not the contract "
               "(the note says why; the difference is shown where it means something)",
    WRONG: "every rank's weights equal, but a check of the pattern failed (named below)",
    DIFFERS: "the ranks end with different weights: a silent wrong result",
    REFUSED: "every rank stopped with the same one-line error (hvdtrain's UserError, below)",
    HANG: "a collective waited until Horovod's stall check shut the job's collectives down "
          f"({STALL_ABORT_S} s here; 600 s by default), or the job ran past its time limit",
    ERROR: "an exception other than hvdtrain's one-line error (its type and first line below), "
           "or a refusal on some ranks only",
    NOT_OFFERED: "the pattern does not exist on this stack",
}
STACKS = {"keras3": "Keras 3", "keras2": "Keras 2"}   # key -> column label


@dataclass(frozen=True)
class Row:
    case: str
    verdict: str
    across: float | None = None       # largest difference between ranks
    to_2b: float | None = None        # largest difference to 1 rank at 2B
    detail: str = ""                  # the refusal, error or check, word for word


def stack_key(stack: str) -> str:
    """"tensorflow 2.21.0, keras 3.15.1, horovod 0.28.1" -> "keras3"."""
    return "keras" + re.search(r"keras (\d+)", stack).group(1)


# ---------------------------------------------------------------------------------------------
# Verdicts

def own_words(message: str) -> str:
    """What a rank said itself: not Horovod's shut-down notice, which every rank of a stalled
    job gets (the stall check's report says more)."""
    text = message.split(" (then: ")[0]
    return "" if "Horovod has been shut down" in text else text


def verdict(name: str, contract: str, ranks: list[dict | None], job: str = "") -> Row:
    """The verdict on one case from every rank's record (None: the rank recorded nothing, the
    job having ended in it); ``job``: what the job said when it ended in this case."""
    said = [(r, rec["status"], own_words(rec["message"])) for r, rec in enumerate(ranks) if rec]
    words = "; ".join(f"rank {r}: {status}: {text}" for r, status, text in said if text)
    statuses = [rec["status"] if rec else None for rec in ranks]
    if None in statuses or HANG in statuses:
        return Row(name, HANG, detail="; ".join(filter(None, [words, job])))
    if all(s == NOT_OFFERED for s in statuses):
        return Row(name, NOT_OFFERED, detail=ranks[0]["message"])
    if all(s == REFUSED for s in statuses) and len({rec["message"] for rec in ranks}) == 1:
        return Row(name, REFUSED, detail=ranks[0]["message"])
    if any(s != "done" for s in statuses):
        return Row(name, ERROR, detail=words)
    spread = [rec.get("across") for rec in ranks]
    across = None if None in spread else max(spread)
    to_2b = ranks[0].get("to_2b")
    checks = "; ".join(f"{what}: {'yes' if holds else 'NO'} ({detail})"
                       for what, (holds, detail) in ranks[0].get("checks", {}).items())
    if across is None or across > 0:
        return Row(name, DIFFERS, across if across is not None else float("inf"), to_2b, checks)
    if not all(holds for holds, _ in ranks[0].get("checks", {}).values()):
        return Row(name, WRONG, across, to_2b, checks)
    if contract == EXACT:
        limit = TOLERANCE * max(1.0, ranks[0].get("reference_scale", 1.0))
        return Row(name, SAME_AS_2B if to_2b is not None and to_2b <= limit else NOT_2B,
                   across, to_2b, checks)
    return Row(name, IDENTICAL, across, to_2b, checks)


def verdicts(results: dict) -> dict[str, Row]:
    """Every case's Row, from run_stack's results."""
    contracts = {c.name: c.contract for c in CASES}
    return {name: verdict(name, contracts[name], entry["ranks"], entry.get("job", ""))
            for name, entry in results["cases"].items()}


# ---------------------------------------------------------------------------------------------
# Running the cases on this stack

def stall_line(output: str) -> str:
    """Horovod's stall report: the tensors each rank waited in, shortened."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith("Missing ranks:"):
            # (a log line of the other rank's may follow on the same line: cut at its date)
            waits = [" ".join(re.split(r"\[\d{4}-\d\d-\d\d ", w)[0].split())[:160]
                     for w in lines[i + 1:i + 1 + RANKS] if re.match(r"\s*\d+!?: ", w)]
            return "Horovod's stall check: missing ranks: " + "; ".join(waits)
    return ""


def run_stack(work: Path, timeout: float = JOB_TIMEOUT_S) -> dict:
    """The cases at 2 ranks under mpirun with this interpreter, as few jobs as the hangs allow:
    each case's records from every rank, the stack, the jobs and their seconds."""
    from helpers import JobTimedOut, launch
    names = [c.name for c in CASES]
    cases: dict[str, dict] = {}
    stack, seconds, jobs = "", 0.0, 0
    while remaining := [n for n in names if n not in cases]:
        out = work / f"job{jobs}"
        argv = [sys.executable, str(WORKER), "--out", str(out), "--cases", ",".join(remaining)]
        started = time.monotonic()
        try:
            job = launch("mpi", RANKS, argv, timeout=timeout)
            output = job.output
            ending = f"the job exited with status {job.returncode}" if job.returncode else ""
        except JobTimedOut as e:
            output, ending = str(e), f"the job ran past its {timeout:.0f} s and was killed"
        seconds += time.monotonic() - started
        jobs += 1
        reports = [json.loads(p.read_text()) if p.exists() else {}
                   for p in (out / f"rank{r}.json" for r in range(RANKS))]
        stack = next((r["stack"] for r in reports if r.get("stack")), stack)
        for name in remaining:
            records = [report.get("cases", {}).get(name) for report in reports]
            if all(records) and not any(rec["status"] == HANG for rec in records):
                cases[name] = {"ranks": records}
                continue
            if f"case {name} start" not in output:
                raise RuntimeError(f"the cases' job never started {name}: {ending or 'it ended'}; "
                                   f"its output:\n{output[-4000:]}")
            cases[name] = {"ranks": records,
                           "job": "; ".join(filter(None, [stall_line(output), ending]))}
            break
    return {"stack": stack, "key": stack_key(stack), "jobs": jobs, "seconds": round(seconds, 1),
            "cases": {name: cases[name] for name in names}}


# ---------------------------------------------------------------------------------------------
# The page, and reading it back

def figure(value: float | None) -> str:
    if value is None:
        return "—"
    return "0" if value == 0 else f"{value:.1e}"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(runs: list[dict], *, command: str, date: str, code: str) -> str:
    """docs/guarantees.md for ``runs`` (run_stack's results, one per stack); ``code``: which
    hvdtrain ran (its commit)."""
    runs = sorted(runs, key=lambda run: list(STACKS).index(run["key"]))
    rows = {run["key"]: verdicts(run) for run in runs}
    lines = [
        "# What hvdtrain guarantees, from runs",
        "",
        f"Generated by `{command}` on {date} ({code}); do not edit by hand. "
        "`tests/multirank/test_guarantees.py` runs the same cases on the installed stack and "
        "fails when a verdict differs from this page.",
        "",
        "Each row is a pattern of a user's own Keras script through hvdtrain's library path "
        "(`from hvdtrain import distributed as dist`: `dist.init()`, "
        "`dist.distributed_optimizer(...)`, `dist.fit_callbacks()`, `model.fit` or an own "
        "`train_step`), run at 2 ranks x batch 8 for 4 steps on 16-feature data, rank r seeded "
        "100 + r (so only rank 0's broadcast makes them start alike): the cases of "
        "`tests/guarantees_worker.py`, all in one 2-rank job per stack under mpirun (one more "
        "job after a case that hangs). *across ranks*: the largest difference between a "
        "rank's final weights (BatchNormalization's moving statistics included) and rank 0's. "
        "*to 1 rank at 2B*: the largest difference to the same script at 1 rank, batch 16, on "
        "the same global batches (rank 0's batch k, then rank 1's), with a plain optimizer and "
        "no hvdtrain, from rank 0's initial weights (or the restored state). Horovod's own "
        "API through hvdtrain runs in the same jobs: [horovod-api.md](horovod-api.md).",
        "",
    ]
    for run in runs:
        lines.append(f"- {STACKS[run['key']]}: {run['stack']}; {run['jobs']} "
                     f"job{'s' if run['jobs'] > 1 else ''}, {run['seconds']:.0f} s")
    lines += ["", "Verdicts:", ""]
    lines += [f"- `{name}`: {meaning}" for name, meaning in VERDICTS.items()]
    library = [entry for entry in CASES if entry.family == "library"]
    lines += ["", *case_table(runs, rows, library)]
    lines += said(runs, rows, library)
    return "\n".join(lines) + "\n"


def case_table(runs: list[dict], rows: dict[str, dict[str, Row]], cases: list) -> list[str]:
    """The table of ``cases``: per stack the verdict and its figures, then the note."""
    labels = [STACKS[run["key"]] for run in runs]
    header = ["pattern"] + [part for label in labels
                            for part in (label, "across ranks", "to 1 rank at 2B")] + [
        "the case, and what it needs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in cases:
        cells = [f"`{entry.name}`: {entry.title}"]
        for run in runs:
            row = rows[run["key"]][entry.name]
            cells += [row.verdict, figure(row.across), figure(row.to_2b)]
        contract = "the contract: 1 rank at 2B. " if entry.contract == EXACT else ""
        lines.append("| " + " | ".join(cell(c) for c in [*cells, contract + entry.note]) + " |")
    return lines


def said(runs: list[dict], rows: dict[str, dict[str, Row]], cases: list) -> list[str]:
    """What each stack's runs of ``cases`` said: refusals, errors and checks, word for word."""
    names = {entry.name for entry in cases}
    lines = []
    for run in runs:
        words = [row for row in rows[run["key"]].values() if row.detail and row.case in names]
        lines += ["", f"## What the {STACKS[run['key']]} runs said", ""]
        lines += [f"- `{row.case}` ({row.verdict}): {row.detail}" for row in words]
    return lines


def first_table(text: str) -> str:
    """The first Markdown table in ``text``: its lines from the first that starts with "| "."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
               len(lines))
    return "\n".join(lines[start:end])


def parse(text: str) -> dict[str, dict[str, str]]:
    """The verdicts of the page's first table: stack key -> case -> verdict."""
    found: dict[str, dict[str, str]] = {}
    table = [line for line in first_table(text).splitlines() if line.startswith("| ")]
    header = [c.strip() for c in table[0].strip("|").split(" | ")]
    columns = {key: header.index(label) for key, label in STACKS.items() if label in header}
    for line in table[1:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        name = re.match(r"`(\w+)`", cells[0]).group(1)
        for key, column in columns.items():
            found.setdefault(key, {})[name] = cells[column]
    return found


def mismatches(expected: dict[str, str], found: dict[str, Row]) -> list[str]:
    """Each case whose verdict on the page is not the run's, or that only one of them has."""
    out = []
    for name in sorted(set(expected) | set(found)):
        got = found[name].verdict if name in found else "(not run)"
        want = expected.get(name, "(not on the page)")
        if got != want:
            detail = f" ({found[name].detail})" if name in found and found[name].detail else ""
            out.append(f"{name}: the page says {want!r}, the run {got!r}{detail}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, type=Path, help="the results, written here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hvdtrain-guarantees-") as work:
        results = run_stack(Path(work))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    for row in verdicts(results).values():
        print(f"{row.case:30} {row.verdict:28} {figure(row.across):>8} {figure(row.to_2b):>8}")
    print(f"{results['stack']}: {results['jobs']} job(s), {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()

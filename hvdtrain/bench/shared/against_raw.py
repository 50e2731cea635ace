"""bench phases' all-reduces after backprop against raw ``MPI_Allreduce`` of the same bytes: the
raw figure (timed in a launch of its own), which runs count, their ratio per round, and their
table with the target's verdict (shared/targets.py)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from hvdtrain.bench.shared import collectives, report, stats
from hvdtrain.bench.shared.targets import STEP_ALLREDUCE_OVER_RAW
from hvdtrain.bench.shared.timeline import PHASES

RAW_REPEATS = 5   # timed batches of raw MPI_Allreduce a round
# The phases held against raw MPI_Allreduce of the same bytes.
AGAINST_RAW = ("MPI_ALLREDUCE", "ALLREDUCE")
SAME_BYTES = 0.01


def raw_mpi_ms(nbytes: int, ranks: int, work_dir: Path) -> float:
    """Raw MPI_Allreduce of ``nbytes`` on ``ranks`` ranks (bench allreduce's mpi4py path, its
    own launch): milliseconds per call, the median batch."""
    timed = collectives.measure(collectives.RAW_MPI, [nbytes], ranks, RAW_REPEATS, work_dir)
    return timed["rows"][0]["seconds"]["median"] * 1e3


def same_bytes(nbytes: int | None, reference: int) -> bool:
    """Whether a run all-reduced the bytes of the reference (this stack's flat tensor, whose
    gradients are padded to aligned starts: SAME_BYTES of them at most)."""
    return nbytes is not None and abs(nbytes - reference) <= SAME_BYTES * reference


def of_raw_mpi(rounds: Sequence[Mapping[str, dict]]) -> dict[str, Any]:
    """Per run whose all-reduce ran after backprop in every round (during none of it), on the
    same bytes, each of AGAINST_RAW's phases over the round's raw MPI_Allreduce of those bytes
    (measured after this stack's job), per round: median and spread. Empty where a round has
    no raw figure."""
    if not all("raw_mpi_ms" in r["this"] for r in rounds):
        return {}
    out: dict[str, Any] = {}
    for which in rounds[0]:
        runs = [r[which] for r in rounds]
        if not all(j.get("during_backprop") == 0.0 and
                   same_bytes(j.get("gradient_bytes"), r["this"]["gradient_bytes"])
                   for j, r in zip(runs, rounds)):
            continue
        out[which] = {n: stats.ratio_summary([j["phases_ms"][n] / r["this"]["raw_mpi_ms"]
                                              for j, r in zip(runs, rounds)], stats.SPREAD_LIMIT)
                      for n in AGAINST_RAW if all(n in j["phases_ms"] for j in runs)}
    return out


def table_lines(result: dict[str, Any]) -> list[str]:
    """The table of the all-reduces after backprop against raw MPI_Allreduce, and the
    target's verdict on this stack's; nothing where no round timed raw MPI."""
    rows, verdicts = [], []
    for r in result["results"]:
        against = r.get("of_raw_mpi") or {}
        raw_ms = statistics.median(rd["this"]["raw_mpi_ms"] for rd in r["rounds"]) \
            if against else 0.0
        for which, ratios in against.items():
            rows.append([r["model"], which, f"{r['rounds'][0][which]['gradient_bytes']:,}",
                         f"{raw_ms:.2f}"] + [stats.ratio_cell(ratios[n]) if n in ratios
                                             else "" for n in AGAINST_RAW])
        if "ALLREDUCE" in against.get("this", {}):
            ratio = against["this"]["ALLREDUCE"]
            verdicts.append(f"- {r['model']}, this stack's all-reduce over raw MPI_Allreduce: "
                            f"{stats.ratio_cell(ratio, STEP_ALLREDUCE_OVER_RAW, at_least=False)}")
    if not rows:
        return []
    return ["", "The all-reduces that ran after backprop against raw `MPI_Allreduce` of the "
                "same bytes (mpi4py, preallocated buffers, one core per rank, in a launch of "
                "its own right after this stack's job of each round): raw MPI's time (median "
                "over rounds), and per round the phase over it, median ratio (spread).", "",
            report.markdown_table(["model", "stack", "gradient bytes", "raw MPI_Allreduce, ms",
                                   f"{PHASES['MPI_ALLREDUCE']} / raw",
                                   "all-reduce / raw"], rows), "",
            f"Target: this stack's all-reduce within {STEP_ALLREDUCE_OVER_RAW:g}x raw "
            f"MPI_Allreduce of the same bytes.", *verdicts]

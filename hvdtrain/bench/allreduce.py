"""All-reduce bus bandwidth against message size, with the definitions of nccl-tests.

    algbw = S / t          (S: bytes in the message, t: time per all-reduce)
    busbw = algbw * 2(N-1)/N

busbw is the rate at which each rank's link carries data in a ring all-reduce (each rank sends
2(N-1)/N * S), so it can be compared across N and with a link's bandwidth. Every path is its
own launch (Horovod's background thread and TensorFlow's pools would compete with the next
path's ranks for the cores), with 2 ranks bound one per core:

- raw ``MPI_Allreduce`` through mpi4py on buffers allocated once per size (Open MPI defaults),
  with separate send and receive buffers, and in place (``MPI_IN_PLACE``);
- Horovod over MPI (mpirun) and over Gloo (horovodrun --gloo), as hvdtrain launches it, with
  the message as one tensor, one ``tf.function`` call from Python per all-reduce, and split
  into 8 tensors submitted together (as an optimizer submits gradients) with tensor fusion on
  (Horovod's default) and off (HOROVOD_FUSION_THRESHOLD=0);
- Horovod over MPI as a training step calls it: ``collectives.CHAIN`` all-reduces chained in
  one ``tf.function``, each on the one before's output, which the op reduces in its own
  buffer; the per-all-reduce time is the call's over CHAIN (the first of each call reduces the
  held input into a new buffer). It is held against raw MPI in place, the others against raw
  MPI with separate buffers;
- a memory-copy reference: numpy copying S bytes between two preallocated buffers in one
  process, the bandwidth one core's memory traffic reaches here.

Each size is timed ``repeats`` times over a batch of back-to-back all-reduces (more for small
messages); the time of a batch is the slowest rank's, and the figure is the median batch.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.bench import registry
from hvdtrain.bench.shared import collectives, host, plots, report, stats
from hvdtrain.bench.shared.collectives import (FULL_PATHS, HOROVOD_MPI, HOROVOD_MPI_CHAINED,
                                               QUICK_PATHS, ops_per_batch, time_batches)
from hvdtrain.bench.shared.targets import (BANDWIDTH, BANDWIDTH_WINDOW, FLOOR, FLOOR_BYTES, KIB,
                                           MIB)

FULL_SIZES = tuple(4 * KIB * 4 ** k for k in range(8))       # 4 KiB .. 64 MiB
QUICK_SIZES = (4 * KIB, 1 * MIB, 4 * MIB)


# ---------------------------------------------------------------------------------------------
# Driver

def memcpy_reference(sizes: Sequence[int], repeats: int) -> list[dict]:
    """Copy bandwidth between two preallocated buffers, in this process (one core)."""
    import numpy as np
    rows = []
    for nbytes in sizes:
        src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        ops = ops_per_batch(nbytes)
        seconds = time_batches(lambda: np.copyto(dst, src), ops, repeats, lambda s: s,
                                lambda: None)
        rows.append({"bytes": nbytes, "seconds": seconds})
    return rows


def _raw_for(path: dict, paths: list[dict]) -> dict | None:
    """The raw MPI_Allreduce path a path is held against: in place for one reducing in place,
    separate buffers otherwise (the first raw path of that kind)."""
    return next((p for p in paths if p["kind"] == "mpi4py"
                 and p.get("in_place", False) == path.get("in_place", False)), None)


def add_ratios(paths: list[dict]) -> None:
    """Each path's busbw as a fraction of raw MPI_Allreduce's at the same size, with the same
    kind of buffers (_raw_for)."""
    for p in paths:
        raw = _raw_for(p, paths)
        if raw is None:
            continue
        reference = {r["bytes"]: r["busbw_GBps"] for r in raw["rows"]}
        for r in p["rows"]:
            r["of_raw_mpi"] = r["busbw_GBps"] / reference[r["bytes"]]


RANKS = 2


def run(out_dir: Path, *, quick: bool = False) -> dict[str, Any]:
    machine = host.machine()   # before the work: its load is the machine's own
    sizes = QUICK_SIZES if quick else FULL_SIZES
    paths = QUICK_PATHS if quick else FULL_PATHS
    ranks, repeats = RANKS, (3 if quick else 5)
    measured = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for path in paths:
            report.say(f"allreduce: {path.label}, {len(sizes)} sizes on {ranks} ranks...")
            measured.append(collectives.measure(path, sizes, ranks, repeats, Path(tmp)))
    add_ratios(measured)
    copy = [{**r, "GBps": r["bytes"] / stats.summarize(r["seconds"])["median"] / 1e9}
            for r in memcpy_reference(sizes, repeats)]
    result = {"benchmark": "allreduce", "machine": machine, "ranks": ranks,
              "repeats": repeats, "paths": measured, "memcpy": copy,
              "target": _target(measured)}
    report.write_outputs(out_dir, "allreduce", result, markdown(result))
    plot(out_dir, result)
    return result


TARGET_PATHS = (HOROVOD_MPI, HOROVOD_MPI_CHAINED)


def _target(paths: list[dict]) -> dict[str, Any]:
    """Each of TARGET_PATHS measured, against its raw MPI path (_raw_for): the smallest
    bus-bandwidth ratio within BANDWIDTH_WINDOW (sizes outside it, 64 MiB say, do not count)
    and the time ratio at FLOOR_BYTES, each with its goal and whether it is met."""
    out: dict[str, Any] = {"bandwidth_window_bytes": list(BANDWIDTH_WINDOW),
                           "bandwidth_goal": BANDWIDTH, "floor_bytes": FLOOR_BYTES,
                           "floor_goal": FLOOR, "paths": []}
    for wanted in TARGET_PATHS:
        path = next((p for p in paths if p["label"] == wanted.label), None)
        raw = path and _raw_for(path, paths)
        if path is None or raw is None:
            continue
        out["paths"].append({"label": path["label"], "raw": raw["label"],
                             **_path_target(path, raw)})
    return out if out["paths"] else {}


def _path_target(path: dict, raw: dict) -> dict[str, Any]:
    low, high = BANDWIDTH_WINDOW
    window = [r for r in path["rows"] if low <= r["bytes"] <= high]
    worst = min(window, key=lambda r: r["of_raw_mpi"]) if window else None
    raw_time = {r["bytes"]: r["seconds"]["median"] for r in raw["rows"]}
    floor = next((r for r in path["rows"] if r["bytes"] == FLOOR_BYTES), None)
    out: dict[str, Any] = {}
    if worst is not None:
        out.update(of_raw_mpi_min_in_window=worst["of_raw_mpi"], worst_bytes=worst["bytes"],
                   bandwidth_met=worst["of_raw_mpi"] >= BANDWIDTH)
    if floor is not None and FLOOR_BYTES in raw_time:
        ratio = floor["seconds"]["median"] / raw_time[FLOOR_BYTES]
        out.update(floor_us=floor["seconds"]["median"] * 1e6,
                   floor_raw_mpi_us=raw_time[FLOOR_BYTES] * 1e6,
                   floor_time_over_raw_mpi=ratio, floor_met=ratio <= FLOOR)
    return out


def target_lines(target: dict[str, Any]) -> list[str]:
    """The targets in words, for the table's foot."""
    lines = []
    for t in target.get("paths", []):
        if "of_raw_mpi_min_in_window" in t:
            low, high = target["bandwidth_window_bytes"]
            v = t["of_raw_mpi_min_in_window"]
            lines.append(f"- {t['label']}: bus bandwidth over {t['raw']}'s, lowest from "
                         f"{_size_label(low)} to {_size_label(high)}: {v:.4f} (at "
                         f"{_size_label(t['worst_bytes'])}): "
                         f"{stats.verdict(v, target['bandwidth_goal'])}")
        if "floor_time_over_raw_mpi" in t:
            v = t["floor_time_over_raw_mpi"]
            lines.append(f"- {t['label']}: the {_size_label(target['floor_bytes'])} floor, "
                         f"{t['floor_us']:,.1f} us against {t['raw']}'s "
                         f"{t['floor_raw_mpi_us']:,.1f} us, {v:,.2f}x: "
                         f"{stats.verdict(v, target['floor_goal'], at_least=False)}")
    return lines


def _size_label(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def markdown(result: dict[str, Any]) -> str:
    sizes = [r["bytes"] for r in result["paths"][0]["rows"]]
    headers = ["path"] + [_size_label(s) for s in sizes]
    rows = [[p["label"]] + [f"{r['busbw_GBps']:.2f}" for r in p["rows"]]
            for p in result["paths"]]
    rows.append(["memcpy, one process (GB/s copied)"]
                + [f"{r['GBps']:.2f}" for r in result["memcpy"]])
    ratio_rows = [[p["label"]] + [f"{r.get('of_raw_mpi', float('nan')):.2f}" for r in p["rows"]]
                  for p in result["paths"] if p["kind"] != "mpi4py"]
    latency = [[p["label"]] + [f"{r['seconds']['median'] * 1e6:,.0f}" for r in p["rows"]]
               for p in result["paths"]]
    return "\n".join([
        f"All-reduce bus bandwidth, GB/s (nccl-tests definitions, {result['ranks']} ranks, "
        f"one core each; median of {result['repeats']} batches):", "",
        report.markdown_table(headers, rows), "",
        "Bus bandwidth as a fraction of raw MPI_Allreduce's (separate buffers; in place for "
        "the chained path):", "",
        report.markdown_table(headers, ratio_rows), "",
        "Time per all-reduce, microseconds:", "",
        report.markdown_table(headers, latency), "",
        "Targets (medians of the batches above; the Gloo path against MPI on the demo job is "
        "bench peers' hvdtrain-gloo row):", "", *target_lines(result.get("target", {}))])


def plot(out_dir: Path, result: dict[str, Any]) -> None:
    series = {p["label"]: ([r["bytes"] for r in p["rows"]], [r["busbw_GBps"] for r in p["rows"]])
              for p in result["paths"]}
    series["memcpy (GB/s copied)"] = ([r["bytes"] for r in result["memcpy"]],
                                      [r["GBps"] for r in result["memcpy"]])
    plots.plot_lines(out_dir / "allreduce.png", series, title="All-reduce bus bandwidth",
                      xlabel="message size (bytes)", ylabel="busbw (GB/s)", logx=True,
                      logy=True)



def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench allreduce``."""
    run(Path(args.out), quick=args.quick)


BENCHMARK = registry.Benchmark(
    name="allreduce",
    help="all-reduce bus bandwidth against message size (Horovod, MPI, Gloo)",
    main=main, in_all=True, title="All-reduce bus bandwidth")



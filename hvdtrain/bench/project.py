"""A projection past this machine: the ring all-reduce cost model, fed with measured figures.

One training step on N ranks costs its compute time t_c plus one ring all-reduce of the
gradients (S bytes, fused into one buffer by Horovod):

    T_ar(N) = 2(N-1) * a + 2(N-1)/N * S * b        (a: latency per hop, b: seconds per byte)
    E(N)    = t_c / (t_c + T_ar(N))                  (weak-scaling efficiency, no overlap)

t_c is measured (one rank's step time in the scaling benchmark), S is 4 bytes per parameter.
a and b are either this machine's, fitted to the measured Horovod/MPI all-reduce (a from the
smallest message, b from the best bus bandwidth at 1 MiB and above), or a cluster's, given as
parameters (default: 25 Gbit/s links and 10 us per hop, the RoCE network of Horovod's
published 512-GPU run). The model ignores the overlap of back-propagation with the all-reduce,
which Horovod does, so it is pessimistic for large models; Horovod's paper (Sergeev and
Del Balso, 2018) reports 90% at 512 GPUs for ResNet-101 and Inception V3 and 68% for VGG-16.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.bench import common, registry
from hvdtrain.errors import UserError

RANKS = (8, 64, 512)
PUBLISHED = {"ResNet-101": 0.90, "Inception V3": 0.90, "VGG-16": 0.68}  # at 512 GPUs
CLUSTER_LINK_GBITPS = 25.0
CLUSTER_LATENCY_US = 10.0


def ring_allreduce_seconds(ranks: int, nbytes: float, latency_s: float,
                           seconds_per_byte: float) -> float:
    """2(N-1)a + 2(N-1)/N * S * b: each rank sends 2(N-1) chunks of S/N bytes."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    return 2 * (ranks - 1) * latency_s + 2 * (ranks - 1) / ranks * nbytes * seconds_per_byte


def efficiency(compute_s: float, ranks: int, nbytes: float, latency_s: float,
               seconds_per_byte: float) -> float:
    """Weak-scaling efficiency of a step of ``compute_s`` seconds followed by a ring all-reduce
    of ``nbytes`` over ``ranks``: compute / (compute + all-reduce)."""
    return compute_s / (compute_s + ring_allreduce_seconds(ranks, nbytes, latency_s,
                                                           seconds_per_byte))


def fit_link(allreduce_result: dict[str, Any]) -> dict[str, float]:
    """This machine's a and b from the Horovod/MPI path of the all-reduce benchmark."""
    from hvdtrain.bench.allreduce import HOROVOD_MPI, MIB
    path = next((p for p in allreduce_result["paths"] if p["label"] == HOROVOD_MPI.label), None)
    if path is None:
        raise UserError("the all-reduce results hold no Horovod/MPI path: run "
                        "'hvdtrain bench allreduce' first")
    ranks = allreduce_result["ranks"]
    smallest = min(path["rows"], key=lambda r: r["bytes"])
    big = [r["busbw_GBps"] for r in path["rows"] if r["bytes"] >= MIB] or \
        [r["busbw_GBps"] for r in path["rows"]]
    return {"latency_s": smallest["seconds"]["median"] / (2 * (ranks - 1)),
            "seconds_per_byte": 1 / (max(big) * 1e9)}


def project(models: Sequence[dict[str, Any]], links: dict[str, dict[str, float]],
            ranks: Sequence[int] = RANKS) -> list[dict[str, Any]]:
    """Efficiency at each N for each model (compute_s, params) on each link."""
    rows = []
    for m in models:
        nbytes = 4.0 * m["params"]
        for link_name, link in links.items():
            rows.append({"model": m["model"], "link": link_name, "params": m["params"],
                         "compute_s": m["compute_s"],
                         "efficiency": {str(n): efficiency(m["compute_s"], n, nbytes,
                                                           link["latency_s"],
                                                           link["seconds_per_byte"])
                                        for n in ranks}})
    return rows


def run(out_dir: Path, *, link_gbitps: float = CLUSTER_LINK_GBITPS,
        latency_us: float = CLUSTER_LATENCY_US) -> dict[str, Any]:
    scaling = _read(out_dir / "scaling.json", "scaling")
    allreduce = _read(out_dir / "allreduce.json", "allreduce")
    models = []
    for r in scaling["results"]:
        if r["ranks"] == 1:
            step_s = r["batch_size_per_rank"] / r["total_samples_per_sec"]["median"]
            models.append({"model": r["model"], "params": r["raw"][0]["params"],
                           "compute_s": step_s})
    links = {"this machine (measured Horovod/MPI)": fit_link(allreduce),
             f"cluster ({link_gbitps:g} Gbit/s, {latency_us:g} us)": {
                 "latency_s": latency_us * 1e-6,
                 "seconds_per_byte": 8 / (link_gbitps * 1e9)}}
    result = {"benchmark": "project", "machine": common.machine(), "ranks": list(RANKS),
              "links": links, "published_512": PUBLISHED, "rows": project(models, links)}
    common.write_outputs(out_dir, "project", result, markdown(result))
    plot(out_dir, result)
    return result


def _read(path: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"{path} is missing or unreadable: run 'hvdtrain bench {name} --out "
                        f"{path.parent}' first (or 'hvdtrain bench all')") from None


def markdown(result: dict[str, Any]) -> str:
    ranks = [str(n) for n in result["ranks"]]
    rows = [[r["model"], f"{r['params']:,}", f"{r['compute_s'] * 1e3:,.0f}", r["link"]]
            + [f"{r['efficiency'][n]:.2f}" for n in ranks] for r in result["rows"]]
    rows += [[name, "", "", "Horovod's paper, 512 GPUs, 25 GbE RoCE"] + [""] * (len(ranks) - 1)
             + [f"{e:.2f}"] for name, e in result["published_512"].items()]
    links = "; ".join(f"{k}: a = {v['latency_s'] * 1e6:,.1f} us, 1/b = "
                      f"{1 / v['seconds_per_byte'] / 1e9:,.2f} GB/s"
                      for k, v in result["links"].items())
    return "\n".join([
        "Projected weak-scaling efficiency, ring model 2(N-1)a + 2(N-1)/N*S*b, no overlap "
        f"({links}):", "",
        common.markdown_table(["model", "parameters", "compute ms/step", "link"]
                              + [f"N={n}" for n in ranks], rows)])


def plot(out_dir: Path, result: dict[str, Any]) -> None:
    ranks = result["ranks"]
    series = {f"{r['model']}, {r['link']}": (ranks, [r["efficiency"][str(n)] for n in ranks])
              for r in result["rows"]}
    common.plot_lines(out_dir / "project.png", series, title="Projected efficiency (ring model)",
                      xlabel="ranks", ylabel="efficiency", logx=True)



# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench project

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench project's options (bench all's too)."""
    parser.add_argument("--link-gbitps", type=float, default=CLUSTER_LINK_GBITPS,
                        help=f"cluster link bandwidth for the projection (default "
                             f"{CLUSTER_LINK_GBITPS:g})")
    parser.add_argument("--latency-us", type=float, default=CLUSTER_LATENCY_US,
                        help=f"cluster latency per hop for the projection (default "
                             f"{CLUSTER_LATENCY_US:g})")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench project``: from scaling.json and allreduce.json in --out."""
    run(Path(args.out), link_gbitps=args.link_gbitps, latency_us=args.latency_us)


BENCHMARK = registry.Benchmark(
    name="project", help="ring-model efficiency at 8, 64, 512 ranks from the measured figures",
    main=main, add_arguments=add_arguments, quick=False, title="Projection past this machine")

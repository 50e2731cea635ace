"""A projection past this machine: the cost model of a step on N ranks (shared/cost_model.py),
fed with measured figures, and checked against Horovod's paper (shared/paper.py).

t_c is measured (one rank's step time in bench scaling), S is 4 bytes per parameter, in one
fused all-reduce (hvdtrain's binding reduces a step's gradients together, under Horovod's
fusion threshold). The link is either this machine's, each term fitted to its own measurement
in bench allreduce (a hop's latency from raw MPI_Allreduce, Horovod's fixed cost per fused
all-reduce from Horovod/MPI less raw MPI, the bandwidth from Horovod/MPI), or a cluster's,
given as parameters (default: 25 Gbit/s links and 10 us per hop, the RoCE network of Horovod's
published 512-GPU run) with Horovod's fixed cost as measured here. The model ignores the
overlap of back-propagation with the all-reduce, which Horovod does, so it is pessimistic for
large models. Nothing is measured here: it reads scaling.json and allreduce.json in --out.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.errors import UserError
from hvdtrain.bench import registry
from hvdtrain.bench.shared import cost_model, host, paper, plots, report
from hvdtrain.bench.shared.cost_model import Link

RANKS = (8, 64, 512)
CLUSTER_LINK_GBITPS = paper.CLUSTER_LINK_GBITPS
CLUSTER_LATENCY_US = paper.CLUSTER_LATENCY_US
THIS_MACHINE = "this machine (measured Horovod/MPI)"


def project(models: Sequence[dict[str, Any]], links: dict[str, Link],
            ranks: Sequence[int] = RANKS) -> list[dict[str, Any]]:
    """Efficiency at each N for each model (compute_s, params) on each link, and the
    all-reduce's terms at each N."""
    rows = []
    for m in models:
        nbytes = 4.0 * m["params"]
        for link_name, link in links.items():
            rows.append({"model": m["model"], "link": link_name, "params": m["params"],
                         "compute_s": m["compute_s"],
                         "efficiency": {str(n): cost_model.efficiency(m["compute_s"], n, nbytes,
                                                                      link) for n in ranks},
                         "allreduce": {str(n): cost_model.allreduce_parts(n, nbytes, link)
                                       for n in ranks}})
    return rows


def measured_models(scaling: dict[str, Any]) -> list[dict[str, Any]]:
    """Each model's one-rank step (seconds) and parameter count from bench scaling's result."""
    return [{"model": r["model"], "params": r["raw"][0]["params"],
             "compute_s": r["batch_size_per_rank"] / r["total_samples_per_sec"]["median"]}
            for r in scaling["results"] if r["ranks"] == 1]


def links(allreduce: dict[str, Any], link_gbitps: float, latency_us: float
          ) -> dict[str, Link]:
    """This machine's link, fitted to bench allreduce's result, and the cluster's (its hop and
    bandwidth given, Horovod's fixed cost as measured here); UserError when the result lacks
    a path the fit needs."""
    try:
        here = cost_model.fit_link(allreduce)
    except ValueError as e:
        raise UserError(f"{e}: run 'hvdtrain bench allreduce' first") from None
    cluster = Link(hop_s=latency_us * 1e-6, seconds_per_byte=8 / (link_gbitps * 1e9),
                   fixed_s=here.fixed_s)
    return {THIS_MACHINE: here, f"cluster ({link_gbitps:g} Gbit/s, {latency_us:g} us)": cluster}


def run(out_dir: Path, *, link_gbitps: float = CLUSTER_LINK_GBITPS,
        latency_us: float = CLUSTER_LATENCY_US) -> dict[str, Any]:
    scaling = _read(out_dir / "scaling.json", "scaling")
    allreduce = _read(out_dir / "allreduce.json", "allreduce")
    fitted = links(allreduce, link_gbitps, latency_us)
    # Measured nothing itself: its machine is the one its link was measured on.
    result = {"benchmark": "project", "machine": allreduce["machine"], "ranks": list(RANKS),
              "links": {k: v.as_dict() for k, v in fitted.items()},
              "published_512": paper.PUBLISHED,
              "rows": project(measured_models(scaling), fitted),
              # The measured inputs: which runs the figures above came from.
              "inputs": {name: {"date_utc": r["machine"]["date_utc"],
                                "stack": host.stack_line(r["machine"].get("versions", {}))}
                         for name, r in (("scaling.json", scaling), ("allreduce.json",
                                                                     allreduce))},
              "paper_validation": paper.validate_paper(link_gbitps)}
    report.write_outputs(out_dir, "project", result, markdown(result))
    plot(out_dir, result)
    return result


def _read(path: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"{path} is missing or unreadable: run 'hvdtrain bench {name} --out "
                        f"{path.parent}' first (or 'hvdtrain bench all')") from None


def link_text(name: str, link: dict[str, Any]) -> str:
    """'NAME: a = 1.9 us per hop, F = 318.0 us per fused all-reduce, 1/b = 2.99 GB/s'."""
    return (f"{name}: a = {link['hop_s'] * 1e6:,.1f} us per hop, F = "
            f"{link['fixed_s'] * 1e6:,.1f} us per fused all-reduce, 1/b = "
            f"{1 / link['seconds_per_byte'] / 1e9:,.2f} GB/s")


def markdown(result: dict[str, Any]) -> str:
    ranks = [str(n) for n in result["ranks"]]
    last = ranks[-1]
    rows = [[r["model"], f"{r['params']:,}", f"{r['compute_s'] * 1e3:,.0f}", r["link"]]
            + [f"{r['efficiency'][n]:.2f}" for n in ranks]
            + [" / ".join(f"{r['allreduce'][last][k] * 1e3:,.2f}"
                          for k in ("fixed_s", "hops_s", "bandwidth_s"))]
            for r in result["rows"]]
    rows += [[name, "", "", "Horovod's paper, 512 GPUs, 25 GbE RoCE"] + [""] * (len(ranks) - 1)
             + [f"{e:.2f}", ""] for name, e in result["published_512"].items()]
    return "\n".join([
        "Projected weak-scaling efficiency, no overlap: T_ar(N) = F + h(N)a + 2(N-1)a + "
        "2(N-1)/N*S*b, Horovod's fixed cost F once per fused all-reduce, its negotiation "
        "h(N) = 2 ceil(log2 N) hops (the response cache's two bit-vector all-reduces), the "
        "ring's 2(N-1) hops of latency a, the bytes at 1/b ("
        + "; ".join(link_text(k, v) for k, v in result["links"].items()) + "):", "",
        report.markdown_table(["model", "parameters", "compute ms/step", "link"]
                              + [f"N={n}" for n in ranks]
                              + [f"all-reduce ms at N={last}: F and negotiation / hops / "
                                 f"bytes"], rows),
        "", "Measured inputs: " + "; ".join(
            f"{k} of {v['date_utc']} ({v['stack']})"
            for k, v in result.get("inputs", {}).items()) + ".",
        "", paper.paper_markdown(result["paper_validation"])])


def plot(out_dir: Path, result: dict[str, Any]) -> None:
    ranks = result["ranks"]
    series = {f"{r['model']}, {r['link']}": (ranks, [r["efficiency"][str(n)] for n in ranks])
              for r in result["rows"]}
    plots.plot_lines(out_dir / "project.png", series,
                     title="Projected efficiency (Horovod's fixed cost and the ring)",
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
    main=main, add_arguments=add_arguments, quick=False, in_all=True,
    title="Projection past this machine")

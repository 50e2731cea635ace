"""bench cluster's arithmetic (pure): from what every rank of the user's job timed, the total and
per-rank rates, the efficiency against the ranks alone, the link fitted to the all-reduce's
phases, the projection to larger worlds (shared/cost_model.py) and the tables.

The 1-rank figure: every rank trains alone at once (the same model with a plain optimizer, no
all-reduce, Horovod started but idle), each on its own core budget and host as the job places
it, so that the efficiency, total / (sum of the ranks' rates alone), leaves out what the
hardware shares (a host's memory bandwidth and clock under all its ranks) and keeps what the
distribution costs: the all-reduce, the wait for the slowest rank, hvdtrain's loop against a
plain ``fit`` (bench tax's figure). Each rank's rate alone also shows a slow host. Horovod's
paper instead compares with one device alone; a launch of one rank gives that figure.
"""
from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from hvdtrain.launch import placement
from hvdtrain.errors import UserError
from hvdtrain.bench.shared import cost_model, report, steps
from hvdtrain.bench.shared.cost_model import Link
from hvdtrain.bench.shared.timeline import PHASES

# Above this the job beat its ranks alone by more than noise: the figure is flagged, not a gain.
EFFICIENCY_NOISE = 1.05
PROJECTED_RANKS = (8, 64, 512)
COLLECTIVES = ("MPI_ALLREDUCE", "GLOO_ALLREDUCE")


def inside_a_job(environ: Mapping[str, str]) -> bool:
    """Whether a launcher (mpirun, horovodrun, srun, ...) started this process: one of the
    rank variables placement knows is set."""
    return any(name in environ for name in placement.LAUNCHER_RANK_VARS)


def input_shape(text: str) -> tuple[int, ...]:
    """--input-shape ``text`` such as 64,64,3; UserError unless positive integers."""
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise UserError(f"--input-shape={text!r}: expected positive integers such as 64,64,3")
    return shape


def repeat_rates(figures: Mapping[str, Sequence[float]]) -> list[float]:
    """One rank's samples/s in each timed repeat (steps.timed_repeats' figures)."""
    return [n / s for n, s in zip(figures["samples"], figures["seconds"])]


def efficiency(total: float, alone: Sequence[float]) -> float:
    """The job's total samples/s over what its ranks did alone, summed: 1.0 when N ranks
    together do what each did alone."""
    return total / sum(alone)


def throughput(everyone: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every rank's figures (rank order) -> per rank its rate in the job and alone (medians
    over repeats), the total (samples of all ranks over the slowest rank's time, per repeat;
    median), the efficiency and whether it is flagged."""
    totals = steps.repeat_rates([r["job"] for r in everyone])
    ranks = [{"rank": r["rank"], "host": r["host"],
              "job_samples_per_sec": statistics.median(repeat_rates(r["job"])),
              "alone_samples_per_sec": statistics.median(repeat_rates(r["alone"]))}
             for r in everyone]
    total = statistics.median(totals)
    value = efficiency(total, [r["alone_samples_per_sec"] for r in ranks])
    return {"total_samples_per_sec": total, "total_per_repeat": totals,
            "per_rank_samples_per_sec": statistics.median(r["job_samples_per_sec"]
                                                          for r in ranks),
            "ranks": ranks, "efficiency": value,
            "efficiency_flag": (f"above {EFFICIENCY_NOISE}: the job beat its ranks alone, "
                                f"noise (a busy host while they ran alone?)"
                                if value > EFFICIENCY_NOISE else None)}


def fitted_link(phases_ms: Mapping[str, float], ranks: int, nbytes: float,
                hop_s: float) -> Link:
    """The cost model's link from one step's all-reduce of ``nbytes`` on ``ranks`` ranks, as
    the timeline shows it: the collective (MPI's or Gloo's) is the ring, 2(N-1)a + 2(N-1)/N *
    S * b, with the hop latency a given (one size on one world cannot tell a from b); the rest
    of the all-reduce (the copies, Horovod's cycle and callback) is Horovod's fixed cost F,
    less the negotiation's hops. ValueError without the phases or on one rank."""
    collective = next((phases_ms[n] for n in COLLECTIVES if n in phases_ms), None)
    if ranks < 2 or collective is None or "ALLREDUCE" not in phases_ms or nbytes <= 0:
        raise ValueError("the timeline holds no all-reduce of the gradients to fit")
    ring_s, total_s = collective / 1e3, phases_ms["ALLREDUCE"] / 1e3
    byte_s = max(ring_s - 2 * (ranks - 1) * hop_s, 0.0) / (2 * (ranks - 1) / ranks * nbytes)
    fixed = total_s - ring_s - cost_model.negotiation_hops(ranks, "cache") * hop_s
    return Link(hop_s=hop_s, seconds_per_byte=byte_s, fixed_s=max(fixed, 0.0))


def projection(compute_s: float, nbytes: float, link: Link,
               ranks: Sequence[int]) -> list[dict[str, Any]]:
    """The cost model's efficiency at each N (no overlap, one fused all-reduce) and the
    all-reduce's terms there."""
    return [{"ranks": n, "efficiency": cost_model.efficiency(compute_s, n, nbytes, link),
             "allreduce": cost_model.allreduce_parts(n, nbytes, link)} for n in ranks]


# ---------------------------------------------------------------------------------------------
# The tables

def rate_text(value: float) -> str:
    return f"{value:,.1f}"


def markdown(result: Mapping[str, Any]) -> str:
    """bench cluster's report: the job, the rates per rank, the all-reduce's phases and the
    projection (those it has)."""
    t = result["throughput"]
    eff = f"{t['efficiency']:.3f}" + (f" (flagged: {t['efficiency_flag']})"
                                      if t["efficiency_flag"] else "")
    size = result["world_size"]
    lines = [f"bench cluster: {result['model']} on {size} rank{'s' if size > 1 else ''} "
             f"({result['controller']}; {result['stack']}), input {result['input_shape']}, "
             f"batch {result['batch_size_per_rank']} per rank, "
             f"{result['gradient_bytes']:,} bytes of gradients; medians over "
             f"{result['plan']['repeats']} repeats of {result['plan']['steps_per_repeat']} "
             f"steps.", "",
             f"Total {rate_text(t['total_samples_per_sec'])} samples/s, "
             f"{rate_text(t['per_rank_samples_per_sec'])} per rank; efficiency {eff} against "
             f"every rank alone at once (a plain optimizer, no all-reduce).", "",
             report.markdown_table(
                 ["rank", "host", "samples/s in the job", "samples/s alone"],
                 [[r["rank"], r["host"], rate_text(r["job_samples_per_sec"]),
                   rate_text(r["alone_samples_per_sec"])] for r in t["ranks"]])]
    phases = result.get("phases")
    if phases:
        lines += ["", f"The gradients' all-reduce per step (rank 0's Horovod timeline, "
                      f"{phases['steps']} steps, median; the step {phases['step_ms']:.2f} ms):",
                  "", report.markdown_table(["phase", "ms per step"],
                                            [[PHASES[n], f"{ms:.3f}"]
                                             for n, ms in phases["phases_ms"].items()])]
    lines += ["", projection_markdown(result)]
    return "\n".join(lines)


def projection_markdown(result: Mapping[str, Any]) -> str:
    rows = result.get("projection")
    if not rows:
        return f"No projection: {result.get('projection_missing', 'no all-reduce measured')}."
    link = result["link"]
    bandwidth = (f"{1 / link['seconds_per_byte'] / 1e9:,.2f} GB/s"
                 if link["seconds_per_byte"] else "no measurable byte cost")
    return "\n".join([
        f"Projected weak-scaling efficiency (bench project's cost model, no overlap): a = "
        f"{link['hop_s'] * 1e6:g} us per hop (given), F = {link['fixed_s'] * 1e6:,.1f} us per "
        f"fused all-reduce and 1/b = {bandwidth} (fitted to the phases above), the compute "
        f"{result['compute_s'] * 1e3:,.2f} ms per step (the ranks alone):", "",
        report.markdown_table(["ranks", "efficiency", "all-reduce ms: F and negotiation / "
                               "hops / bytes"],
                              [[r["ranks"], f"{r['efficiency']:.3f}",
                                " / ".join(f"{r['allreduce'][k] * 1e3:,.3f}"
                                           for k in ("fixed_s", "hops_s", "bandwidth_s"))]
                               for r in rows]),
        "", f"At the job's {result['world_size']} ranks the model gives "
            f"{rows_at(rows, result['world_size']):.3f}, measured "
            f"{result['throughput']['efficiency']:.3f}: the model counts the all-reduce "
            f"alone; what it leaves out (the wait for the slowest rank, the negotiation above, "
            f"hvdtrain's loop against a plain fit) is the difference."])


def rows_at(rows: Sequence[Mapping[str, Any]], ranks: int) -> float:
    """The projected efficiency at ``ranks`` among ``rows``."""
    return next(r["efficiency"] for r in rows if r["ranks"] == ranks)

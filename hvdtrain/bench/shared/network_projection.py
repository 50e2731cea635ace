"""bench network's check of the cost model (shared/cost_model.py) against each shaped link
(pure): from the same round's one-host step and the link's measured throughput, the step each
system should take on the link, beside the step it took.

One host's step t_1 (2 ranks over shared memory, whose all-reduce of a MobileNetV2's gradients
takes milliseconds against a step of seconds) stands for the compute. On the link, the ring
moves 2(N-1)/N * S bytes per rank at the measured rate (both ways at once, as the ring sends,
where the probe measured that); tbf adds no latency and a veth hop
costs microseconds, so the hop and Horovod's fixed cost (under a millisecond, bench allreduce)
are left at zero against steps of seconds. A system that reduces after backprop adds the
transfer to t_1; one that overlaps (buckets, Horovod's per-tensor reduction) hides up to the
backward pass's share of t_1 (cost_model.BACKWARD_SHARE) under Gloo, and nothing under mpirun,
whose transfer waits for backprop to end on a rank's one core (System.transfer_hides); fp16
compression halves S.

The error of a prediction is predicted / measured step - 1, per round. For overlap, the step
against max(t_1, transfer): what perfect overlap would give (1.0), per round.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from hvdtrain.bench.shared import cost_model, network_figures, report, stats
from hvdtrain.bench.shared.cost_model import Link
from hvdtrain.bench.shared.network_systems import RANKS, System

HEADLINE = "hvdtrain"            # the system whose error is the link's projection_error


def link_of(gbit_per_s: float) -> Link:
    """The shaped link as the cost model sees it: its measured rate (``link_rate``), no hop or
    fixed cost."""
    return Link(hop_s=0.0, seconds_per_byte=8 / (gbit_per_s * 1e9))


def link_rate(link: Mapping[str, Any]) -> float:
    """The rate the ring sees: both ways at once where the probe measured it (a round of an
    earlier probe has the one-way stream only)."""
    return link.get("both_ways_gbit_per_s") or link["achieved_gbit_per_s"]


def step_of(rate: float, batch_per_rank: int) -> float:
    """Seconds per step of a 2-rank job whose total rate is ``rate`` samples/s."""
    return RANKS * batch_per_rank / rate


def predicted_step(system: System, one_host_step: float, gradient_bytes: float,
                   gbit_per_s: float) -> dict[str, float]:
    """``system``'s step on a link measured at ``gbit_per_s`` (cost_model.step_seconds's
    parts)."""
    return cost_model.step_seconds(one_host_step, RANKS, system.gradient_share * gradient_bytes,
                                   link_of(gbit_per_s),
                                   overlap=1.0 if system.transfer_hides else 0.0)


def round_at(round_: Mapping[str, Any], key: str, systems: Sequence[System],
             batch_per_rank: int, gradient_bytes: float) -> dict[str, dict[str, float]]:
    """One round at one link: per system, the one-host step, the predicted and the measured
    step on the link, and the prediction's error."""
    on_link = round_["links"][key]
    rate = link_rate(on_link["link"])
    out = {}
    for system in systems:
        alone = step_of(round_["one_host"][system.name], batch_per_rank)
        parts = predicted_step(system, alone, gradient_bytes, rate)
        measured = step_of(on_link["systems"][system.name], batch_per_rank)
        out[system.name] = {"one_host_step_s": alone, "transfer_s": parts["bandwidth_s"],
                            "predicted_step_s": parts["step_s"], "measured_step_s": measured,
                            "error": parts["step_s"] / measured - 1}
    return out


def projection(rounds: Sequence[Mapping[str, Any]], gbit_per_s: float,
               systems: Sequence[System], batch_per_rank: int,
               gradient_bytes: float) -> dict[str, Any]:
    """One link speed over the rounds, the keys its entry in ``links`` gains: ``projection``,
    each system's predicted and measured step and the error (median, min, max);
    ``projection_error``, the headline system's error; ``overlap_over_ideal``, for each system
    that reduces during backprop (hvdtrain's buckets, Horovod's per-tensor reduction), its step
    over max(compute, transfer), per round (None where none ran)."""
    key = network_figures.speed_key(gbit_per_s)
    per_round = [round_at(r, key, systems, batch_per_rank, gradient_bytes) for r in rounds]
    by_system = {s.name: {field: stats.summarize([r[s.name][field] for r in per_round])
                          for field in ("one_host_step_s", "transfer_s", "predicted_step_s",
                                        "measured_step_s", "error")}
                 for s in systems}
    names = [s.name for s in systems]
    overlap = {s.name: stats.ratio_summary([
        r[s.name]["measured_step_s"] / max(r[s.name]["one_host_step_s"], r[s.name]["transfer_s"])
        for r in per_round]) for s in systems if s.overlaps_backprop}
    return {"projection": by_system,
            "projection_error": by_system[HEADLINE]["error"] if HEADLINE in names else None,
            "overlap_over_ideal": overlap or None}


def table(result: Mapping[str, Any]) -> str:
    """Per link and system: the transfer, the predicted and measured step, the error."""
    rows = []
    for link in result["links"]:
        for name, s in link["projection"].items():
            rows.append([f"{link['gbit_per_s']:g} Gbit/s", name,
                         f"{s['one_host_step_s']['median']:.2f}",
                         f"{s['transfer_s']['median']:.2f}",
                         f"{s['predicted_step_s']['median']:.2f}",
                         f"{s['measured_step_s']['median']:.2f}",
                         stats.range_cell(s["error"], lambda e: f"{e:+.1%}")])
    return report.markdown_table(
        ["link", "system", "one-host step s", "transfer s (model)", "predicted step s",
         "measured step s", "error: median (rounds' range)"], rows)

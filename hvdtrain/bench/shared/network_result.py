"""bench network's result file: the figures of a run's rounds (network_figures.py's tables
and ratios, network_projection.py's cost-model check), written as network.json, .md and .png;
and a saved file's figures computed again by this code (``--render``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.errors import UserError
from hvdtrain.bench.shared import (network_figures, network_projection, network_systems, plots,
                                   report, stats)
from hvdtrain.bench.shared.network_systems import System


def write(out_dir: Path, result: dict[str, Any]) -> None:
    """network.json, .md and .png in ``out_dir``."""
    report.write_outputs(out_dir, "network", result, markdown(result))
    plot(out_dir, result)


def with_figures(result: dict[str, Any], systems: Sequence[System]) -> dict[str, Any]:
    """``result`` (what ran and its ``rounds``) with the figures the rounds give: each link's
    figures with the cost model's check beside them, and one host's."""
    rounds = result["rounds"]
    workload = result["workload"]
    figures = network_figures.figures(rounds, result["speeds"], [s.name for s in systems])
    for link in figures["links"]:
        link.update(network_projection.projection(
            rounds, link["gbit_per_s"], systems, workload["batch_size_per_rank"],
            workload["gradient_bytes"]))
    return {**result, "plan": {**result["plan"], "rounds": len(rounds)},
            "load_average_before_each_round": [r["load_average"] for r in rounds],
            **figures}


def render(path: Path, out_dir: Path, bucket_mb: float) -> dict[str, Any]:
    """A saved network.json's figures computed again from its rounds by this code (its
    tables, ratios and cost model), written into ``out_dir``; ``bucket_mb``: the buckets of a
    file that predates the key; UserError for a file that is not one."""
    try:
        saved = json.loads(path.read_text())
        names = ",".join(saved["systems"])
        if saved["benchmark"] != "network" or not saved["rounds"]:
            raise ValueError("no rounds")
        saved["workload"]["gradient_bytes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--render {path}: not a bench network result ({e})") from None
    # A file written before these keys: the speeds its links hold, ``bucket_mb``.
    saved.setdefault("speeds", [link["gbit_per_s"] for link in saved.get("links", [])])
    saved.setdefault("bucket_mb", bucket_mb)
    result = with_figures(saved, network_systems.chosen_systems(names, saved["bucket_mb"]))
    write(out_dir, result)
    return result


def markdown(result: dict[str, Any]) -> str:
    """network.md: the figures, then the cost model's predictions beside the measured steps."""
    overlap = [f"{name} at {link['gbit_per_s']:g} Gbit/s {stats.ratio_cell(ratio)}"
               for link in result["links"]
               for name, ratio in (link.get("overlap_over_ideal") or {}).items()]
    return "\n".join([
        network_figures.markdown(result), "",
        "The cost model (bench project's) against each link: from the same round's one-host "
        "step and the link's measured rate, the step each system should take "
        f"({result['workload']['gradient_bytes'] / 1e6:,.1f} MB of float32 gradients; "
        "network_projection.py says how):", "", network_projection.table(result)]
        + (["", "Overlap against its ideal: the step of each system that reduces during "
            "backprop over max(one-host step, the model's transfer), per round (1.0: the "
            "transfer wholly hidden, or the compute): " + "; ".join(overlap) + "."]
           if overlap else []))


def plot(out_dir: Path, result: dict[str, Any]) -> None:
    """network.png: each system's efficiency against the link's speed."""
    links = result["links"]
    speeds = [link["gbit_per_s"] for link in links]
    series = {name: (speeds, [link["systems"][name]["efficiency"]["median"] for link in links])
              for name in result["systems"]}
    plots.plot_lines(out_dir / "network.png", series, logx=True,
                     title=f"2 ranks on 2 hosts: {result['workload']['name']}",
                     xlabel="link (Gbit/s, tc tbf)", ylabel="efficiency against one host")

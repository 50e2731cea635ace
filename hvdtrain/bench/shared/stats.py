"""Statistics of repeated measurements on a shared machine: medians, spreads, ratios per
interleaved round, and the verdict of a figure against its target."""
from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of repeated measurements: robust to the odd slow repeat that a shared
    machine produces. ``spread`` is (max - min) / |median|: never negative, so that a figure
    whose median is below zero (a difference of two noisy times) is noise when it spreads."""
    if not values:
        raise ValueError("no measurements to summarize")
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values), "n": len(values),
            "spread": (max(values) - min(values)) / abs(median) if median else 0.0}


# A ratio whose rounds spread wider than this is noise: the figure does not count.
SPREAD_LIMIT = 0.10


def ratio_summary(per_round: Sequence[float], limit: float = SPREAD_LIMIT) -> dict[str, Any]:
    """A ratio measured once per interleaved round: its median, spread, the rounds, and whether
    the spread makes it noise."""
    summary = summarize(per_round)
    return {**summary, "per_round": list(per_round), "noise": summary["spread"] > limit}


def ratio_text(ratio: Mapping[str, Any]) -> str:
    """'0.9796 (spread 9.8%)': four decimals, so that a ratio just under a target such as 0.98
    does not print as the target, and the spread to a tenth of a percent."""
    return f"{ratio['median']:.4f} (spread {ratio['spread']:.1%})"


def rounds_text(per_round: Sequence[float]) -> str:
    """'1.01 (0.69, 1.01, 1.05; spread 35%)': a per-round figure's median, every round, and the
    spread, as the result folders' own summaries print them."""
    ratio = ratio_summary(per_round)
    each = ", ".join(f"{v:.2f}" for v in per_round)
    return f"{ratio['median']:.2f} ({each}; spread {ratio['spread']:.0%})"


def verdict(value: float, target: float, *, at_least: bool = True,
            noise: bool = False) -> str:
    """'meets >= 0.98', 'misses >= 0.98', or 'noise: does not count' when the figure's spread
    is past SPREAD_LIMIT (whatever its median)."""
    if noise:
        return "noise: does not count"
    met = value >= target if at_least else value <= target
    return f"{'meets' if met else 'misses'} {'>=' if at_least else '<='} {target:g}"


def range_cell(summary: Mapping[str, float], show: Callable[[float], str]) -> str:
    """A table cell for a ``summarize``: the median, then the lowest to the highest, each as
    ``show`` writes it."""
    return f"{show(summary['median'])} ({show(summary['min'])} to {show(summary['max'])})"


def ratio_cell(ratio: Mapping[str, Any], target: float | None = None, *,
               at_least: bool = True) -> str:
    """A table cell for a ``ratio_summary``: the figure, its spread, and the verdict against
    ``target`` (or 'noise' alone where there is no target)."""
    text = ratio_text(ratio)
    if target is not None:
        met = verdict(ratio["median"], target, at_least=at_least, noise=ratio["noise"])
        return f"{text}: {met}"
    return text + (" noise" if ratio["noise"] else "")

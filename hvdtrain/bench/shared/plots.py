"""A benchmark's PNG plots (matplotlib's Agg backend, imported when a plot is drawn: no
display needed, and no matplotlib for a benchmark that draws none)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence


def plot_lines(path: Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
               title: str, xlabel: str, ylabel: str, logx: bool = False,
               logy: bool = False, reference: tuple[Sequence[float], Sequence[float]] | None = None,
               reference_label: str = "") -> None:
    """One PNG with a line per series (matplotlib's Agg backend: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if reference:
        ax.plot(*reference, linestyle="--", color="gray", label=reference_label)
    if logx:
        # Ticks at the measured points, written as they were given (0.07, 0.2, 1; 1, 2, 4).
        ticks = sorted({x for xs, _ in series.values() for x in xs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel(xlabel)
    _finish(fig, ax, path, title=title, ylabel=ylabel, logy=logy)


def plot_bars(path: Path, groups: Mapping[str, Mapping[str, float]], *, title: str,
              ylabel: str, logy: bool = False, reference: float | None = None,
              reference_label: str = "") -> None:
    """One PNG of grouped bars: a group per key of ``groups``, a bar per inner key."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(k for bars in groups.values() for k in bars))
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, label in enumerate(labels):
        xs = [g + (i - (len(labels) - 1) / 2) * width for g, bars in enumerate(groups.values())
              if label in bars]
        ax.bar(xs, [bars[label] for bars in groups.values() if label in bars], width,
               label=label)
    if reference is not None:
        ax.axhline(reference, linestyle="--", color="gray", label=reference_label)
    ax.set_xticks(range(len(groups)), list(groups))
    _finish(fig, ax, path, title=title, ylabel=ylabel, logy=logy)


def _finish(fig, ax, path: Path, *, title: str, ylabel: str, logy: bool) -> None:
    """The title, labels, grid and legend every plot has; then the PNG."""
    import matplotlib.pyplot as plt
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)

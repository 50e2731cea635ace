"""Interleaved rounds over stacks: each round measures every stack, in the reverse order every
other round, so that a drift in the machine's load falls on all."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hvdtrain.bench.shared.host import load_average
from hvdtrain.bench.shared.report import say


def stack_pythons(python: str, other_python: str | None) -> dict[str, str]:
    """The stacks a comparison measures, by the names its results use: 'this' (``python``)
    and, when there is one, 'other'."""
    return {"this": python, **({"other": other_python} if other_python else {})}


def stack_rounds(what: str, rounds: int, pythons: Mapping[str, str],
                 measure: Callable[[str], dict[str, Any]]
                 ) -> tuple[list[dict[str, dict[str, Any]]], list[float]]:
    """``rounds`` interleaved rounds of ``measure(python)`` on each stack of ``pythons`` (name:
    interpreter), in the reverse order every other round so that a drift in the machine's load
    falls on all: per round each stack's figures, and the load average before each round."""
    measured, loads = [], []
    for i in range(rounds):
        loads.append(load_average())
        order = list(pythons) if i % 2 == 0 else list(pythons)[::-1]
        row = {}
        for which in order:
            say(f"{what}, round {i + 1}/{rounds}, {which} stack...")
            row[which] = measure(pythons[which])
        measured.append({which: row[which] for which in pythons})
    return measured, loads


def rounds_per_model(what: str, models: Sequence[str], rounds: int, pythons: Mapping[str, str],
                     measure: Callable[[str, Path, str], dict[str, Any]],
                     summarize: Callable[[str, list, list[float]], dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """Per model: its ``stack_rounds`` of ``measure(model, work_dir, python)``, then
    ``summarize(model, rounds, loads)``; the jobs write into a temporary ``work_dir``."""
    results = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for name in models:
            measured, loads = stack_rounds(f"{what}: {name}", rounds, pythons,
                                           lambda python: measure(name, Path(tmp), python))
            results.append(summarize(name, measured, loads))
    return results

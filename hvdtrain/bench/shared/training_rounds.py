"""The training jobs bench scaling, tax and stacks time, in interleaved rounds: per model and
round, on each stack, plain Keras ``fit`` (plain_job) and hvdtrain's Trainer at each world size
(trainer_job), in the reverse order every other round so that a drift in the machine's load
falls on all.

Run alone, each of those benchmarks measures the jobs it reads. Under ``bench all`` they read
one set of rounds, ``for_all``'s, measured once by the first of them: scaling's rows, tax's
plain fit and 1-rank hvdtrain, and stacks' 1- and 2-rank hvdtrain are the same jobs, and a
launch costs seconds of TensorFlow's start-up whatever it times.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Sequence, Union

from hvdtrain.bench.shared import arguments, host, plain_job, plans, report, trainer_job
from hvdtrain.bench.shared.interleave import stack_pythons
from hvdtrain.bench.shared.workloads import WORKLOADS

PLAIN = "plain"
Side = Union[str, int]   # PLAIN, or the world size of an hvdtrain job
ALL_SIDES: tuple[Side, ...] = (PLAIN, 1, 2)


@dataclasses.dataclass(frozen=True)
class Request:
    """Which jobs to time: every side on every stack (``pythons``: (name, interpreter)) for
    every model, ``rounds`` times, each job to ``plan`` (its world sizes are the sides')."""
    models: tuple[str, ...]
    pythons: tuple[tuple[str, str], ...]
    plan: plans.Plan
    rounds: int
    sides: tuple[Side, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", dataclasses.replace(self.plan, world_sizes=()))

    def holds(self, other: Request) -> bool:
        """Whether these rounds hold every job of ``other``'s, to the same plan, in at least as
        many rounds."""
        return (self.plan == other.plan and self.rounds >= other.rounds
                and set(other.models) <= set(self.models)
                and set(other.pythons) <= set(self.pythons) and set(other.sides) <= set(self.sides))


def stack_request(*, models: Sequence[str], rounds: int, quick: bool, python: str,
                  other_python: str | None, sides: tuple[Side, ...]) -> Request:
    """The rounds of ``sides`` on the stack of ``python`` (and of ``other_python``, when given),
    to the full plan or --quick's: what ``arguments.stack_choice`` chose, as rounds."""
    return Request(models=tuple(models),
                   pythons=tuple(stack_pythons(python, other_python).items()),
                   plan=plans.QUICK if quick else plans.FULL, rounds=rounds, sides=sides)


def for_all(args: argparse.Namespace) -> Request:
    """The rounds ``bench all`` measures once for scaling, tax and stacks: their models, this
    stack (or --venv's) and --other-venv's (when given), and every side."""
    return stack_request(**arguments.stack_choice(args), sides=ALL_SIDES)


def shared_in_all(args: argparse.Namespace, own: Request) -> Request:
    """Under ``bench all``, its one set of rounds (``for_all``) where they hold ``own``'s jobs;
    ``own`` otherwise (run alone, or asked for other jobs: another plan, launcher or stack)."""
    if getattr(args, "in_all", False):
        shared = for_all(args)
        if shared.holds(own):
            return shared
    return own


def round_order(round_index: int, stacks: list[str],
                sides: tuple[Side, ...]) -> list[tuple[str, Side]]:
    """The (stack, side) jobs of one round: every side of every stack, in the reverse order
    every other round, so that a drift in the machine's load falls on all."""
    order = [(stack, side) for stack in stacks for side in sides]
    return order if round_index % 2 == 0 else order[::-1]


def measure_job(name: str, side: Side, plan: plans.Plan, work_dir: Path,
                python: str) -> dict[str, Any]:
    """One job: trainer_job.measure's row at a world size (with the consistency check's cost,
    which bench tax reads), or plain fit's samples/s and its rank's raw figures."""
    workload = WORKLOADS[name]
    if side == PLAIN:
        rate, raw = plain_job.measure_plain(workload, plan, work_dir, python)
        return {"samples_per_sec": rate, "raw": raw}
    return trainer_job.measure(workload, int(side), plan, work_dir, python=python,
                               check_cost=True)


def side_label(side: Side) -> str:
    return "plain fit" if side == PLAIN else f"hvdtrain on {side} rank(s)"


def measure(request: Request) -> dict[str, dict[str, Any]]:
    """Per model: ``rounds``, each round's job per stack and side ({stack: {side: job}}), and
    the load average before each round."""
    results: dict[str, dict[str, Any]] = {}
    pythons = dict(request.pythons)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for name in request.models:
            measured, loads = [], []
            for i in range(request.rounds):
                loads.append(host.load_average())
                row: dict[str, dict[Side, Any]] = {stack: {} for stack in pythons}
                for stack, side in round_order(i, list(pythons), request.sides):
                    report.say(f"training rounds: {name}, round {i + 1}/{request.rounds}, "
                               f"{stack} stack, {side_label(side)}...")
                    row[stack][side] = measure_job(name, side, request.plan, Path(tmp),
                                                   pythons[stack])
                measured.append(row)
            results[name] = {"rounds": measured, "loads": loads}
    return results


_MEASURED: dict[Request, dict[str, dict[str, Any]]] = {}


def measured(request: Request) -> dict[str, dict[str, Any]]:
    """``measure(request)``, once per process: a second benchmark asking for the same rounds
    (under ``bench all``) reads the first one's."""
    if request not in _MEASURED:
        _MEASURED[request] = measure(request)
    return _MEASURED[request]

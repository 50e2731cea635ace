"""The options several benchmarks share, defined once each: the models (--models), the rounds
(--rounds), the stacks (--venv, --other-venv), and what they choose.

``bench all`` takes an option that several of its benchmarks define once (the first
definition), so each is defined with ``default=None`` and its default resolved by the
benchmark that reads it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from hvdtrain.errors import UserError
from hvdtrain.bench.shared.workloads import DEFAULT_MODELS, QUICK_MODELS, WORKLOADS, model_names

ROUNDS, QUICK_ROUNDS = 3, 2   # interleaved rounds of a comparison of stacks


def add_models(parser: argparse.ArgumentParser, *names: str) -> None:
    """--models (and any alias in ``names``): a comma list of benchmark models."""
    parser.add_argument("--models", *names, dest="models", default=None,
                        help=f"comma list of {', '.join(WORKLOADS)} (default: {DEFAULT_MODELS}; "
                             f"--quick: {QUICK_MODELS})")


def add_rounds(parser: argparse.ArgumentParser, help: str) -> None:
    """--rounds: interleaved rounds (``help`` says whose default)."""
    parser.add_argument("--rounds", type=int, default=None, help=help)


def add_other_venv(parser: argparse.ArgumentParser) -> None:
    """--other-venv, shared by tax, stacks, peers, ops and phases (bench all takes it once)."""
    parser.add_argument("--other-venv", type=Path, default=None,
                        help="the other stack's virtualenv (e.g. .venv-keras2), measured in the "
                             "same interleaved rounds")


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark that compares this stack with --other-venv's (tax, ops,
    phases): the models, the rounds, --venv and --other-venv."""
    add_models(parser)
    add_rounds(parser, f"interleaved rounds per model (default {ROUNDS}; --quick: "
                       f"{QUICK_ROUNDS})")
    parser.add_argument("--venv", type=Path, default=None,
                        help="measure the stack of this virtualenv (e.g. .venv-keras2) instead "
                             "of this one")
    add_other_venv(parser)


def venv_python(venv: Path | None, option: str) -> str | None:
    """The interpreter of ``venv`` (None: None); UserError when it has none."""
    if venv is None:
        return None
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        raise UserError(f"{python} not found: {option} takes a virtualenv made by "
                        f"'make install STACK=...', e.g. .venv-keras2")
    return str(python)


def rounds(args: argparse.Namespace) -> int:
    """--rounds, or a comparison's default for --quick or not."""
    return args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)


def stack_choice(args: argparse.Namespace) -> dict[str, Any]:
    """What ``add_stack_arguments``' options chose, as tax's, ops' and phases' ``run`` take it:
    the models, rounds, --quick, this stack's interpreter and the other's."""
    return {"models": model_names(args.models, args.quick), "rounds": rounds(args),
            "quick": args.quick,
            "python": venv_python(args.venv, "--venv") or sys.executable,
            "other_python": venv_python(args.other_venv, "--other-venv")}


def stack_main(run: Callable[..., Any]) -> Callable[[argparse.Namespace], None]:
    """The ``main`` of a benchmark that takes ``add_stack_arguments``: ``run(out, **what they
    chose)``; UserError when --venv or --other-venv has no Python or a model is unknown."""
    def main(args: argparse.Namespace) -> None:
        run(Path(args.out), **stack_choice(args))
    return main

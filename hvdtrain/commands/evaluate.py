"""``hvdtrain eval``: a run's latest checkpoint on its whole eval set (any number of ranks)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hvdtrain.launch import rank_process
from hvdtrain.commands import run_dirs
from hvdtrain.training import rank_job

NAME = "eval"
HELP = "evaluate a run's latest checkpoint on its whole eval set"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Evaluate RUN_DIR's latest checkpoint with the config saved beside it."
    parser.add_argument("--run-dir", required=True, help="a run directory written by train")
    parser.add_argument("--set", dest="assignments", action="append", default=[],
                        metavar="KEY=VALUE", help="override a saved key (e.g. data.eval_path)")


def run(args: argparse.Namespace) -> int:
    with rank_job.same_on_every_rank():
        cfg = run_dirs.saved_config(args)
        rank_process.load_tensorflow()
    from hvdtrain.training import trainer  # Horovod loads here

    world = rank_job.start(cfg, options=None)

    def evaluate() -> None:
        result = trainer.Trainer(cfg, world).evaluate_checkpoint(Path(args.run_dir))
        if world.is_chief:
            print(json.dumps(result))
    return rank_job.run(world, evaluate)

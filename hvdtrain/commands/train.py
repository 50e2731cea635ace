"""``hvdtrain train``: training on every rank launched, from a preset and config layers."""
from __future__ import annotations

import argparse
from typing import Any

from hvdtrain import config as config_lib
from hvdtrain.launch import rank_process
from hvdtrain.config import overrides, presets
from hvdtrain.training import rank_job

NAME = "train"
HELP = "train a model (launch under horovodrun or mpirun for N ranks)"

# Flags that are shortcuts for config keys: flag dest -> (section, key).
SHORTCUTS = {"run_dir": ("run", "run_dir"), "epochs": ("train", "epochs"),
             "batch_size": ("train", "batch_size"), "lr": ("optim", "lr"),
             "model": ("model", "name"), "data": ("data", "source"),
             "loop": ("train", "loop"), "timeline": ("horovod", "timeline")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Train on every rank launched (horovodrun -np N, mpirun -np N, or one process alone).\n"
        "Config layers, later wins: --preset, --config FILE.toml, --set section.key=value, "
        "then the shortcut flags.")
    parser.epilog = ("config keys (TOML: [section] key = value; CLI: --set section.key=value):\n"
                     + overrides.describe())
    parser.add_argument("--preset", default="digits",
                        help=f"starting config: {', '.join(presets.PRESETS)} (default digits)")
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file of [section] key = value")
    parser.add_argument("--set", dest="assignments", action="append", default=[],
                        metavar="KEY=VALUE", help="override one key, e.g. --set optim.lr=0.1 "
                                                  "(repeatable)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in the run dir (starts at "
                             "epoch 1 if there is none yet)")
    parser.add_argument("--elastic", action="store_true",
                        help="elastic training under horovodrun --min-np/--max-np "
                             "--host-discovery-script (Gloo): go on when workers are lost or "
                             "added, from the last epoch committed")
    parser.add_argument("--run-dir", help="= --set run.run_dir=...")
    parser.add_argument("--epochs", type=int, help="= --set train.epochs=...")
    parser.add_argument("--batch-size", type=int, help="= --set train.batch_size=... (per rank)")
    parser.add_argument("--lr", type=float, help="= --set optim.lr=... (for one rank)")
    parser.add_argument("--model", help="= --set model.name=...")
    parser.add_argument("--data", help="= --set data.source=...")
    parser.add_argument("--loop", help="= --set train.loop=... (fit or custom)")
    parser.add_argument("--timeline", metavar="PATH",
                        help="= --set horovod.timeline=PATH (Horovod timeline, Chrome trace JSON)")


def config_from_args(args: argparse.Namespace) -> config_lib.Config:
    """The config train's flags make: --preset, --config, --set, then the shortcut flags."""
    extra: dict[str, dict[str, Any]] = {}
    for dest, (section, key) in SHORTCUTS.items():
        value = getattr(args, dest)
        if value is not None:
            extra.setdefault(section, {})[key] = value
    return presets.build_config(args.preset, args.config, args.assignments, extra)


def run(args: argparse.Namespace) -> int:
    with rank_job.same_on_every_rank():
        cfg = config_from_args(args)
        rank_process.load_tensorflow()
    from hvdtrain.training import trainer  # Horovod loads here

    world = rank_job.start(cfg, options=cfg.horovod, elastic=args.elastic)
    return rank_job.run(world, lambda: trainer.Trainer(cfg, world, resume=args.resume,
                                                    elastic=args.elastic).train())

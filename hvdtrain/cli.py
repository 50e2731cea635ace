"""``hvdtrain train|eval|predict|data|bench``: the only reader of sys.argv.

    hvdtrain train --preset digits                          # one process
    horovodrun -np 2 -H localhost:2 --gloo hvdtrain train   # 2 ranks over Gloo
    mpirun -np 2 hvdtrain train --set train.epochs=5        # 2 ranks over MPI
    mpirun -np 2 hvdtrain predict --run-dir RUN photos/     # a CSV of predicted classes
    hvdtrain data convert photos/ shards/ --image-shape 64,64,3   # one process
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

from hvdtrain import config as config_lib
from hvdtrain import launching, overrides, placement, presets
from hvdtrain.commands import doctor, launch, setup
from hvdtrain.errors import UserError

COMMANDS = {command.NAME: command for command in (doctor, setup, launch)}

# Flags that are shortcuts for config keys: flag dest -> (section, key).
SHORTCUTS = {"run_dir": ("run", "run_dir"), "epochs": ("train", "epochs"),
             "batch_size": ("train", "batch_size"), "lr": ("optim", "lr"),
             "model": ("model", "name"), "data": ("data", "source"),
             "loop": ("train", "loop"), "timeline": ("horovod", "timeline")}

DATA_DEFAULTS, TRAIN_DEFAULTS = config_lib.DataConfig(), config_lib.TrainConfig()
SHARED_ERROR_GRACE_S = 3.0
LOST_A_RANK_EXIT_CODE = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, from rank 0 only
        raise UserError(f"{message} (see '{self.prog} --help')", shared=True)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hvdtrain", description="Data-parallel Keras training on N ranks "
                     "with Horovod ring all-reduce.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser(
        "train", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="train a model (launch under horovodrun or mpirun for N ranks)",
        description="Train on every rank launched (horovodrun -np N, mpirun -np N, or one "
                    "process alone).\nConfig layers, later wins: --preset, --config FILE.toml, "
                    "--set section.key=value, then the shortcut flags.",
        epilog="config keys (TOML: [section] key = value; CLI: --set section.key=value):\n"
               + overrides.describe())
    train.add_argument("--preset", default="digits",
                       help=f"starting config: {', '.join(presets.PRESETS)} (default digits)")
    train.add_argument("--config", metavar="FILE.toml", help="TOML file of [section] key = value")
    train.add_argument("--set", dest="assignments", action="append", default=[],
                       metavar="KEY=VALUE", help="override one key, e.g. --set optim.lr=0.1 "
                                                 "(repeatable)")
    train.add_argument("--resume", action="store_true",
                       help="continue from the latest checkpoint in the run dir (starts at "
                            "epoch 1 if there is none yet)")
    train.add_argument("--elastic", action="store_true",
                       help="elastic training under horovodrun --min-np/--max-np "
                            "--host-discovery-script (Gloo): go on when workers are lost or "
                            "added, from the last epoch committed")
    train.add_argument("--run-dir", help="= --set run.run_dir=...")
    train.add_argument("--epochs", type=int, help="= --set train.epochs=...")
    train.add_argument("--batch-size", type=int, help="= --set train.batch_size=... (per rank)")
    train.add_argument("--lr", type=float, help="= --set optim.lr=... (for one rank)")
    train.add_argument("--model", help="= --set model.name=...")
    train.add_argument("--data", help="= --set data.source=...")
    train.add_argument("--loop", help="= --set train.loop=... (fit or custom)")
    train.add_argument("--timeline", metavar="PATH",
                       help="= --set horovod.timeline=PATH (Horovod timeline, Chrome trace JSON)")

    evaluate = sub.add_parser(
        "eval", help="evaluate a run's latest checkpoint on its whole eval set",
        description="Evaluate RUN_DIR's latest checkpoint with the config saved beside it.")
    evaluate.add_argument("--run-dir", required=True, help="a run directory written by train")
    evaluate.add_argument("--set", dest="assignments", action="append", default=[],
                          metavar="KEY=VALUE", help="override a saved key (e.g. data.eval_path)")
    _add_predict_parser(sub)
    _add_data_parser(sub)
    # hvdtrain bench scaling|allreduce|peers|project|all: its own parser, in hvdtrain.bench,
    # which is imported for this command alone.
    # (Listed here for 'hvdtrain --help'; run() hands 'bench ...' to it before parsing.)
    sub.add_parser("bench", help="scaling benchmarks: figures as JSON, Markdown tables and PNG "
                                 "plots ('hvdtrain bench --help')")
    for command in COMMANDS.values():
        command.add_arguments(sub.add_parser(command.NAME, help=command.HELP))
    return parser


def _add_predict_parser(sub) -> None:
    predict = sub.add_parser(
        "predict", help="a trained model over images, an .npz or TFRecord files: a CSV of "
                        "predicted classes (any number of ranks)",
        description="Run RUN_DIR's exported model (or, without one, its latest checkpoint) "
                    "over INPUT: a folder of JPEG/PNG images (flat or one sub-folder per "
                    "class), an image, an .npz file (array x) or TFRecord files; without "
                    "INPUT, over the run's eval set. Writes a CSV of input, class and "
                    "probability in input order (rank 0); an existing file is refused.")
    predict.add_argument("input", nargs="?", default="", metavar="INPUT")
    predict.add_argument("--run-dir", required=True, help="a run directory written by train")
    predict.add_argument("--out", metavar="FILE.csv",
                         help="where rank 0 writes the CSV (default RUN_DIR/predictions.csv)")
    predict.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    predict.add_argument("--batch-size", type=int, default=256,
                         help="inputs per batch on each rank (default 256)")


def _add_data_parser(sub) -> None:
    data_cmd = sub.add_parser("data", help="prepare data: 'hvdtrain data convert SRC DST'")
    actions = data_cmd.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    convert = actions.add_parser(
        "convert", help="image folders or .npz to TFRecord shards (one process, no launcher)",
        description="Convert SRC (a folder with one sub-folder of JPEG/PNG images per class, or "
                    "an .npz file with arrays x and y) to TFRecord shards in DST, with a sidecar "
                    "file that lets 'hvdtrain train --data tfrecord --set data.path=DST' run "
                    "without other data flags. An existing DST is refused.")
    convert.add_argument("src", metavar="SRC")
    convert.add_argument("dst", metavar="DST")
    convert.add_argument("--shards", type=int, default=4,
                         help="files per split (default 4; at least the number of ranks "
                              "lets each rank read whole files)")
    convert.add_argument("--image-shape", metavar="H,W,C",
                         help="image folders: the size every image is resized to, and 1 "
                              "(grey) or 3 (colour) channels")
    convert.add_argument("--eval-path", default="",
                         help="the eval set (like SRC); default: hold out --eval-fraction")
    convert.add_argument("--eval-fraction", type=float, default=DATA_DEFAULTS.eval_fraction,
                         help="share of every class held out for eval (default "
                              f"{DATA_DEFAULTS.eval_fraction}), drawn as training on SRC "
                              "with the same --seed would")
    convert.add_argument("--seed", type=int, default=TRAIN_DEFAULTS.seed,
                         help=f"seed of the hold-out and of the shards' order (default "
                              f"{TRAIN_DEFAULTS.seed}, train.seed's default)")


def _data_convert(args: argparse.Namespace) -> int:
    shape = (overrides.parse_value("--image-shape", args.image_shape, tuple[int, ...])
             if args.image_shape else None)
    launching.load_tensorflow()
    from hvdtrain import convert

    meta = convert.convert(args.src, args.dst, shards=args.shards, image_shape=shape,
                           eval_path=args.eval_path, eval_fraction=args.eval_fraction,
                           seed=args.seed)
    print(f"wrote {args.dst}: {sum(meta['train_counts'])} train samples in "
          f"{len(meta['train_files'])} files + {sum(meta['eval_counts'])} eval in "
          f"{len(meta['eval_files'])}, {len(meta['class_names'])} classes, "
          f"{','.join(map(str, meta['image_shape']))}; train with: hvdtrain train --data "
          f"tfrecord --set data.path={args.dst}", flush=True)
    return 0


def _train_config(args: argparse.Namespace) -> config_lib.Config:
    extra: dict[str, dict[str, Any]] = {}
    for dest, (section, key) in SHORTCUTS.items():
        value = getattr(args, dest)
        if value is not None:
            extra.setdefault(section, {})[key] = value
    return presets.build_config(args.preset, args.config, args.assignments, extra)


def _saved_config(args: argparse.Namespace) -> config_lib.Config:
    """eval and predict: the run's config.json, with eval's --set on top."""
    saved = Path(args.run_dir) / "config.json"
    if not Path(args.run_dir).is_dir():
        raise UserError(f"run dir {args.run_dir} does not exist: pass the --run-dir of a "
                        f"training run")
    try:
        values = json.loads(saved.read_text())
    except FileNotFoundError:
        raise UserError(f"{saved} not found: is {args.run_dir} a run directory?") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {saved}: {e}") from None
    base = overrides.from_dict(values)
    return overrides.with_overrides(
        base, overrides.parse_assignments(getattr(args, "assignments", [])))


def _predict_request(args: argparse.Namespace):
    from hvdtrain import predict  # nothing runs before dist.init
    return predict.request(args.run_dir, args.input, args.out, overwrite=args.overwrite,
                           batch_size=args.batch_size)


def _exit_after_losing_a_rank(rank: int) -> NoReturn:
    print(f"hvdtrain: error: rank {rank}: another rank died or stalled in the "
          f"middle of a collective, so Horovod shut down (the launcher's report names "
          f"the rank); continue from the last checkpoint with --resume",
          file=sys.stderr, flush=True)
    # Now, not after the interpreter's teardown: with a peer gone, Horovod's and
    # TensorFlow's shutdown only delay the exit (by 0.3 s and more, measured), long
    # enough for horovodrun to kill this rank first and lose its status.
    sys.stdout.flush()
    os._exit(LOST_A_RANK_EXIT_CODE)


def run(argv: Sequence[str] | None = None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv[:1] == ["bench"]:  # launches its own jobs: no Horovod in this process
            from hvdtrain.bench import suite
            return suite.main(argv[1:], _Parser)
        args = _parser().parse_args(argv)
        if args.command == "data":
            return _data_convert(args)
        if args.command in COMMANDS:
            return COMMANDS[args.command].run(args)
        try:  # argv (and the files it names) are the same on every rank, so is this error
            cfg = _train_config(args) if args.command == "train" else _saved_config(args)
            launching.load_tensorflow()
            request = _predict_request(args) if args.command == "predict" else None
        except UserError as e:
            raise UserError(str(e), shared=True) from None
        from hvdtrain import dist, predict, trainer  # Horovod loads here

        elastic = args.command == "train" and args.elastic
        world = dist.init(device=cfg.run.device, intra_op_threads=cfg.run.intra_op_threads,
                          inter_op_threads=cfg.run.inter_op_threads,
                          # eval and predict must not overwrite the training run's timeline
                          options=cfg.horovod if args.command == "train" else None,
                          stall_warning_s=cfg.run.stall_warning_s,
                          stall_abort_s=cfg.run.stall_abort_s, elastic=elastic)
        try:
            if args.command == "train":
                trainer.Trainer(cfg, world, resume=args.resume, elastic=elastic).train()
            elif args.command == "predict":
                predict.run(request, cfg, world)
            else:
                result = trainer.Trainer(cfg, world).evaluate_checkpoint(Path(args.run_dir))
                if world.is_chief:
                    print(json.dumps(result))
        except Exception as e:
            if not dist.lost_a_rank(e):
                raise
            _exit_after_losing_a_rank(world.rank)
        return 0
    except UserError as e:
        if placement.launcher_rank() == 0 or not e.shared:
            print(f"hvdtrain: error: {e}", file=sys.stderr, flush=True)
        else:
            # Let rank 0 report and exit first: launchers tear the job down as soon as any
            # rank exits non-zero, which could otherwise kill rank 0 before it prints.
            time.sleep(SHARED_ERROR_GRACE_S)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def main() -> None:
    launching.end_rank(run())


if __name__ == "__main__":
    main()

"""``hvdtrain predict``: a trained model over inputs, a CSV of predicted classes."""
from __future__ import annotations

import argparse

from hvdtrain.launch import rank_process
from hvdtrain.commands import run_dirs
from hvdtrain.training import rank_job

NAME = "predict"
HELP = ("a trained model over images, an .npz or TFRecord files: a CSV of predicted classes "
        "(any number of ranks)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run RUN_DIR's exported model (or, without one, its latest checkpoint) over INPUT: a "
        "folder of JPEG/PNG images (flat or one sub-folder per class), an image, an .npz file "
        "(array x) or TFRecord files; without INPUT, over the run's eval set. Writes a CSV of "
        "input, class and probability in input order (rank 0); an existing file is refused.")
    parser.add_argument("input", nargs="?", default="", metavar="INPUT")
    parser.add_argument("--run-dir", required=True, help="a run directory written by train")
    parser.add_argument("--out", metavar="FILE.csv",
                        help="where rank 0 writes the CSV (default RUN_DIR/predictions.csv)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="inputs per batch on each rank (default 256)")


def run(args: argparse.Namespace) -> int:
    with rank_job.same_on_every_rank():
        cfg = run_dirs.saved_config(args)
        rank_process.load_tensorflow()
        from hvdtrain.training import predict  # nothing runs before dist.init (Horovod loads here)
        request = predict.request(args.run_dir, args.input, args.out,
                                  overwrite=args.overwrite, batch_size=args.batch_size)
    world = rank_job.start(cfg, options=None)
    return rank_job.run(world, lambda: predict.run(request, cfg, world))

"""``hvdtrain data convert SRC DST``: image folders or an .npz to TFRecord shards."""
from __future__ import annotations

import argparse

from hvdtrain import config as config_lib
from hvdtrain.launch import rank_process
from hvdtrain.config import overrides
from hvdtrain.commands.parsing import Parser

NAME = "data"
HELP = "prepare data: 'hvdtrain data convert SRC DST'"
DATA_DEFAULTS, TRAIN_DEFAULTS = config_lib.DataConfig(), config_lib.TrainConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="data_command", required=True, parser_class=Parser)
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


def run(args: argparse.Namespace) -> int:
    shape = (overrides.parse_value("--image-shape", args.image_shape, tuple[int, ...])
             if args.image_shape else None)
    rank_process.load_tensorflow()
    from hvdtrain.data import convert

    meta = convert.convert(args.src, args.dst, shards=args.shards, image_shape=shape,
                           eval_path=args.eval_path, eval_fraction=args.eval_fraction,
                           seed=args.seed)
    print(f"wrote {args.dst}: {sum(meta['train_counts'])} train samples in "
          f"{len(meta['train_files'])} files + {sum(meta['eval_counts'])} eval in "
          f"{len(meta['eval_files'])}, {len(meta['class_names'])} classes, "
          f"{','.join(map(str, meta['image_shape']))}; train with: hvdtrain train --data "
          f"tfrecord --set data.path={args.dst}", flush=True)
    return 0

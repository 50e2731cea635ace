"""What ``hvdtrain predict`` runs a model over: INPUT read as a data split that the eval pipeline
shards (``sources.eval_dataset``), with one name per input for the CSV, in input order.

    a folder of JPEG/PNG files (flat, or one sub-folder per class), or one image file
        -> images.ImageFiles, resized to the model's input; named by their paths (sorted)
    an .npz file with an array x (y not needed)  -> sources.Arrays; named by their row, 0, 1, ...
    TFRecord files in the layout the tfrecord source reads (a file, a folder of shards, a glob
    or a comma list)                             -> records.Records; named FILE:RECORD
    nothing: the run's own eval set, as training held it out

A folder is read as images when it has sub-folders or its first file is an image, else as
TFRecord files. Nothing here knows about Horovod.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hvdtrain.data import images, records, sources
from hvdtrain.config import Config
from hvdtrain.errors import UserError


@dataclass(frozen=True)
class Inputs:
    split: sources.Split
    names: list[str]      # the CSV's input column, in input order

    def __len__(self) -> int:
        return len(self.names)


def read(spec: str, input_shape: tuple[int, ...], config: Config) -> Inputs:
    """INPUT (``spec``; empty: the run's eval set) for a model taking ``input_shape``."""
    if not spec:
        split = sources.load(config.data, config.train.seed).eval
    elif spec.endswith(".npz"):
        split = sources.read_npz(spec, labels=False)
    elif _is_images(spec):
        split = _images(spec, input_shape)
    else:
        split = records.scan(spec, input_shape, None, shape_from="the model's input shape",
                             shape_fix="the model was trained on other images")
    if isinstance(split, sources.Arrays) and split.x.shape[1:] != tuple(input_shape):
        raise UserError(f"{spec or config.data.path}: x holds inputs of shape "
                        f"{split.x.shape[1:]} but the model takes {tuple(input_shape)}: pass "
                        f"inputs of the model's shape (images: a folder, resized for you)")
    return Inputs(split, names(split))


def _is_images(spec: str) -> bool:
    """An image file, or a folder with sub-folders or whose first file is an image."""
    if os.path.isfile(spec):
        return _starts_like_image(spec)
    if not os.path.isdir(spec):
        return False
    files, folders = images.entries(spec)
    return bool(folders) or bool(files and _starts_like_image(files[0]))


def _starts_like_image(path: str) -> bool:
    try:
        return images.is_image(path)
    except OSError:   # not readable: named by the TFRecord reader
        return False


def _images(spec: str, input_shape: tuple[int, ...]) -> images.ImageFiles:
    if len(input_shape) != 3 or input_shape[-1] not in (1, 3):
        raise UserError(f"the model takes inputs of shape {tuple(input_shape)}, not images "
                        f"(height, width, 1 or 3 channels): pass an .npz file or TFRecord "
                        f"files of that shape")
    if os.path.isfile(spec):
        paths = [images.checked_image(spec)]
    else:
        files, folders = images.entries(spec)
        files += [path for folder in folders for path in images.entries(folder)[0]]
        paths = sorted(images.checked_image(path) for path in files)
    if not paths:
        raise UserError(f"{spec} holds no images (JPEG or PNG files, in it or in its "
                        f"sub-folders)")
    return images.ImageFiles(tuple(paths), np.zeros(len(paths), np.int32),
                             tuple(input_shape), ())


def names(split: sources.Split) -> list[str]:
    """One name per sample of ``split``, in order: the file path of an image, FILE:RECORD of a
    record, the row number of an array."""
    if isinstance(split, images.ImageFiles):
        return list(split.paths)
    if isinstance(split, records.Records):
        return [f"{path}:{i}" for path, count in zip(split.files, split.counts)
                for i in range(count)]
    return [str(i) for i in range(len(split))]

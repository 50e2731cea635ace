"""Image folders: ``ROOT/<class name>/<image file>``, JPEG and PNG in any mix, the layout of
Keras's ``image_dataset_from_directory`` and torchvision's ``ImageFolder``.

Class ids are the sorted folder names, so every rank (and the eval set) numbers them alike.
Files are decoded and resized inside tf.data (``image_decoding``); nothing here knows about
Horovod: sharding takes ``rank`` and ``size`` as arguments.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from hvdtrain.data import sharding
from hvdtrain.data.image_decoding import batch_decoder, check_decodable, decode_all, decoded
from hvdtrain.data.tfdata import TrainStream, gathered_train, indexed_train, keeps_in_memory
from hvdtrain.errors import UserError

# The first bytes of the formats decoded here (tf.io.decode_image also reads GIF and BMP, but
# hvdtrain promises JPEG and PNG).
MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")


@dataclass(frozen=True)
class ImageFiles:
    """A split of an image folder: paths with their class ids, and the shape they decode to."""
    paths: tuple[str, ...]
    labels: np.ndarray           # int32 [n], ids into class_names
    image_shape: tuple[int, ...]  # (H, W, C)
    class_names: tuple[str, ...]
    cache: str = "off"           # data.cache: on, off, auto (see ``cached``)

    def __len__(self) -> int:
        return len(self.paths)


# ---------------------------------------------------------------------------------------------
# Reading the folders

def _list(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            # Hidden entries (.DS_Store, .ipynb_checkpoints) are not data.
            return sorted((e for e in entries if not e.name.startswith(".")),
                          key=lambda e: e.name)
    except FileNotFoundError:
        raise UserError(f"image folder {folder} does not exist: check data.path / "
                        f"data.eval_path") from None
    except NotADirectoryError:
        raise UserError(f"{folder} is a file, not a folder: data.source=images needs a folder "
                        f"with one sub-folder of images per class") from None
    except PermissionError:
        raise UserError(f"image folder {folder} is not readable (permission denied): fix its "
                        f"permissions") from None


def is_image(path: str) -> bool:
    """Whether ``path`` starts like a JPEG or PNG (OSError when it cannot be read)."""
    with open(path, "rb") as f:
        head = f.read(8)
    return head.startswith(MAGIC)


def checked_image(path: str) -> str:
    """``path``, once it is known to start like a JPEG or PNG (else a UserError naming it)."""
    try:
        image = is_image(path)
    except OSError as e:
        raise UserError(f"image {path} is not readable ({e.strerror}): fix its permissions or "
                        f"remove it") from None
    if not image:
        raise UserError(f"{path} is not a JPEG or PNG image: remove it from the folder (or "
                        f"convert it)")
    return path


def entries(folder: str) -> tuple[list[str], list[str]]:
    """The files and the sub-folders of ``folder``, sorted, hidden entries left out."""
    listed = _list(Path(folder))
    return [e.path for e in listed if e.is_file()], [e.path for e in listed if e.is_dir()]


def scan(root: str, image_shape: tuple[int, ...], *, cache: str = "off") -> ImageFiles:
    """Every image of ``root``'s class folders, checked cheaply (the folders are readable, no
    class is empty, every file starts like a JPEG or PNG); the content is checked by
    ``image_decoding.undecodable``."""
    classes = [e for e in _list(Path(root)) if e.is_dir()]
    if not classes:
        raise UserError(f"{root} holds no class folders: data.source=images needs "
                        f"{root}/<class name>/<images>")
    paths: list[str] = []
    labels: list[int] = []
    for label, entry in enumerate(classes):
        files = [checked_image(path) for path in entries(entry.path)[0]]
        if not files:
            raise UserError(f"class folder {entry.path} holds no images: add some, or remove "
                            f"the folder")
        paths += files
        labels += [label] * len(files)
    return ImageFiles(tuple(paths), np.array(labels, np.int32), tuple(image_shape),
                      tuple(e.name for e in classes), cache)


def hold_out(images: ImageFiles, fraction: float, seed: int) -> tuple[ImageFiles, ImageFiles]:
    """``fraction`` of every class, drawn by ``seed``, as the eval set (the same on every
    rank)."""
    rng = np.random.default_rng([seed, 1])
    train: list[int] = []
    held: list[int] = []
    for label, name in enumerate(images.class_names):
        members = np.flatnonzero(images.labels == label)
        n_eval = max(1, int(round(len(members) * fraction)))
        if n_eval >= len(members):
            raise UserError(f"class {name} holds {len(members)} images, too few to hold out "
                            f"{fraction:.0%} for eval: add images or pass data.eval_path")
        chosen = rng.permutation(members)
        held += chosen[:n_eval].tolist()
        train += chosen[n_eval:].tolist()
    return subset(images, sorted(train)), subset(images, sorted(held))


def subset(images: ImageFiles, indices) -> ImageFiles:
    """The files of ``images`` at ``indices`` (and their labels), in that order."""
    indices = np.asarray(indices, np.int64)
    return dataclasses.replace(images, paths=tuple(images.paths[i] for i in indices),
                               labels=images.labels[indices])


def check_same_classes(train: ImageFiles, evaluation: ImageFiles, eval_root: str) -> None:
    """UserError naming the class folders the eval folder lacks or adds, unless both hold the
    same classes."""
    if train.class_names != evaluation.class_names:
        missing = sorted(set(train.class_names) - set(evaluation.class_names))
        extra = sorted(set(evaluation.class_names) - set(train.class_names))
        parts = ([f"lacks {', '.join(missing)}"] if missing else []) + (
            [f"has extra {', '.join(extra)}"] if extra else [])
        raise UserError(f"eval folder {eval_root} {' and '.join(parts)}: its class folders "
                        f"must be the same as the training folder's")


# ---------------------------------------------------------------------------------------------
# Sharding: each rank takes its share of EVERY class, so no rank trains without a class.

def own_indices(images: ImageFiles, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s files: every size-th file of each class (disjoint, together complete)."""
    own = [np.flatnonzero(images.labels == label)[rank::size]
           for label in range(len(images.class_names))]
    return np.sort(np.concatenate(own)) if own else np.zeros(0, np.int64)


def check_shardable(images: ImageFiles, size: int) -> None:
    """UserError unless every class has at least ``size`` training images: each rank takes a
    share of every class."""
    for label in range(len(images.class_names)):
        members = np.flatnonzero(images.labels == label)
        if len(members) < size:
            folder = os.path.dirname(images.paths[members[0]])
            raise UserError(f"class folder {folder} holds {len(members)} training images but "
                            f"{size} ranks were launched: each rank takes a share of every class; "
                            f"add images to it or launch at most {len(members)} ranks")


def padded_width(images: ImageFiles, size: int, rank: int, pad: bool) -> int:
    """Samples per epoch on ``rank``: its own share, or (padded) the largest share of any rank."""
    if not pad:
        return len(own_indices(images, rank, size))
    return max(len(own_indices(images, r, size)) for r in range(size))


# ---------------------------------------------------------------------------------------------
# Decoding (image_decoding.py) and its checks

def cached(split: ImageFiles, count: int) -> bool:
    """Whether a rank keeps its ``count`` images in memory once decoded (data.cache)."""
    return keeps_in_memory(split.cache, count, split.image_shape)


def read_problem(split, rank: int, size: int) -> str | None:
    """After a decode failure in training: which of this rank's files is to blame, or None."""
    if not isinstance(split, ImageFiles):
        return None
    try:
        check_decodable([split.paths[i] for i in own_indices(split, rank, size)],
                        split.image_shape[-1])
    except UserError as e:
        return str(e)
    return None


def check_ready(train: ImageFiles, evaluation: ImageFiles, rank: int, size: int,
                verify: bool) -> None:
    """What only the world size can tell: a file of every class per rank, and (``verify``)
    this rank's share of the files decoded once, so that a corrupt file stops every rank
    before training, named."""
    check_shardable(train, size)
    if verify:
        for split in (train, evaluation):
            mine = sharding.shard_indices(len(split), rank, size)
            check_decodable([split.paths[i] for i in mine], split.image_shape[-1])


# ---------------------------------------------------------------------------------------------
# Per-rank pipelines

def train_stream(split: ImageFiles, rank: int, size: int, batch_size: int, first_epoch: int,
                 epochs: int, seed: int, shuffle: bool, pad: bool) -> TrainStream:
    """The array rule on file indices: this rank's share of every class, padded by wrapping
    around it, shuffled by (seed, epoch, rank)."""
    own = own_indices(split, rank, size)
    orders = sharding.orders_of(own, padded_width(split, size, rank, pad), rank,
                                first_epoch, epochs, seed, shuffle)
    if cached(split, len(own)):  # decode this rank's files once; batches gather from memory
        return gathered_train(decode_all([split.paths[i] for i in own], split.image_shape),
                              split.labels[own], np.searchsorted(own, orders), batch_size,
                              ids=lambda: [split.paths[i] for i in own])
    labels = tf.constant(split.labels)
    fetch = batch_decoder(tf.constant(split.paths), split.image_shape)
    return indexed_train(orders, batch_size, lambda idx: (fetch(idx), tf.gather(labels, idx)),
                         ids=lambda: split.paths)


def eval_images(split: ImageFiles, rank: int, size: int) -> tf.data.Dataset:
    """This rank's disjoint share of the files, in order, decoded (kept when cached)."""
    own = sharding.shard_indices(len(split), rank, size)
    ds = tf.data.Dataset.zip((decoded([split.paths[i] for i in own], split.image_shape),
                              tf.data.Dataset.from_tensor_slices(split.labels[own])))
    return ds.cache() if cached(split, len(own)) else ds

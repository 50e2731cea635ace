"""Data sources -> validated arrays or record files -> per-rank tf.data pipelines.

Nothing here knows about Horovod: pipelines take ``rank`` and ``size`` as arguments.
Sources: ``synthetic`` (a learnable random problem), ``digits`` (scikit-learn's built-in 8x8
digits), ``npz`` (arrays ``x`` and ``y``), ``tfrecord`` (``image_raw`` bytes + int64 ``label``
per record, the MNIST TFRecord layout, optionally with the sidecar ``hvdtrain data convert``
writes) and ``images`` (class folders of JPEG/PNG files, see ``hvdtrain.data.images``).
Every source's order is a function of (seed, epoch, rank), so a resumed run sees the batches an
uninterrupted one would have seen.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from hvdtrain.data import images, records, sharding, sklearn_data, tfdata
from hvdtrain.config import DataConfig
from hvdtrain.errors import UserError
from hvdtrain.data.records import Records
from hvdtrain.data.tfdata import TrainStream


@dataclass(frozen=True)
class Arrays:
    """An in-memory split: x float32 [n, *input_shape], y int32 [n]."""
    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


Split = Arrays | Records | images.ImageFiles
DIGITS_SHAPE = (8, 8, 1)


@dataclass(frozen=True)
class DataSet:
    train: Split
    eval: Split
    input_shape: tuple[int, ...]
    num_classes: int
    description: str
    class_names: tuple[str, ...] = ()   # empty: the class ids "0", "1", ...

    def names(self) -> list[str]:
        """The class names, or the class ids as strings when the source has no names."""
        return list(self.class_names) or [str(i) for i in range(self.num_classes)]


# ---------------------------------------------------------------------------------------------
# Sources

def load(cfg: DataConfig, seed: int) -> DataSet:
    """Reads and checks the configured source; every user mistake becomes a UserError."""
    if cfg.source == "synthetic":
        return _synthetic(cfg, seed)
    if cfg.source == "digits":
        return _digits()
    if cfg.source == "npz":
        return _npz(cfg, seed)
    if cfg.source == "images":
        return _images(cfg, seed)
    return _tfrecord(cfg)


def input_shape(cfg: DataConfig) -> tuple[int, ...]:
    """The shape of one input of the configured source, without reading its samples where the
    config or a sidecar says it (an .npz file is read)."""
    if cfg.source == "digits":
        return DIGITS_SHAPE
    if cfg.source == "npz":
        return tuple(read_npz(cfg.path).x.shape[1:])
    meta = records.read_sidecar(cfg.path) if cfg.source == "tfrecord" and os.path.isdir(
        cfg.path) else None
    return tuple(meta["image_shape"]) if meta else tuple(cfg.image_shape)


def _images(cfg: DataConfig, seed: int) -> DataSet:
    shape = tuple(cfg.image_shape)
    found = images.scan(cfg.path, shape, cache=cfg.cache)
    if cfg.eval_path:
        train, evaluation = found, images.scan(cfg.eval_path, shape, cache=cfg.cache)
        images.check_same_classes(train, evaluation, cfg.eval_path)
    else:
        train, evaluation = images.hold_out(found, cfg.eval_fraction, seed)
    names = train.class_names
    return DataSet(train, evaluation, shape, len(names),
                   f"images {len(train)} train + {len(evaluation)} eval, {len(names)} classes, "
                   f"resized to {','.join(map(str, shape))}", names)


def _synthetic(cfg: DataConfig, seed: int) -> DataSet:
    # Labels come from a fixed random linear map of the inputs, so the problem is learnable and
    # accuracy means something; the same seed gives the same data on every rank.
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((cfg.num_samples, *cfg.image_shape), dtype=np.float32)
    weights = rng.standard_normal((int(np.prod(cfg.image_shape)), cfg.num_classes))
    y = np.argmax(x.reshape(len(x), -1) @ weights, axis=1).astype(np.int32)
    train, evaluation = _hold_out(Arrays(x, y), cfg.eval_fraction, seed)
    return DataSet(train, evaluation, tuple(cfg.image_shape), cfg.num_classes,
                   f"synthetic {len(train)}+{len(evaluation)} x {cfg.image_shape}")


def _digits() -> DataSet:
    images, digits = sklearn_data.digits()  # ships inside scikit-learn's wheel: no download
    x = (images / 16.0).astype(np.float32)[..., None]     # pixels 0..16 -> 0..1, HWC
    y = digits.astype(np.int32)
    # A fixed split (the same on every machine and run): every 5th sample is held out.
    is_eval = np.arange(len(y)) % 5 == 0
    train, evaluation = Arrays(x[~is_eval], y[~is_eval]), Arrays(x[is_eval], y[is_eval])
    return DataSet(train, evaluation, DIGITS_SHAPE, 10,
                   f"digits {len(train)} train + {len(evaluation)} eval, 8x8x1")


def _npz(cfg: DataConfig, seed: int) -> DataSet:
    data = read_npz(cfg.path)
    num_classes = cfg.num_classes or int(data.y.max()) + 1
    records.check_labels(data.y, num_classes, cfg.path)
    if cfg.eval_path:
        evaluation = read_npz(cfg.eval_path)
        records.check_labels(evaluation.y, num_classes, cfg.eval_path)
        if evaluation.x.shape[1:] != data.x.shape[1:]:
            raise UserError(f"{cfg.eval_path} holds inputs of shape {evaluation.x.shape[1:]} but "
                            f"{cfg.path} holds {data.x.shape[1:]}: they must match")
        train = data
    else:
        train, evaluation = _hold_out(data, cfg.eval_fraction, seed)
    return DataSet(train, evaluation, tuple(data.x.shape[1:]), num_classes,
                   f"npz {len(train)} train + {len(evaluation)} eval, {data.x.shape[1:]}")


def read_npz(path: str, *, labels: bool = True) -> Arrays:
    """Arrays ``x`` (uint8 scaled to [0, 1]) and ``y`` of an .npz file, checked; without
    ``labels`` (``hvdtrain predict``) ``y`` may be absent and is not read."""
    if not os.path.exists(path):
        raise UserError(f"data file {path} does not exist: check data.path / data.eval_path")
    needed = ("x", "y") if labels else ("x",)
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise UserError(f"{path} is a single .npy array, not an .npz archive: save it with "
                            f"np.savez(path, x=inputs, y=labels)")
        with loaded as npz:
            missing = [k for k in needed if k not in npz.files]
            if missing:
                raise UserError(f"{path} has no array {' or '.join(missing)} (it holds "
                                f"{', '.join(npz.files) or 'nothing'}): save it with "
                                f"np.savez(path, x=inputs, y=labels)")
            x = npz["x"]
            y = npz["y"] if labels else np.zeros(len(x), np.int32)
    except PermissionError:
        raise UserError(f"data file {path} is not readable (permission denied)") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise UserError(f"data file {path} is not a readable .npz file ({e})") from None
    if len(x) != len(y):
        raise UserError(f"{path}: x has {len(x)} samples but y has {len(y)}: they must have "
                        f"the same length")
    if len(y) == 0:
        raise UserError(f"{path} holds no samples")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise UserError(f"{path}: y must be a 1-D array of integer class ids, got "
                        f"{y.dtype} of shape {y.shape}")
    if not np.issubdtype(x.dtype, np.number) or x.ndim < 2:
        raise UserError(f"{path}: x must be numeric with one row per sample, got {x.dtype} of "
                        f"shape {x.shape}")
    if np.issubdtype(x.dtype, np.inexact):
        finite = np.isfinite(x).reshape(len(x), -1).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise UserError(f"{path}: x holds NaN or infinite values in {len(bad)} samples "
                            f"(the first is sample {bad[0]}): they would turn every weight "
                            f"into NaN; drop or fix those samples")
    scale = 1.0 / 255.0 if x.dtype == np.uint8 else 1.0
    return Arrays((x * scale).astype(np.float32), y.astype(np.int32))


def _hold_out(data: Arrays, fraction: float, seed: int) -> tuple[Arrays, Arrays]:
    order = np.random.default_rng([seed, 1]).permutation(len(data))
    n_eval = max(1, int(round(len(data) * fraction)))
    if n_eval >= len(data):
        raise UserError(f"{len(data)} samples are too few to hold out {fraction:.0%} for eval")
    ev, tr = order[:n_eval], order[n_eval:]
    return Arrays(data.x[tr], data.y[tr]), Arrays(data.x[ev], data.y[ev])


def _tfrecord(cfg: DataConfig) -> DataSet:
    meta = records.read_sidecar(cfg.path) if os.path.isdir(cfg.path) else None
    shape, names = tuple(cfg.image_shape), ()
    train_spec, eval_spec = cfg.path, cfg.eval_path
    if meta:  # converted by hvdtrain: shape, classes and the split come with the shards
        shape, names = meta["image_shape"], meta["class_names"]
        folder = Path(cfg.path)
        train_spec = ",".join(str(folder / f) for f in meta["train_files"])
        eval_spec = eval_spec or ",".join(str(folder / f) for f in meta["eval_files"])
    if not eval_spec:
        raise UserError("data.source=tfrecord needs the eval records too: pass "
                        "--set data.eval_path=PATH")
    num_classes = len(names) or cfg.num_classes
    train = records.scan(train_spec, shape, num_classes, cache=cfg.cache)
    evaluation = records.scan(eval_spec, shape, num_classes, cache=cfg.cache)
    return DataSet(train, evaluation, shape, num_classes,
                   f"tfrecord {len(train)} train ({len(train.files)} files) + "
                   f"{len(evaluation)} eval, {shape}", names)


# ---------------------------------------------------------------------------------------------
# Per-rank pipelines

def train_dataset(split: Split, *, rank: int, size: int, batch_size: int, first_epoch: int,
                  epochs: int, seed: int, shuffle: bool,
                  shuffle_buffer: int = 10_000, pad: bool = True) -> TrainStream:
    """This rank's batches for epochs first_epoch..epochs-1, with the steps per epoch (equal on
    every rank). ``pad=False`` (horovod.join_uneven): each rank reads its own shard once per
    epoch, so ranks may run different numbers of steps."""
    if isinstance(split, Arrays):
        orders = sharding.epoch_orders(len(split), rank, size, first_epoch, epochs, seed,
                                       shuffle, pad)
        return tfdata.gathered_train(split.x, split.y, orders, batch_size,
                                     ids=lambda: [str(i) for i in range(len(split))])
    if isinstance(split, images.ImageFiles):
        return images.train_stream(split, rank, size, batch_size, first_epoch, epochs, seed,
                                   shuffle, pad)
    return records.train_stream(split, rank, size, batch_size, first_epoch, epochs, seed,
                                shuffle, shuffle_buffer, pad)


def eval_dataset(split: Split, *, rank: int, size: int, batch_size: int) -> tf.data.Dataset:
    """This rank's disjoint share of the eval set, unpadded: together the ranks see every eval
    sample exactly once, so summed counts give the exact accuracy."""
    if isinstance(split, Arrays):
        own = sharding.shard_indices(len(split), rank, size)
        ds = tf.data.Dataset.from_tensor_slices((split.x[own], split.y[own]))
    elif isinstance(split, images.ImageFiles):
        ds = images.eval_images(split, rank, size)
    else:
        ds = records.eval_records(split, rank, size)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)

"""Data sources -> validated arrays or record files -> per-rank tf.data pipelines.

Nothing here knows about Horovod: pipelines take ``rank`` and ``size`` as arguments.
Sources: ``synthetic`` (a learnable random problem), ``digits`` (scikit-learn's built-in 8x8
digits), ``npz`` (arrays ``x`` and ``y``) and ``tfrecord`` (``image_raw`` bytes + int64 ``label``
per record, the MNIST TFRecord layout).
"""
from __future__ import annotations

import glob
import math
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from hvdtrain import sharding
from hvdtrain.config import DataConfig
from hvdtrain.errors import UserError


@dataclass(frozen=True)
class Arrays:
    """An in-memory split: x float32 [n, *input_shape], y int32 [n]."""
    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Records:
    """A split in TFRecord files, with the number of records in each file."""
    files: tuple[str, ...]
    counts: tuple[int, ...]
    image_shape: tuple[int, ...]

    def __len__(self) -> int:
        return sum(self.counts)


Split = Arrays | Records


@dataclass(frozen=True)
class DataSet:
    train: Split
    eval: Split
    input_shape: tuple[int, ...]
    num_classes: int
    description: str


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
    return _tfrecord(cfg)


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
    from sklearn.datasets import load_digits  # ships inside scikit-learn's wheel: no download

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]     # pixels 0..16 -> 0..1, HWC
    y = bunch.target.astype(np.int32)
    # A fixed split (the same on every machine and run): every 5th sample is held out.
    is_eval = np.arange(len(y)) % 5 == 0
    train, evaluation = Arrays(x[~is_eval], y[~is_eval]), Arrays(x[is_eval], y[is_eval])
    return DataSet(train, evaluation, (8, 8, 1), 10,
                   f"digits {len(train)} train + {len(evaluation)} eval, 8x8x1")


def _npz(cfg: DataConfig, seed: int) -> DataSet:
    data = _read_npz(cfg.path)
    num_classes = cfg.num_classes or int(data.y.max()) + 1
    _check_labels(data.y, num_classes, cfg.path)
    if cfg.eval_path:
        evaluation = _read_npz(cfg.eval_path)
        _check_labels(evaluation.y, num_classes, cfg.eval_path)
        if evaluation.x.shape[1:] != data.x.shape[1:]:
            raise UserError(f"{cfg.eval_path} holds inputs of shape {evaluation.x.shape[1:]} but "
                            f"{cfg.path} holds {data.x.shape[1:]}: they must match")
        train = data
    else:
        train, evaluation = _hold_out(data, cfg.eval_fraction, seed)
    return DataSet(train, evaluation, tuple(data.x.shape[1:]), num_classes,
                   f"npz {len(train)} train + {len(evaluation)} eval, {data.x.shape[1:]}")


def _read_npz(path: str) -> Arrays:
    if not os.path.exists(path):
        raise UserError(f"data file {path} does not exist: check data.path / data.eval_path")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise UserError(f"{path} is a single .npy array, not an .npz archive: save it with "
                            f"np.savez(path, x=inputs, y=labels)")
        with loaded as npz:
            missing = [k for k in ("x", "y") if k not in npz.files]
            if missing:
                raise UserError(f"{path} has no array {' or '.join(missing)} (it holds "
                                f"{', '.join(npz.files) or 'nothing'}): save it with "
                                f"np.savez(path, x=inputs, y=labels)")
            x, y = npz["x"], npz["y"]
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


def _check_labels(y: np.ndarray, num_classes: int, path: str) -> None:
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= num_classes:
        raise UserError(f"{path}: labels range over {low}..{high} but data.num_classes="
                        f"{num_classes} allows 0..{num_classes - 1}: fix the labels or pass "
                        f"--set data.num_classes={max(high + 1, 2)}")


def _hold_out(data: Arrays, fraction: float, seed: int) -> tuple[Arrays, Arrays]:
    order = np.random.default_rng([seed, 1]).permutation(len(data))
    n_eval = max(1, int(round(len(data) * fraction)))
    if n_eval >= len(data):
        raise UserError(f"{len(data)} samples are too few to hold out {fraction:.0%} for eval")
    ev, tr = order[:n_eval], order[n_eval:]
    return Arrays(data.x[tr], data.y[tr]), Arrays(data.x[ev], data.y[ev])


# TFRecord ----------------------------------------------------------------------------------

_FEATURES = {"image_raw": tf.io.FixedLenFeature([], tf.string),
             "label": tf.io.FixedLenFeature([], tf.int64)}


def _tfrecord(cfg: DataConfig) -> DataSet:
    if not cfg.eval_path:
        raise UserError("data.source=tfrecord needs the eval records too: pass "
                        "--set data.eval_path=PATH")
    train = _scan_records(cfg.path, cfg.image_shape, cfg.num_classes)
    evaluation = _scan_records(cfg.eval_path, cfg.image_shape, cfg.num_classes)
    return DataSet(train, evaluation, tuple(cfg.image_shape), cfg.num_classes,
                   f"tfrecord {len(train)} train ({len(train.files)} files) + "
                   f"{len(evaluation)} eval, {cfg.image_shape}")


def resolve_files(spec: str) -> list[str]:
    """A file, a directory (its files), a glob, or a comma-separated list of these."""
    files: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if os.path.isdir(part):
            found = sorted(str(p) for p in Path(part).iterdir() if p.is_file())
        elif any(c in part for c in "*?["):
            found = sorted(glob.glob(part))
        else:
            found = [part] if os.path.exists(part) else []
        if not found:
            raise UserError(f"no data files at {part}: check data.path / data.eval_path")
        files.extend(found)
    return files


def _scan_records(spec: str, image_shape: tuple[int, ...], num_classes: int) -> Records:
    """Counts the records of every file and checks each one parses, with the right image size
    and labels in range, so that a bad file stops the run before training, on every rank."""
    want_bytes = math.prod(image_shape)
    counts = []
    files = resolve_files(spec)
    for path in files:
        if not os.access(path, os.R_OK):
            raise UserError(f"data file {path} is not readable (permission denied)")
        parsed = tf.data.TFRecordDataset(path).map(
            lambda r: tf.io.parse_single_example(r, _FEATURES))
        stats = parsed.map(lambda f: (tf.strings.length(f["image_raw"]), f["label"]))
        try:
            lengths, labels = _gather(stats)
        except tf.errors.DataLossError as e:
            where = re.search(r"(truncated|corrupted) record at \d+", e.message)
            raise UserError(f"{path} is not a valid TFRecord file"
                            f" ({where.group(0) if where else 'truncated or corrupted'}): "
                            f"rewrite it, or leave it out of the data path") from None
        except tf.errors.InvalidArgumentError:
            raise UserError(f"{path}: records must hold 'image_raw' (bytes) and 'label' "
                            f"(int64) features") from None
        if len(labels) == 0:
            raise UserError(f"{path} holds no records")
        if np.any(lengths != want_bytes):
            got = int(lengths[lengths != want_bytes][0])
            raise UserError(f"{path}: an image holds {got} bytes but data.image_shape="
                            f"{','.join(map(str, image_shape))} needs {want_bytes}: pass the "
                            f"shape of the stored images")
        _check_labels(labels, num_classes, path)
        counts.append(len(labels))
    return Records(tuple(files), tuple(counts), tuple(image_shape))


def _gather(stats: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    lengths, labels = [], []
    for length, label in stats.batch(4096).as_numpy_iterator():
        lengths.append(length)
        labels.append(label)
    if not labels:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    return np.concatenate(lengths), np.concatenate(labels)


def _decode(image_shape: tuple[int, ...]):
    def decode(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        features = tf.io.parse_single_example(record, _FEATURES)
        image = tf.io.decode_raw(features["image_raw"], tf.uint8)
        image = tf.reshape(tf.cast(image, tf.float32) / 255.0, image_shape)
        return image, tf.cast(features["label"], tf.int32)
    return decode


# ---------------------------------------------------------------------------------------------
# Per-rank pipelines

@dataclass(frozen=True)
class TrainStream:
    dataset: tf.data.Dataset
    steps_per_epoch: int       # the same on every rank (unless not padded)
    samples_per_epoch: int     # on this rank (and on each other rank, unless not padded)

def train_dataset(split: Split, *, rank: int, size: int, batch_size: int, first_epoch: int,
                  epochs: int, seed: int, shuffle: bool,
                  shuffle_buffer: int = 10_000, pad: bool = True) -> TrainStream:
    """This rank's batches for epochs first_epoch..epochs-1, with the steps per epoch (equal on
    every rank). ``pad=False`` (horovod.join_uneven): each rank reads its own shard once per
    epoch, so ranks may run different numbers of steps."""
    if isinstance(split, Arrays):
        return _array_train(split, rank, size, batch_size, first_epoch, epochs, seed, shuffle,
                            pad)
    return _record_train(split, rank, size, batch_size, seed, shuffle, shuffle_buffer, pad)


def _array_train(split: Arrays, rank: int, size: int, batch_size: int, first_epoch: int,
                 epochs: int, seed: int, shuffle: bool, pad: bool) -> TrainStream:
    orders = sharding.epoch_orders(len(split), rank, size, first_epoch, epochs, seed, shuffle,
                                   pad)
    x, y = tf.constant(split.x), tf.constant(split.y)
    ds = (tf.data.Dataset.from_tensor_slices(orders)                       # one row per epoch
          .flat_map(lambda order: tf.data.Dataset.from_tensor_slices(order).batch(batch_size))
          .map(lambda idx: (tf.gather(x, idx), tf.gather(y, idx)),
               num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))
    samples = orders.shape[1]
    return TrainStream(ds, math.ceil(samples / batch_size), samples)


def _record_train(split: Records, rank: int, size: int, batch_size: int, seed: int,
                  shuffle: bool, shuffle_buffer: int, pad: bool) -> TrainStream:
    own_files = sharding.shard_files(list(split.files), rank, size)
    if own_files is not None:  # whole files per rank: no rank reads another's records
        files = tf.data.Dataset.from_tensor_slices(own_files)
        if shuffle:
            files = files.shuffle(len(own_files), seed=seed + rank)
        ds = files.interleave(tf.data.TFRecordDataset, cycle_length=min(4, len(own_files)),
                              num_parallel_calls=tf.data.AUTOTUNE)
    else:  # fewer files than ranks: every rank reads all files, keeps every size-th record
        ds = tf.data.TFRecordDataset(list(split.files)).shard(size, rank)
    # Ranks with fewer records wrap around their own shard, so every rank runs the steps of the
    # largest shard and none waits in an all-reduce that its peers never join (unless not
    # padded: then each runs its own share and waits in hvd.join).
    per_rank = sharding.records_per_rank(split.counts, size)
    steps = math.ceil((max(per_rank) if pad else per_rank[rank]) / batch_size)
    ds = ds.repeat()
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed + rank, reshuffle_each_iteration=True)
    ds = (ds.map(_decode(split.image_shape), num_parallel_calls=tf.data.AUTOTUNE)
          .batch(batch_size, drop_remainder=True)
          .prefetch(tf.data.AUTOTUNE))
    return TrainStream(ds, steps, steps * batch_size)


def eval_dataset(split: Split, *, rank: int, size: int, batch_size: int) -> tf.data.Dataset:
    """This rank's disjoint share of the eval set, unpadded: together the ranks see every eval
    sample exactly once, so summed counts give the exact accuracy."""
    if isinstance(split, Arrays):
        own = sharding.shard_indices(len(split), rank, size)
        ds = tf.data.Dataset.from_tensor_slices((split.x[own], split.y[own]))
    else:
        ds = (tf.data.TFRecordDataset(list(split.files)).shard(size, rank)
              .map(_decode(split.image_shape), num_parallel_calls=tf.data.AUTOTUNE))
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)

"""TFRecord files in the MNIST layout (``image_raw`` bytes + int64 ``label`` per record):
finding and checking them, the sidecar ``hvdtrain data convert`` writes beside its shards, and
a rank's stream of records whose order is a function of (seed, epoch, rank)."""
from __future__ import annotations

import glob
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from hvdtrain.data import sharding
from hvdtrain.errors import UserError
from hvdtrain.data.tfdata import (TrainStream, carrying_ids, gathered_train, keeps_in_memory,
                                  observed, shard_log, with_thread_budget)

FEATURES = {"image_raw": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
SIDECAR = "hvdtrain-data.json"


@dataclass(frozen=True)
class Records:
    """A split in TFRecord files, with the number of records in each file."""
    files: tuple[str, ...]
    counts: tuple[int, ...]
    image_shape: tuple[int, ...]
    cache: str = "off"           # data.cache: on, off, auto (tfdata.keeps_in_memory)

    def __len__(self) -> int:
        return sum(self.counts)


def read_sidecar(folder: str) -> dict | None:
    """The description ``hvdtrain data convert`` writes beside its shards, or None."""
    path = Path(folder) / SIDECAR
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        return {**meta, "image_shape": tuple(meta["image_shape"]),
                "class_names": tuple(meta["class_names"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a readable hvdtrain sidecar ({e}): convert again, or "
                        f"delete it and pass data.image_shape and data.num_classes") from None


def resolve_files(spec: str) -> list[str]:
    """A file, a directory (its files), a glob, or a comma-separated list of these."""
    files: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if os.path.isdir(part):
            found = sorted(str(p) for p in Path(part).iterdir()
                           if p.is_file() and p.name != SIDECAR)
        elif any(c in part for c in "*?["):
            found = sorted(glob.glob(part))
        else:
            found = [part] if os.path.exists(part) else []
        if not found:
            raise UserError(f"no data files at {part}: check data.path / data.eval_path")
        files.extend(found)
    return files


def check_labels(y: np.ndarray, num_classes: int, path: str) -> None:
    """UserError naming ``path`` unless every label in ``y`` is in 0..num_classes-1."""
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= num_classes:
        raise UserError(f"{path}: labels range over {low}..{high} but data.num_classes="
                        f"{num_classes} allows 0..{num_classes - 1}: fix the labels or pass "
                        f"--set data.num_classes={max(high + 1, 2)}")


def scan(spec: str, image_shape: tuple[int, ...], num_classes: int | None, *,
         shape_from: str = "data.image_shape",
         shape_fix: str = "pass the shape of the stored images", cache: str = "off") -> Records:
    """Counts the records of every file and checks each one parses, with the right image size
    and labels in range (``num_classes``; None: any label), so that a bad file stops the run
    before training, on every rank. ``shape_from`` and ``shape_fix``: where a wrong size's
    message says the shape came from, and what to do."""
    want_bytes = math.prod(image_shape)
    counts = []
    files = resolve_files(spec)
    for path in files:
        if not os.access(path, os.R_OK):
            raise UserError(f"data file {path} is not readable (permission denied)")
        lengths, labels = _lengths_and_labels(path)
        if len(labels) == 0:
            raise UserError(f"{path} holds no records")
        if np.any(lengths != want_bytes):
            got = int(lengths[lengths != want_bytes][0])
            raise UserError(f"{path}: an image holds {got} bytes but {shape_from}="
                            f"{','.join(map(str, image_shape))} needs {want_bytes}: "
                            f"{shape_fix}")
        if num_classes is not None:
            check_labels(labels, num_classes, path)
        counts.append(len(labels))
    return Records(tuple(files), tuple(counts), tuple(image_shape), cache)


def _lengths_and_labels(path: str) -> tuple[np.ndarray, np.ndarray]:
    stats = tf.data.TFRecordDataset(path).map(
        lambda r: tf.io.parse_single_example(r, FEATURES)).map(
        lambda f: (tf.strings.length(f["image_raw"]), f["label"]))
    lengths, labels = [], []
    try:
        for length, label in stats.batch(4096).as_numpy_iterator():
            lengths.append(length)
            labels.append(label)
    except tf.errors.DataLossError as e:
        where = re.search(r"(truncated|corrupted) record at \d+", e.message)
        raise UserError(f"{path} is not a valid TFRecord file"
                        f" ({where.group(0) if where else 'truncated or corrupted'}): "
                        f"rewrite it, or leave it out of the data path") from None
    except tf.errors.InvalidArgumentError:
        raise UserError(f"{path}: records must hold 'image_raw' (bytes) and 'label' "
                        f"(int64) features") from None
    if not labels:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    return np.concatenate(lengths), np.concatenate(labels)


def batch_decoder(image_shape: tuple[int, ...]):
    """A batch of serialized records -> (float32 images [n, *image_shape] in [0, 1], int32
    labels), parsed in one op: record by record, parsing cost more than a small model's step
    (hvdtrain bench input)."""
    def decode(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        features = tf.io.parse_example(batch, FEATURES)
        pixels = tf.io.decode_raw(features["image_raw"], tf.uint8)  # equal lengths: see scan
        images = tf.reshape(tf.cast(pixels, tf.float32) / 255.0, (-1, *image_shape))
        return images, tf.cast(features["label"], tf.int32)
    return decode


def decoder(image_shape: tuple[int, ...]):
    """A serialized record -> (float32 image in [0, 1] of ``image_shape``, int32 label)."""
    decode_batch = batch_decoder(image_shape)

    def decode(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images, labels = decode_batch(record[None])
        return images[0], labels[0]
    return decode


def named_records(path: tf.Tensor) -> tf.data.Dataset:
    """The records of one file with their ids beside them, FILE:INDEX (the shard log)."""
    return tf.data.TFRecordDataset(path).enumerate().map(
        lambda i, record: (record, tf.strings.join([path, tf.strings.as_string(i)], ":")))


def _own_records(split: Records, rank: int, size: int, named: bool = False) -> tuple[
        list[str] | None, tf.data.Dataset]:
    """This rank's files (None when there are fewer files than ranks) and its records in file
    order: whole files per rank, or else every size-th record of all files; ``named``: each
    with its id beside it."""
    own_files = sharding.shard_files(list(split.files), rank, size)
    files = list(split.files) if own_files is None else own_files
    ds = (tf.data.Dataset.from_tensor_slices(files).flat_map(named_records) if named
          else tf.data.TFRecordDataset(files))
    return own_files, ds if own_files is not None else ds.shard(size, rank)


def train_stream(split: Records, rank: int, size: int, batch_size: int, first_epoch: int,
                 epochs: int, seed: int, shuffle: bool, shuffle_buffer: int,
                 pad: bool) -> TrainStream:
    """This rank's batches, epoch by epoch, each epoch exactly its steps of full batches (a
    rank wraps around its share). The order is a function of (seed, epoch, rank), so a resumed
    run replays the epochs an uninterrupted one ran."""
    # Ranks with fewer records wrap around their own share, so every rank runs the steps of the
    # largest share and none waits in an all-reduce that its peers never join (unless not
    # padded: then each runs its own share and waits in hvd.join).
    per_rank = sharding.records_per_rank(split.counts, size)
    steps = math.ceil((max(per_rank) if pad else per_rank[rank]) / batch_size)
    if keeps_in_memory(split.cache, per_rank[rank], split.image_shape):
        orders = sharding.orders_of(np.arange(per_rank[rank]), steps * batch_size, rank,
                                    first_epoch, epochs, seed, shuffle)
        return _kept_stream(split, rank, size, batch_size, orders)
    return _streamed(split, rank, size, batch_size, steps,
                     sharding.epoch_seeds(seed, rank, first_epoch, epochs),
                     shuffle_buffer if shuffle else 0)


def _kept_stream(split: Records, rank: int, size: int, batch_size: int,
                 orders: np.ndarray) -> TrainStream:
    """data.cache: the rank's records decoded once into memory, each epoch gathered by its row
    of ``orders`` (positions among the rank's records, the array rule)."""
    named = shard_log() is not None
    x, y, ids = _decoded_all(_own_records(split, rank, size, named)[1], split.image_shape,
                             named)
    return gathered_train(x, y, orders, batch_size, ids=lambda: ids)


def _streamed(split: Records, rank: int, size: int, batch_size: int, steps: int,
              epoch_seeds: np.ndarray, shuffle_buffer: int) -> TrainStream:
    """The rank's records read from the files every epoch: its files in an order shuffled by
    the epoch's seed, then its records through a shuffle buffer (0: neither shuffle)."""
    folder = shard_log()
    own_files, own = _own_records(split, rank, size, named=folder is not None)

    def one_epoch(epoch_seed: tf.Tensor) -> tf.data.Dataset:
        ds = own
        if own_files is not None:
            files = tf.data.Dataset.from_tensor_slices(own_files)
            if shuffle_buffer:
                files = files.shuffle(len(own_files), seed=epoch_seed)
            # Sequential (no num_parallel_calls): the same order, and on a rank's one or two
            # cores faster than a parallel interleave's threads (hvdtrain bench input).
            ds = files.interleave(named_records if folder else tf.data.TFRecordDataset,
                                  cycle_length=min(4, len(own_files)))
        if shuffle_buffer:
            ds = ds.shuffle(shuffle_buffer, seed=epoch_seed)
        return ds.repeat().take(steps * batch_size)   # each epoch exactly its steps

    decode = batch_decoder(split.image_shape)
    ds = (tf.data.Dataset.from_tensor_slices(epoch_seeds).flat_map(one_epoch)
          .batch(batch_size, drop_remainder=True)
          .map(carrying_ids(decode) if folder else decode,
               num_parallel_calls=tf.data.AUTOTUNE))
    ds = (observed(ds, steps, folder) if folder else ds).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    # The same order, about twice the records per second on one thread (measured): fused, the
    # shuffle then repeat of each epoch is the slower of the two.
    options.experimental_optimization.shuffle_and_repeat_fusion = False
    return TrainStream(with_thread_budget(ds.with_options(options)), steps, steps * batch_size)


def _decoded_all(records: tf.data.Dataset, image_shape: tuple[int, ...],
                 named: bool = False) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``records`` decoded: float32 images [n, *image_shape], int32 labels [n], and
    (``named``: records with their ids beside them) their ids."""
    decode = batch_decoder(image_shape)
    chunks = list(with_thread_budget(records.batch(4096).map(
        carrying_ids(decode) if named else decode)).as_numpy_iterator())
    if not chunks:
        return np.zeros((0, *image_shape), np.float32), np.zeros(0, np.int32), []
    ids = [i.decode() for c in chunks for i in c[2]] if named else []
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks]), ids


def eval_records(split: Records, rank: int, size: int) -> tf.data.Dataset:
    """This rank's disjoint share of the records, in file order, decoded (kept when cached)."""
    ds = (tf.data.TFRecordDataset(list(split.files)).shard(size, rank)
          .map(decoder(split.image_shape), num_parallel_calls=tf.data.AUTOTUNE))
    share = len(sharding.shard_indices(len(split), rank, size))
    return ds.cache() if keeps_in_memory(split.cache, share, split.image_shape) else ds

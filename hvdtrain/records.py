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

from hvdtrain import sharding
from hvdtrain.errors import UserError
from hvdtrain.tfdata import TrainStream, with_thread_budget

FEATURES = {"image_raw": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
SIDECAR = "hvdtrain-data.json"


@dataclass(frozen=True)
class Records:
    """A split in TFRecord files, with the number of records in each file."""
    files: tuple[str, ...]
    counts: tuple[int, ...]
    image_shape: tuple[int, ...]

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
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= num_classes:
        raise UserError(f"{path}: labels range over {low}..{high} but data.num_classes="
                        f"{num_classes} allows 0..{num_classes - 1}: fix the labels or pass "
                        f"--set data.num_classes={max(high + 1, 2)}")


def scan(spec: str, image_shape: tuple[int, ...], num_classes: int | None, *,
         shape_from: str = "data.image_shape",
         shape_fix: str = "pass the shape of the stored images") -> Records:
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
    return Records(tuple(files), tuple(counts), tuple(image_shape))


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


def train_stream(split: Records, rank: int, size: int, batch_size: int, first_epoch: int,
                 epochs: int, seed: int, shuffle: bool, shuffle_buffer: int,
                 pad: bool) -> TrainStream:
    """This rank's batches, epoch by epoch: every shuffle of an epoch is seeded by (seed, epoch,
    rank) and the interleave is deterministic, so a resumed run replays the epochs an
    uninterrupted one ran."""
    own_files = sharding.shard_files(list(split.files), rank, size)
    # Ranks with fewer records wrap around their own shard, so every rank runs the steps of the
    # largest shard and none waits in an all-reduce that its peers never join (unless not
    # padded: then each runs its own share and waits in hvd.join).
    per_rank = sharding.records_per_rank(split.counts, size)
    steps = math.ceil((max(per_rank) if pad else per_rank[rank]) / batch_size)

    def one_epoch(epoch_seed: tf.Tensor) -> tf.data.Dataset:
        if own_files is not None:  # whole files per rank: no rank reads another's records
            files = tf.data.Dataset.from_tensor_slices(own_files)
            if shuffle:
                files = files.shuffle(len(own_files), seed=epoch_seed)
            ds = files.interleave(tf.data.TFRecordDataset, cycle_length=min(4, len(own_files)),
                                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:  # fewer files than ranks: every rank reads all files, keeps every size-th record
            ds = tf.data.TFRecordDataset(list(split.files)).shard(size, rank)
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=epoch_seed)
        return ds.repeat().take(steps * batch_size)   # each epoch exactly its steps

    seeds = sharding.epoch_seeds(seed, rank, first_epoch, epochs)
    ds = (tf.data.Dataset.from_tensor_slices(seeds).flat_map(one_epoch)
          .batch(batch_size, drop_remainder=True)
          .map(batch_decoder(split.image_shape), num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))
    options = tf.data.Options()
    # The same order, about twice the records per second on one thread (measured): fused, the
    # shuffle then repeat of each epoch is the slower of the two.
    options.experimental_optimization.shuffle_and_repeat_fusion = False
    return TrainStream(with_thread_budget(ds.with_options(options)), steps, steps * batch_size)


def eval_records(split: Records, rank: int, size: int) -> tf.data.Dataset:
    """This rank's disjoint share of the records, in file order, decoded."""
    return (tf.data.TFRecordDataset(list(split.files)).shard(size, rank)
            .map(decoder(split.image_shape), num_parallel_calls=tf.data.AUTOTUNE))

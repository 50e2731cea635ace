"""``hvdtrain data convert SRC DST``: an image folder or an ``.npz`` file to TFRecord shards in
the layout the tfrecord source reads, with a sidecar (``records.SIDECAR``) so that training on
DST needs no other flag.

The source is read by the training source itself (``sources.load``), so the classes, the checks
and the eval hold-out are those of training on SRC with the same seed and fraction. Every shard is
written under a ``.partial`` name inside ``DST.partial-PID`` and renamed when complete; the
folder becomes DST last. A conversion killed half-way leaves no DST and no shard that looks
complete; an existing DST is refused, never touched.

    DST/train-00000-of-00004.tfrecord ... DST/eval-00000-of-00004.tfrecord
    DST/hvdtrain-data.json     image_shape, class_names, the files and their counts
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from hvdtrain import files
from hvdtrain.data import image_decoding, images, records, sources
from hvdtrain.config import DataConfig
from hvdtrain.errors import UserError
from hvdtrain.progress import Progress


def _uint8(x: np.ndarray, where: str) -> np.ndarray:
    """[0, 1] floats as the bytes the record layout stores (value * 255, rounded)."""
    if x.size and (x.min() < 0.0 or x.max() > 1.0):
        raise UserError(f"{where}: x ranges over {x.min():g}..{x.max():g} but TFRecord shards "
                        f"store bytes: save x as uint8 (0..255) or as floats in 0..1")
    return np.rint(x * 255.0).astype(np.uint8)


def _samples(split: sources.Split, order: np.ndarray,
             where: str) -> Iterator[tuple[np.ndarray, int]]:
    """(uint8 image, label) for the samples of ``split`` at ``order``, in that order."""
    if isinstance(split, sources.Arrays):
        pixels = _uint8(split.x[order], where)
        yield from zip(pixels, split.y[order].tolist())
        return
    assert isinstance(split, images.ImageFiles)  # convert reads .npz files and image folders
    paths = [split.paths[i] for i in order]
    # Decoded in parallel, in order: a failure surfaces at the position of its file.
    stream = image_decoding.decoded(paths, split.image_shape).as_numpy_iterator()
    for path, label in zip(paths, split.labels[order].tolist()):
        try:
            image = next(stream)
        except tf.errors.OpError:
            raise UserError(f"image {path} cannot be decoded (truncated or corrupt): replace "
                            f"or remove it, then convert again") from None
        yield _uint8(image, path), label


def _example(image: np.ndarray, label: int) -> bytes:
    feature = {"image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(
                   value=[image.tobytes()])),
               "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_split(name: str, split: sources.Split, shards: int, folder: Path, seed: int,
                 progress: Progress, where: str) -> tuple[list[str], list[int]]:
    """The split in min(shards, samples) files, its samples drawn in one seeded shuffle so that
    every file holds a mix of the classes. Returns the file names and their counts."""
    order = np.random.default_rng([seed, 2]).permutation(len(split))
    count = min(shards, len(split))
    names, counts = [], []
    for k in range(count):
        final = folder / f"{name}-{k:05d}-of-{count:05d}.tfrecord"
        partial = final.with_name(final.name + ".partial")
        mine = order[k::count]
        with tf.io.TFRecordWriter(str(partial)) as writer:
            for image, label in _samples(split, mine, where):
                writer.write(_example(image, label))
                progress.advance()
        os.rename(partial, final)   # complete: only now does it look like a shard
        names.append(final.name)
        counts.append(len(mine))
    return names, counts


def source_config(src: str, *, image_shape: tuple[int, ...] | None, eval_path: str,
                  eval_fraction: float) -> DataConfig:
    """The data config that trains on SRC directly: images for a folder, npz for a file."""
    if os.path.isdir(src):
        if not image_shape:
            raise UserError(f"{src} is an image folder: pass --image-shape HEIGHT,WIDTH,"
                            f"CHANNELS (every image is resized to it, e.g. 28,28,1)")
        return DataConfig(source="images", path=src, eval_path=eval_path,
                          eval_fraction=eval_fraction, image_shape=image_shape)
    if not os.path.exists(src):
        raise UserError(f"{src} does not exist: pass an image folder (one sub-folder per "
                        f"class) or an .npz file with arrays x and y")
    return DataConfig(source="npz", path=src, eval_path=eval_path, eval_fraction=eval_fraction,
                      num_classes=0)


def _refuse_existing(dst: Path) -> None:
    if os.path.lexists(dst):
        raise UserError(f"{dst} already exists: 'hvdtrain data convert' never overwrites; "
                        f"choose another DST or remove it first")


def convert(src: str, dst: str, *, shards: int = 4, image_shape: tuple[int, ...] | None = None,
            eval_path: str = "", eval_fraction: float = 0.2, seed: int = 42,
            progress: Callable[[int], Progress] = Progress) -> dict:
    """Writes DST and returns its sidecar. ``progress(total)`` makes the progress reporter."""
    target = Path(dst)
    _refuse_existing(target)
    if shards < 1:
        raise UserError(f"--shards must be >= 1, got {shards}")
    cfg = source_config(src, image_shape=image_shape, eval_path=eval_path,
                        eval_fraction=eval_fraction)
    dataset = sources.load(cfg, seed)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    try:
        partial.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"cannot create {partial}: {e.strerror}: choose another DST") from None
    try:
        meta = _write(dataset, partial, shards, seed, progress, cfg)
        _refuse_existing(target)   # created by someone else meanwhile: theirs stays
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)   # nothing half-written stays behind
        raise
    return meta


def _write(dataset: sources.DataSet, folder: Path, shards: int, seed: int,
           progress: Callable[[int], Progress], cfg: DataConfig) -> dict:
    report = progress(len(dataset.train) + len(dataset.eval))
    train_files, train_counts = _write_split("train", dataset.train, shards, folder, seed,
                                             report, cfg.path)
    eval_files, eval_counts = _write_split("eval", dataset.eval, shards, folder, seed, report,
                                           cfg.eval_path or cfg.path)
    meta = {"format": "hvdtrain-tfrecord", "source": os.path.abspath(cfg.path),
            "image_shape": list(dataset.input_shape), "class_names": dataset.names(),
            "train_files": train_files, "train_counts": train_counts,
            "eval_files": eval_files, "eval_counts": eval_counts}
    files.write_json_atomic(folder / records.SIDECAR, meta)
    return meta

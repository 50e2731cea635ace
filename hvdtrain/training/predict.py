"""``hvdtrain predict --run-dir RUN [INPUT]``: a trained model over new inputs, on any number of
ranks, into one CSV of input, predicted class name and its probability, in input order.

    hvdtrain predict --run-dir runs/photos new-photos/                      # one process
    mpirun -np 4 hvdtrain predict --run-dir runs/photos new-photos/ --out new.csv

The model is RUN/model (the export, read by ``dist.load_model``), or else the latest checkpoint
in a model rebuilt from RUN/config.json; the class names come from its classes.json. INPUT is
read by ``predict_inputs``. Each rank scores inputs r, r+N, r+2N, ... (the eval sharding), rank
0 gathers the scores, puts them back in input order and writes the CSV (under a temporary name,
then renamed); an existing file is refused unless --overwrite.
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf

from hvdtrain.models import registry
from hvdtrain.training import checkpoints
from hvdtrain.data import image_decoding, images, predict_inputs, sharding, sources
from hvdtrain import distributed as dist, files
from hvdtrain.config import Config
from hvdtrain.errors import UserError
from hvdtrain.progress import Progress
from hvdtrain.training.rundir import CLASSES_FILE

DEFAULT_OUT = "predictions.csv"
HEADER = ("input", "class", "probability")


@dataclass(frozen=True)
class Request:
    """What to predict and where to write it, checked before Horovod starts."""
    run_dir: Path
    model_dir: Path | None      # RUN/model, or None: the latest checkpoint
    checkpoint: Path | None
    input: str                  # empty: the run's own eval set
    out: Path
    overwrite: bool
    batch_size: int


def request(run_dir: str, input_spec: str, out: str | None, *, overwrite: bool,
            batch_size: int) -> Request:
    """The file checks every rank makes alike before Horovod starts (the run directory and
    INPUT must be visible on every host, as training data is)."""
    folder = Path(run_dir)
    model_dir = folder / "model"   # renamed into place when complete (rundir.export)
    latest = checkpoints.latest(folder)
    if not model_dir.is_dir() and not latest:
        raise UserError(f"{folder} holds no exported model (model/) and no checkpoint: train "
                        f"first, or pass the --run-dir of a trained run")
    if input_spec and not any(c in input_spec for c in "*?[,") and not os.path.exists(
            input_spec):
        raise UserError(f"input {input_spec} does not exist: pass a folder of images, an .npz "
                        f"file or TFRecord files")
    target = Path(out) if out else folder / DEFAULT_OUT
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    check_output(target, overwrite)
    return Request(folder, model_dir if model_dir.is_dir() else None,
                   latest[1] if latest and not model_dir.is_dir() else None, input_spec, target,
                   overwrite, batch_size)


def check_output(path: Path, overwrite: bool) -> None:
    """UserError unless ``path`` can take the CSV: not a folder, not an existing file (unless
    ``overwrite``), in a writable folder."""
    if path.is_dir():
        raise UserError(f"--out {path} is a folder: pass a file name such as {path}/"
                        f"{DEFAULT_OUT}")
    if path.exists() and not overwrite:
        raise UserError(f"{path} already exists: pass --overwrite to replace it, or --out "
                        f"another file")
    parent = path.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UserError(f"cannot write {path}: its folder {parent} does not exist or is not "
                        f"writable")


# ---------------------------------------------------------------------------------------------
# The model and its classes

def class_names(folder: Path) -> list[str] | None:
    """The class names training saved in ``folder`` (a run directory), or None if it saved none;
    UserError if the file is unreadable."""
    path = folder / CLASSES_FILE
    if not path.is_file():
        return None
    try:
        return [str(n) for n in json.loads(path.read_text())["class_names"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a readable class list ({e}): restore it, or delete it "
                        f"to name the classes by their ids") from None


def load_model(req: Request, config: Config) -> tuple[tf.keras.Model, list[str]]:
    """The model to predict with, and its class names in class-id order."""
    if req.model_dir:
        names = class_names(req.model_dir)
        try:
            model = dist.load_model(req.model_dir)
        except (OSError, ValueError, ImportError, tf.errors.OpError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"cannot load the model in {req.model_dir} ({first}): move it "
                            f"away to predict with the latest checkpoint") from None
    else:
        names = class_names(req.run_dir) or sources.load(config.data, config.train.seed).names()
        tf.keras.mixed_precision.set_global_policy(config.train.precision)
        model = registry.build(config.model, sources.input_shape(config.data), len(names))
        assert req.checkpoint is not None  # request(): no model/ means a checkpoint
        checkpoints.restore_weights(model, req.checkpoint)
    outputs = int(model.outputs[0].shape[-1])
    names = names or [str(i) for i in range(outputs)]
    if len(names) != outputs:
        raise UserError(f"the model has {outputs} outputs but its {CLASSES_FILE} names "
                        f"{len(names)} classes: restore the file the run wrote")
    return model, names


def input_shape(model: tf.keras.Model) -> tuple[int, ...]:
    """The input shape of ``model`` without the batch dimension; UserError if any dimension is
    not fixed."""
    shape = tuple(model.inputs[0].shape[1:])
    if None in shape:
        raise UserError(f"the model takes inputs of shape {shape}: hvdtrain predict needs a "
                        f"fixed input shape")
    return tuple(int(d) for d in shape)


# ---------------------------------------------------------------------------------------------
# Scoring, gathering, writing

def score_shard(model: tf.keras.Model, split: sources.Split, rank: int, size: int,
                batch_size: int, progress: Progress | None = None,
                batches: list[int] | None = None) -> np.ndarray:
    """[class id, probability] of each of this rank's inputs (r, r+N, ...), in order; the size
    of each batch scored appended to ``batches``."""
    @tf.function(reduce_retracing=True)
    def probabilities(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(tf.cast(model(x, training=False), tf.float32))

    rows = [np.zeros((0, 2))]
    for x, _ in sources.eval_dataset(split, rank=rank, size=size, batch_size=batch_size):
        p = probabilities(x).numpy()
        rows.append(np.stack([p.argmax(axis=1), p.max(axis=1)], axis=1))
        if progress:
            progress.advance(len(p))
        if batches is not None:
            batches.append(len(p))
    return np.concatenate(rows)


def in_input_order(per_rank: Sequence[np.ndarray]) -> np.ndarray:
    """Rank r's rows are inputs r, r+N, r+2N, ...: the rows of every rank, back in order."""
    size = len(per_rank)
    total = sum(len(rows) for rows in per_rank)
    out = np.empty((total, *per_rank[0].shape[1:]), per_rank[0].dtype)
    for rank, rows in enumerate(per_rank):
        if len(rows) != len(sharding.shard_indices(total, rank, size)):
            raise ValueError(f"rank {rank} scored {len(rows)} of {total} inputs, not its share")
        out[rank::size] = rows
    return out


def write_csv(path: Path, names: Sequence[str], classes: Sequence[str], scores: np.ndarray,
              overwrite: bool) -> None:
    """The CSV, written under a temporary name and renamed: never a half-written file."""
    check_output(path, overwrite)  # again: another job may have written it meanwhile

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(HEADER)
            for name, (class_id, probability) in zip(names, scores):
                writer.writerow([name, classes[int(class_id)], f"{probability:.6f}"])

    try:
        files.written_whole(path, write)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror}") from None


def run(req: Request, config: Config, world: dist.World) -> None:
    """Every rank: load and check (all stop together on a problem), score its shard; rank 0
    gathers and writes."""
    problem, model, inputs = None, None, None
    names: list[str] = []
    try:
        model, names = load_model(req, config)
        inputs = predict_inputs.read(req.input, input_shape(model), config)
        if isinstance(inputs.split, images.ImageFiles):  # a corrupt file named before scoring
            own = sharding.shard_indices(len(inputs), world.rank, world.size)
            image_decoding.check_decodable([inputs.split.paths[i] for i in own],
                                           inputs.split.image_shape[-1])
    except UserError as e:
        problem = str(e)
    dist.agree_or_fail(problem, world)  # Horovod: all ranks stop together, or none does
    assert inputs is not None  # read: no rank had a problem
    share = len(sharding.shard_indices(len(inputs), world.rank, world.size))
    label = f"predicting (rank 0 of {world.size})" if world.size > 1 else "predicting"
    progress = Progress(share, label=label) if world.is_chief and share else None
    batches: list[int] = []
    scores = score_shard(model, inputs.split, world.rank, world.size, req.batch_size, progress,
                         batches)
    # Horovod: every rank's scores, in rank order, for rank 0 to put back in input order.
    everyone = dist.allgather_object(scores)
    dist.rank0_then_all(  # Horovod: a failed write stops every rank with rank 0's error
        lambda: write_csv(req.out, inputs.names, names, in_input_order(everyone),
                          req.overwrite), world)
    if world.is_chief:
        print(f"wrote {req.out}: {len(inputs)} predictions over {len(names)} classes, of "
              f"{req.input or 'the eval set of ' + str(req.run_dir)} (rank 0: {len(batches)} "
              f"batch{'es' if len(batches) != 1 else ''}, the largest of "
              f"{max(batches, default=0)})", flush=True)

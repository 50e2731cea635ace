"""The run directory's policy: where a run lives, when it may be opened, and what rank 0 writes
at the end besides the checkpoints (``checkpoints.py``): the exported model.

    RUN_DIR/config.json     the config the run started with (never rewritten)
    RUN_DIR/config.resume-NNNN.json   the config of a --resume after epoch NNNN
    RUN_DIR/classes.json    the class names, in class-id order (for ``hvdtrain predict``)
    RUN_DIR/checkpoints/    one checkpoint per epoch (checkpoints.py)
    RUN_DIR/metrics.jsonl   one line per epoch (callbacks.MetricsLog)
    RUN_DIR/summary.json    written when training ends (report.summary)
    RUN_DIR/model/          the trained model (export), with its classes.json

Rank 0 alone calls these; ``dist.rank0_then_all`` hands its answer (or error) to every rank.
"""
from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import tensorflow as tf

from hvdtrain import files
from hvdtrain.training import checkpoints
from hvdtrain import distributed as dist
from hvdtrain.config import Config, to_dict
from hvdtrain.errors import UserError


def default_run_dir(config: Config) -> str:
    """The configured run directory, or runs/PRESET-YYYYmmdd-HHMMSS when none is set."""
    if config.run.run_dir:
        return config.run.run_dir
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{config.preset}-{stamp}")


CLASSES_FILE = "classes.json"
CONFIG_FILE = "config.json"


def resume_config_file(epochs_done: int) -> str:
    """Where a --resume after ``epochs_done`` epochs records its config: config.json keeps the
    config the run started with, so a resume with changed settings does not erase it."""
    return f"config.resume-{epochs_done:04d}.json"


def save_class_names(folder: Path, class_names: Sequence[str]) -> None:
    """Writes ``class_names`` to FOLDER/classes.json (atomically), where predict reads them."""
    files.write_json_atomic(folder / CLASSES_FILE, {"class_names": list(class_names)})


def open_run_dir(run_dir: Path, checkpoint: tf.train.Checkpoint, config: Config, *,
                 resume: bool, say: Callable[[str], None],
                 class_names: Sequence[str] = ()) -> tuple[int, dict]:
    """Refuses to overwrite an earlier run, makes the run directory owner-only (unless
    run.private is false), restores the latest checkpoint when resuming, and writes the config
    (a resume's beside the first) and the class names. Returns (epochs already done, their
    last metrics)."""
    found = checkpoints.latest(run_dir)
    if found and not resume:
        raise UserError(f"{run_dir} already holds a run (checkpoint after epoch {found[0]}): "
                        f"pass --resume to continue it, or choose another --run-dir")
    if (run_dir / "summary.json").exists() and not resume:
        raise UserError(f"{run_dir} already holds a finished run: choose another --run-dir")
    if config.run.private:
        # From here on rank 0, the one writer, creates files owner-only: the checkpoints, logs
        # and model hold the user's model and data, which a umask of 022 lets anyone read.
        os.umask(0o077)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create run dir {run_dir}: {e.strerror}") from None
    if not os.access(run_dir, os.W_OK):
        raise UserError(f"run dir {run_dir} is not writable: choose another --run-dir")
    if config.run.private and run_dir.stat().st_mode & 0o077:
        try:  # also a directory made before: by the user, or by a run with run.private=false
            run_dir.chmod(0o700)
        except OSError as e:
            raise UserError(f"cannot make run dir {run_dir} owner-only: {e.strerror}: pass "
                            f"--set run.private=false to keep its permissions") from None
    start_epoch, restored = 0, {}
    if found:
        checkpoints.restore(checkpoint, found[1])
        start_epoch = found[0]
        restored = checkpoints.read_meta(found[1]).get("metrics", {})
        say(f"resuming {run_dir} after epoch {start_epoch} from {found[1].name}")
    elif resume:
        say(f"no checkpoint in {run_dir} yet: starting at epoch 1")
    config_file = run_dir / CONFIG_FILE
    if resume and config_file.exists():
        config_file = run_dir / resume_config_file(start_epoch)
    files.write_json_atomic(config_file, to_dict(config))
    if class_names:
        save_class_names(run_dir, class_names)
    return start_epoch, restored


def export(model: tf.keras.Model, run_dir: Path, *, class_names: Sequence[str] = ()) -> Path:
    """The trained model in RUN_DIR/model (in the format this Keras loads), with its class
    names beside it, swapped in atomically."""
    final = run_dir / "model"
    tmp = run_dir / f".model.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    dist.save_model(model, tmp)
    if class_names:
        save_class_names(tmp, class_names)  # travels with the model
    if final.exists():
        old = run_dir / f".model.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    return final

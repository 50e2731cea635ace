"""Per-epoch checkpoints in RUN_DIR/checkpoints/epoch-NNNN, written atomically.

A checkpoint is first written to a hidden temporary directory and then renamed into place;
a rename is atomic on POSIX file systems, so a crash mid-write never leaves a half checkpoint
where ``latest`` would find it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import tensorflow as tf

from hvdtrain.errors import UserError
from hvdtrain.files import write_json as _write_json  # a name the fault tests replace

SUBDIR = "checkpoints"
_NAME = re.compile(r"^epoch-(\d{4,})$")


def directory(run_dir: str | Path) -> Path:
    """RUN_DIR/checkpoints, where every checkpoint of a run goes."""
    return Path(run_dir) / SUBDIR


def completed(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(epochs done, path) of every complete checkpoint, oldest first."""
    root = directory(run_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _NAME.match(entry.name)
        if match and (entry / "meta.json").is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest(run_dir: str | Path) -> tuple[int, Path] | None:
    """(epochs done, path) of the newest complete checkpoint, or None if there is none."""
    done = completed(run_dir)
    return done[-1] if done else None


class WriteFailed(UserError):
    """A checkpoint could not be written (disk full, directory read-only)."""


def save(checkpoint: tf.train.Checkpoint, run_dir: str | Path, epochs_done: int,
         meta: dict, keep: int) -> Path:
    """Writes ``checkpoint`` and its meta.json (``epochs_done`` and ``meta``) as
    RUN_DIR/checkpoints/epoch-NNNN, atomically: under a temporary name, renamed when complete;
    keeps the newest ``keep``. Returns its path; WriteFailed (the earlier ones intact) if it
    cannot be written."""
    root = directory(run_dir)
    final = root / f"epoch-{epochs_done:04d}"
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_unfinished(root)
        checkpoint.write(str(tmp / "ckpt"))
        _write_json(tmp / "meta.json", {"epochs_done": epochs_done, **meta})
    except (OSError, tf.errors.OpError) as e:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-written one behind
        reason = getattr(e, "strerror", None) or getattr(e, "message", "") or str(e)
        raise WriteFailed(f"cannot write checkpoint {final}: {reason.strip().splitlines()[0]}; "
                          f"the earlier checkpoints are intact: free space or fix the "
                          f"permissions, then --resume") from None
    if final.exists():  # the same epoch trained again: the new one replaces it
        shutil.rmtree(final)
    os.rename(tmp, final)
    for _, old in completed(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _remove_unfinished(root: Path) -> None:
    """Deletes temporary directories left by a writer that died mid-write (rank 0 alone
    writes, so none of them is still being written)."""
    for entry in root.glob(".epoch-*.tmp-*"):
        shutil.rmtree(entry, ignore_errors=True)


def restore(checkpoint: tf.train.Checkpoint, path: Path) -> None:
    """Loads weights and optimizer state; a checkpoint of another model is a user error."""
    _read(checkpoint, path, "this model and optimizer", "resume with the config it was "
          "written with, or use a new run_dir")


def restore_weights(model: tf.keras.Model, path: Path) -> None:
    """Loads the model's weights alone (``hvdtrain predict``: no optimizer)."""
    status = _read(tf.train.Checkpoint(model=model), path, "the model of its run's "
                   "config.json", "was config.json changed after training?")
    status.expect_partial()  # the optimizer's slots are left in the file, on purpose


def _read(checkpoint: tf.train.Checkpoint, path: Path, what: str, fix: str):
    try:
        return checkpoint.read(str(path / "ckpt")).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"checkpoint {path} does not fit {what} ({first}): {fix}") from None


def read_meta(path: Path) -> dict:
    """The meta.json of the checkpoint folder ``path``, as a dict."""
    with open(path / "meta.json") as f:
        return json.load(f)

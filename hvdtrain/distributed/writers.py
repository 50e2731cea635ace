"""What Keras writes to disk, safe where every rank writes it.

Scripts save without ``if rank == 0`` (a plain ``model.save``, ``ModelCheckpoint`` or
``BackupAndRestore`` on every rank), and several ranks then write one path at once: two ranks'
bytes in one ``.keras`` zip (a corrupt file, found only when loading it) or an HDF5 lock
error. The ranks hold the same model, so any one rank's whole file is the right one:
``Model.save`` and ``Model.save_weights`` into a local ``.keras`` or ``.h5`` file write a file
of this rank's own beside the target and move it into place (``files.written_whole``), so the
path holds one rank's whole file, whoever writes last. A folder (Keras 2's SavedModel) or a
remote path is written as Keras writes it.

``TensorBoard`` on every rank would write one run per rank into the same folder: on ranks
other than 0 it does nothing, and rank 0's run (its metrics averaged over the ranks) is the
job's. ``BackupAndRestore`` on every rank with one folder makes it whoever comes first, writes it
whole as above, and at the end every rank removes the folder: one that another rank made or
removed first is there or gone, as asked, not an error.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import tensorflow as tf

# Horovod: which rank this process is (rank 0 writes the job's TensorBoard run).
import horovod.tensorflow as hvd

from hvdtrain import files

SUFFIXES = (".keras", ".h5")  # the files Keras writes in one piece (.weights.h5 among them)
WRAPPED = "hvdtrain_whole_file"


def write_safely() -> None:
    """Installs all three, once per process (``dist.init`` and ``hvd.init()`` do, at 2 ranks
    or more)."""
    model = tf.keras.Model
    for name in ("save", "save_weights"):
        method = getattr(model, name)
        if not getattr(method, WRAPPED, False):
            setattr(model, name, whole_file(method))
    board = tf.keras.callbacks.TensorBoard
    if not getattr(board.set_model, WRAPPED, False):
        board.set_model = rank_zero_board(board.set_model)
    backup = tf.keras.callbacks.BackupAndRestore
    if not getattr(backup.on_train_end, WRAPPED, False):
        backup.on_train_end = removed_by_any_rank(backup.on_train_end)
    save = getattr(backup, "_save_model", None)   # Keras 3's; Keras 2 saves another way
    if save is not None and not getattr(save, WRAPPED, False):
        backup._save_model = folder_made_by_any_rank(save)


def local_file(filepath: Any) -> Path | None:
    """``filepath`` as a local path Keras writes in one piece, or None."""
    if not isinstance(filepath, (str, os.PathLike)) or "://" in str(filepath):
        return None
    path = Path(filepath)
    return path if path.name.endswith(SUFFIXES) else None


def whole_file(method: Callable) -> Callable:
    """``method`` (Model.save or save_weights) writing its file whole, then moving it."""
    @functools.wraps(method)
    def save(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        path = local_file(filepath)
        if (path is None or args or kwargs.get("overwrite") is False
                or kwargs.get("zipped") is False):  # Keras 3's zipped=False: a folder
            return method(self, filepath, *args, **kwargs)  # as Keras writes it (or asks)
        # Named for the host and process, no Horovod: a save may follow Horovod's shutdown.
        return files.written_whole(path, lambda own: method(self, str(own), **kwargs))

    setattr(save, WRAPPED, True)
    return save


def rank_zero_board(set_model: Callable) -> Callable:
    """TensorBoard's ``set_model``; on ranks other than 0 it and every hook do nothing."""
    @functools.wraps(set_model)
    def set_on_rank_zero(self: Any, model: Any) -> None:
        if hvd.rank() == 0:  # Horovod: rank 0 writes the job's run
            set_model(self, model)
            return
        for name in dir(tf.keras.callbacks.Callback):
            if name.startswith("on_"):
                setattr(self, name, _nothing)

    setattr(set_on_rank_zero, WRAPPED, True)
    return set_on_rank_zero


def folder_made_by_any_rank(save_model: Callable) -> Callable:
    """Keras 3 BackupAndRestore's save, which makes its folder where it does not exist yet:
    two ranks may both find it missing, and the second one's makedirs would fail on the folder
    the first just made (FileExistsError). Here it is made first, whoever makes it."""
    @functools.wraps(save_model)
    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "://" not in str(self.backup_dir):
            os.makedirs(self.backup_dir, exist_ok=True)
        return save_model(self, *args, **kwargs)

    setattr(save, WRAPPED, True)
    return save


def removed_by_any_rank(on_train_end: Callable) -> Callable:
    """BackupAndRestore's ``on_train_end``, which removes its folder: where another rank
    removed a file of it first, the rest is removed, and the end goes on."""
    @functools.wraps(on_train_end)
    def end(self: Any, logs: dict | None = None) -> None:
        try:
            on_train_end(self, logs)
        except FileNotFoundError:
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    setattr(end, WRAPPED, True)
    return end


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None

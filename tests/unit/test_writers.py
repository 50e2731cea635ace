"""hvdtrain/distributed/writers.py and step_guard.py without a launcher: a model file written on
every rank goes through a file of the rank's own, moved into place whole; TensorBoard does
nothing on ranks other than 0; the line that names a variable with a gradient on some ranks
only. Across ranks (the same path saved on every rank, loads on every rank; one TensorBoard
run; a layer skipped on one rank; unknown-length data running out unequally; a backup folder
two ranks make at once): the cases
``save_every_rank``, ``layer_skipped_on_rank`` and ``unequal_batches_unknown_length`` that
tests/guarantees_worker.py runs (tests/guarantees_data.py, guarantees_apart.py)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from hvdtrain.distributed import step_guard, writers


def small_model() -> tf.keras.Model:
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_a_model_file_is_written_under_the_rank_s_own_name_then_moved_whole(tmp_path):
    seen: list[str] = []

    def save(model, filepath, **kwargs):
        seen.append(filepath)
        assert not (tmp_path / "model.weights.h5").exists()  # the target untouched meanwhile
        Path(filepath).write_bytes(b"whole")

    writers.whole_file(save)(small_model(), str(tmp_path / "model.weights.h5"))
    # Beside the target, hidden, ending as it ends (Keras picks the format by the ending).
    assert Path(seen[0]).parent == tmp_path and seen[0].endswith(".model.weights.h5")
    assert Path(seen[0]).name.startswith(".model.weights.h5.tmp-")
    assert seen[0] != str(tmp_path / "model.weights.h5")
    assert (tmp_path / "model.weights.h5").read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.weights.h5"]  # nothing left


def test_a_failed_save_leaves_the_old_file_and_no_stray_one(tmp_path):
    (tmp_path / "model.keras").write_bytes(b"old")

    def save(model, filepath, **kwargs):
        Path(filepath).write_bytes(b"half")
        raise OSError("disk full")

    try:
        writers.whole_file(save)(small_model(), tmp_path / "model.keras")
    except OSError:
        pass
    assert (tmp_path / "model.keras").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]


def test_folders_remote_paths_and_overwrite_false_are_written_as_keras_writes_them():
    assert writers.local_file("gs://bucket/model.keras") is None
    assert writers.local_file("saved_model_dir") is None           # Keras 2's SavedModel
    assert writers.local_file(Path("a/model.h5")) == Path("a/model.h5")
    calls = []
    writers.whole_file(lambda model, path, **kw: calls.append((path, kw)))(
        None, "m.keras", overwrite=False)
    assert calls == [("m.keras", {"overwrite": False})]  # Keras asks, or refuses, itself


def test_a_real_keras_save_through_the_wrapper_loads_back(tmp_path):
    model = small_model()
    save_weights = writers.whole_file(type(model).save_weights)
    save_weights(model, str(tmp_path / "m.weights.h5"))
    other = small_model()
    other.load_weights(str(tmp_path / "m.weights.h5"))
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), other.get_weights()))


def test_tensorboard_does_nothing_on_ranks_other_than_0(tmp_path, monkeypatch):
    monkeypatch.setattr(writers.hvd, "rank", lambda: 1)
    set_model = writers.rank_zero_board(tf.keras.callbacks.TensorBoard.set_model)
    board = tf.keras.callbacks.TensorBoard(str(tmp_path / "board"))
    set_model(board, small_model())
    board.on_train_begin()
    board.on_epoch_end(0, {"loss": 1.0})
    board.on_train_end()
    assert not (tmp_path / "board").exists()
    # Control: on rank 0 it writes its run.
    monkeypatch.setattr(writers.hvd, "rank", lambda: 0)
    board = tf.keras.callbacks.TensorBoard(str(tmp_path / "board"))
    set_model(board, small_model())
    board.on_train_begin()
    board.on_epoch_end(0, {"loss": 1.0})
    board.on_train_end()
    assert (tmp_path / "board").exists()


class Optimizer:
    pass


def test_the_variable_with_a_gradient_on_some_ranks_only_is_named(monkeypatch):
    variables = [tf.Variable([1.0], name=n) for n in ("first", "middle", "last")]
    mine, theirs = Optimizer(), Optimizer()
    step_guard.record_layout(mine, [1, 2, 3], variables)
    step_guard.record_layout(theirs, [1, None, 3], variables)
    model = type("Model", (), {"optimizer": mine})()
    gathered = [getattr(mine, step_guard.LAYOUT), getattr(theirs, step_guard.LAYOUT)]
    monkeypatch.setattr(step_guard.hvd, "allgather_object", lambda obj, name=None: gathered)
    problem = step_guard.layout_problem(model)
    assert "variable 'middle" in problem and "gradient on rank 0 but none on rank 1" in problem
    # Control: the same layout on every rank names nothing (the mismatch was something else).
    gathered[1] = gathered[0]
    assert step_guard.layout_problem(model) is None


def test_a_backup_folder_another_rank_removed_first_is_no_error(tmp_path):
    folder = tmp_path / "backup"
    folder.mkdir()
    (folder / "left.json").write_text("{}")

    def on_train_end(self, logs=None):  # as when a peer unlinked a file between listing and us
        raise FileNotFoundError("training_metadata.json")

    backup = type("Backup", (), {"backup_dir": str(folder)})()
    writers.removed_by_any_rank(on_train_end)(backup)
    assert not folder.exists()
    # Control: unwrapped, the end raises.
    folder.mkdir()
    try:
        on_train_end(backup)
        raise AssertionError("expected FileNotFoundError")
    except FileNotFoundError:
        pass


def test_a_backup_folder_another_rank_made_first_is_no_error(tmp_path):
    folder = tmp_path / "backup"

    def save_model(self, epoch, batch, logs):  # Keras 3's: makedirs where it found no folder
        if not folder.exists():
            folder.mkdir()          # a peer makes it between the check and this rank's makedirs
            folder.joinpath("peer").write_text("")
            os.makedirs(folder)
        return epoch

    backup = type("Backup", (), {"backup_dir": str(folder)})()
    assert writers.folder_made_by_any_rank(save_model)(backup, 3, None, {}) == 3
    assert folder.is_dir() and not (folder / "peer").exists()
    # Control: unwrapped, the rank that finds no folder fails on the one its peer made.
    folder.rmdir()
    try:
        save_model(backup, 3, None, {})
        raise AssertionError("expected FileExistsError")
    except FileExistsError:
        pass


def test_keras_2s_backup_checkpoint_is_written_by_rank_0_alone(monkeypatch):
    written = []
    backed_up = writers.backed_up_by_rank_zero(lambda self, epoch, batch=0: written.append(epoch))
    monkeypatch.setattr(writers.hvd, "rank", lambda: 1)
    backed_up(object(), 3)
    assert written == []
    # Control: rank 0 writes it.
    monkeypatch.setattr(writers.hvd, "rank", lambda: 0)
    backed_up(object(), 3)
    assert written == [3]

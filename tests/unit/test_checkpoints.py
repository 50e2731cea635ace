"""hvdtrain.training.checkpoints without MPI: what a run directory's checkpoints look like after
saves, prunes, a crash mid-write, a second write of the same epoch and a failed write."""
from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import files
from hvdtrain.training import checkpoints


def state(value: float) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(v=tf.Variable(np.full(4, value, np.float32)))


def names(run_dir) -> list[str]:
    return sorted(p.name for p in checkpoints.directory(run_dir).iterdir())


def test_saves_keep_the_last_k_and_latest_restores_the_newest(tmp_path):
    for epoch in range(1, 6):
        checkpoints.save(state(epoch), tmp_path, epoch, {"metrics": {"loss": 1 / epoch}}, keep=3)
    assert names(tmp_path) == ["epoch-0003", "epoch-0004", "epoch-0005"]
    epoch, path = checkpoints.latest(tmp_path)
    assert epoch == 5 and checkpoints.read_meta(path) == {"epochs_done": 5,
                                                          "metrics": {"loss": 0.2}}
    restored = state(0)
    checkpoints.restore(restored, path)
    np.testing.assert_array_equal(restored.v.numpy(), np.full(4, 5, np.float32))


def test_leftovers_of_a_crash_are_never_found_and_the_next_write_removes_them(tmp_path):
    checkpoints.save(state(1), tmp_path, 1, {}, keep=3)
    root = checkpoints.directory(tmp_path)
    # What a writer killed mid-write leaves: a hidden temporary directory. And a directory with
    # a checkpoint's name but no meta.json (the last file written), copied half, say.
    (root / ".epoch-0002.tmp-999").mkdir()
    (root / ".epoch-0002.tmp-999" / "ckpt.index").write_bytes(b"half")
    (root / "epoch-0003").mkdir()
    assert checkpoints.latest(tmp_path)[0] == 1
    assert [e for e, _ in checkpoints.completed(tmp_path)] == [1]
    checkpoints.save(state(2), tmp_path, 2, {}, keep=3)
    assert names(tmp_path) == ["epoch-0001", "epoch-0002", "epoch-0003"]  # no .tmp- left
    assert checkpoints.latest(tmp_path)[0] == 2


def test_the_same_epoch_written_again_replaces_the_earlier_one(tmp_path):
    checkpoints.save(state(1), tmp_path, 1, {"metrics": {"loss": 9.0}}, keep=3)
    checkpoints.save(state(7), tmp_path, 1, {"metrics": {"loss": 1.0}}, keep=3)
    assert names(tmp_path) == ["epoch-0001"]
    epoch, path = checkpoints.latest(tmp_path)
    assert checkpoints.read_meta(path)["metrics"] == {"loss": 1.0}
    restored = state(0)
    checkpoints.restore(restored, path)
    assert restored.v.numpy()[0] == 7


def test_a_failed_write_names_the_checkpoint_and_leaves_the_others(tmp_path, monkeypatch):
    checkpoints.save(state(1), tmp_path, 1, {}, keep=3)

    def disk_full(path, obj):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    monkeypatch.setattr(checkpoints, "_write_json", disk_full)
    with pytest.raises(checkpoints.WriteFailed) as failed:
        checkpoints.save(state(2), tmp_path, 2, {}, keep=3)
    assert f"cannot write checkpoint {checkpoints.directory(tmp_path) / 'epoch-0002'}: No space " \
           f"left on device; the earlier checkpoints are intact" in str(failed.value)
    assert names(tmp_path) == ["epoch-0001"]   # nothing half-written left behind


def test_a_checkpoint_of_another_model_is_a_user_error(tmp_path):
    checkpoints.save(state(1), tmp_path, 1, {}, keep=3)
    other = tf.train.Checkpoint(w=tf.Variable(np.zeros(3, np.float32)))
    with pytest.raises(checkpoints.UserError, match="does not fit this model and optimizer"):
        checkpoints.restore(other, checkpoints.latest(tmp_path)[1])


def test_json_is_written_whole_or_not_at_all(tmp_path):
    files.write_json_atomic(tmp_path / "a.json", {"x": 1})
    files.write_json_atomic(tmp_path / "a.json", {"x": 2})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary left

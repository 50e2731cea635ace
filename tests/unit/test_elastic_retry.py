"""hvd.elastic.run's retry loop (hvdtrain/distributed/elastic_retry.py) on the errors a user's
training raises, beside Horovod's own decorator on the same errors: a lost worker's error from
inside a tf.function restarts the loop, a user's own error is raised. The loop under
horovodrun's elastic mode with a worker really lost: tests/multirank/test_horovod_elastic.py."""
from __future__ import annotations

import pytest
import tensorflow as tf

# What a rank's fit step raised when a peer died during its all-reduce (Horovod 0.28.1 under
# Gloo, TensorFlow 2.21, captured): the node's name, not the op's.
LOST_IN_A_STEP = (
    "Graph execution error:\n\nDetected at node my_bucket defined at (most recent call last):\n"
    '  File "<string>", line 263, in horovod_grouped_allreduce\n\nHorovod has been shut down. '
    "This was caused by an exception on one of the ranks or an attempt to allreduce, allgather "
    "or broadcast a tensor after one of the ranks finished execution. If the shutdown was "
    "caused by an exception, you should see the exception in the log before the first "
    "shutdown message.\n\t [[{{node my_bucket}}]] [Op:__inference_step_15]")


class State:
    """What the loop asks of an elastic state, counted."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        if name in ("sync", "restore", "on_reset", "on_hosts_updated"):
            return lambda *args: self.calls.append(name)
        raise AttributeError(name)


def failing_once(error: Exception):
    attempts = []

    def train(state):
        attempts.append(1)
        if len(attempts) == 1:
            raise error
        return "trained"
    return train


def decorators(monkeypatch):
    import horovod.tensorflow.elastic as horovods
    from hvdtrain.distributed import elastic_retry
    resets = []
    # The reset shuts Horovod down and starts it again on the new workers: counted here.
    monkeypatch.setattr(elastic_retry, "_reset", lambda: resets.append(1))
    monkeypatch.setattr(horovods, "_reset", lambda: resets.append(1))
    return elastic_retry.run, horovods.run, resets


def test_a_worker_lost_inside_a_step_restarts_the_loop_from_the_last_commit(monkeypatch):
    ours, horovods, resets = decorators(monkeypatch)
    state = State()
    assert ours(failing_once(tf.errors.UnknownError(None, None, LOST_IN_A_STEP)))(state) \
        == "trained"
    assert state.calls == ["sync", "restore", "on_reset", "sync"] and resets == [1]
    # Control: Horovod's own decorator takes it for the end of training.
    state = State()
    assert horovods(failing_once(tf.errors.UnknownError(None, None, LOST_IN_A_STEP)))(state) \
        is None
    assert state.calls == ["sync"]


def test_a_users_own_unknown_error_is_raised_not_taken_for_the_end(monkeypatch):
    ours, horovods, resets = decorators(monkeypatch)
    own = tf.errors.UnknownError(None, None, "the reader's file system went away")
    with pytest.raises(tf.errors.UnknownError, match="file system went away"):
        ours(failing_once(own))(State())
    assert horovods(failing_once(own))(State()) is None   # control: swallowed
    assert resets == []

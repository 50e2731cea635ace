"""Horovod's elastic retry loop on either Keras, with the error that restarts it told apart
from every other error.

Horovod's own decorator (``horovod.tensorflow.elastic.run``, which its Keras layer hands on)
takes an ``UnknownError`` for a lost worker only when it names HorovodAllreduce, -Allgather or
-Broadcast, and returns None for any other ``UnknownError``: a worker lost inside a
``tf.function`` (a fit step: the error names the node, not the op), in a join or a
reduce-scatter, or a user's own error, ended training as if it had finished. Here every Horovod
op's error restarts the loop and any other error is raised. The same loop on both bindings."""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, TypeVar

import tensorflow as tf

# Horovod: ranks re-formed after a loss (shut down, init again on the new set of workers).
import horovod.tensorflow as hvd
# Horovod: the loop itself (sync state from rank 0, run; on a lost worker restore the last
# commit, on an added one go on from it; reset, run again) and the error that drives it.
from horovod.common.elastic import run_fn
from horovod.common.exceptions import HorovodInternalError

T = TypeVar("T")

# An op error from a collective names its op (HorovodGroupedAllreduce, HorovodJoin, ...); a
# collective failed by Horovod's shutdown after a peer died says so.
_HOROVOD_OP = re.compile(r"\bHorovod[A-Z][A-Za-z]*\b|Horovod has been shut down")


def peer_lost(error: BaseException) -> bool:
    """True for the error a collective raises when a worker left the ring under it."""
    return isinstance(error, tf.errors.UnknownError) and bool(_HOROVOD_OP.search(str(error)))


def _reset() -> None:
    hvd.shutdown()
    hvd.init()


def run(train: Callable[..., T]) -> Callable[..., T]:
    """``train(state, ...)`` in Horovod's elastic retry loop: run again from the last commit
    when a worker is lost, from the next one when a worker is added."""
    def attempt(state: Any, *args: Any, **kwargs: Any) -> T:
        try:
            return train(state, *args, **kwargs)
        except tf.errors.UnknownError as e:
            if peer_lost(e):
                raise HorovodInternalError(e) from e
            raise
    return functools.wraps(train)(run_fn(attempt, _reset))

"""The checks all ranks agree on: a user error on any rank stops every rank together (never a
rank left waiting in a collective), the same config on every rank, rank 0's work handed to all,
and the error that says a peer was lost."""
from __future__ import annotations

from typing import Callable, TypeVar

import tensorflow as tf

# Horovod: verdicts and rank 0's config gathered or broadcast as Python objects.
import horovod.tensorflow as hvd
# Horovod: the error a collective raises when a peer died mid-operation.
from horovod.common.exceptions import HorovodInternalError

from hvdtrain import config as config_lib
from hvdtrain.distributed.collectives import broadcast_object
from hvdtrain.distributed.world import World
from hvdtrain.errors import UserError

T = TypeVar("T")


def check_same_config(values: dict, world: World) -> None:
    """Stops every rank when any was started with a config other than rank 0's (a TOML file
    that differs between hosts, say): ranks would otherwise train with different settings."""
    if world.size == 1:
        return
    # Horovod: rank 0's config reaches every rank, which compares its hash with its own.
    root = hvd.broadcast_object(values, root_rank=0, name="hvdtrain_config")
    problem = None
    if config_lib.fingerprint(values) != config_lib.fingerprint(root):
        keys = config_lib.differences(values, root)
        problem = (f"the config differs from rank 0's (hash {config_lib.fingerprint(values)} vs "
                   f"{config_lib.fingerprint(root)}, in {', '.join(keys)}): start every rank "
                   f"with the same arguments and config file")
    agree_or_fail(problem, world)


def lost_a_rank(error: BaseException) -> bool:
    """True for the error a rank gets when another rank died (or the stall check gave up)
    while it waited in a collective."""
    # Horovod: its background thread shuts down and fails every pending collective.
    return isinstance(error, HorovodInternalError) or (
        isinstance(error, tf.errors.OpError) and "Horovod has been shut down" in str(error))


def agree_or_fail(problem: str | None, world: World) -> None:
    """A collective check: if any rank hit a user error, every rank raises it, together.

    A rank that simply exited on its own error would leave the others waiting forever in their
    next all-reduce; gathering everyone's verdict first makes all ranks stop within seconds.
    """
    if world.size == 1:
        if problem:
            raise UserError(problem)
        return
    # Horovod: gather every rank's verdict (None = fine) so all ranks take the same branch.
    verdicts = hvd.allgather_object(problem)
    failed = [(r, p) for r, p in enumerate(verdicts) if p]
    if failed:
        rank, first = failed[0]
        where = "" if len(failed) == world.size else f" (on rank {rank})"
        raise UserError(f"{first}{where}", shared=True)


def rank0_then_all(work: Callable[[], T], world: World) -> T:
    """A collective: runs ``work`` on rank 0 alone (file system work such as opening the run
    directory), then gives its result, or its user error, to every rank."""
    result, problem = None, None
    if world.is_chief:
        try:
            result = work()
        except UserError as e:
            problem = str(e)
    agree_or_fail(problem, world)  # Horovod: rank 0's error stops every rank
    return broadcast_object(result)  # Horovod: rank 0's answer reaches every rank

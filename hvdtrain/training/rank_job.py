"""What every rank's job shares, in the commands that run on every rank (train, eval,
predict) and the benchmark that trains on the user's cluster: errors every rank meets alike,
Horovod's start, and the exit when a peer is lost."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn

from hvdtrain import config as config_lib
from hvdtrain.errors import UserError

if TYPE_CHECKING:
    from hvdtrain import distributed as dist

LOST_A_RANK_EXIT_CODE = 1


@contextlib.contextmanager
def same_on_every_rank() -> Iterator[None]:
    """Marks a UserError raised inside as shared: argv (and the files it names) are the same
    on every rank, so is the error, and rank 0 alone reports it."""
    try:
        yield
    except UserError as e:
        raise UserError(str(e), shared=True) from None


def start(cfg: config_lib.Config, *, options: config_lib.HorovodConfig | None,
          elastic: bool = False) -> dist.World:
    """Horovod started with ``cfg``'s run settings; ``options``: the HOROVOD_* settings to
    apply (None: leave them, so that eval and predict do not overwrite the training run's
    timeline). Returns this rank's World."""
    from hvdtrain import distributed as dist  # Horovod loads here
    return dist.init(device=cfg.run.device, intra_op_threads=cfg.run.intra_op_threads,
                     inter_op_threads=cfg.run.inter_op_threads, options=options,
                     stall_warning_s=cfg.run.stall_warning_s,
                     stall_abort_s=cfg.run.stall_abort_s, elastic=elastic)


def run(world: dist.World, work: Callable[[], object]) -> int:
    """Calls ``work`` on this rank and returns 0; when a peer dies or stalls in the middle of
    a collective, ends this process at once with one line instead."""
    from hvdtrain import distributed as dist
    try:
        work()
    except Exception as e:
        if not dist.lost_a_rank(e):
            raise
        _exit_after_losing_a_rank(world.rank)
    return 0


def _exit_after_losing_a_rank(rank: int) -> NoReturn:
    print(f"hvdtrain: error: rank {rank}: another rank died or stalled in the "
          f"middle of a collective, so Horovod shut down (the launcher's report names "
          f"the rank); continue from the last checkpoint with --resume",
          file=sys.stderr, flush=True)
    # Now, not after the interpreter's teardown: with a peer gone, Horovod's and
    # TensorFlow's shutdown only delay the exit (by 0.3 s and more, measured), long
    # enough for horovodrun to kill this rank first and lose its status.
    sys.stdout.flush()
    os._exit(LOST_A_RANK_EXIT_CODE)

"""What the subcommands that run on every rank (train, eval, predict) share: errors every rank
meets alike, the run directory's saved config, Horovod's start, and the exit when a peer is
lost."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn

from hvdtrain import config as config_lib
from hvdtrain.config import overrides
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


def saved_config(args: argparse.Namespace) -> config_lib.Config:
    """eval and predict: the config.json of ``args.run_dir``, with eval's --set on top."""
    saved = Path(args.run_dir) / "config.json"
    if not Path(args.run_dir).is_dir():
        raise UserError(f"run dir {args.run_dir} does not exist: pass the --run-dir of a "
                        f"training run")
    try:
        values = json.loads(saved.read_text())
    except FileNotFoundError:
        raise UserError(f"{saved} not found: is {args.run_dir} a run directory?") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {saved}: {e}") from None
    base = overrides.from_dict(values)
    return overrides.with_overrides(
        base, overrides.parse_assignments(getattr(args, "assignments", [])))


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

"""A rank's place in the job (``World``): plain values that the rest of hvdtrain takes instead of
asking Horovod, and its refresh after an elastic reset."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

# Horovod: the rank and size after an elastic reset.
import horovod.tensorflow as hvd

from hvdtrain.errors import UserError


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    controller: str      # "mpi" or "gloo"
    device: str          # "/GPU:0" or "/CPU:0": where this rank's ops run
    intra_op_threads: int
    inter_op_threads: int
    stack: str = ""      # e.g. "tensorflow 2.18.1, keras 3.15.1, horovod 0.28.1"

    @property
    def is_chief(self) -> bool:
        """Rank 0: the one rank that prints and writes."""
        return self.rank == 0


def controller() -> str:
    """The controller the launcher chose for this job: "mpi" (mpirun) or "gloo" (horovodrun
    --gloo, elastic)."""
    # Horovod: which controller hvd.init() joined.
    return "mpi" if hvd.mpi_enabled() and not hvd.gloo_enabled() else "gloo"


def refresh_world(world: World) -> World:
    """The same process after an elastic reset: its rank and the world size may have changed."""
    # Horovod: after a reset, hvd.init() has rebuilt the ring with the workers left (or added).
    return dataclasses.replace(world, rank=hvd.rank(), size=hvd.size(),
                               local_rank=hvd.local_rank(), local_size=hvd.local_size())


def shard(*arrays: Any) -> tuple[Any, ...]:
    """This rank's rows of ``arrays`` (NumPy arrays of one length, as ``fit(x, y)`` takes
    them), by hvdtrain's own rule: rank r of N takes rows r, r+N, r+2N, ...; a rank one row
    short repeats its first, so that every rank runs as many steps (a rank with more batches
    would wait forever in an all-reduce). ``x, y = dist.shard(x, y)``."""
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise UserError(f"dist.shard() takes arrays of one length, got {sorted(lengths)}")
    rows = lengths.pop()
    # Horovod: this rank's place in the job picks its rows.
    rank, size = hvd.rank(), hvd.size()
    if rows < size:
        raise UserError(f"dist.shard(): {rows} rows cannot give each of {size} ranks one")
    own = np.resize(np.arange(rank, rows, size), -(-rows // size))  # wraps
    return tuple(np.asarray(a)[own] for a in arrays)

"""A rank's place in the job (``World``): plain values that the rest of hvdtrain takes instead of
asking Horovod, and its refresh after an elastic reset."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Horovod: the rank and size after an elastic reset.
import horovod.tensorflow as hvd


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

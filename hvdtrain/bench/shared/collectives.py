"""The all-reduce paths bench allreduce times (raw MPI_Allreduce, Horovod over MPI and Gloo, one
tensor or several, fusion on or off), their arithmetic (nccl-tests' bandwidths, calls per timed
batch), their launch (bench allreduce's, and bench phases' raw MPI_Allreduce of a step's
gradient bytes) and their rank side: ``python -m hvdtrain.bench.shared.collectives rank
OPTIONS``."""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from hvdtrain.launch import launchers
from hvdtrain.bench.shared import jobs, launch, stats
from hvdtrain.bench.shared.targets import MIB

MODULE = "hvdtrain.bench.shared.collectives"
MOVED_PER_BATCH = 64 * MIB    # a batch of all-reduces moves about this much (at least 3 ops)


@dataclass(frozen=True)
class CommPath:
    label: str
    launcher: launchers.Launcher
    kind: str              # mpi4py | horovod
    pieces: int = 1        # the message split into this many tensors, submitted together
    fusion: bool = True
    # mpi4py: MPI_IN_PLACE. Horovod: CHAIN all-reduces chained in one tf.function, each on the
    # one before's output, which nothing else holds: the op reduces it in its own buffer, as a
    # training step's flat gradients, and no Python call comes between two all-reduces.
    in_place: bool = False

    def env(self) -> dict[str, str]:
        # Horovod: a fusion threshold of 0 bytes turns tensor fusion off.
        return {} if self.fusion else {"HOROVOD_FUSION_THRESHOLD": "0"}


RAW_MPI = CommPath("MPI_Allreduce (mpi4py)", "mpi", "mpi4py")
RAW_MPI_IN_PLACE = CommPath("MPI_Allreduce in place (mpi4py)", "mpi", "mpi4py", in_place=True)
HOROVOD_MPI = CommPath("Horovod/MPI", "mpi", "horovod")
HOROVOD_MPI_CHAINED = CommPath("Horovod/MPI, chained in one graph, in place", "mpi", "horovod",
                               in_place=True)
HOROVOD_GLOO = CommPath("Horovod/Gloo", "gloo", "horovod")
CHAIN = 10       # all-reduces per call of the chained path
FULL_PATHS = (RAW_MPI, RAW_MPI_IN_PLACE, HOROVOD_MPI, HOROVOD_MPI_CHAINED,
              CommPath("Horovod/MPI, 8 tensors, fusion on", "mpi", "horovod", 8),
              CommPath("Horovod/MPI, 8 tensors, fusion off", "mpi", "horovod", 8, False),
              HOROVOD_GLOO,
              CommPath("Horovod/Gloo, 8 tensors, fusion on", "gloo", "horovod", 8),
              CommPath("Horovod/Gloo, 8 tensors, fusion off", "gloo", "horovod", 8, False))
# --quick (the tests' run): the MPI paths each way; Gloo's slow start only in the full run.
QUICK_PATHS = (RAW_MPI, RAW_MPI_IN_PLACE, HOROVOD_MPI, HOROVOD_MPI_CHAINED)


# ---------------------------------------------------------------------------------------------
# Pure arithmetic

def bandwidths(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for one all-reduce of ``nbytes`` taking ``seconds``."""
    algbw = nbytes / seconds
    return algbw, algbw * 2 * (ranks - 1) / ranks


def ops_per_batch(nbytes: int) -> int:
    """Back-to-back all-reduces per timed batch, at most: enough that small messages are not
    lost in the clock's resolution, at least 3, at most 200."""
    return max(3, min(200, MOVED_PER_BATCH // nbytes))


# A timed batch need not last longer than this: a slow path (Gloo with fusion off, 30 ms per
# all-reduce) timed over 200 calls spent minutes of bench all's budget on what 0.5 s shows.
MIN_BATCH_S = 0.5


def batch_ops(seconds_per_op: float, most: int) -> int:
    """Calls per timed batch for an all-reduce that took ``seconds_per_op`` untimed: enough for
    MIN_BATCH_S, at least 3, at most ``most`` (ops_per_batch)."""
    if seconds_per_op <= 0:
        return most
    return max(3, min(most, math.ceil(MIN_BATCH_S / seconds_per_op)))


# ---------------------------------------------------------------------------------------------
# Driver side

def measure(path: CommPath, sizes: Sequence[int], ranks: int, repeats: int,
            work_dir: Path) -> dict[str, Any]:
    """``path`` timed at each of ``sizes`` (bytes) in a launch of its own: per size the
    seconds per all-reduce (median and spread of ``repeats`` batches) and the bandwidths."""
    out = (work_dir / f"{path.kind}-{path.launcher}-{path.pieces}-{path.fusion}"
                      f"-{path.in_place}.json")
    options = {"kind": path.kind, "launcher": path.launcher, "pieces": path.pieces,
               "in_place": path.in_place, "sizes": list(sizes), "repeats": repeats,
               "out": str(out)}
    command = launch.launch_command(path.launcher, ranks, launch.rank_argv(MODULE, options))
    output = jobs.run_job(command, env=path.env(), what=f"all-reduce over {path.label}")
    raw = jobs.read_json_output(out, f"all-reduce over {path.label}", output)
    return {**asdict(path), "rows": [_row(r, ranks) for r in raw["rows"]]}


def _row(raw: dict, ranks: int) -> dict:
    t = stats.summarize(raw["seconds"])
    algbw, busbw = bandwidths(raw["bytes"], t["median"], ranks)
    return {"bytes": raw["bytes"], "seconds": t, "algbw_GBps": algbw / 1e9,
            "busbw_GBps": busbw / 1e9}


# ---------------------------------------------------------------------------------------------
# Rank side

def time_batches(step: Callable[[], Any], most: int, repeats: int,
                  slowest: Callable[[float], float], barrier: Callable[[], Any]) -> list[float]:
    """Seconds per all-reduce for each of ``repeats`` batches of calls of ``step`` (batch_ops:
    at most ``most``, fewer for a slow one, from the second untimed call at the slowest rank,
    so that every rank makes as many), after two untimed calls; each batch counts at the
    slowest rank."""
    step()
    barrier()
    start = time.perf_counter()
    step()
    ops = batch_ops(slowest(time.perf_counter() - start), most)
    per_op = []
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        for _ in range(ops):
            step()
        per_op.append(slowest(time.perf_counter() - start) / ops)
    return per_op


def rank_mpi4py(options: dict[str, Any]) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rows = []
    for nbytes in options["sizes"]:
        recv = np.zeros(nbytes // 4, np.float32)  # allocated once per size, reused by every call
        send = MPI.IN_PLACE if options.get("in_place") else np.ones_like(recv)
        seconds = time_batches(lambda: comm.Allreduce(send, recv, op=MPI.SUM),
                                ops_per_batch(nbytes), options["repeats"],
                                lambda s: comm.allreduce(s, op=MPI.MAX), comm.Barrier)
        recv[:] = 1
        comm.Allreduce(send, recv, op=MPI.SUM)
        if not np.all(recv == comm.size):
            raise RuntimeError(f"MPI_Allreduce of {nbytes} bytes gave a wrong sum")
        rows.append({"bytes": nbytes, "seconds": seconds})
    if comm.rank == 0:
        Path(options["out"]).write_text(json.dumps({"ranks": comm.size, "rows": rows}))


def rank_horovod(options: dict[str, Any]) -> None:
    if not launchers.entry(options["launcher"]).binds_cores:
        launch.pin_to_own_core()
    import numpy as np
    import tensorflow as tf
    from hvdtrain import distributed as dist

    world = dist.init(device="cpu")
    pieces, chain = options["pieces"], CHAIN if options.get("in_place") else 1
    rows = []
    for nbytes in options["sizes"]:
        tensors = [tf.ones([nbytes // 4 // pieces], tf.float32) for _ in range(pieces)]

        def reduce_chain(ts: list, n: int = nbytes) -> list:
            for link in range(chain):
                ts = dist.allreduce_each(ts, name=f"bench{n}_{link}")
            return ts
        reduce = tf.function(reduce_chain)
        last: list = []

        def step() -> None:
            last[:] = reduce(tensors)
        seconds = time_batches(
            step, ops_per_batch(nbytes), options["repeats"],
            lambda s: max(dist.allgather_object(s)),
            lambda: dist.allreduce_sum(np.zeros(1)))
        if not all(float(t[0]) == world.size ** chain for t in last):
            raise RuntimeError(f"Horovod all-reduce of {nbytes} bytes gave a wrong sum")
        rows.append({"bytes": nbytes, "seconds": [s / chain for s in seconds]})
    if world.is_chief:
        Path(options["out"]).write_text(json.dumps({"ranks": world.size, "rows": rows,
                                                    "controller": world.controller}))


def rank_main(options: dict[str, Any]) -> None:
    (rank_mpi4py if options["kind"] == "mpi4py" else rank_horovod)(options)


if __name__ == "__main__":
    launch.rank_entry(sys.argv, rank_main, MODULE)

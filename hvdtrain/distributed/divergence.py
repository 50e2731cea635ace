"""What the consistency check compares, and the one line it stops with: pure, on plain values
(``consistency.py`` gathers them from every rank), testable without MPI.

Every rank shows the others a ``Snapshot`` at each check point; the ranks agree when they are
at the same point with equal checksums and hyperparameters. Ranks that agree give checksums
equal to the last bit (the same float64 sums of the same values); drift is far larger than
``TOLERANCE``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TOLERANCE = 1e-6   # relative
CAUSES = ("an optimizer not made distributed (dist.distributed_optimizer), a callback or "
          "assignment that changes weights or the optimizer on some ranks only, or weights "
          "restored on some ranks after the broadcast")
OFF = ("dist.fit_callbacks(consistency_check=False) or --set train.consistency_check=false "
       "turns this check off")


@dataclass(frozen=True)
class Snapshot:
    """What one rank shows the others at a check point: where it is (``phase``), and the
    checksums and hyperparameters it holds there (empty where the point compares none)."""
    phase: tuple
    names: tuple[str, ...] = ()
    checksums: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    hyperparameters: dict = field(default_factory=dict)
    batch: tuple[float, ...] = ()
    samples: tuple[int, ...] = ()   # the MinHash signature of the samples of its first epoch
    due: bool = True   # at an epoch's start: whether its end compares every weight (rank 0's)


def _differs(a: float, b: float, scale: float) -> bool:
    return abs(a - b) > TOLERANCE * max(scale, 1e-30)


def variable_difference(snapshots: list[Snapshot]) -> tuple[int, int, int] | None:
    """(rank, variable index, how many differ) for the first rank whose checksums differ from
    rank 0's, or None."""
    root = snapshots[0].checksums
    for rank, other in enumerate(snapshots[1:], start=1):
        if other.checksums.shape != root.shape:
            return rank, -1, max(len(root), len(other.checksums))
        bad = [i for i, ((s0, q0), (s1, q1)) in enumerate(zip(root, other.checksums))
               if _differs(s0, s1, abs(s0) + np.sqrt(q0)) or _differs(q0, q1, q0)]
        if bad:
            return rank, bad[0], len(bad)
    return None


def _hyperparameter_differs(a: float | None, b: float | None) -> bool:
    return a is None or b is None or _differs(a, b, max(abs(a), abs(b)))


def hyperparameter_difference(snapshots: list[Snapshot]) -> tuple[int, str] | None:
    """(rank, name) for the first hyperparameter that differs from rank 0's, or None."""
    root = snapshots[0].hyperparameters
    for rank, other in enumerate(snapshots[1:], start=1):
        for name in sorted(set(root) | set(other.hyperparameters)):
            if _hyperparameter_differs(root.get(name), other.hyperparameters.get(name)):
                return rank, name
    return None


def differing_hyperparameters(snapshots: list[Snapshot]) -> set[str]:
    """The names of every hyperparameter that differs from rank 0's on some rank."""
    names = set().union(*(s.hyperparameters for s in snapshots))
    return {name for name in names
            if any(_hyperparameter_differs(snapshots[0].hyperparameters.get(name),
                                           s.hyperparameters.get(name)) for s in snapshots[1:])}


def describe_phase(phase: tuple) -> str:
    if phase[0] == "epoch":
        return f"starting epoch {phase[1] + 1}"
    if phase[0] == "validation":
        return f"validating in epoch {phase[1] + 1}"
    if phase[0] == "epoch end":
        return f"ending epoch {phase[1] + 1}"
    return {"end": "at the end of training"}.get(phase[0], " ".join(map(str, phase)))


def phase_problem(snapshots: list[Snapshot]) -> str | None:
    """Why the ranks are not at the same point of training, or None."""
    phases = [s.phase for s in snapshots]
    if len(set(phases)) == 1:
        return None
    listed = ", ".join(f"rank {r} {describe_phase(p)}" for r, p in enumerate(phases))
    if any(p[0] == "validation" for p in phases):
        return (f"the ranks do not all validate ({listed}): validation_data or "
                f"validation_split on some ranks only; give every rank its validation data "
                f"(each its own part, e.g. dist.shard(x_val, y_val)): the metrics are averaged "
                f"over ranks")
    if all(p[0] == "epoch" for p in phases):
        return (f"the ranks start training at different epochs ({listed}): a BackupAndRestore, "
                f"a restore or an initial_epoch on some ranks only; restore on rank 0 alone "
                f"before fit (dist.fit_callbacks() broadcasts its state), pass the same "
                f"initial_epoch on every rank, or give every rank a BackupAndRestore of its "
                f"own backup_dir")
    return (f"the ranks left the epoch loop at different points ({listed}): a callback stopped "
            f"training on some ranks only (EarlyStopping, TerminateOnNaN, stop_training): put "
            f"it on every rank (the metrics it reads are averaged over ranks, so all stop "
            f"together)")


def difference_problem(snapshots: list[Snapshot], when: str) -> str | None:
    """The one line naming the first variable or hyperparameter that differs, or None."""
    hyper = hyperparameter_difference(snapshots)
    if hyper:
        rank, name = hyper
        a = snapshots[0].hyperparameters.get(name)
        b = snapshots[rank].hyperparameters.get(name)
        return (f"the ranks' optimizers differ {when}: {name} is {a:g} on rank 0 but {b:g} on "
                f"rank {rank}: a callback or assignment on some ranks only changed it; change "
                f"it on every rank alike, or in a callback at an epoch's start on rank 0 "
                f"(taken by every rank); {OFF}")
    found = variable_difference(snapshots)
    if found:
        rank, index, count = found
        what = (f"variable '{snapshots[0].names[index]}' ({count} of "
                f"{len(snapshots[0].names)} differ)" if index >= 0 else
                f"the number of trainable variables ({len(snapshots[0].names)} vs "
                f"{len(snapshots[rank].names)})")
        return (f"the ranks' models differ {when}: {what} is not the same on rank {rank} as "
                f"on rank 0. Likely: {CAUSES}; {OFF}")
    return None


def same_batches(batches: list[tuple[float, ...]]) -> bool:
    """True when every rank's first batch has the same checksum (and has elements)."""
    first = batches[0]
    return (len(first) == 3 and first[2] > 0 and all(
        len(b) == 3 and not any(_differs(x, y, abs(x) + 1e-12) for x, y in zip(first, b))
        for b in batches[1:]))


NO_SAMPLE = 2**63 - 1  # a signature's entry before any sample was seen


def repeated_samples(snapshots: list[Snapshot]) -> tuple[int, float] | None:
    """(rank, share) for the first rank whose first epoch drew mostly the same samples as rank
    0's, or None. Each signature holds, per hash function, the least hash over the samples
    an epoch trained on (MinHash): the share of entries two ranks have in common estimates
    how much of their samples they share. Shards have none in common; the whole data set on
    every rank has all."""
    root = snapshots[0].samples
    if not root or NO_SAMPLE in root:
        return None
    for rank, other in enumerate(snapshots[1:], start=1):
        if len(other.samples) == len(root):
            share = sum(a == b for a, b in zip(root, other.samples)) / len(root)
            if share > 0.5:
                return rank, share
    return None


def repeated_problem(snapshots: list[Snapshot]) -> str | None:
    """The one line for ranks whose first epoch drew mostly the same samples, or None."""
    found = repeated_samples(snapshots)
    if found is None:
        return None
    rank, share = found
    return (f"ranks 0 and {rank} trained on mostly the same samples in their first epoch (about "
            f"{share:.0%} in common), so the ranks repeat each other's work: {UNSHARDED}; "
            f"{OFF}")


UNREDUCED = ("the gradients were not averaged over ranks: compile with "
             "dist.distributed_optimizer(...) (a loaded model: "
             "model.compile(dist.distributed_optimizer(model.optimizer), ...)), or reduce them "
             "in an own train_step with dist.distributed_tape")
UNSHARDED = ("give each rank its own part of the data (tf.data: dataset.shard(world.size, "
             "world.rank) before shuffle and batch; arrays given to fit: "
             "x, y = dist.shard(x, y))")

"""The registry of the guarantees cases, which tests/guarantees_worker.py runs: what a case is
(``Case``, appended to ``CASES`` by ``@case`` in the order the case modules define them), the
contracts a case is held to (EXACT, NONE), what it is given (``Context``) and what it returns
(``Outcome``), and the sizes of the data every case trains on.

Each case module registers its cases when it is imported; guarantees_worker.py imports them
all, in the order the cases run, and the table reads CASES from it. Importing this module loads
no TensorFlow.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

FEATURES, CLASSES, BATCH, STEPS, RANKS = 16, 4, 8, 4, 2
ROWS = STEPS * RANKS * BATCH           # 64 rows: 4 global batches of 16
SEED = 100                             # rank r seeds 100 + r: only the broadcast makes them agree
# How long a collective may wait for a rank before Horovod's stall check shuts the job's
# collectives down: a hang costs this, and a rank may lag its peer by less (the cases keep the
# ranks' work alike: every rank trains the reference too).
STALL_WARNING_S, STALL_ABORT_S = 10, 30

EXACT = "= 1 rank at 2B"    # the contract: 2 ranks x B end as 1 rank x 2B on the same batches
NONE = "none"               # no such contract (the note says why); the ranks must agree


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    contract: str          # EXACT or NONE
    note: str              # what the case does and what hvdtrain promises for it
    run: Callable[["Context"], "Outcome"]
    family: str = "library"   # "horovod": Horovod's API (docs/horovod-api.md)


CASES: list[Case] = []


def case(name: str, title: str, contract: str, note: str, family: str = "library"):
    def register(run: Callable[["Context"], "Outcome"]) -> Callable[["Context"], "Outcome"]:
        CASES.append(Case(name, title, contract, " ".join(note.split()), run, family))
        return run
    return register


class NotOffered(Exception):
    """The pattern does not exist on this stack (an argument its Keras lacks, a layer hvdtrain
    does not offer)."""


@dataclass
class Context:
    tf: Any
    dist: Any
    rank: int
    size: int
    out: Path


@dataclass
class Outcome:
    state: list            # this rank's final weights (get_weights: trainable and not)
    reference: list | None = None    # the reference's final weights, where the contract is EXACT
    checks: dict = field(default_factory=dict)   # description -> [holds, detail]

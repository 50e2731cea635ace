"""A check the tests switch on through the environment: every rank's final weights on disk,
to compare the ranks of a job that only the launcher started (elastic training, say)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

# A folder where every rank writes its final weights to rank{R}.npz (R: its rank at the end).
WEIGHTS_LOG_ENV = "HVDTRAIN_DEBUG_WEIGHTS_LOG"


def log_weights(model: Any, rank: int) -> None:
    """Writes a Keras ``model``'s weights, in order, to the folder WEIGHTS_LOG_ENV names (if
    set) as rank{rank}.npz."""
    folder = os.environ.get(WEIGHTS_LOG_ENV)
    if folder:
        np.savez(Path(folder, f"rank{rank}.npz"),
                 *[np.asarray(w) for w in model.get_weights()])

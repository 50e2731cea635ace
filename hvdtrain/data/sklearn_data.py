"""scikit-learn's 8x8 digits, read from the file its wheel ships (datasets/data/digits.csv.gz)
without importing scikit-learn: the import (scipy's stats with it) costs a second or more of
every rank's start on every digits run, for a 1,797-row CSV. ``load_digits`` is the fallback
where the file is not where scikit-learn keeps it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

DIGITS_FILE = ("datasets", "data", "digits.csv.gz")  # inside the installed sklearn package


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 images [n, 8, 8], float64 pixels 0..16, and their digits (int), exactly as
    ``sklearn.datasets.load_digits()`` gives ``images`` and ``target``."""
    path = shipped_file(*DIGITS_FILE)
    if path is None:
        from sklearn.datasets import load_digits
        bunch = load_digits()
        return bunch.images, bunch.target
    table = np.loadtxt(path, delimiter=",")  # 64 pixels, then the digit, per row
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def shipped_file(*parts: str) -> Path | None:
    """A file inside the installed scikit-learn package, found without importing it; None
    when scikit-learn or the file is missing."""
    spec = importlib.util.find_spec("sklearn")  # a top-level name: finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0], *parts)
    return path if path.is_file() else None

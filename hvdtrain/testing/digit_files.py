"""scikit-learn's 8x8 digits written as the files users keep: one folder of PNG and JPEG images
per class (named by word, so that the sorted folder names are not the digits), and the two JPEG
photographs scikit-learn ships. The tests train and predict on them; ``hvdtrain bench input``
measures the file sources on them. Nothing is downloaded: both ship inside scikit-learn's wheel.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hvdtrain.data import sklearn_data

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SORTED = sorted(NAMES)          # class id = position here


def digits_uint8(side: int = 8, channels: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits as uint8 images [n, side, side, channels] (``side`` a multiple of 8:
    each pixel repeated; grey repeated to ``channels``), and their digits."""
    images, digits = sklearn_data.digits()
    x = np.rint(images / 16.0 * 255).astype(np.uint8)[..., None]
    x = np.kron(x, np.ones((1, side // 8, side // 8, channels), np.uint8))
    return x, digits


def write_digits(root: Path, indices, *, every_kind: bool = True, side: int = 8,
                 channels: int = 1) -> list[Path]:
    """Digit ``i`` as ROOT/<word>/d<i>.png (side x side) when i is even, else as a JPEG of
    twice the side: two formats and two sizes in every class (``every_kind=False``: PNG
    only). Returns the paths in order."""
    import tensorflow as tf
    x, y = digits_uint8(side, channels)
    paths = []
    for i in indices:
        folder = root / NAMES[y[i]]
        folder.mkdir(parents=True, exist_ok=True)
        if i % 2 == 0 or not every_kind:
            path, data = folder / f"d{i:04d}.png", tf.io.encode_png(x[i])
        else:
            big = np.kron(x[i], np.ones((2, 2, 1), np.uint8))
            path, data = folder / f"d{i:04d}.jpg", tf.io.encode_jpeg(big, quality=95)
        path.write_bytes(data.numpy())
        paths.append(path)
    return paths


def write_digit_tree(root: Path, limit: int | None = None, *, side: int = 8,
                     channels: int = 1) -> tuple[Path, Path]:
    """ROOT/train and ROOT/eval: every 5th digit held out, as the digits source does."""
    n = 1797 if limit is None else limit
    write_digits(root / "train", [i for i in range(n) if i % 5], side=side, channels=channels)
    write_digits(root / "eval", [i for i in range(n) if i % 5 == 0], side=side,
                 channels=channels)
    return root / "train", root / "eval"


def sample_photos() -> list[Path]:
    """The paths of the two JPEG photographs scikit-learn ships (needs Pillow to read them)."""
    from sklearn.datasets import load_sample_images
    return [Path(p) for p in load_sample_images().filenames]

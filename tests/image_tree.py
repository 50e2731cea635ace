"""Real image trees for the tests: scikit-learn's 8x8 digits written as PNG and JPEG files in
one folder per class (named by word, so that the sorted folder names are not the digits), and
the two JPEG photographs scikit-learn ships."""
from __future__ import annotations

from pathlib import Path

import numpy as np

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SORTED = sorted(NAMES)          # class id = position here


def digits_uint8() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    bunch = load_digits()
    return np.rint(bunch.images / 16.0 * 255).astype(np.uint8)[..., None], bunch.target


def write_digits(root: Path, indices, *, every_kind: bool = True) -> list[Path]:
    """Digit ``i`` as ROOT/<word>/d<i>.png (8x8) when i is even, else as a 16x16 JPEG (each
    pixel doubled): two formats and two sizes in every class. Returns the paths in order."""
    import tensorflow as tf
    x, y = digits_uint8()
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


def write_digit_tree(root: Path, limit: int | None = None) -> tuple[Path, Path]:
    """ROOT/train and ROOT/eval: every 5th digit held out, as the digits source does."""
    x, _ = digits_uint8()
    n = len(x) if limit is None else limit
    write_digits(root / "train", [i for i in range(n) if i % 5])
    write_digits(root / "eval", [i for i in range(n) if i % 5 == 0])
    return root / "train", root / "eval"


def sample_photos() -> list[Path]:
    from sklearn.datasets import load_sample_images
    return [Path(p) for p in load_sample_images().filenames]

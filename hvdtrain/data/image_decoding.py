"""Image files to pixels, inside tf.data: the decoder (any stored size resized, grey and colour
converted to the channels asked), a list of files decoded in order or whole (data.cache), and
the files that do not decode (truncated or corrupt), found in one parallel pass and named.

Plain paths in, no classes or ranks: ``images`` (the folders, their splits and shares),
``convert`` and ``predict`` build on it.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain.data.tfdata import with_thread_budget
from hvdtrain.errors import UserError


def decoder(image_shape: tuple[int, ...]):
    """path -> float32 image in [0, 1] of ``image_shape`` (H, W, C): decoded (grey and colour
    converted to C channels), then resized with antialiasing whatever its stored size."""
    height, width, channels = image_shape

    def decode(path: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(tf.io.read_file(path), channels=channels,
                                   expand_animations=False)
        image = tf.image.resize(tf.cast(image, tf.float32), (height, width), antialias=True)
        return tf.clip_by_value(image / 255.0, 0.0, 1.0)
    return decode


def decoded(paths, image_shape: tuple[int, ...]) -> tf.data.Dataset:
    """The images of ``paths`` in order, decoded in parallel."""
    ds = tf.data.Dataset.from_tensor_slices(tf.constant(list(paths), tf.string)).map(
        decoder(image_shape), num_parallel_calls=tf.data.AUTOTUNE)
    return with_thread_budget(ds)


def decode_all(paths, image_shape: tuple[int, ...]) -> np.ndarray:
    """The images of ``paths`` as one float32 array [n, *image_shape] (data.cache); a file
    that fails (data.verify_images off) is named."""
    try:
        chunks = list(decoded(paths, image_shape).batch(256).as_numpy_iterator())
    except tf.errors.OpError:
        check_decodable(paths, image_shape[-1])
        raise
    return (np.concatenate(chunks) if chunks
            else np.zeros((0, *image_shape), np.float32))


def batch_decoder(paths: tf.Tensor, image_shape: tuple[int, ...]):
    """A batch of indices -> the decoded images of those files (for index-ordered streams)."""
    decode = decoder(image_shape)
    spec = tf.TensorSpec(image_shape, tf.float32)

    def fetch(idx: tf.Tensor) -> tf.Tensor:
        return tf.map_fn(decode, tf.gather(paths, idx), fn_output_signature=spec)
    return fetch


def undecodable(paths, channels: int) -> list[str]:
    """The files of ``paths`` that cannot be read or decoded (truncated or corrupt), found in
    one parallel pass: a failed file is dropped from the stream, so its index is missing."""
    paths = list(paths)
    if not paths:
        return []

    def check(index: tf.Tensor, path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        image = tf.io.decode_image(tf.io.read_file(path), channels=channels,
                                   expand_animations=False)
        return index, tf.shape(image)  # a data dependency: the decode cannot be pruned
    ds = (tf.data.Dataset.from_tensor_slices((np.arange(len(paths)), paths))
          .map(check, num_parallel_calls=tf.data.AUTOTUNE)
          .ignore_errors()
          .batch(1024))
    seen = np.zeros(len(paths), bool)
    for batch, _ in with_thread_budget(ds).as_numpy_iterator():
        seen[batch] = True
    return [p for p, ok in zip(paths, seen) if not ok]


def check_decodable(paths, channels: int) -> None:
    """UserError naming the first of ``paths`` that does not decode with ``channels`` channels."""
    bad = undecodable(paths, channels)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UserError(f"image {bad[0]}{more} cannot be decoded (truncated or corrupt): "
                        f"replace or remove it")

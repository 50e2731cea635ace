"""data.source=images without MPI: class folders of real PNG and JPEG files, decoding and
resizing, the per-class split and sharding, exact resume, the cache, and every bad input."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from helpers import shard_logged
from hvdtrain.training import rundir
from hvdtrain.data import image_decoding, images, sources, tfdata
from hvdtrain.config import DataConfig
from hvdtrain.testing.digit_files import NAMES, SORTED, digits_uint8, sample_photos, write_digits
from hvdtrain.errors import UserError

N = 60  # digits 0..59: 6 per class on average, PNG (8x8) and JPEG (16x16) in each


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images") / "train"
    write_digits(root, range(N))
    (root / NAMES[0] / ".DS_Store").write_bytes(b"\x00junk")  # hidden: not data
    return root


def _cfg(path, **kw) -> DataConfig:
    return DataConfig(source="images", path=str(path), **kw)


def _index(path: str) -> int:
    return int(Path(path).stem[1:])   # d0042.png -> 42


def test_classes_are_the_sorted_folder_names_and_labels_follow_them(tree):
    found = images.scan(str(tree), (8, 8, 1))
    _, y = digits_uint8()
    assert found.class_names == tuple(SORTED) and len(found) == N
    for path, label in zip(found.paths, found.labels):
        assert Path(path).parent.name == SORTED[label]
        assert SORTED[label] == NAMES[y[_index(path)]]          # the digit's own class
    assert {Path(p).suffix for p in found.paths} == {".png", ".jpg"}


def test_decoding_png_is_exact_and_jpeg_resized_from_16x16_is_close(tree):
    x, _ = digits_uint8()
    found = images.scan(str(tree), (8, 8, 1))
    decoded = image_decoding.decode_all(found.paths, (8, 8, 1))
    assert decoded.shape == (N, 8, 8, 1) and decoded.dtype == np.float32
    for path, image in zip(found.paths, decoded):
        want = x[_index(path)] / 255.0
        if path.endswith(".png"):        # lossless and already 8x8: exactly the pixels
            np.testing.assert_allclose(image, want, atol=1e-6)
        else:                            # JPEG at 16x16, resized back to 8x8
            big = np.kron(x[_index(path)], np.ones((2, 2, 1))).astype(np.float32)
            resized = tf.image.resize(big, (8, 8), antialias=True).numpy() / 255.0
            assert np.abs(image - resized).mean() < 0.03      # JPEG's loss only
            assert np.abs(image - want).mean() < 0.1          # antialiasing blurs a little
    # The check is sharp: a neighbouring digit is far away.
    assert np.abs(decoded[0] - x[_index(found.paths[1])] / 255.0).mean() > 0.1


def test_real_photos_are_resized_and_converted_to_the_channels_asked(tmp_path):
    from sklearn.datasets import load_sample_images
    arrays = load_sample_images().images                  # what scikit-learn decodes
    photos = sample_photos()
    colour = image_decoding.decode_all([str(p) for p in photos], (16, 24, 3))
    grey = image_decoding.decode_all([str(p) for p in photos], (16, 24, 1))
    assert colour.shape == (2, 16, 24, 3) and grey.shape == (2, 16, 24, 1)
    for array, rgb, g in zip(arrays, colour, grey):
        want = tf.image.resize(array.astype(np.float32), (16, 24), antialias=True).numpy() / 255
        assert np.abs(rgb - want).mean() < 0.02          # two JPEG decoders, one picture
        luma = rgb @ np.array([0.299, 0.587, 0.114], np.float32)
        assert np.abs(g[..., 0] - luma).mean() < 0.02
    assert np.abs(colour[0] - colour[1]).mean() > 0.1    # sharp: the two photos differ


def test_eval_fraction_is_held_out_per_class(tree):
    found = images.scan(str(tree), (8, 8, 1))
    ds = sources.load(_cfg(tree, eval_fraction=0.25), seed=3)
    assert ds.class_names == tuple(SORTED) and ds.num_classes == 10
    assert sorted(ds.train.paths + ds.eval.paths) == sorted(found.paths)
    assert not set(ds.train.paths) & set(ds.eval.paths)
    for label in range(10):
        n = int(np.sum(found.labels == label))
        assert int(np.sum(ds.eval.labels == label)) == max(1, round(n * 0.25))
    again, other = sources.load(_cfg(tree, eval_fraction=0.25), seed=3), sources.load(
        _cfg(tree, eval_fraction=0.25), seed=4)
    assert again.eval.paths == ds.eval.paths and other.eval.paths != ds.eval.paths


@pytest.mark.parametrize("size", [1, 2, 3])
def test_train_shards_every_class_equal_steps_disjoint_and_complete(tree, size):
    split = images.scan(str(tree), (8, 8, 1))
    batch, epochs = 4, 2
    streams = [sources.train_dataset(split, rank=r, size=size, batch_size=batch, first_epoch=0,
                                  epochs=epochs, seed=5, shuffle=True) for r in range(size)]
    width = max(len(images.own_indices(split, r, size)) for r in range(size))
    assert {s.steps_per_epoch for s in streams} == {math.ceil(width / batch)}
    owned = []
    for rank, stream in enumerate(streams):
        xs, ys = zip(*stream.dataset.as_numpy_iterator())
        assert len(xs) == epochs * stream.steps_per_epoch
        seen = np.concatenate(ys)
        assert len(seen) == epochs * width
        own = images.own_indices(split, rank, size)
        assert set(np.unique(split.labels[own]).tolist()) == set(range(10))  # every class
        owned.append(set(own.tolist()))
    assert set().union(*owned) == set(range(N))
    assert sum(map(len, owned)) == N                      # disjoint


@pytest.mark.parametrize("cache", ["on", "off"])
def test_shard_log_names_the_files_the_stream_yields(tree, tmp_path, monkeypatch, cache):
    split = images.scan(str(tree), (8, 8, 1), cache=cache)
    monkeypatch.setenv(tfdata.SHARD_LOG_ENV, str(tmp_path))
    xs, ids = shard_logged(sources.train_dataset(split, rank=1, size=3, batch_size=4,
                                              first_epoch=0, epochs=2, seed=5, shuffle=True),
                           tmp_path)
    assert set(ids) == {split.paths[i] for i in images.own_indices(split, 1, 3)}
    np.testing.assert_allclose(np.concatenate(xs), image_decoding.decode_all(ids, (8, 8, 1)),
                               atol=1e-6)


def _batches(split, first_epoch, epochs=3, rank=1, size=2, seed=7, **kw):
    stream = sources.train_dataset(split, rank=rank, size=size, batch_size=4,
                                first_epoch=first_epoch, epochs=epochs, seed=seed,
                                shuffle=True, **kw)
    return stream.steps_per_epoch, list(stream.dataset.as_numpy_iterator())


def test_resumed_image_stream_equals_the_uninterrupted_one(tree):
    split = images.scan(str(tree), (8, 8, 1))
    steps, full = _batches(split, 0)
    _, resumed = _batches(split, 2)
    assert len(resumed) == steps
    for (xa, ya), (xb, yb) in zip(full[2 * steps:], resumed):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    # Sharp: epochs differ from each other, and another seed gives another order.
    first = np.concatenate([y for _, y in full[:steps]])
    last = np.concatenate([y for _, y in full[2 * steps:]])
    assert not np.array_equal(first, last)
    _, other = _batches(split, 2, seed=8)
    assert not np.array_equal(np.concatenate([y for _, y in other]), last)


def test_cache_gives_the_same_batches(tree):
    split = images.scan(str(tree), (8, 8, 1))
    cached = images.scan(str(tree), (8, 8, 1), cache="on")
    _, plain = _batches(split, 1)
    _, kept = _batches(cached, 1)
    assert len(plain) == len(kept)
    for (xa, ya), (xb, yb) in zip(plain, kept):
        np.testing.assert_allclose(xa, xb, atol=1e-6)
        np.testing.assert_array_equal(ya, yb)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_eval_is_disjoint_complete_and_unpadded(tree, size):
    split = images.scan(str(tree), (8, 8, 1), cache="on" if size == 2 else "off")
    want = image_decoding.decode_all(split.paths, (8, 8, 1))
    seen = []
    for rank in range(size):
        for x, y in sources.eval_dataset(split, rank=rank, size=size, batch_size=4) \
                .as_numpy_iterator():
            seen += list(zip(x, y))
    assert len(seen) == N
    got = sorted((y, x.tobytes()) for x, y in seen)
    assert got == sorted((y, x.tobytes()) for x, y in zip(want, split.labels))


def test_class_names_are_saved(tree, tmp_path):
    ds = sources.load(_cfg(tree), seed=0)
    rundir.save_class_names(tmp_path, ds.names())
    assert json.loads((tmp_path / "classes.json").read_text())["class_names"] == SORTED


# ---------------------------------------------------------------------------------------------
# Bad input: a UserError naming the file or folder and what to do.

def _bad_tree(root: Path, case: str) -> tuple[DataConfig, str, str]:
    """A small tree with one defect; returns (config, the path named, a phrase)."""
    train = root / "train"
    write_digits(train, range(40))
    some = sorted((train / "three").iterdir())
    if case == "truncated jpeg":
        jpeg = next(p for p in some if p.suffix == ".jpg")
        jpeg.write_bytes(jpeg.read_bytes()[:-40])
        return _cfg(train), str(jpeg), "cannot be decoded (truncated or corrupt)"
    if case == "corrupt jpeg":
        jpeg = next(p for p in some if p.suffix == ".jpg")
        raw = bytearray(jpeg.read_bytes())
        raw[3:40] = b"\x13" * 37                          # the header segments destroyed
        jpeg.write_bytes(bytes(raw))
        return _cfg(train), str(jpeg), "cannot be decoded (truncated or corrupt)"
    if case == "not an image":
        text = train / "three" / "readme.txt"
        text.write_text("these are threes")
        return _cfg(train), str(text), "is not a JPEG or PNG image"
    if case == "empty class":
        (train / "ten").mkdir()
        return _cfg(train), str(train / "ten"), "holds no images"
    if case == "no class folders":
        flat = root / "flat"
        flat.mkdir()
        shutil.copy(some[0], flat / some[0].name)
        return _cfg(flat), str(flat), "holds no class folders"
    if case == "missing folder":
        return _cfg(root / "nope"), str(root / "nope"), "does not exist"
    if case == "a file, not a folder":
        return _cfg(some[0]), str(some[0]), "is a file, not a folder"
    if case == "eval classes differ":
        ev = root / "eval"
        write_digits(ev, range(40, 60))
        shutil.rmtree(ev / "seven")
        (ev / "eleven").mkdir()
        shutil.copy(some[0], ev / "eleven" / some[0].name)
        return _cfg(train, eval_path=str(ev)), str(ev), "seven and has extra eleven"
    if case == "too few to hold out":
        for extra in sorted((train / "two").iterdir())[1:]:
            extra.unlink()
        return _cfg(train), "two", "too few to hold out"
    raise AssertionError(case)


CASES = ["truncated jpeg", "corrupt jpeg", "not an image", "empty class", "no class folders",
         "missing folder", "a file, not a folder", "eval classes differ", "too few to hold out"]


@pytest.mark.fault
@pytest.mark.parametrize("case", CASES)
def test_bad_image_input_is_a_user_error_naming_the_file(tmp_path, case):
    cfg, named, phrase = _bad_tree(tmp_path, case)
    with pytest.raises(UserError) as info:
        ds = sources.load(cfg, seed=0)
        images.check_ready(ds.train, ds.eval, 0, 1, True)
    assert phrase in str(info.value) and named in str(info.value)


@pytest.mark.fault
def test_a_corrupt_file_is_found_by_the_rank_that_owns_it(tmp_path):
    cfg, named, _ = _bad_tree(tmp_path, "truncated jpeg")
    ds = sources.load(cfg, seed=0)
    owner = [r for r in range(2) if named in [ds.train.paths[i] for i in range(r, len(ds.train), 2)]
             + [ds.eval.paths[i] for i in range(r, len(ds.eval), 2)]]
    assert len(owner) == 1
    images.check_ready(ds.train, ds.eval, 1 - owner[0], 2, True)  # the other rank's share is fine
    with pytest.raises(UserError, match="cannot be decoded"):
        images.check_ready(ds.train, ds.eval, owner[0], 2, True)
    images.check_ready(ds.train, ds.eval, owner[0], 2, False)  # off: only the cheap checks


@pytest.mark.fault
def test_a_class_with_fewer_files_than_ranks_is_refused(tmp_path):
    train = tmp_path / "train"
    write_digits(train, range(40))
    ds = sources.load(_cfg(train, eval_path=str(train)), seed=0)
    smallest = int(np.bincount(ds.train.labels).min())
    images.check_ready(ds.train, ds.eval, 0, smallest, True)
    with pytest.raises(UserError) as info:
        images.check_ready(ds.train, ds.eval, 0, smallest + 1, True)
    assert f"holds {smallest} training images but {smallest + 1} ranks" in str(info.value)


@pytest.mark.fault
def test_an_unreadable_folder_is_a_user_error(tmp_path, monkeypatch):
    train = tmp_path / "train"
    write_digits(train, range(20))
    real = os.scandir

    def scandir(path):      # root ignores permission bits, so deny the read here
        if Path(path) == train / "four":
            raise PermissionError(13, "Permission denied")
        return real(path)
    monkeypatch.setattr(images.os, "scandir", scandir)
    with pytest.raises(UserError, match=f"{train / 'four'} is not readable"):
        sources.load(_cfg(train), seed=0)


@pytest.mark.fault
@pytest.mark.parametrize("shape", [(8, 8), (8, 8, 2), (8, 8, 4)])
def test_images_need_one_or_three_channels(shape):
    with pytest.raises(UserError, match="1 \\(grey\\) or 3 \\(colour\\)"):
        DataConfig(source="images", path="x", image_shape=shape)

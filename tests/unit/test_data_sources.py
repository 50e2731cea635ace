"""hvdtrain.data.sources' sources without MPI: digits, synthetic, npz and tfrecord, each loaded
and checked, and each of their user errors (a missing, garbled, truncated or mismatched file, a
bad label, a bad file spec); and that loading them imports no Horovod."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import RECORD_SHAPE, record_config, write_records, write_shards
from hvdtrain.data import records, sources
from hvdtrain.config import DataConfig
from hvdtrain.errors import UserError

# The sources are hvdtrain's over numpy and tf.data calls both TensorFlow versions share; on
# the other stack the core's multi-rank tests load them end to end.
pytestmark = pytest.mark.one_stack


def test_data_module_does_not_import_horovod():
    code = ("import sys, hvdtrain.data.sources; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'horovod']; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# digits

@pytest.fixture(scope="module")
def digits() -> sources.DataSet:
    return sources.load(DataConfig(source="digits"), seed=0)


def test_digits_split_sizes_and_values(digits):
    assert len(digits.train) == 1437 and len(digits.eval) == 360
    assert digits.input_shape == (8, 8, 1) and digits.num_classes == 10
    for split in (digits.train, digits.eval):
        assert split.x.shape[1:] == (8, 8, 1)
        assert split.x.dtype == np.float32 and split.y.dtype == np.int32
        assert split.x.min() == 0.0 and split.x.max() == 1.0
        assert set(np.unique(split.y).tolist()) == set(range(10))


def test_digits_train_and_eval_are_disjoint(digits):
    train_rows = {row.tobytes() for row in digits.train.x}
    eval_rows = {row.tobytes() for row in digits.eval.x}
    assert len(train_rows) == 1437 and len(eval_rows) == 360   # no duplicates inside a split
    assert not train_rows & eval_rows


def test_digits_split_is_fixed(digits):
    again = sources.load(DataConfig(source="digits"), seed=123)   # the seed does not matter
    for a, b in ((digits.train, again.train), (digits.eval, again.eval)):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)


# ---------------------------------------------------------------------------------------------
# synthetic

SYNTH = DataConfig(source="synthetic", num_samples=200, image_shape=(4, 4, 2), num_classes=5,
                   eval_fraction=0.25)


def test_synthetic_shapes_and_classes():
    ds = sources.load(SYNTH, seed=3)
    assert len(ds.train) == 150 and len(ds.eval) == 50
    assert ds.input_shape == (4, 4, 2) and ds.num_classes == 5
    for split in (ds.train, ds.eval):
        assert split.x.shape[1:] == (4, 4, 2) and split.x.dtype == np.float32
        assert split.y.dtype == np.int32
        assert split.y.min() >= 0 and split.y.max() <= 4
    assert len(np.unique(ds.train.y)) >= 3      # a real classification problem, not one class


def test_synthetic_is_deterministic_per_seed():
    a, b, c = sources.load(SYNTH, seed=3), sources.load(SYNTH, seed=3), sources.load(SYNTH, seed=4)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.train.y, b.train.y)
    np.testing.assert_array_equal(a.eval.x, b.eval.x)
    assert not np.array_equal(a.train.x, c.train.x)
    assert not np.array_equal(a.eval.x, c.eval.x)


def test_synthetic_train_and_eval_are_disjoint():
    ds = sources.load(SYNTH, seed=3)
    train_rows = {r.tobytes() for r in ds.train.x}
    assert not train_rows & {r.tobytes() for r in ds.eval.x}


# ---------------------------------------------------------------------------------------------
# npz

def _npz_cfg(path, **kw) -> DataConfig:
    return DataConfig(source="npz", path=str(path), **kw)


def test_npz_loads_and_scales_uint8(tmp_path):
    x = (np.arange(20 * 9) % 256).astype(np.uint8).reshape(20, 3, 3)
    x[0, 0, 0] = 255
    y = (np.arange(20) % 4).astype(np.int64)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    ds = sources.load(_npz_cfg(tmp_path / "d.npz", num_classes=0), seed=1)
    assert ds.num_classes == 4                     # inferred as max(y)+1
    assert ds.input_shape == (3, 3)
    assert len(ds.train) == 16 and len(ds.eval) == 4
    together = np.concatenate([ds.train.x, ds.eval.x])
    assert together.dtype == np.float32
    assert together.min() >= 0.0 and together.max() == pytest.approx(1.0)
    # Every original row is there exactly once, divided by 255, with its own label.
    expected = {(r.astype(np.float32) / 255).round(5).tobytes(): int(label)
                for r, label in zip(x, y)}
    got = {r.round(5).tobytes(): int(label)
           for r, label in zip(together, np.concatenate([ds.train.y, ds.eval.y]))}
    assert got == expected


def test_npz_float_inputs_are_not_rescaled(tmp_path):
    x = np.linspace(-3, 3, 10 * 2, dtype=np.float64).reshape(10, 2)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(10) % 2)
    ds = sources.load(_npz_cfg(tmp_path / "d.npz", num_classes=2), seed=1)
    together = np.concatenate([ds.train.x, ds.eval.x])
    assert together.min() == pytest.approx(-3) and together.max() == pytest.approx(3)


def test_npz_with_eval_path(tmp_path):
    xt, yt = np.random.default_rng(0).random((12, 5)), np.arange(12) % 3
    xe, ye = np.random.default_rng(1).random((5, 5)), np.array([0, 1, 2, 2, 1])
    np.savez(tmp_path / "train.npz", x=xt, y=yt)
    np.savez(tmp_path / "eval.npz", x=xe, y=ye)
    ds = sources.load(_npz_cfg(tmp_path / "train.npz", eval_path=str(tmp_path / "eval.npz"),
                            num_classes=3), seed=0)
    assert len(ds.train) == 12 and len(ds.eval) == 5     # nothing held out of train
    np.testing.assert_allclose(ds.train.x, xt.astype(np.float32))
    np.testing.assert_array_equal(ds.train.y, yt)
    np.testing.assert_allclose(ds.eval.x, xe.astype(np.float32))
    np.testing.assert_array_equal(ds.eval.y, ye)
    assert ds.num_classes == 3 and ds.input_shape == (5,)


def _bad_npz(tmp_path, case):
    """Writes the bad input of ``case``; returns (config, key phrase of the message)."""
    good = tmp_path / "good.npz"
    np.savez(good, x=np.zeros((6, 4), np.float32), y=np.arange(6) % 3)
    path = tmp_path / "bad.npz"
    if case == "missing":
        return _npz_cfg(tmp_path / "nope.npz"), "does not exist"
    if case == "garbage":
        path.write_bytes(b"this is not a numpy file at all\x00\x01\x02" * 8)
        return _npz_cfg(path), "not a readable .npz"
    if case == "garbage_zip":
        path.write_bytes(b"PK\x03\x04" + b"\xff" * 64)
        return _npz_cfg(path), "not a readable .npz"
    if case == "no_y":
        np.savez(path, x=np.zeros((4, 2)), labels=np.zeros(4, int))
        return _npz_cfg(path), "no array y"
    if case == "length":
        np.savez(path, x=np.zeros((5, 2)), y=np.zeros(4, int))
        return _npz_cfg(path), "x has 5 samples but y has 4"
    if case == "label_too_big":
        np.savez(path, x=np.zeros((6, 2)), y=np.array([0, 1, 2, 3, 4, 5]))
        return _npz_cfg(path, num_classes=3), "data.num_classes=6"
    if case == "negative_label":
        np.savez(path, x=np.zeros((4, 2)), y=np.array([0, -1, 1, 2]))
        return _npz_cfg(path, num_classes=3), "labels range over -1..2"
    if case == "float_labels":
        np.savez(path, x=np.zeros((4, 2)), y=np.array([0.0, 1.0, 0.0, 1.0]))
        return _npz_cfg(path), "integer class ids"
    if case in ("nan", "inf"):
        x = np.zeros((5, 2), np.float32)
        x[3, 1] = np.nan if case == "nan" else -np.inf
        np.savez(path, x=x, y=np.arange(5) % 3)
        return _npz_cfg(path), "NaN or infinite values in 1 samples (the first is sample 3)"
    if case == "empty":
        np.savez(path, x=np.zeros((0, 2)), y=np.zeros(0, int))
        return _npz_cfg(path), "no samples"
    if case == "eval_shape":
        np.savez(path, x=np.zeros((3, 5), np.float32), y=np.array([0, 1, 2]))
        return _npz_cfg(good, eval_path=str(path), num_classes=3), "must match"
    if case == "eval_missing":
        return _npz_cfg(good, eval_path=str(tmp_path / "nope.npz"), num_classes=3), \
            "does not exist"
    if case == "eval_label_too_big":
        np.savez(path, x=np.zeros((3, 4), np.float32), y=np.array([0, 1, 7]))
        return _npz_cfg(good, eval_path=str(path), num_classes=3), "data.num_classes=8"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing", "garbage", "garbage_zip", "no_y", "length",
                                  "label_too_big", "negative_label", "float_labels", "nan",
                                  "inf", "empty",
                                  "eval_shape", "eval_missing", "eval_label_too_big"])
def test_npz_bad_inputs_are_user_errors(tmp_path, case):
    cfg, phrase = _bad_npz(tmp_path, case)
    with pytest.raises(UserError) as info:
        sources.load(cfg, seed=0)
    message = str(info.value)
    assert phrase in message
    bad_file = cfg.eval_path if case.startswith("eval") else cfg.path
    assert bad_file in message                             # says which file is wrong


def test_npz_given_a_plain_npy_file_is_a_user_error(tmp_path):
    # np.save writes .npy (one array), a likely mix-up for np.savez: np.load then returns an
    # ndarray instead of an NpzFile.
    path = tmp_path / "data.npy"
    np.save(path, np.zeros((4, 2), np.float32))
    with pytest.raises(UserError) as info:
        sources.load(_npz_cfg(path), seed=0)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------------------------
# tfrecord

SHAPE = RECORD_SHAPE


def test_tfrecord_counts_records_in_every_file(tmp_path):
    paths = write_shards(tmp_path / "train", [3, 5, 2])
    ev = write_records(tmp_path / "eval.tfrecord", range(4))
    ds = sources.load(record_config(tmp_path / "train", ev), seed=0)
    assert isinstance(ds.train, sources.Records)
    assert ds.train.files == tuple(map(str, paths))
    assert ds.train.counts == (3, 5, 2) and len(ds.train) == 10
    assert ds.eval.counts == (4,) and len(ds.eval) == 4
    assert ds.input_shape == SHAPE and ds.num_classes == 3
    assert ds.train.image_shape == SHAPE


def test_resolve_files_directory_glob_and_list(tmp_path):
    a = write_shards(tmp_path / "a", [1, 1, 1])
    b = write_shards(tmp_path / "b", [1], prefix="other")
    (tmp_path / "a" / "sub").mkdir()                       # a subdirectory is not a file
    (tmp_path / "a" / "notes.txt").write_text("x")
    # A directory: all its files (not its subdirectories), sorted.
    assert records.resolve_files(str(tmp_path / "a")) == \
        sorted([*map(str, a), str(tmp_path / "a" / "notes.txt")])
    # A glob, sorted.
    assert records.resolve_files(str(tmp_path / "a" / "part-*.tfrecord")) == list(map(str, a))
    assert records.resolve_files(str(tmp_path / "a" / "part-0[02].tfrecord")) == [str(a[0]),
                                                                                str(a[2])]
    # A comma-separated list of any of these, in the order given, blanks ignored.
    spec = f"{b[0]} , {tmp_path / 'a' / 'part-*.tfrecord'},,"
    assert records.resolve_files(spec) == [str(b[0]), *map(str, a)]
    assert records.resolve_files(str(a[1])) == [str(a[1])]


@pytest.mark.parametrize("spec", ["nope.tfrecord", "nope-*.tfrecord", "emptydir",
                                  "ok.tfrecord,nope.tfrecord"])
def test_resolve_files_missing_is_a_user_error(tmp_path, spec):
    write_records(tmp_path / "ok.tfrecord", [1])
    (tmp_path / "emptydir").mkdir()
    full = ",".join(str(tmp_path / part) for part in spec.split(","))
    with pytest.raises(UserError) as info:
        records.resolve_files(full)
    assert "no data files at" in str(info.value)
    assert str(tmp_path / spec.split(",")[-1]) in str(info.value)   # names the bad part


def test_tfrecord_glob_and_list_specs_load(tmp_path):
    write_shards(tmp_path / "d", [2, 3, 4])
    ev = write_shards(tmp_path / "e", [2, 2], prefix="ev")
    ds = sources.load(record_config(tmp_path / "d" / "*.tfrecord", f"{ev[0]},{ev[1]}"), seed=0)
    assert ds.train.counts == (2, 3, 4) and ds.eval.counts == (2, 2)


def test_tfrecord_truncated_file_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(5))
    raw = path.read_bytes()
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    for cut in (1, 7, 30):
        path.write_bytes(raw[:-cut])
        with pytest.raises(UserError) as info:
            sources.load(record_config(path, ev), seed=0)
        assert str(path) in str(info.value) and "truncated" in str(info.value)
        assert "{{" not in str(info.value) and "Op:" not in str(info.value)  # no TF internals


@pytest.mark.parametrize("content, fragment", [
    (b"definitely not a tfrecord file" * 10, "not a valid TFRecord file"),
    (b"", "holds no records"),
])
def test_tfrecord_garbage_or_empty_file_is_a_user_error(tmp_path, content, fragment):
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(content)
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError, match=fragment):
        sources.load(record_config(path, ev), seed=0)


def test_tfrecord_missing_path_is_a_user_error(tmp_path):
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError, match="no data files at"):
        sources.load(record_config(tmp_path / "missing.tfrecord", ev), seed=0)
    train = write_records(tmp_path / "train.tfrecord", range(2))
    with pytest.raises(UserError, match="no data files at .*missing-eval"):
        sources.load(record_config(train, tmp_path / "missing-eval"), seed=0)


def test_tfrecord_wrong_image_size_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(3), shape=(5, 5, 1))
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError) as info:
        sources.load(record_config(path, ev), seed=0)
    message = str(info.value)
    assert "25 bytes" in message and "needs 16" in message and "data.image_shape" in message


def test_tfrecord_label_out_of_range_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(3), labels=[0, 1, 9])
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError) as info:
        sources.load(record_config(path, ev), seed=0)
    assert "data.num_classes=10" in str(info.value) and str(path) in str(info.value)
    neg = write_records(tmp_path / "n.tfrecord", range(2), labels=[0, -2])
    with pytest.raises(UserError, match="labels range over -2..0"):
        sources.load(record_config(path.parent / "eval.tfrecord", neg), seed=0)


def test_tfrecord_wrong_features_are_a_user_error(tmp_path):
    path = tmp_path / "f.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "img": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * 16]))}))
            .SerializeToString())
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError, match="'image_raw'.*'label'"):
        sources.load(record_config(path, ev), seed=0)


def test_tfrecord_without_eval_path_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(3))
    with pytest.raises(UserError, match="data.eval_path"):
        sources.load(DataConfig(source="tfrecord", path=str(path), image_shape=SHAPE,
                             num_classes=3), seed=0)

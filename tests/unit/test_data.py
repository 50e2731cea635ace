"""hvdtrain.data.sources without MPI: sources (digits, synthetic, npz, tfrecord), their user
errors, and the per-rank pipelines for any (rank, size), checked against what every rank actually
yields."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import RECORD_SHAPE, shard_logged, write_records, write_shards
from hvdtrain.data import records, sharding, sources, tfdata
from hvdtrain.config import DataConfig
from hvdtrain.errors import UserError

# The pipelines are hvdtrain's over tf.data calls both TensorFlow versions share; on the other
# stack the core's multi-rank tests (2 ranks x B = 1 rank x 2B, resume, the sparse and uneven
# shards) run them end to end.
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


def _tfr_cfg(path, eval_path, **kw) -> DataConfig:
    kw.setdefault("image_shape", SHAPE)
    kw.setdefault("num_classes", 3)
    return DataConfig(source="tfrecord", path=str(path), eval_path=str(eval_path), **kw)


def test_tfrecord_counts_records_in_every_file(tmp_path):
    paths = write_shards(tmp_path / "train", [3, 5, 2])
    ev = write_records(tmp_path / "eval.tfrecord", range(4))
    ds = sources.load(_tfr_cfg(tmp_path / "train", ev), seed=0)
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
    ds = sources.load(_tfr_cfg(tmp_path / "d" / "*.tfrecord", f"{ev[0]},{ev[1]}"), seed=0)
    assert ds.train.counts == (2, 3, 4) and ds.eval.counts == (2, 2)


def test_tfrecord_truncated_file_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(5))
    raw = path.read_bytes()
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    for cut in (1, 7, 30):
        path.write_bytes(raw[:-cut])
        with pytest.raises(UserError) as info:
            sources.load(_tfr_cfg(path, ev), seed=0)
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
        sources.load(_tfr_cfg(path, ev), seed=0)


def test_tfrecord_missing_path_is_a_user_error(tmp_path):
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError, match="no data files at"):
        sources.load(_tfr_cfg(tmp_path / "missing.tfrecord", ev), seed=0)
    train = write_records(tmp_path / "train.tfrecord", range(2))
    with pytest.raises(UserError, match="no data files at .*missing-eval"):
        sources.load(_tfr_cfg(train, tmp_path / "missing-eval"), seed=0)


def test_tfrecord_wrong_image_size_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(3), shape=(5, 5, 1))
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError) as info:
        sources.load(_tfr_cfg(path, ev), seed=0)
    message = str(info.value)
    assert "25 bytes" in message and "needs 16" in message and "data.image_shape" in message


def test_tfrecord_label_out_of_range_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(3), labels=[0, 1, 9])
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError) as info:
        sources.load(_tfr_cfg(path, ev), seed=0)
    assert "data.num_classes=10" in str(info.value) and str(path) in str(info.value)
    neg = write_records(tmp_path / "n.tfrecord", range(2), labels=[0, -2])
    with pytest.raises(UserError, match="labels range over -2..0"):
        sources.load(_tfr_cfg(path.parent / "eval.tfrecord", neg), seed=0)


def test_tfrecord_wrong_features_are_a_user_error(tmp_path):
    path = tmp_path / "f.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "img": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * 16]))}))
            .SerializeToString())
    ev = write_records(tmp_path / "eval.tfrecord", range(2))
    with pytest.raises(UserError, match="'image_raw'.*'label'"):
        sources.load(_tfr_cfg(path, ev), seed=0)


def test_tfrecord_without_eval_path_is_a_user_error(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", range(3))
    with pytest.raises(UserError, match="data.eval_path"):
        sources.load(DataConfig(source="tfrecord", path=str(path), image_shape=SHAPE,
                             num_classes=3), seed=0)


# ---------------------------------------------------------------------------------------------
# Array pipelines

def indexed(n: int) -> sources.Arrays:
    """x holds each sample's index (twice, to have a 2-D input), y = index % 10."""
    idx = np.arange(n, dtype=np.float32)
    return sources.Arrays(np.stack([idx, -idx], axis=1), (np.arange(n) % 10).astype(np.int32))


def _check_pairs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The sample indices of a batch, after checking x and y belong to the same samples."""
    index = x[:, 0].astype(np.int64)
    np.testing.assert_array_equal(x[:, 1], -x[:, 0])
    np.testing.assert_array_equal(y, index % 10)
    return index


N, BATCH, EPOCHS, SEED = 11, 3, 3, 17


def _all_batches(ds: tf.data.Dataset, expected: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exactly ``expected`` batches, and the dataset is exhausted after them."""
    it = ds.as_numpy_iterator()
    batches = [next(it) for _ in range(expected)]
    with pytest.raises(StopIteration):
        next(it)
    return batches


@pytest.mark.parametrize("size", [1, 2, 3])
def test_array_train_epochs_are_equal_complete_and_disjoint(size):
    split = indexed(N)
    steps = sharding.steps_per_epoch(N, size, BATCH)
    shard = sharding.padded_shard_size(N, size)
    per_rank = []
    for rank in range(size):
        stream = sources.train_dataset(split, rank=rank, size=size, batch_size=BATCH,
                                    first_epoch=0, epochs=EPOCHS, seed=SEED, shuffle=True)
        assert stream.steps_per_epoch == steps == math.ceil(math.ceil(N / size) / BATCH)
        assert stream.samples_per_epoch == shard
        batches = _all_batches(stream.dataset, EPOCHS * steps)
        epochs = []
        for e in range(EPOCHS):
            chunk = batches[e * steps:(e + 1) * steps]
            sizes = [len(x) for x, _ in chunk]
            assert all(s == BATCH for s in sizes[:-1]) and 1 <= sizes[-1] <= BATCH
            assert sum(sizes) == shard
            for x, y in chunk:
                assert x.shape[1:] == (2,) and x.dtype == np.float32 and y.dtype == np.int32
            epochs.append(np.concatenate([_check_pairs(x, y) for x, y in chunk]))
        per_rank.append(epochs)

    for e in range(EPOCHS):
        seen = [set(per_rank[r][e].tolist()) for r in range(size)]
        for r in range(size):                            # a rank sees exactly its own shard
            assert seen[r] == set(sharding.shard_indices(N, r, size).tolist())
            for q in range(r):
                assert not seen[r] & seen[q]             # unpadded shards are disjoint
        assert set().union(*seen) == set(range(N))       # every sample, every epoch
    for r in range(size):                                # shuffle: epochs differ in order
        assert not all(np.array_equal(per_rank[r][0], per_rank[r][e]) for e in range(EPOCHS))


@pytest.mark.parametrize("size", [1, 2, 3])
def test_array_train_resume_gives_the_same_batches(size):
    split = indexed(N)
    steps = sharding.steps_per_epoch(N, size, BATCH)
    for rank in range(size):
        kw = dict(rank=rank, size=size, batch_size=BATCH, epochs=EPOCHS, seed=SEED,
                  shuffle=True)
        full = _all_batches(sources.train_dataset(split, first_epoch=0, **kw).dataset,
                            EPOCHS * steps)
        for first in range(1, EPOCHS):
            stream = sources.train_dataset(split, first_epoch=first, **kw)
            assert stream.steps_per_epoch == steps
            resumed = _all_batches(stream.dataset, (EPOCHS - first) * steps)
            for (xa, ya), (xb, yb) in zip(full[first * steps:], resumed):
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)


def test_array_train_resume_at_the_last_epoch_is_empty():
    # A run resumed when it already reached train.epochs: the trainer builds the stream before
    # it checks whether anything is left to train, so this must work and yield no batches.
    stream = sources.train_dataset(indexed(N), rank=0, size=2, batch_size=BATCH,
                                first_epoch=EPOCHS, epochs=EPOCHS, seed=SEED, shuffle=True)
    assert stream.steps_per_epoch == sharding.steps_per_epoch(N, 2, BATCH)
    assert _all_batches(stream.dataset, 0) == []


def test_array_train_without_shuffle_keeps_shard_order():
    # N=7, size 2: rank 1 owns 1,3,5 and pads to 4 by wrapping around its own shard.
    stream = sources.train_dataset(indexed(7), rank=1, size=2, batch_size=3, first_epoch=0,
                                epochs=2, seed=0, shuffle=False)
    batches = _all_batches(stream.dataset, 4)
    order = [_check_pairs(x, y).tolist() for x, y in batches]
    assert order == [[1, 3, 5], [1], [1, 3, 5], [1]]


def test_array_train_seed_changes_the_order():
    kw = dict(rank=0, size=1, batch_size=N, first_epoch=0, epochs=1, shuffle=True)
    a = _all_batches(sources.train_dataset(indexed(N), seed=1, **kw).dataset, 1)[0][0]
    b = _all_batches(sources.train_dataset(indexed(N), seed=1, **kw).dataset, 1)[0][0]
    c = _all_batches(sources.train_dataset(indexed(N), seed=2, **kw).dataset, 1)[0][0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_shard_log_names_the_rows_the_stream_yields_and_is_absent_unset(tmp_path,
                                                                        monkeypatch):
    kw = dict(rank=1, size=2, batch_size=BATCH, first_epoch=0, epochs=2, seed=SEED,
              shuffle=True)
    monkeypatch.setenv(tfdata.SHARD_LOG_ENV, str(tmp_path))
    logged = sources.train_dataset(indexed(N), **kw)
    xs, ids = shard_logged(logged, tmp_path)
    rows = np.concatenate([x[:, 0] for x in xs]).astype(int).tolist()
    assert [int(i) for i in ids] == rows          # padded: the wrapped-around row twice
    # Unset, the stream has no step of the log's (its graph holds no Python call).
    monkeypatch.delenv(tfdata.SHARD_LOG_ENV)
    assert b"EagerPyFunc" in logged.dataset._as_serialized_graph().numpy()
    assert b"EagerPyFunc" not in sources.train_dataset(
        indexed(N), **kw).dataset._as_serialized_graph().numpy()


@pytest.mark.parametrize("n, size", [(7, 2), (7, 3), (11, 3), (5, 1)])
def test_array_eval_is_disjoint_complete_and_unpadded(n, size):
    split = indexed(n)
    seen = []
    for rank in range(size):
        batches = list(sources.eval_dataset(split, rank=rank, size=size, batch_size=2)
                       .as_numpy_iterator())
        assert all(len(x) <= 2 for x, _ in batches)
        idx = np.concatenate([_check_pairs(x, y) for x, y in batches])
        assert len(idx) == len(set(idx.tolist()))        # nothing twice on one rank
        seen.append(idx)
    together = np.concatenate(seen)
    assert len(together) == n                            # no padding anywhere
    assert sorted(together.tolist()) == list(range(n))   # disjoint and complete


# ---------------------------------------------------------------------------------------------
# TFRecord pipelines

def _pixels(x: np.ndarray) -> np.ndarray:
    """The record index stored in each image (every pixel holds it)."""
    values = np.rint(x * 255).astype(np.int64)
    assert (values == values.reshape(len(values), -1)[:, :1, None, None]).all()
    return values[:, 0, 0, 0]


def _records(tmp_path, counts, cache="off") -> sources.Records:
    folder = tmp_path / "records"
    write_shards(folder, counts)
    ev = write_records(tmp_path / "eval.tfrecord", range(3))
    return sources.load(_tfr_cfg(folder, ev, cache=cache), seed=0).train


KEPT_OR_STREAMED = pytest.mark.parametrize("cache", ["on", "off"])   # data.cache's two paths


@pytest.mark.parametrize("cache, count, kept", [
    ("on", 10**9, True), ("off", 1, False),
    ("auto", tfdata.AUTO_CACHE_BYTES // (4 * 64), True),       # 8x8x1 float32: 256 B each
    ("auto", tfdata.AUTO_CACHE_BYTES // (4 * 64) + 1, False)])
def test_auto_cache_keeps_what_fits_in_a_gib(cache, count, kept):
    assert tfdata.keeps_in_memory(cache, count, (8, 8, 1)) is kept


@KEPT_OR_STREAMED
@pytest.mark.parametrize("counts, owned", [
    ((3, 5, 2, 4), [set(range(0, 3)) | set(range(8, 10)),      # files 0 and 2
                    set(range(3, 8)) | set(range(10, 14))]),   # files 1 and 3
    ((7,), [{0, 2, 4, 6}, {1, 3, 5}]),                         # one file: record sharding
])
@pytest.mark.parametrize("shuffle", [True, False])
def test_record_train_equal_steps_and_own_shard(tmp_path, counts, owned, shuffle, cache):
    split = _records(tmp_path, counts, cache)
    batch = 2
    streams = [sources.train_dataset(split, rank=r, size=2, batch_size=batch, first_epoch=0,
                                  epochs=2, seed=5, shuffle=shuffle, shuffle_buffer=64)
               for r in range(2)]
    steps = math.ceil(max(len(o) for o in owned) / batch)
    assert [s.steps_per_epoch for s in streams] == [steps, steps]
    assert [s.samples_per_epoch for s in streams] == [steps * batch] * 2
    for rank, stream in enumerate(streams):
        batches = list(stream.dataset.take(2 * steps).as_numpy_iterator())
        assert len(batches) == 2 * steps                 # enough batches for every epoch
        for x, y in batches:
            assert x.shape == (batch, *SHAPE) and x.dtype == np.float32
            assert y.shape == (batch,) and y.dtype == np.int32
            assert 0.0 <= x.min() and x.max() <= 1.0
        idx = np.concatenate([_pixels(x) for x, _ in batches])
        labels = np.concatenate([y for _, y in batches])
        np.testing.assert_array_equal(labels, idx % 3)   # label travels with its image
        assert set(idx.tolist()) <= owned[rank]          # a rank reads only its own share
        if not shuffle:                                  # in order: epoch 1 covers the shard
            first = np.concatenate([_pixels(x) for x, _ in batches[:steps]])
            assert set(first.tolist()) == owned[rank]


@KEPT_OR_STREAMED
@pytest.mark.parametrize("counts", [(3, 5, 2, 4), (7,)])   # whole files, record by record
def test_shard_log_names_the_records_the_stream_yields(tmp_path, monkeypatch, counts, cache):
    split = _records(tmp_path, counts, cache)
    starts = dict(zip(split.files, np.cumsum((0, *split.counts)).tolist()))
    monkeypatch.setenv(tfdata.SHARD_LOG_ENV, str(tmp_path))
    xs, ids = shard_logged(sources.train_dataset(
        split, rank=1, size=2, batch_size=2, first_epoch=0, epochs=2, seed=5, shuffle=True,
        shuffle_buffer=3), tmp_path)
    positions = [starts[f] + int(i) for f, i in (name.rsplit(":", 1) for name in ids)]
    assert positions == np.concatenate([_pixels(x) for x in xs]).tolist()


@KEPT_OR_STREAMED
@pytest.mark.parametrize("counts", [(3, 5, 2, 4), (7,)])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_record_eval_is_disjoint_complete_and_unpadded(tmp_path, counts, size, cache):
    split = _records(tmp_path, counts, cache)
    seen = []
    for rank in range(size):
        for x, y in sources.eval_dataset(split, rank=rank, size=size, batch_size=4) \
                .as_numpy_iterator():
            assert x.shape[1:] == SHAPE and len(x) <= 4
            seen.extend(_pixels(x).tolist())
            np.testing.assert_array_equal(y, _pixels(x) % 3)
    assert sorted(seen) == list(range(sum(counts)))


@KEPT_OR_STREAMED
@pytest.mark.parametrize("counts", [(3, 5, 2, 4), (7,)])   # whole files, record by record
def test_resumed_record_stream_equals_the_uninterrupted_one(tmp_path, counts, cache):
    split = _records(tmp_path, counts, cache)

    def stream(first_epoch, seed=5):
        s = sources.train_dataset(split, rank=1, size=2, batch_size=2, first_epoch=first_epoch,
                               epochs=4, seed=seed, shuffle=True, shuffle_buffer=3)
        return s.steps_per_epoch, [_pixels(x) for x, _ in s.dataset.as_numpy_iterator()]
    steps, full = stream(0)
    assert len(full) == 4 * steps
    _, resumed = stream(2)
    assert len(resumed) == 2 * steps
    for a, b in zip(full[2 * steps:], resumed):
        np.testing.assert_array_equal(a, b)
    # Sharp: the epochs differ from each other, and another seed replays another order.
    epochs = [np.concatenate(full[e * steps:(e + 1) * steps]) for e in range(4)]
    assert len({e.tobytes() for e in epochs}) > 1
    _, other = stream(2, seed=6)
    assert not np.array_equal(np.concatenate(other), np.concatenate(resumed))

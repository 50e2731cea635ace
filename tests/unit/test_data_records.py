"""hvdtrain.data.sources' per-rank pipelines of TFRecord files without MPI, each both kept in
memory and streamed (data.cache): every rank as many steps as the others and its own share of
the files (or of the records, for one file), evaluation disjoint, complete and unpadded, a
resumed stream equal to the uninterrupted one, and the shard log naming the records a stream
yields; and the 1 GiB rule of data.cache=auto."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import RECORD_SHAPE, record_config, shard_logged, write_records, write_shards
from hvdtrain.data import sources, tfdata

# The pipelines are hvdtrain's over tf.data calls both TensorFlow versions share; on the other
# stack the core's multi-rank tests (2 ranks x B = 1 rank x 2B, resume, the sparse and uneven
# shards) run them end to end.
pytestmark = pytest.mark.one_stack

SHAPE = RECORD_SHAPE


def _pixels(x: np.ndarray) -> np.ndarray:
    """The record index stored in each image (every pixel holds it)."""
    values = np.rint(x * 255).astype(np.int64)
    assert (values == values.reshape(len(values), -1)[:, :1, None, None]).all()
    return values[:, 0, 0, 0]


def _records(tmp_path, counts, cache="off") -> sources.Records:
    folder = tmp_path / "records"
    write_shards(folder, counts)
    ev = write_records(tmp_path / "eval.tfrecord", range(3))
    return sources.load(record_config(folder, ev, cache=cache), seed=0).train


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

"""``horovod.bucket_mb`` and ``horovod.flatten`` without a launcher: the reducer's bucketing
arithmetic (which gradients share an all-reduce), each bucket sent as one flat tensor and split
back in place, the config's check and the banner. Across ranks (2 x B == 1 x 2B on every bucket
size, one Horovod op per bucket, flat and grouped alike to the bit):
tests/multirank/test_binding.py."""
from __future__ import annotations

import dataclasses
import itertools
import random
import re

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import distributed as dist
from hvdtrain.training import report
from hvdtrain.config import presets
from hvdtrain.config import HorovodConfig
from hvdtrain.config.sections import AUTO_BUCKET_MB
from hvdtrain.distributed import reducer
from hvdtrain.launch import rank_env
from hvdtrain.distributed.reducer import buckets, flat_layout
from hvdtrain.errors import UserError


def test_buckets_run_from_the_last_gradient_to_the_first():
    # Backprop computes the last layers' gradients first: they make the first bucket (in
    # variable order within it).
    assert buckets([4, 4, 4, 4], 8) == [[2, 3], [0, 1]]
    assert buckets([4, 4, 4], 8) == [[1, 2], [0]]


def test_a_bucket_is_closed_when_the_next_gradient_would_take_it_past_the_limit():
    assert buckets([4, 4, 4, 4], 12) == [[1, 2, 3], [0]]  # exactly the limit: still fits
    assert buckets([4, 4, 4, 4], 11) == [[2, 3], [0, 1]]  # one byte less: it does not
    assert buckets([4, 4, 4, 4], 7) == [[3], [2], [1], [0]]
    assert buckets([4, 4, 4, 4], 1) == [[3], [2], [1], [0]]


def test_a_gradient_larger_than_the_bucket_goes_alone():
    assert buckets([4, 100, 4, 4], 8) == [[2, 3], [1], [0]]
    assert buckets([100, 4, 4], 8) == [[1, 2], [0]]
    # A shape unknown when traced counts as larger than any bucket.
    assert buckets([4, None, 4], 1_000) == [[2], [1], [0]]


def test_size_zero_makes_one_bucket_in_variable_order():
    assert buckets([4, 100, None, 4], 0) == [[0, 1, 2, 3]]
    assert buckets([], 0) == [] and buckets([], 8) == []


def test_gradients_that_fit_one_bucket_are_laid_out_as_at_size_zero():
    # The same flat tensor, so the same sums in the same order: auto's buckets across hosts
    # train a small model to the bit as one all-reduce on one host does.
    for sizes in ([4, 100, 4, 4], [7], [1, 2, 3, 4, 5]):
        assert buckets(sizes, sum(sizes)) == buckets(sizes, 0) == [list(range(len(sizes)))]
    # Control: a byte less than all of them makes two buckets.
    assert buckets([1, 2, 3, 4, 5], 14) == [[1, 2, 3, 4], [0]]


def test_every_gradient_lands_in_exactly_one_bucket_within_the_limit():
    rng = random.Random(0)
    for _ in range(200):
        sizes = [rng.randint(1, 50) for _ in range(rng.randint(1, 20))]
        limit = rng.randint(1, 120)
        got = buckets(sizes, limit)
        assert sorted(i for bucket in got for i in bucket) == list(range(len(sizes)))
        # Consecutive positions, ascending within a bucket, the buckets from the last
        # positions to the first.
        assert [i for bucket in reversed(got) for i in bucket] == list(range(len(sizes)))
        for bucket in got:
            assert len(bucket) == 1 or sum(sizes[i] for i in bucket) <= limit
        # Greedy: no bucket could have taken the next bucket's first gradient (its last).
        for this, after in zip(got, got[1:]):
            assert sum(sizes[i] for i in this) + sizes[after[-1]] > limit


def test_bucket_mb_below_zero_but_auto_is_refused_with_one_line():
    for value in (-2.0, -0.5):
        with pytest.raises(UserError, match=r"^horovod.bucket_mb must be >= 0 \(0: one "
                                            r"all-reduce per step\) or -1 \(auto\), got "
                                            rf"{value}$"):
            HorovodConfig(bucket_mb=value)
    # Control: -1 (auto, the default), 0 and a size are accepted.
    assert HorovodConfig().bucket_mb == -1
    assert [HorovodConfig(bucket_mb=mb).bucket_mb for mb in (-1, 0, 0.5)] == [-1, 0, 0.5]


def test_auto_buckets_are_in_force_where_the_ranks_span_hosts():
    auto = HorovodConfig()
    # (ranks, ranks on this host): two hosts of one, two hosts of four, three hosts unevenly.
    for size, local_size in ((2, 1), (8, 4), (3, 2), (3, 1)):
        assert auto.buckets_in_force(size, local_size) == AUTO_BUCKET_MB == 2.0
    # Controls: one host, or one rank; a size set is kept wherever the ranks are.
    assert auto.buckets_in_force(2, 2) == auto.buckets_in_force(1, 1) == 0
    assert HorovodConfig(bucket_mb=0).buckets_in_force(2, 1) == 0
    assert HorovodConfig(bucket_mb=0.5).buckets_in_force(2, 2) == 0.5


def test_auto_buckets_under_elastic_training_whatever_the_world():
    # A step traced in one world runs on in the next, and the ranks match buckets by name: one
    # plan for every world, even a rank alone on one host.
    auto = HorovodConfig()
    for size, local_size in ((1, 1), (2, 2), (3, 1)):
        assert auto.buckets_in_force(size, local_size, elastic=True) == AUTO_BUCKET_MB
    assert HorovodConfig(bucket_mb=0).buckets_in_force(1, 1, elastic=True) == 0
    assert rank_env.is_elastic({"HOROVOD_ELASTIC": "1"})
    # Controls: not elastic where Horovod's driver did not say so.
    assert not rank_env.is_elastic({}) and not rank_env.is_elastic({"HOROVOD_ELASTIC": "0"})


def banner_lines(config, world, prefix, elastic=False):
    """The lines of rank 0's banner for ``config`` and ``world`` that start with ``prefix``."""
    buckets = config.horovod.buckets_in_force(world.size, world.local_size, elastic)
    text = report.banner(config, world, data="d", params=1, steps=1, peak_lr=0.1, start_epoch=0,
                         horovod_in_force="fusion 128 MB", buckets_mb=buckets, run_dir="r",
                         hvdtrain="0.2.0")
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_the_banner_names_the_bucket_size_when_set():
    config = presets.digits()
    bucketed = dataclasses.replace(config, horovod=HorovodConfig(bucket_mb=2.5))
    grouped = dataclasses.replace(config, horovod=HorovodConfig(flatten=False))
    world = dist.World(0, 2, 0, 2, "mpi", "/CPU:0", 1, 1, "stack")
    lines = [line for cfg in (bucketed, grouped, config)
             for line in banner_lines(cfg, world, "  horovod")]
    assert lines == ["  horovod fusion 128 MB, buckets 2.5 MB",
                     "  horovod fusion 128 MB, grouped all-reduce", "  horovod fusion 128 MB"]


def test_the_banner_notes_buckets_that_wait_for_backprop_under_mpirun_on_one_core():
    config = presets.digits()
    bucketed = dataclasses.replace(config, horovod=HorovodConfig(bucket_mb=2.0))
    one_core = dist.World(0, 2, 0, 2, "mpi", "/CPU:0", 1, 1, "stack")
    [note] = banner_lines(bucketed, one_core, "  note")
    assert "mpirun" in note and "horovodrun --gloo" in note and "bucket_mb" in note
    # Controls: no note under Gloo, with more threads, on a GPU, alone, or without buckets.
    for world in (dist.World(0, 2, 0, 2, "gloo", "/CPU:0", 1, 1, "stack"),
                  dist.World(0, 2, 0, 2, "mpi", "/CPU:0", 4, 2, "stack"),
                  dist.World(0, 2, 0, 2, "mpi", "/GPU:0", 1, 1, "stack"),
                  dist.World(0, 1, 0, 1, "mpi", "/CPU:0", 1, 1, "stack")):
        assert banner_lines(bucketed, world, "  note") == []
    assert banner_lines(config, one_core, "  note") == []


def test_the_banner_says_auto_buckets_are_in_force_across_hosts():
    config = presets.digits()
    two_hosts = dist.World(0, 2, 0, 1, "gloo", "/CPU:0", 1, 1, "stack")
    assert banner_lines(config, two_hosts, "  horovod") == [
        "  horovod fusion 128 MB, buckets 2 MB (auto: ranks on several hosts)"]
    assert banner_lines(config, two_hosts, "  note") == []
    # Under elastic training, on one host or alone, the banner gives that reason instead.
    for world in (dist.World(0, 2, 0, 2, "gloo", "/CPU:0", 1, 1, "stack"),
                  dist.World(0, 1, 0, 1, "gloo", "/CPU:0", 1, 1, "stack")):
        assert banner_lines(config, world, "  horovod", elastic=True) == [
            "  horovod fusion 128 MB, buckets 2 MB (auto: elastic training)"]
    # Under mpirun on one core they wait for backprop: the note says so, as for a size set.
    mpi_two_hosts = dataclasses.replace(two_hosts, controller="mpi")
    [note] = banner_lines(config, mpi_two_hosts, "  note")
    assert "horovodrun --gloo" in note
    # Controls: on one host, alone, or with 0 set, one all-reduce and no note.
    zero = dataclasses.replace(config, horovod=HorovodConfig(bucket_mb=0))
    for cfg, world in ((config, dist.World(0, 2, 0, 2, "mpi", "/CPU:0", 1, 1, "stack")),
                       (config, dist.World(0, 1, 0, 1, "mpi", "/CPU:0", 1, 1, "stack")),
                       (zero, mpi_two_hosts)):
        assert banner_lines(cfg, world, "  horovod") == ["  horovod fusion 128 MB"]
        assert banner_lines(cfg, world, "  note") == []


def test_flat_layout_starts_every_gradient_on_a_64_byte_boundary():
    assert flat_layout([16, 1, 17, 0, 32], 4) == [16, 16, 32, 0, 32]   # float32: 16 a row
    assert flat_layout([1, 33], 2) == [32, 64]                          # float16: 32
    sizes = [random.Random(seed).randrange(1, 5000) for seed in range(50)]
    for itemsize in (2, 4, 8):
        layout = flat_layout(sizes, itemsize)
        starts = list(itertools.accumulate([0, *layout]))
        assert all(start * itemsize % reducer.ALIGN_BYTES == 0 for start in starts)
        assert all(0 <= room - size < reducer.ALIGN_BYTES // itemsize
                   for room, size in zip(layout, sizes))
    # Control: the gradients back to back start off the boundary.
    assert any(start * 4 % reducer.ALIGN_BYTES for start in itertools.accumulate(sizes))


@pytest.mark.parametrize("flatten", [True, False])
def test_a_bucket_is_one_flat_tensor_whose_parts_come_back_in_place(monkeypatch, flatten):
    # reduce_gradients as the binding calls it at 2 ranks, with Horovod's collectives replaced
    # by ones that record what they were sent and return it doubled.
    sent: list[tuple[str, list]] = []

    def allreduce(tensor, **options):
        sent.append(("allreduce", [tensor.shape.as_list()]))
        return tensor * 2

    def grouped_allreduce(tensors, **options):
        sent.append(("grouped", [t.shape.as_list() for t in tensors]))
        return [t * 2 for t in tensors]
    monkeypatch.setattr(reducer.hvd, "size", lambda: 2)
    monkeypatch.setattr(reducer.hvd, "local_size", lambda: 2)   # one host: no auto buckets
    monkeypatch.setattr(reducer.hvd, "allreduce", allreduce)
    monkeypatch.setattr(reducer.hvd, "grouped_allreduce", grouped_allreduce)
    shapes = [(3, 5), (7,), (16,), (2, 2, 3), (1,)]
    grads = [tf.reshape(tf.range(np.prod(shape), dtype=tf.float32) + 100 * k, shape)
             for k, shape in enumerate(shapes)]
    out = dist.reduce_gradients([*grads, None], HorovodConfig(flatten=flatten))
    assert out[-1] is None
    for grad, back in zip(grads, out):
        assert back.shape == grad.shape and np.array_equal(back.numpy(), 2 * grad.numpy())
    sizes = [int(np.prod(shape)) for shape in shapes]
    # Control: horovod.flatten off sends each gradient as a tensor of its own.
    assert sent == ([("allreduce", [[sum(flat_layout(sizes, 4))]])] if flatten else
                    [("grouped", [list(shape) for shape in shapes])])


@pytest.mark.parametrize("bucket_mb", [0, 0.00001, 0.0002])   # one; each its own; several
def test_a_gradient_missing_on_some_ranks_stops_the_step_before_any_gradient_is_sent(
        monkeypatch, bucket_mb):
    # reduce_gradients as the distributed tape calls it, with the variables, at 2 ranks:
    # first an all-reduce of which places are missing, then the gradients. Horovod's
    # collectives replaced by ones that record what they were sent and average the places
    # with a ``peer``'s (the gradients come back as sent).
    sent: list[tuple[str, list]] = []
    peer = tf.zeros([2, 3])

    def allreduce(tensor, name, **options):
        sent.append((name, tensor.numpy().tolist()))
        return (tensor + peer) / 2 if name.endswith(reducer.PLACES) else tensor

    def grouped_allreduce(tensors, name, **options):
        sent.extend((name, t.numpy().tolist()) for t in tensors)
        return list(tensors)
    monkeypatch.setattr(reducer.hvd, "size", lambda: 2)
    monkeypatch.setattr(reducer.hvd, "local_size", lambda: 2)
    monkeypatch.setattr(reducer.hvd, "allreduce", allreduce)
    monkeypatch.setattr(reducer.hvd, "grouped_allreduce", grouped_allreduce)
    variables = [tf.Variable(tf.ones(shape)) for shape in [(16, 2), (16,), (8,)]]
    grads = [tf.fill((16, 2), 3.0), None, tf.fill((8,), 5.0)]
    options = HorovodConfig(bucket_mb=bucket_mb)
    places = "hvdtrain_gradients" + reducer.PLACES
    # A peer that misses the same one (its places: missing, then present): the step goes on.
    peer = tf.constant([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    out = dist.reduce_gradients(grads, options, variables=variables)
    assert out[1] is None
    assert [g.numpy().tolist() for g in (out[0], out[2])] == [
        grads[0].numpy().tolist(), grads[2].numpy().tolist()]
    assert sent[0] == (places, peer.numpy().tolist())
    flat = [x for _, part in sent[1:] for x in np.ravel(part)]
    assert flat.count(3.0) == 32 and flat.count(5.0) == 8 and len(flat) <= 32 + 16  # padded
    # A peer with every gradient: the step stops on the places, before any gradient is sent.
    sent.clear()
    peer = tf.constant([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    refused = re.escape(reducer.MISSING_ON_SOME_RANKS)
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused):
        dist.reduce_gradients(grads, options, variables=variables)
    assert [name for name, _ in sent] == [places]
    # Controls: with that gradient here too, the same peer passes; a peer that joined
    # (hvd.join: zeros) passes either way; without the variables, no places are sent.
    dist.reduce_gradients([grads[0], tf.fill((16,), 4.0), grads[2]], options, variables=variables)
    peer = tf.zeros([2, 3])
    dist.reduce_gradients(grads, options, variables=variables)
    sent.clear()
    dist.reduce_gradients(grads, options)
    assert sent and places not in [name for name, _ in sent]


def test_timelines_tell_the_check_of_missing_gradients_from_the_gradients():
    # bench phases and bench cluster read a step's gradients from Horovod's timeline: the
    # tensors all-reduced once a step; the check's all-reduce is one too, so they leave it out.
    from hvdtrain.bench.shared import timeline
    assert timeline.PLACES == reducer.PLACES
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
              for pid, name in ((1, "hvdtrain_gradients"), (2, "hvdtrain_update_places"))]
    for step in range(4):
        for pid in (1, 2):
            events += [{"ph": "B", "pid": pid, "name": "ALLREDUCE", "ts": 100 * step + pid},
                       {"ph": "E", "pid": pid, "ts": 100 * step + pid + 5}]
    assert list(timeline.tensor_phases(events)) == [1]
    # Control: named as a gradient, it would count as one.
    events[1]["args"]["name"] = "hvdtrain_gradients_b1"
    assert list(timeline.tensor_phases(events)) == [1, 2]

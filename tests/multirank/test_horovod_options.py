"""Horovod's options through hvdtrain, each checked for what it promises against a replay
computed in this process, or against what a Horovod timeline shows crossed the wire: fp16
compression, backward passes (accumulation), Adasum, join with uneven shards and
sparse_as_dense; and Adasum refused on 3 ranks. Real 2-rank runs under horovodrun --gloo and
mpirun (which one is named per test), on CPU."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import (EXACT, assert_ok, assert_stopped_with_one_line, hvdtrain,
                     largest_difference, launch, weights, worker, write_records, write_shards)
from replays import (CUSTOM, PLAIN_SGD, assert_same, gradient_allreduces, initial_model,
                     local_gradients, replay_two_ranks, sgd_step, train)

pytestmark = [pytest.mark.multirank, pytest.mark.core]


def gradient_traffic(sizes: list[int]) -> tuple[int, int]:
    """The all-reduces and the elements that carry one step's dense float32 gradients of
    ``sizes`` elements, on either stack: one flat tensor, in which each gradient is padded to
    an aligned start (reducer.flat_layout). (On Keras 2, Horovod's own optimizer and tape
    sent one all-reduce per gradient before they reduced through hvdtrain's reducer.)"""
    from hvdtrain.distributed import reducer
    return 1, sum(reducer.flat_layout(sizes, 4))


def variable_sizes(model) -> list[int]:
    return [int(np.prod(v.shape)) for v in model.trainable_variables]


# The compression is the reducer's, the same on both stacks; the guarantees table runs fp16
# compression on each (case fp16_compression).
@pytest.mark.one_stack
def test_fp16_compression_halves_the_bytes_and_stays_close(tmp_path):
    # horovodrun --gloo; the timeline (rank 0's Chrome trace) shows what crossed the wire. The
    # custom loop without and with compression, and fit with it (Horovod's optimizer there).
    args = [*EXACT, "--set", "train.epochs=3"]
    runs = {}
    for name, loop, compression in (("plain", "custom", "none"), ("fp16", "custom", "fp16"),
                                    ("fit-fp16", "fit", "fp16")):
        timeline = tmp_path / f"{name}.json"
        ranks = train("gloo", 2, tmp_path / name, *args, "--set", f"train.loop={loop}",
                      "--set", f"horovod.compression={compression}",
                      "--set", f"horovod.timeline={timeline}")
        assert_same(ranks[0], ranks[1], atol=0)
        runs[name] = ranks[0], gradient_allreduces(timeline)
    plain, (plain_count, plain_bytes) = runs["plain"]
    # 5 steps (266 samples, 133 per rank, batch 32) x 3 epochs, each step's 6 gradient tensors
    # (3 dense layers, 6,570 parameters) in one flat all-reduce (both stacks; Keras 2's Horovod
    # optimizer and tape sent one each, 90 all-reduces, before), in 4 bytes an element, or 2
    # compressed.
    sizes = variable_sizes(initial_model("synthetic-mlp", ["data.num_samples=333"])[2])
    assert len(sizes) == 6 and sum(sizes) == 6570
    count, elements = gradient_traffic(sizes)
    assert (plain_count, plain_bytes) == (count * 15, elements * 15 * 4)
    for name in ("fp16", "fit-fp16"):
        weights_, allreduced = runs[name]
        assert allreduced == (count * 15, elements * 15 * 2), name
        worst = assert_same(weights_, plain, atol=1e-3)  # measured: about 1e-4
        assert worst > 1e-6, name  # the gradients really were rounded
        print(f"{name}: {allreduced[1]} vs {plain_bytes} gradient bytes all-reduced by rank 0, "
              f"largest weight difference {worst:.2e}")


# The accumulation is the binding's tape and the reducer's, both shared; the guarantees table
# runs backward_passes_per_step on each stack.
@pytest.mark.one_stack
def test_k_backward_passes_of_batch_b_equal_one_step_of_batch_kb(tmp_path):
    # Plain SGD, fixed lr, no shuffling. 2 ranks (mpirun) x k=2 passes x batch 8 accumulate the
    # same 32 samples per update as one process (fit) with batch 32: the same updates.
    settings = [*PLAIN_SGD, "train.epochs=2", "data.num_samples=333", "run.tensorboard=false",
                "run.export=false"]
    plain_sgd = [a for s in settings for a in ("--set", s)]
    accumulated = train("mpi", 2, tmp_path / "k2", *plain_sgd, *CUSTOM,
                        "--set", "horovod.backward_passes_per_step=2",
                        "--set", "train.batch_size=8")
    assert_same(accumulated[0], accumulated[1], atol=0)
    (big_batch,) = train("single", 1, tmp_path / "b32", *plain_sgd, "--set",
                         "train.batch_size=32")
    print("k=2 x batch 8 x 2 ranks vs batch 32, largest weight difference:",
          assert_same(accumulated[0], big_batch, atol=1e-5))
    # Sharp: updating after every batch of 8 per rank (k=1) ends elsewhere. Replayed here (the
    # replays match launched runs to 1e-5 in the tests below) rather than launched.
    cfg, dataset, model = initial_model("synthetic-mlp", [*settings, "train.batch_size=8"])
    every_batch = replay_two_ranks(cfg, dataset, model, lr_at=lambda step: cfg.optim.lr)
    assert largest_difference(every_batch, big_batch) > 1e-3


def adasum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two ranks' gradients (Maleki et al., 2021), tensor by tensor: the parts along
    each other's direction are counted once, orthogonal parts add."""
    dot = float(np.vdot(a, b))
    return (1 - dot / (2 * np.vdot(a, a))) * a + (1 - dot / (2 * np.vdot(b, b))) * b


# Adasum is the reducer's and the loop is hvdtrain's own, both shared; the guarantees table runs
# Adasum on each stack (adasum_fit, adasum_tape).
@pytest.mark.one_stack
def test_adasum_on_the_custom_loop_is_adasum(tmp_path):
    # mpirun (Horovod implements Adasum over MPI). One step: each rank's whole shard (133
    # samples) in one batch; the replay combines the two ranks' gradients by Adasum.
    # optim.lr_scaling is left at its default (auto: none under Adasum).
    settings = [*(s for s in PLAIN_SGD if not s.startswith("optim.lr_scaling")),
                "train.epochs=1", "train.batch_size=200", "data.num_samples=333"]
    args = [a for s in settings for a in ("--set", s)]
    ranks = train("mpi", 2, tmp_path / "adasum", *args, *CUSTOM, "--set", "horovod.op=adasum",
                  "--set", "run.tensorboard=false", "--set", "run.export=false")
    assert_same(ranks[0], ranks[1], atol=0)

    from hvdtrain.data import sharding
    cfg, dataset, model = initial_model("synthetic-mlp", settings)
    start = [w.copy() for w in model.get_weights()]
    x, y = dataset.train.x, dataset.train.y
    grads = [local_gradients(model, x[own], y[own])
             for own in (sharding.shard_indices(len(y), r, 2) for r in range(2))]
    sgd_step(model, [adasum(a, b) for a, b in zip(*grads)], cfg.optim.lr)
    print("adasum vs replay, largest weight difference:",
          assert_same(ranks[0], model.get_weights(), atol=1e-5))
    # Sharp: the plain average of the two gradients gives another step, and so does the
    # Adasum step at the linearly scaled lr (the default before Adasum had its own).
    for grad, lr in (([(a + b) / 2 for a, b in zip(*grads)], cfg.optim.lr),
                     ([adasum(a, b) for a, b in zip(*grads)], 2 * cfg.optim.lr)):
        model.set_weights(start)
        sgd_step(model, grad, lr)
        assert largest_difference(ranks[0], model.get_weights()) > 1e-4


def test_join_uneven_shards_finish_and_train_correctly(tmp_path):
    # horovodrun --gloo. TFRecord files of 40, 8 and 40 records: rank 0 reads files 0 and 2
    # (80 records, 10 batches of 8), rank 1 file 1 (8 records, 1 batch). Rank 1 joins after
    # its batch and answers rank 0's all-reduces with zeros; then rank 0's state is broadcast.
    write_shards(tmp_path / "train", [40, 8, 40])
    write_records(tmp_path / "eval.tfrecord", range(200, 230))
    settings = [*PLAIN_SGD, "data.source=tfrecord", f"data.path={tmp_path / 'train'}",
                f"data.eval_path={tmp_path / 'eval.tfrecord'}", "data.image_shape=4,4,1",
                "data.num_classes=3", "model.name=mlp", "model.width=16",
                "train.batch_size=8", "train.epochs=2", "horovod.join_uneven=true",
                "train.loop=custom"]
    args = [a for s in settings for a in ("--set", s)]
    job = launch("gloo", 2, worker(tmp_path / "out", *args,
                                   "--set", f"run.run_dir={tmp_path / 'run'}"), timeout=240)
    assert_ok(job, "uneven shards with join")
    ranks = [weights(tmp_path / f"out/rank{r}.npz") for r in range(2)]
    assert_same(ranks[0], ranks[1], atol=0)

    # Replay: at each step the average over BOTH ranks, a joined rank counting as zeros.
    from hvdtrain.data import sources
    cfg, dataset, model = initial_model("digits", settings)
    start = model.get_weights()
    streams = [sources.train_dataset(dataset.train, rank=r, size=2, batch_size=8, first_epoch=0,
                                  epochs=2, seed=cfg.train.seed, shuffle=False, pad=False)
               for r in range(2)]
    assert [s.steps_per_epoch for s in streams] == [10, 1]

    def replay(divide_by_active_ranks: bool) -> list[np.ndarray]:
        model.set_weights(start)
        batches = [iter(s.dataset) for s in streams]
        for _ in range(2):
            for step in range(10):
                grads = [local_gradients(model, *next(batches[rank]))
                         for rank, stream in enumerate(streams) if step < stream.steps_per_epoch]
                divisor = len(grads) if divide_by_active_ranks else 2
                sgd_step(model, [sum(g) / divisor for g in zip(*grads)], cfg.optim.lr)
        return model.get_weights()

    print("join vs replay, largest weight difference:",
          assert_same(ranks[0], replay(divide_by_active_ranks=False), atol=1e-5))
    # Sharp: averaging over the ranks still running would end elsewhere.
    other = replay(divide_by_active_ranks=True)
    assert largest_difference(ranks[0], other) > 1e-3


EMBEDDING_SGD = ["model.name=embedding", *PLAIN_SGD, "optim.lr=0.5", "train.epochs=2",
                 "run.tensorboard=false", "run.export=false"]


# sparse_as_dense is the reducer's, the same on both stacks; the guarantees table runs sparse
# gradients (the Embedding cases) on each.
@pytest.mark.one_stack
def test_sparse_as_dense_reduces_embedding_gradients_densely_to_the_same_result(tmp_path):
    # horovodrun --gloo, the embedding model (sparse gradients) on digits, plain SGD: the custom
    # loop without and with the option, and fit with it (Horovod's optimizer there). Sparse:
    # Horovod all-gathers the embedding gradient's rows; dense: one all-reduce of the table.
    # Each must equal a replay that AVERAGES the two ranks' gradients (plain SGD keeps a factor
    # of 2 that Adam would cancel).
    args = [a for s in EMBEDDING_SGD for a in ("--set", s)]
    runs = {}
    for name, loop, dense in (("sparse", "custom", "false"), ("dense", "custom", "true"),
                              ("fit-dense", "fit", "true")):
        timeline = tmp_path / f"{name}.json"
        ranks = train("gloo", 2, tmp_path / name, "--preset", "digits", *args,
                      "--set", f"train.loop={loop}", "--set", f"horovod.sparse_as_dense={dense}",
                      "--set", f"horovod.timeline={timeline}")
        assert_same(ranks[0], ranks[1], atol=0)
        runs[name] = (ranks[0], gradient_allreduces(timeline, "ALLGATHER")[0],
                      *gradient_allreduces(timeline))
    steps = 2 * 23
    cfg, dataset, model = initial_model("digits", EMBEDDING_SGD)
    start = model.get_weights()
    (table,) = [v for v in model.trainable_variables if "embeddings" in v.name]
    sparse_gathers, sparse_reduces, sparse_bytes = runs["sparse"][1:]
    assert sparse_gathers >= steps                           # embedding rows all-gathered ...
    for name in ("dense", "fit-dense"):                      # ... or the table all-reduced:
        gathers, reduces, moved = runs[name][1:]
        assert gathers == 0 and moved >= sparse_bytes + steps * table.numpy().nbytes, name
        # in the step's one flat all-reduce (both stacks; Keras 2's Horovod optimizer and
        # tape sent one more of its own before they reduced through hvdtrain's reducer)
        assert reduces == sparse_reduces, name
    averaged = replay_two_ranks(cfg, dataset, model, lr_at=lambda step: cfg.optim.lr)
    for name, (weights_, *_) in runs.items():
        print(f"{name} vs the replay, largest weight difference:",
              assert_same(weights_, averaged, atol=1e-5))
    # Sharp: summing the ranks' gradients instead of averaging them ends elsewhere.
    model.set_weights(start)
    summed = replay_two_ranks(cfg, dataset, model, lr_at=lambda step: cfg.optim.lr, combine=sum)
    assert largest_difference(runs["fit-dense"][0], summed) > 1e-3


@pytest.mark.beside   # a refusal
@pytest.mark.one_stack   # the world-size check is hvdtrain's, before the binding is used
def test_adasum_on_three_ranks_stops_every_rank_before_training(tmp_path):
    # mpirun -np 3 (oversubscribed on 2 cores): a clear error, exit 2, no run directory.
    run_dir = tmp_path / "run"
    job = launch("mpi", 3, hvdtrain("train", "--preset", "synthetic-mlp", "--loop", "custom",
                                    "--set", "horovod.op=adasum", "--run-dir", str(run_dir)),
                 timeout=120)
    assert_stopped_with_one_line(job, "mpi", "power-of-two number of ranks, got 3")
    assert not run_dir.exists()

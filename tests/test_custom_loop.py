"""The custom loop and Horovod's options, each checked for what it promises: real 2-rank runs
under horovodrun --gloo and mpirun (which one is named per test), on CPU."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import hvdtrain, launch, worker
from test_multirank import EXACT, assert_ok, weights

pytestmark = pytest.mark.multirank

CUSTOM = ["--set", "train.loop=custom"]


def train(launcher: str, np_: int, out: Path, *args: str,
          run_dir: Path | None = None) -> list[list[np.ndarray]]:
    """Runs the test worker and returns every rank's final weights."""
    run_dir = run_dir or out / "run"
    job = launch(launcher, np_, worker(out, *args, "--set", f"run.run_dir={run_dir}"))
    assert_ok(job, f"{launcher} x{np_} {' '.join(args)}")
    return [weights(out / f"rank{r}.npz") for r in range(np_)]


def assert_same(a: list[np.ndarray], b: list[np.ndarray], atol: float) -> float:
    """Asserts equal shapes and values to ``atol``; returns the largest difference."""
    assert [x.shape for x in a] == [y.shape for y in b]
    worst = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    assert worst <= atol, f"largest difference {worst} > {atol}"
    return worst


def test_custom_loop_with_resume_ends_where_fit_ends(tmp_path):
    # Momentum SGD, linear lr scaling with one warmup epoch, shuffled shards: the same config
    # through fit (mpirun) and through the custom loop (horovodrun --gloo), the latter stopped
    # after 2 epochs and resumed to 3, which restores on rank 0 and broadcasts.
    common = [*EXACT, "--set", "optim.lr=0.1"]
    fit = train("mpi", 2, tmp_path / "fit", *common, "--set", "train.epochs=3")
    run = tmp_path / "custom-run"
    two = train("gloo", 2, tmp_path / "two", *common, *CUSTOM, "--set", "train.epochs=2",
                run_dir=run)
    custom = train("mpi", 2, tmp_path / "three", *common, *CUSTOM, "--set", "train.epochs=3",
                   "--resume", run_dir=run)
    assert_same(custom[0], custom[1], atol=0)   # every rank holds the same model
    print("custom vs fit, largest weight difference:",
          assert_same(custom[0], fit[0], atol=1e-5))  # it is fit's model
    # The comparison is sharp: one epoch less is far from it.
    assert max(float(np.abs(x - y).max()) for x, y in zip(two[0], fit[0])) > 1e-2
    summary = json.loads((tmp_path / "three/summary.json").read_text())
    assert summary["loop"] == "custom" and summary["resumed_from_epoch"] == 2
    assert summary["final_eval_accuracy"] == pytest.approx(summary["whole_eval_set_accuracy"])


def gradient_allreduces(timeline: Path) -> tuple[int, int]:
    """From a Horovod timeline (Chrome trace JSON): the number of gradient all-reduces and the
    bytes they carried, read from each ALLREDUCE's end event (dtype and shape of the tensor)."""
    events = json.loads(timeline.read_text())
    tensor_of = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("name") == "process_name" and "name" in e.get("args", {})}
    open_activities: dict[int, list[str]] = {}
    count = total = 0
    for e in events:
        if e["ph"] == "B":
            open_activities.setdefault(e["pid"], []).append(e["name"])
        elif e["ph"] == "E" and open_activities[e["pid"]].pop() == "ALLREDUCE":
            if "grad" not in tensor_of[e["pid"]].lower():
                continue  # the metric sums, not gradients
            shape = json.loads(e["args"]["shape"])
            count += 1
            total += math.prod(shape) * np.dtype(e["args"]["dtype"]).itemsize
    return count, total


def test_fp16_compression_halves_the_bytes_and_stays_close(tmp_path):
    # horovodrun --gloo; the timeline (rank 0's Chrome trace) shows what crossed the wire.
    args = [*EXACT, *CUSTOM, "--set", "train.epochs=3"]
    runs = {}
    for compression in ("none", "fp16"):
        timeline = tmp_path / f"{compression}.json"
        ranks = train("gloo", 2, tmp_path / compression, *args,
                      "--set", f"horovod.compression={compression}",
                      "--set", f"horovod.timeline={timeline}")
        assert_same(ranks[0], ranks[1], atol=0)
        runs[compression] = ranks[0], *gradient_allreduces(timeline)
    (plain, plain_count, plain_bytes), (fp16, fp16_count, fp16_bytes) = runs["none"], runs["fp16"]
    # 6 gradient tensors (3 dense layers) x 5 steps (266 samples, 133 per rank, batch 32) x 3
    # epochs, each an all-reduce event.
    assert plain_count == fp16_count == 6 * 5 * 3
    assert fp16_bytes * 2 == plain_bytes
    worst = assert_same(fp16, plain, atol=1e-3)  # measured: about 1e-4
    assert worst > 0  # the gradients really were rounded
    print(f"fp16: {fp16_bytes} vs {plain_bytes} gradient bytes all-reduced by rank 0, "
          f"largest weight difference {worst:.2e}")


def test_k_backward_passes_of_batch_b_equal_one_step_of_batch_kb(tmp_path):
    # Plain SGD, fixed lr, no shuffling. 2 ranks (mpirun) x k=2 passes x batch 8 accumulate the
    # same 32 samples per update as one process (fit) with batch 32: the same updates.
    plain_sgd = [*EXACT, "--set", "data.shuffle=false", "--set", "optim.momentum=0",
                 "--set", "optim.lr_scaling=none", "--set", "optim.warmup_epochs=0",
                 "--set", "optim.lr=0.1", "--set", "train.epochs=2"]
    accumulated = train("mpi", 2, tmp_path / "k2", *plain_sgd, *CUSTOM,
                        "--set", "horovod.backward_passes_per_step=2",
                        "--set", "train.batch_size=8")
    assert_same(accumulated[0], accumulated[1], atol=0)
    (big_batch,) = train("single", 1, tmp_path / "b32", *plain_sgd, "--set",
                         "train.batch_size=32")
    print("k=2 x batch 8 x 2 ranks vs batch 32, largest weight difference:",
          assert_same(accumulated[0], big_batch, atol=1e-5))
    # Sharp: updating after every batch of 8 per rank (k=1) ends elsewhere.
    every_batch = train("mpi", 2, tmp_path / "k1", *plain_sgd, *CUSTOM,
                        "--set", "train.batch_size=8")
    assert max(float(np.abs(x - y).max()) for x, y in zip(every_batch[0], big_batch)) > 1e-3

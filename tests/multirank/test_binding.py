"""The Keras 3 binding through a library user's own ``fit`` (tests/binding_worker.py runs the
cases in one job): sparse gradients after dense ones, a model without an Input, Adam's state
restored on rank 0 only; and at one rank, the reducer's pass-through and its refusals."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import TESTS, assert_ok, hvdtrain, importable_from, launch

WORKER = TESTS / "binding_worker.py"


def run_cases(np_: int, out: Path, *args: str) -> dict[str, list[list[np.ndarray]]]:
    """Every case's arrays, per rank."""
    out.mkdir()
    job = launch("mpi", np_, [sys.executable, str(WORKER), "--out", str(out), *args],
                 timeout=240)
    assert_ok(job, f"the binding's cases at {np_} ranks")
    cases: dict[str, list[list[np.ndarray]]] = {}
    for path in sorted(out.glob("*.rank*.npz")):
        case = path.name.split(".")[0]
        with np.load(path) as f:
            arrays = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
        cases.setdefault(case, []).append(arrays)
    return cases


def biggest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert len(a) == len(b) > 0
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, dict]:
    """The cases at 2 ranks x batch 8, run once for the tests below."""
    out = tmp_path_factory.mktemp("binding") / "two"
    return out, run_cases(2, out, "--batch", "8")


@pytest.mark.multirank
@pytest.mark.core
def test_library_pattern_at_two_ranks_ends_with_identical_ranks(two_ranks):
    out, two = two_ranks
    # Bug 1: a dense gradient before the embedding's sparse one trains; bug 2: a model without
    # an Input (seeds 100 + rank) ends alike on both ranks.
    for case in ("dense_first", "no_input"):
        assert biggest_difference(*two[case]) == 0, case
    # Adam restored on rank 0 only: its step count (7, then 1 step) and slots reach rank 1.
    rank0, rank1 = two["restored"]
    assert biggest_difference(rank0, rank1) == 0
    assert int(rank1[0]) == 7 + 1
    # Float32 and float16 gradients in one step: each averaged, dtype kept (the ranks gave
    # different values, so a reduction that did nothing would fail here).
    pairs = [json.loads((out / f"pair.rank{r}.json").read_text()) for r in (0, 1)]
    for pair in pairs:
        assert pair["mixed"] == [1.5, 3.0] and pair["mixed_dtypes"] == ["float32", "float16"]
    # Rank 1 had no batch and joined at once: rank 0's batch averaged with its zeros.
    assert pairs[0]["joined"] == [2.0]
    assert pairs[0]["last_to_join"] == pairs[1]["last_to_join"] == 0


@pytest.mark.keras3_only
@pytest.mark.multirank
@pytest.mark.core
def test_library_pattern_at_two_ranks_equals_one_rank_at_twice_the_batch(two_ranks, tmp_path):
    # Keras 3: a model built before fit is broadcast with its optimizer before the first step
    # (Horovod's own Keras 2 callback broadcasts after it, so there is no exact replay there).
    out, two = two_ranks
    one = run_cases(1, tmp_path / "one", "--batch", "16")
    assert biggest_difference(two["dense_first"][0], one["dense_first"][0]) < 1e-5
    # Control for bug 2: the broadcast at on_train_begin only, when nothing is built yet.
    old = run_cases(2, tmp_path / "old", "--batch", "8", "--old-broadcast")
    assert biggest_difference(*old["no_input"]) > 1e-2
    # At 1 rank (the replay's job): the gradients pass through untouched, with no all-reduce
    # (control: fp16 on the wire would round them; a traced all-reduce shows as a Horovod op).
    single = json.loads((tmp_path / "one" / "single.json").read_text())
    assert single["passed_through"] == [np.float32(3.14159265)]
    assert single["fp16_round_trip"] != single["passed_through"]
    assert single["reducer_ops"] == [] and single["allreduce_ops"] == ["HorovodAllreduce"]
    # A tape's gradients given to a distributed optimizer: refused, not reduced twice.
    assert single["double_reduction"].startswith("these gradients come from dist.distributed_tape")
    assert "custom loop" in single["accumulation_steps"]
    # unscale_gradients, a no-op on Keras 3 before (the loss scale optimizer unscales inside
    # apply_gradients): refused, saying what to use.
    assert single["unscale"].startswith("unscale_gradients() does not exist on Keras 3")
    # AdamW's exclude_from_weight_decay, set before wrapping, still holds: the bias is left
    # alone while the kernel decays (a copy rebuilt from the config decayed both).
    assert single["weight_decay"] == {"bias": [1.0, 1.0], "kernel_decayed": True}
    # Metric averaging: an array metric element-wise; metrics named differently on the ranks
    # (one each, so a count alone would not tell) stop both ranks with one line.
    for rank in (0, 1):
        pair = json.loads((out / f"pair.rank{rank}.json").read_text())
        assert pair["averaged"] == {"loss": 1.5, "per_class": [1.0, 3.0]}
        assert pair["other_names"] == ("the ranks log different metrics, which cannot be "
                                       "averaged: rank 0 accuracy, rank 1 mae; compile the same "
                                       "metrics on every rank")


@pytest.mark.multirank
@pytest.mark.core
def test_cli_trains_a_user_model_whose_dense_gradients_come_first(tmp_path):
    # Before the reducer grouped sparse gradients apart, both ranks failed here with
    # "'SymbolicTensor' object has no attribute 'dense_shape'".
    job = launch("mpi", 2, hvdtrain("train", "--preset", "synthetic-mlp", "--epochs", "1",
                                    "--model", "binding_worker:dense_first_on_input",
                                    "--run-dir", str(tmp_path / "run")),
                 env=importable_from(TESTS), timeout=180)
    assert_ok(job, "hvdtrain train with the dense-first user model")
    assert "model binding_worker:dense_first_on_input, 1,232 parameters" in job.output
    assert "done: eval accuracy" in job.output


def test_backward_passes_given_to_the_fit_path_are_refused_with_one_line():
    import tensorflow as tf
    from hvdtrain import distributed as dist
    from hvdtrain.config import HorovodConfig
    from hvdtrain.errors import UserError
    with pytest.raises(UserError, match=r"^backward_passes_per_step > 1 is not applied .* "
                                        r"accumulate in hvdtrain's custom loop \(--loop custom\)$"):
        dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1),
                                   HorovodConfig(backward_passes_per_step=2))
    # Control: k = 1 is the plain optimizer's path, accepted.
    assert dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1),
                                      HorovodConfig(backward_passes_per_step=1))

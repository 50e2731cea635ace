"""The README's library example (hvdtrain's distributed optimizer in a user's own Keras ``fit``),
run exactly as the README prints it, under both launchers, on whichever stack is installed."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, assert_ok, largest_difference, launch, weights

pytestmark = [pytest.mark.multirank, pytest.mark.core]

README = ROOT / "README.md"
MARKER = "<!-- the library example: tests/multirank/test_library.py runs it -->"

# Runs the README's script unchanged, then saves what every rank ends with. ``--no-allreduce``
# is the control: the optimizer is left plain, as a wrapper that silently did nothing would,
# and the consistency check, which would stop that, is off.
HARNESS = """
import json, os, runpy, sys
import numpy as np
if "--no-allreduce" in sys.argv:
    from hvdtrain import distributed as dist
    dist.distributed_optimizer = lambda optimizer, options=None: optimizer
    checked = dist.fit_callbacks
    dist.fit_callbacks = lambda *args, **kwargs: checked(*args, consistency_check=False)
scope = runpy.run_path(sys.argv[1], run_name="__main__")
rank = scope["world"].rank
np.savez(os.path.join(sys.argv[2], f"rank{rank}.npz"), *scope["model"].get_weights())
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
    json.dump({k: [float(v) for v in vs] for k, vs in scope["history"].history.items()}, f)
"""


def readme_example() -> str:
    text = README.read_text()
    assert MARKER in text, f"{README} lost the marker {MARKER!r}"
    block = re.search(r"```python\n(.*?)```", text[text.index(MARKER):], re.S)
    return block.group(1)


def run_example(launcher: str, tmp_path: Path, *extra: str, example: str | None = None,
                ranks: int = 2) -> list[list[np.ndarray]]:
    """What every rank ends with, running ``example`` (the README's by default)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    script, harness = tmp_path / "train.py", tmp_path / "harness.py"
    script.write_text(example or readme_example())
    harness.write_text(HARNESS)
    out = tmp_path / ("out" + "".join(extra))
    out.mkdir()
    job = launch(launcher, ranks, [sys.executable, str(harness), str(script), str(out), *extra],
                 timeout=240)
    assert_ok(job, f"the README's example under {launcher}")
    ends = []
    for rank in range(ranks):
        ends.append(weights(out / f"rank{rank}.npz"))
    return ends


@pytest.fixture(scope="module")
def without_allreduce(tmp_path_factory) -> list[list[np.ndarray]]:
    """The control, run once: what it shows does not depend on the launcher."""
    return run_example("mpi", tmp_path_factory.mktemp("control"), "--no-allreduce")


@pytest.mark.either_launcher
# On the other stack the same pattern's broadcast is held by test_binding's cases (models seeded
# per rank, at 2 ranks, through dist.fit_callbacks) and its training by the test below.
@pytest.mark.one_stack
def test_the_readme_example_trains_identical_ranks(launcher, without_allreduce, tmp_path):
    rank0, rank1 = run_example(launcher, tmp_path)
    assert len(rank0) == len(rank1) > 0
    for a, b in zip(rank0, rank1):
        np.testing.assert_array_equal(a, b)
    history = (tmp_path / "out" / "rank0.json").read_text()
    assert '"accuracy"' in history
    # Control: without the all-reduce the ranks start alike (broadcast) but drift apart.
    plain0, plain1 = without_allreduce
    assert largest_difference(plain0, plain1) > 1e-3


def test_xla_is_refused_with_one_clear_line(tmp_path):
    # Keras 3 compiles with XLA by itself when it sees a GPU; here it is asked for directly.
    script = tmp_path / "xla.py"
    example = readme_example()
    assert "jit_compile=False" in example
    script.write_text(example.replace("jit_compile=False", "jit_compile=True"))
    job = launch("single", 1, [sys.executable, str(script)], timeout=120)
    assert job.returncode != 0
    assert "Horovod's all-reduce has no XLA lowering: compile with jit_compile=False" in job.output


# A library script whose ranks hold 40 and 32 rows in a dataset of unknown length (a filter):
# fit_callbacks() cannot compare step counts before the first step, so rank 0's fifth batch
# would wait in an all-reduce rank 1 never joins. (Each rank's rows its own, as sharded data is.)
UNKNOWN_LENGTH = """
import numpy as np, tensorflow as tf
from hvdtrain import distributed as dist
world = dist.init(stall_warning_s=5, stall_abort_s=15)
rows = {rows}[world.rank]
x = np.full((rows, 4), 1.0 + world.rank, "float32")
data = (tf.data.Dataset.from_tensor_slices((x, np.zeros(rows, "int64")))
        .filter(lambda x, y: True).batch(8))
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
model.compile(dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1)), jit_compile=False,
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=2, callbacks=dist.fit_callbacks(), verbose=0)
print(f"rank {{world.rank}} done", flush=True)
"""


@pytest.mark.multirank
@pytest.mark.beside  # it mostly waits
@pytest.mark.one_stack  # the same code on both stacks (step_guard.py)
def test_a_library_job_whose_ranks_run_out_of_unknown_length_data_apart_stops_in_one_line(
        tmp_path):
    """Under Gloo (Horovod's stall check does nothing there): the rank that runs out joins,
    and every rank stops with one line naming each rank's step count, well before the stall
    abort (before: the watchdog ended the job at dist.init(stall_abort_s=15); under mpirun,
    the guarantees case unequal_batches_unknown_length)."""
    script = tmp_path / "uneven.py"
    script.write_text(UNKNOWN_LENGTH.format(rows=(40, 32)))
    job = launch("gloo", 2, [sys.executable, str(script)], timeout=150)
    assert job.returncode != 0 and "done" not in job.output, job.output[-3000:]
    assert ("the ranks' data ran out after different numbers of steps in an epoch of fit "
            "(rank 0: 5, rank 1: 4)" in job.output), job.output[-3000:]
    assert "no training step finished" not in job.output, job.output[-3000:]
    # Control: the same script with equal shards trains to its end.
    script.write_text(UNKNOWN_LENGTH.format(rows=(32, 32)))
    job = launch("gloo", 2, [sys.executable, str(script)], timeout=150)
    assert_ok(job, "the same script with equal shards")
    assert "rank 0 done" in job.output and "rank 1 done" in job.output


def same_batches(batch: int, lr: float) -> str:
    """The README's example made to start 2 ranks x 32 and 1 rank x 64 from the same weights and
    feed them the same samples per step: a seed, no shuffle, one epoch (the repeat wraps
    differently after it), a fixed learning rate."""
    example = readme_example()
    seeded = "tf.keras.utils.set_random_seed(0)\nworld = dist.init()"
    for old, new in [("world = dist.init()", seeded),
                     (".shuffle(1000, seed=world.rank)", ""),
                     ("batch, steps = 32, len(x) // (32 * world.size)",
                      f"batch, steps = {batch}, len(x) // 64"),
                     ("SGD(0.05 * world.size,", f"SGD({lr},"), ("epochs=10", "epochs=1")]:
        assert old in example, f"the README's example no longer has {old!r}: update this test"
        example = example.replace(old, new)
    return example


def test_the_readme_example_averages_the_gradients(tmp_path):
    """2 ranks x batch 32 end where 1 rank x batch 64 ends (SGD with momentum, the same samples
    per step). Control: had the ranks' gradients been summed, not averaged, the update would be one
    rank's at twice the learning rate, which ends far away."""
    two = run_example("mpi", tmp_path / "two", example=same_batches(32, 0.1))
    one, summed = (run_example("single", tmp_path / name, example=same_batches(64, lr),
                               ranks=1)[0] for name, lr in (("one", 0.1), ("summed", 0.2)))
    alike, close, far = (largest_difference(two[0], two[1]), largest_difference(two[0], one),
                         largest_difference(summed, one))
    print(f"2 x 32 vs 1 x 64: {close:.1e}; summed vs 1 x 64: {far:.1e}")
    assert alike == 0 and close < 1e-5, (alike, close)
    assert far > 1e-2, far

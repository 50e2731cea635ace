"""scripts/patches/horovod-0.28.1-allreduce-in-place.patch, which every Horovod build takes:
Horovod's allreduce op reduces a tensor that nothing else holds in its own buffer, and an
install built with the patch is told from one built without it."""
from __future__ import annotations

import re
import sys

from helpers import run_job, side_by_side
from hvdtrain.install import horovod_patches, shipped

# One all-reduce of a fresh 256 MB tensor inside a tf.function, in a process of its own; it
# prints how far the process's peak resident memory rose, in tensors of that size. Where the
# function also returns the tensor ("held"), the op may not take its buffer.
ONE_ALLREDUCE = """
import resource, sys
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
held = sys.argv[1] == "held"
n = 64 << 20


@tf.function
def reduce(v):
    x = v * 2.0                                     # a new buffer, for the all-reduce alone
    y = hvd.allreduce(x, op=hvd.Sum, name="in_place")
    return (y, x) if held else (y,)


v = tf.ones([n])
reduce(tf.ones([8]))                                # traced on a small input
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = reduce(v)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
assert float(out[0][0]) == 2.0 * hvd.size(), float(out[0][0])
assert not held or float(out[1][0]) == 2.0, "the held input was overwritten"
print(f"peak grew by {grew * 1024 / (4 * n)} tensors")
"""


def test_the_allreduce_op_reduces_a_tensor_nothing_else_holds_in_its_own_buffer():
    hows = ("alone", "held")
    jobs = side_by_side(*(lambda how=how: run_job([sys.executable, "-c", ONE_ALLREDUCE, how],
                                                  timeout=180) for how in hows))
    grew = {}
    for how, job in zip(hows, jobs):
        found = re.search(r"peak grew by (\S+) tensors", job.output)
        assert job.returncode == 0 and found, job.output[-2000:]
        grew[how] = float(found[1])
    # The input's buffer and no other: the peak rises by one tensor, not by two.
    assert grew["alone"] < 1.5, grew
    # Control: the same op on an input the function returns too allocates its own output
    # (two tensors), and leaves the input as it was (asserted in the process).
    assert grew["held"] > 1.5, grew


def test_an_install_built_with_the_in_place_patch_is_told_from_one_without(tmp_path):
    path, marker = horovod_patches.IN_PLACE_MARKER
    patch = (shipped.folder("patches") / horovod_patches.IN_PLACE_PATCH).read_text()
    # The marker is a line the patch adds, to the file the check reads.
    added = patch.split(f"+++ b/{path}\n", 1)[1].split("\n--- a/", 1)[0]
    assert any(line.startswith("+") and marker in line for line in added.splitlines())
    assert horovod_patches.built_in_place()         # this virtualenv's Horovod
    installed = tmp_path / path
    installed.parent.mkdir(parents=True)
    installed.write_text(f"# {marker} to its output\n")
    assert horovod_patches.built_in_place(tmp_path)
    # Controls: the file as Horovod ships it, and no file at all.
    installed.write_text("def _allreduce(tensor, name=None, op=Sum):\n")
    assert not horovod_patches.built_in_place(tmp_path)
    installed.unlink()
    assert not horovod_patches.built_in_place(tmp_path)

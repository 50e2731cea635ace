"""A rank's start: rank_process.load_tensorflow holds back the imports Keras 3 makes for features
hvdtrain does not use (scikit-learn, matplotlib), the digits are read without importing
scikit-learn, after dist.init autograph leaves Horovod's code alone, and TensorFlow's start-up
chatter below the log level is dropped. Each check runs in a fresh Python, the way a rank
starts."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import run_job
from hvdtrain.launch import rank_process
from hvdtrain.data import sklearn_data

LOADED = """
import gc, json, sys
{load}
import keras
loaded = {{name: name in sys.modules for name in ["tensorflow", "sklearn", "matplotlib"]}}
finders = [type(f).__name__ for f in sys.meta_path]
collector = {{"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}}
import matplotlib.pyplot, sklearn.datasets  # importable as usual afterwards
print(json.dumps({{"loaded": loaded, "finders": finders, "keras": keras.__version__,
                  "collector": collector}}))
"""


def modules_after(load: str) -> dict:
    done = subprocess.run([sys.executable, "-c", LOADED.format(load=load)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_load_tensorflow_holds_back_what_hvdtrain_does_not_use_and_no_longer():
    after = modules_after(
        "from hvdtrain.launch import rank_process; rank_process.load_tensorflow()")
    assert after["loaded"] == {"tensorflow": True, "sklearn": False, "matplotlib": False}
    assert "_HoldBack" not in after["finders"]
    # The garbage collector, off while TensorFlow loaded, is on again, and what the import made
    # is out of its sight (the control below: a plain import freezes nothing).
    assert after["collector"]["enabled"] and after["collector"]["frozen"] > 100_000, after


@pytest.mark.keras3_only   # Keras 2 does not import them: nothing to hold back there
def test_control_a_plain_import_loads_them_on_keras_3():
    after = modules_after("import tensorflow")
    assert after["keras"].startswith("3."), after["keras"]
    assert after["loaded"] == {"tensorflow": True, "sklearn": True, "matplotlib": True}
    assert after["collector"] == {"enabled": True, "frozen": 0}


DIGITS = """
import sys
from hvdtrain.data import sklearn_data
{fallback}
images, digits = sklearn_data.digits()
print("sklearn" in sys.modules, images.shape, digits.shape)
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["shipped-file", "control-fallback"])
def test_digits_are_read_without_importing_scikit_learn(fallback):
    patch = "sklearn_data.shipped_file = lambda *parts: None" if fallback else ""
    done = subprocess.run([sys.executable, "-c", DIGITS.format(fallback=patch)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(fallback), "(1797,", "8,", "8)", "(1797,)"]


def test_digits_equal_load_digits():
    from sklearn.datasets import load_digits
    bunch = load_digits()
    images, digits = sklearn_data.digits()
    assert sklearn_data.shipped_file(*sklearn_data.DIGITS_FILE) is not None
    assert images.dtype == bunch.images.dtype and digits.dtype == bunch.target.dtype
    assert np.array_equal(images, bunch.images) and np.array_equal(digits, bunch.target)
    # Control: the comparison sees one pixel off.
    changed = images.copy()
    changed[1000, 4, 4] += 1
    assert not np.array_equal(changed, bunch.images)


CONVERTED = """
import json
from hvdtrain.launch import rank_process
rank_process.load_tensorflow()
import tensorflow as tf
from tensorflow.python.autograph.impl import api  # private: to see what autograph rewrites
import horovod.tensorflow as hvd
from hvdtrain import distributed as dist
{init}
converted = set()
convert = api._convert_actual
def recorded(entity, program_ctx):
    converted.add(entity.__module__.partition(".")[0])
    return convert(entity, program_ctx)
api._convert_actual = recorded

def users_step(x):
    if tf.reduce_sum(x) > 0:  # tensor-dependent: autograph must still rewrite the user's code
        x = x * 2.0
    return hvd.allreduce(x, op=hvd.Sum, name="started")

result = tf.function(users_step)(tf.ones([2])).numpy().tolist()
print(json.dumps({{"result": result, "converted": sorted(converted)}}))
"""


@pytest.mark.parametrize("init", ["dist.init()", "hvd.init()"], ids=["dist.init", "control"])
def test_autograph_leaves_horovod_alone_after_dist_init(init, tmp_path):
    script = tmp_path / "step.py"  # a file: autograph reads the user's source
    script.write_text(CONVERTED.format(init=init))
    # run_job: hvd.init() outside a launcher starts Open MPI's singleton daemon beside it.
    done = run_job([sys.executable, str(script)], timeout=120)
    assert done.returncode == 0, done.output[-3000:]
    seen = json.loads(next(line for line in reversed(done.output.splitlines())
                           if line.startswith("{")))
    assert seen["result"] == [2.0, 2.0]  # one rank: the sum of one doubled tensor
    assert "__main__" in seen["converted"]   # the user's step is still converted
    assert ("horovod" in seen["converted"]) == (init == "hvd.init()"), seen["converted"]


# What TensorFlow 2.21 writes to stderr while it loads, past TF_CPP_MIN_LOG_LEVEL (absl logs
# before absl::InitializeLog() ignore it), between lines that must stay.
CHATTER = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    b"I0000 00:00:1795606562.003002    7691 port.cc:153] oneDNN custom operations are on.\n",
    b"I0000 00:00:1795606562.150292    7691 cpu_feature_guard.cc:227] This TensorFlow binary "
    b"is optimized to use available CPU instructions in performance-critical operations.\n",
    b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    b"with the appropriate compiler flags.\n",
]
WARNING = b"W0000 00:00:1795606562.2    7691 gpu.cc:12] a warning\n"  # kept at level 1
KEPT = [
    b"E0000 00:00:1795606562.3    7691 gpu.cc:13] an error\n",
    b"/x.py:3: DeprecationWarning: a Python warning\n",
    b"To enable the following instructions: after a kept line, kept\n",
]

WRITES_TO_FD_2 = """
import os, sys
from hvdtrain.launch import rank_process
lines = [bytes.fromhex(h) for h in sys.argv[2:]]
with rank_process.tensorflow_chatter_dropped(int(sys.argv[1])):
    data = b"".join(lines)
    os.write(2, data[:37])   # split inside a line, as a C++ writer may
    os.write(2, data[37:])
os.write(2, b"after\\n")
"""


def test_tensorflow_chatter_below_the_log_level_is_dropped():
    lines = CHATTER + [WARNING] + KEPT
    dropped = [True] * len(CHATTER)
    assert rank_process.below_log_level(lines, 2) == dropped + [True] + [False] * len(KEPT)
    # Controls: at level 1 the warning stays, at level 0 (the user asked) nothing goes.
    assert rank_process.below_log_level(lines, 1) == dropped + [False] + [False] * len(KEPT)
    assert not any(rank_process.below_log_level(lines, 0))
    # A message's second line read apart from its first (another chunk of the pipe).
    assert rank_process.below_log_level([CHATTER[3]], 2, previous=True) == [True]
    assert rank_process.below_log_level([CHATTER[3]], 2, previous=False) == [False]
    # Through file descriptor 2, as TensorFlow's C++ writes it, in a fresh process.
    for level, expected in ((2, KEPT), (0, lines)):
        done = subprocess.run([sys.executable, "-c", WRITES_TO_FD_2, str(level),
                               *(line.hex() for line in lines)],
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stderr == b"".join(expected) + b"after\n", level

"""bench migration's script: Horovod's synthetic benchmark with only the lines a migration to
Keras 3 changes, and a clear refusal for a script without them."""
from __future__ import annotations

import pytest

from hvdtrain.errors import UserError
from hvdtrain.bench import migration

HOROVOD_LINES = """import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
        hvd.broadcast_variables(opt.variables(), root_rank=0)
"""


def test_the_migrated_script_changes_the_import_line_and_keras_3s_property_only(tmp_path):
    script = tmp_path / "tensorflow2_synthetic_benchmark.py"
    script.write_text(HOROVOD_LINES)
    changed = migration.migrated(script, tmp_path).read_text().splitlines()
    original = HOROVOD_LINES.splitlines()
    differ = [(a, b) for a, b in zip(original, changed) if a != b]
    assert differ == [("import horovod.tensorflow as hvd",
                       "import hvdtrain.horovod.tensorflow as hvd"),
                      ("        hvd.broadcast_variables(opt.variables(), root_rank=0)",
                       "        hvd.broadcast_variables(opt.variables, root_rank=0)")]


def test_a_script_without_the_lines_to_change_is_refused_in_one_line(tmp_path):
    script = tmp_path / "other.py"
    script.write_text("import horovod.torch as hvd\n")
    with pytest.raises(UserError, match="import horovod.tensorflow as hvd"):
        migration.migrated(script, tmp_path)

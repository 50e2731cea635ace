"""The run directory is owner-only by default (run.private): the directory and every folder in it
0700, every file 0600, whatever the umask the job started with; with run.private=false the umask
decides (the control). One process through the CLI, as a user runs it."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from helpers import assert_ok, hvdtrain, launch

pytestmark = [pytest.mark.multirank, pytest.mark.one_stack]

# One short epoch that writes everything a run writes: checkpoint, metrics, TensorBoard, model.
RUN = ["--preset", "synthetic-mlp", "--epochs", "1"]


def modes(run_dir: Path) -> dict[str, int]:
    """The permission bits of the run directory ('.') and of everything under it."""
    found = {".": stat.S_IMODE(run_dir.stat().st_mode)}
    for path in run_dir.rglob("*"):
        found[str(path.relative_to(run_dir))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def train_with_umask_022(run_dir: Path, *args: str) -> dict[str, int]:
    command = ["sh", "-c", 'umask 022 && exec "$@"', "sh",
               *hvdtrain("train", *RUN, "--run-dir", str(run_dir), *args)]
    assert_ok(launch("single", 1, command), "one epoch")
    return modes(run_dir)


def test_run_dir_is_owner_only_unless_run_private_is_false(tmp_path):
    private = train_with_umask_022(tmp_path / "private")
    assert {"config.json", "metrics.jsonl", "summary.json", "checkpoints", "tensorboard",
            "model"} <= set(private)
    wrong = {name: oct(mode) for name, mode in private.items()
             if mode & 0o077 or (mode != 0o700 and (tmp_path / "private" / name).is_dir())}
    assert wrong == {}
    # Control: the same run asked not to be private gets the umask's 0755 and 0644.
    shared = train_with_umask_022(tmp_path / "shared", "--set", "run.private=false")
    assert shared["."] == 0o755 and shared["config.json"] == 0o644
    assert shared["checkpoints"] == 0o755 and shared["summary.json"] == 0o644

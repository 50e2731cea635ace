"""The helpers the test files import (``from helpers import ...``; pytest puts tests/ on the path,
see pyproject.toml): launching real jobs (horovodrun --gloo, mpirun, or one
process) so that none can hang the suite, and the checks and data several test files use.

Every job goes through hvdtrain.testing.jobs (``Job``, ``run_job``), the one runner the tests and
``hvdtrain bench`` share: a session of its own and a tag in its environment, so that at its time
limit, or when the test ends in any other way (an assertion, pytest-timeout), the job and every
process tagged with it are killed, and the output so far goes with the failure.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import numpy as np
import pytest

from hvdtrain.launch import launchers
from hvdtrain.testing.jobs import (JOB_TAG, Job, JobTimedOut, Launched,  # noqa: F401
                                   run_job, tagged_processes)

BIN = launchers.BIN
TESTS = Path(__file__).parent
ROOT = TESTS.parent   # the checkout
LAUNCHERS = list(launchers.MULTI_RANK)  # the tests' launcher parameter: [mpi], [gloo]


launcher_env = launchers.launch_env


def launch_command(launcher: str, np_: int, argv: list[str], *, tag_output: bool = False,
                   ) -> list[str]:
    """launchers.launch_command; ``tag_output`` makes mpirun prefix every line with its rank's
    tag as horovodrun always does (the launcher's row: Entry.tag, Entry.always_tags)."""
    return launchers.launch_command(launcher, np_, argv, tag_output=tag_output)


def launch(launcher: str, np_: int, argv: list[str], *, cwd: Path | None = None,
           timeout: float = 240, env: dict[str, str] | None = None,
           tag_output: bool = False) -> Launched:
    """Runs a job of ``np_`` ranks under ``launcher`` to completion (see run_job)."""
    return run_job(launch_command(launcher, np_, argv, tag_output=tag_output), timeout=timeout,
                   env=env, cwd=cwd)


T = TypeVar("T")


def side_by_side(*calls: Callable[[], T]) -> list[T]:
    """The results of ``calls`` (commands a test runs and then checks, each a process of its
    own), run side by side: a one-process test run leaves the machine's other cores idle."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


def importable_from(folder: Path) -> dict[str, str]:
    """The environment that lets a job's ranks import modules from ``folder`` (a user's model
    module), in front of the PYTHONPATH the tests run with."""
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def worker(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(TESTS / "multirank_worker.py"), "--out", str(out), *args]


def hvdtrain(*args: str) -> list[str]:
    return [str(BIN / "hvdtrain"), *args]


def convert_digits(src: Path, dst: Path, *args: str, timeout: float
                   ) -> subprocess.CompletedProcess:
    """``hvdtrain data convert SRC DST`` of 8x8 grey digit images, one process (no launcher);
    stdout and stderr apart."""
    return subprocess.run(hvdtrain("data", "convert", str(src), str(dst), "--image-shape",
                                   "8,8,1", *args), env=launcher_env(), capture_output=True,
                          text=True, timeout=timeout)


def launcher_turns(cases: Sequence[str], under_both: Sequence[str]) -> list[tuple[str, str]]:
    """(case, launcher) pairs for a table of cases (bad inputs, kinds of input). What a
    launcher does depends on the path the ranks take, not on the case: ``under_both`` names one
    case per path (every rank finds the error, one rank finds it, the ranks' results gathered,
    ...), run under both launchers. Every other case takes one launcher, in turn: what it
    differs in (a message, a reader) does not depend on the launcher."""
    assert set(under_both) <= set(cases), under_both
    turns = itertools.cycle(LAUNCHERS)
    return [(case, launcher) for case in cases
            for launcher in (LAUNCHERS if case in under_both else [next(turns)])]


# ---------------------------------------------------------------------------------------------
# Checks several test files make

def assert_ok(job: Launched, what: str) -> None:
    assert job.returncode == 0, f"{what} failed ({job.returncode}):\n{job.output[-4000:]}"
    assert not job.leftovers, f"{what}: processes left running {job.leftovers}"


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "hvdtrain: error:" in line]


STOPPED_WITHIN_S = 60


def rank_status(line: str, status: int, rank: int | None = None) -> str:
    """A launcher's ``rank_status_line`` as a regex: ``rank``'s (any rank's) exit ``status``."""
    return (re.escape(line).replace(re.escape("{rank}"), str(rank) if rank is not None else r"\d+")
            .replace(re.escape("{status}"), str(status)))


def assert_stopped_with_one_line(job: Launched, launcher: str, expected: str) -> str:
    """A user error: one `hvdtrain: error:` line holding ``expected``, exit status 2 on every
    rank (mpirun's own; horovodrun names the ranks' status), no traceback from any rank, every
    process gone, within a minute. Returns the line."""
    errors = error_lines(job.output)
    assert len(errors) == 1, job.output[-4000:]
    assert expected in errors[0], errors[0]
    status_line = launchers.entry(launcher).rank_status_line
    if status_line:   # the launcher names each rank's status (horovodrun), and exits 1
        assert job.returncode != 0 and re.search(rank_status(status_line, 2), job.output), \
            job.output
    else:             # it exits with the failed rank's (mpirun)
        assert job.returncode == 2, (job.returncode, job.output[-4000:])
    assert not re.search(launchers.entry(launcher).rank_traceback, job.output, re.M), \
        job.output[-4000:]
    assert job.seconds < STOPPED_WITHIN_S and not job.leftovers, (job.seconds, job.leftovers)
    return errors[0]


def weights(path: Path) -> list[np.ndarray]:
    """The arrays a test worker saved (multirank_worker.py), in the model's order."""
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def exported_model(run_dir: Path):
    """The model a run exported to RUN_DIR/model, loaded as hvdtrain predict does (the format
    depends on the stack)."""
    from hvdtrain import distributed as dist
    return dist.load_model(run_dir / "model")


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def largest_difference(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def relative_distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """|a - b| / |b| over all the weights together (Euclidean norms)."""
    flat = lambda ws: np.concatenate([w.ravel() for w in ws])
    return float(np.linalg.norm(flat(a) - flat(b)) / np.linalg.norm(flat(b)))


# A small, fast, deterministic job for the numerical checks (synthetic-mlp: 266 train and 67
# eval samples).
EXACT = ["--set", "data.num_samples=333", "--set", "run.tensorboard=false",
         "--set", "run.export=false"]
# The resume cases' job (digits-mlp, exported): the runs they copy or compare with are
# tests/multirank/conftest.py's, and a run stopped and resumed must equal one made straight.
RESUME_ARGS = ["--preset", "digits-mlp", "--set", "run.tensorboard=false"]


# ---------------------------------------------------------------------------------------------
# TFRecord files whose records tell themselves apart (unit tests and multi-rank tests)

RECORD_SHAPE = (4, 4, 1)


def _example(pixel: int, label: int, shape=RECORD_SHAPE) -> bytes:
    import tensorflow as tf
    image = np.full(shape, pixel, np.uint8)
    return tf.train.Example(features=tf.train.Features(feature={
        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def write_records(path: Path, pixels, labels=None, shape=RECORD_SHAPE) -> Path:
    """One record per pixel value (the image is filled with it, so it tells records apart)."""
    import tensorflow as tf
    pixels = list(pixels)
    labels = [p % 3 for p in pixels] if labels is None else labels
    with tf.io.TFRecordWriter(str(path)) as writer:
        for pixel, label in zip(pixels, labels):
            writer.write(_example(pixel, label, shape))
    return path


def write_shards(folder: Path, counts, prefix="part") -> list[Path]:
    """Files with ``counts`` records; record pixels are global indices 0, 1, 2, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for i, n in enumerate(counts):
        paths.append(write_records(folder / f"{prefix}-{i:02d}.tfrecord", range(start, start + n)))
        start += n
    return paths


def record_config(path, eval_path, **kw):
    """A tfrecord source's DataConfig for ``path`` and ``eval_path``: RECORD_SHAPE and 3 classes
    unless ``kw`` says otherwise."""
    from hvdtrain.config import DataConfig
    kw.setdefault("image_shape", RECORD_SHAPE)
    kw.setdefault("num_classes", 3)
    return DataConfig(source="tfrecord", path=str(path), eval_path=str(eval_path), **kw)


def shard_logged(stream, folder: Path) -> tuple[list[np.ndarray], list[str]]:
    """The inputs of a train stream's first epoch, batch by batch, and the ids its shard log
    wrote for them (the stream built with ``tfdata.SHARD_LOG_ENV`` set to ``folder``)."""
    batches = list(stream.dataset.take(stream.steps_per_epoch).as_numpy_iterator())
    return [x for x, _ in batches], (folder / "rank0.txt").read_text().splitlines()


# ---------------------------------------------------------------------------------------------
# Multi-host runs (test_multihost.py, test_slurm.py) against the same job on one host

# Small and deterministic: the multi-host result must equal the one-host result.
MULTIHOST_TRAIN_ARGS = ["--preset", "digits-mlp", "--epochs", "3",
                        "--set", "run.export=false", "--set", "run.tensorboard=false"]
# Run in a rank's place: writes its host name and address, then runs the rest of its command line.
REPORT_HOST = TESTS / "cluster" / "report_host.sh"
COMPARED = ["final_train_loss", "final_train_accuracy", "final_eval_loss",
            "final_eval_accuracy", "eval_samples", "steps_per_epoch", "world_size"]


def one_host_summary(launcher: str, ranks: int, tmp_path: Path,
                     train_args: list[str] = MULTIHOST_TRAIN_ARGS) -> dict:
    run_dir = tmp_path / "single"
    done = launch(launcher, ranks, hvdtrain("train", *train_args, "--run-dir", str(run_dir)))
    assert_ok(done, "the job on one host")
    return json.loads((run_dir / "summary.json").read_text())


def assert_same_training(multi: dict, single: dict) -> None:
    for key in COMPARED:
        assert multi[key] == pytest.approx(single[key], rel=1e-6, abs=1e-9), key


# ---------------------------------------------------------------------------------------------
# Tests that must run where the suite is expected to run everything

def expects_root_tests() -> bool:
    """True where a skip of the root-only tests (tmpfs and read-only mounts, network namespaces,
    the multi-host and SLURM clusters) would hide coverage: CI as root, unless
    HVDTRAIN_EXPECT_ROOT_TESTS=0; HVDTRAIN_EXPECT_ROOT_TESTS=1 asks for it anywhere."""
    asked = os.environ.get("HVDTRAIN_EXPECT_ROOT_TESTS", "")
    if asked:
        return asked not in ("0", "false", "no")
    return os.environ.get("CI", "").lower() not in ("", "0", "false") and os.geteuid() == 0


def skip_unless_optional(reason: str) -> None:
    """Skips with ``reason``, or fails where these tests are expected to run (CI as root)."""
    if expects_root_tests():
        pytest.fail(f"expected to run here (CI as root, or HVDTRAIN_EXPECT_ROOT_TESTS=1) but "
                    f"cannot: {reason}", pytrace=False)
    pytest.skip(reason)



"""data.source=images at 2 ranks under horovodrun --gloo and mpirun: a real image tree trains
to the digits bar, so do its converted shards, a resumed run on images or shards ends with the
weights of an uninterrupted one, and every bad input stops every rank with one line, exit 2,
nothing written."""
from __future__ import annotations

import itertools
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import (assert_ok, assert_stopped_with_one_line, convert_digits, exported_model,
                     hvdtrain, launch, launcher_turns)
from hvdtrain.data import records, sources, tfdata
from hvdtrain.config import DataConfig
from hvdtrain.launch import launchers
from hvdtrain.testing.digit_files import SORTED, write_digit_tree, write_digits

pytestmark = pytest.mark.multirank

BAR = 0.95  # the digits CNN after 5 epochs at 2 ranks (test_multirank, the array source)


@pytest.fixture(scope="module")
def digit_tree(tmp_path_factory) -> tuple[Path, Path]:
    return write_digit_tree(tmp_path_factory.mktemp("tree"))


def images_args(train: Path, evaluation: Path | None = None) -> list[str]:
    return ["--data", "images", "--set", f"data.path={train}",
            *(["--set", f"data.eval_path={evaluation}"] if evaluation else []),
            "--set", "run.tensorboard=false"]


def test_image_folders_train_to_the_digits_bar(digit_tree, tmp_path):
    # One launcher for each format (the shards below train under mpirun): how ranks start and
    # stop under each launcher does not depend on the data source (test_multirank, both).
    run_dir = tmp_path / "run"
    job = launch("gloo", 2, hvdtrain("train", "--preset", "digits", "--epochs", "5",
                                     *images_args(*digit_tree), "--run-dir", str(run_dir)),
                 env=shard_log(tmp_path / "read"))
    assert_ok(job, "hvdtrain train on images")
    assert_sharded(tmp_path / "read", 2, whole_split("images", digit_tree))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["eval_samples"] == 360
    assert summary["final_eval_accuracy"] >= BAR, summary
    assert "images 1437 train + 360 eval, 10 classes" in summary["data"]
    # The class names are saved beside the run and inside the exported model.
    for where in (run_dir, run_dir / "model"):
        assert json.loads((where / "classes.json").read_text())["class_names"] == SORTED


def shard_log(folder: Path) -> dict[str, str]:
    """The environment that has every rank's train stream write the ids of the samples its
    first epoch yields into folder."""
    folder.mkdir(parents=True, exist_ok=True)
    return {tfdata.SHARD_LOG_ENV: str(folder)}


def whole_split(source: str, digit_tree: tuple[Path, Path], path: Path | None = None) -> set:
    """The ids of every training sample of ``source`` (the tree's folders, or ``path``): an
    image's path, a record's FILE:INDEX."""
    where = {"images": {"path": str(digit_tree[0]), "eval_path": str(digit_tree[1]),
                        "image_shape": (8, 8, 1)},
             "tfrecord": {"path": str(path)}}[source]
    train = sources.load(DataConfig(source=source, **where), seed=42).train
    if isinstance(train, records.Records):
        return {f"{f}:{i}" for f, n in zip(train.files, train.counts) for i in range(n)}
    return set(train.paths)


def assert_sharded(folder: Path, ranks: int, whole: set) -> None:
    """The ranks read pairwise disjoint shares of the training split, together all of it."""
    read = [set((folder / f"rank{r}.txt").read_text().splitlines()) for r in range(ranks)]
    for a, b in itertools.combinations(range(ranks), 2):
        both = read[a] & read[b]
        assert not both, f"ranks {a} and {b} share samples ({len(both)} of {len(whole)})"
    assert set().union(*read) == whole, "the ranks together miss samples or read others"


# A control: every rank builds the train stream of a world of one (rank 0 of 1): no sharding.
NOT_SHARDED = """
from hvdtrain import cli
from hvdtrain.data import sources
build = sources.train_dataset
sources.train_dataset = lambda split, **k: build(split, **{**k, "rank": 0, "size": 1})
cli.main()
"""


def test_three_ranks_read_disjoint_shares_of_tfrecord_files_not_a_multiple_of_3(digit_tree,
                                                                               tmp_path):
    """TFRecord shards in 7 files (not a multiple of 3) at 3 ranks through `hvdtrain train`
    (one epoch), every rank recording what it reads. (Image folders: the 2-rank trainings
    above and below record and check their shares the same way, and test_images.py shards
    them for 1 to 3 ranks; arrays: every test of 2 ranks x B against 1 rank x 2B, which
    disjoint shares alone pass, and the unit tests of the sharding at any N.)"""
    shards = convert(digit_tree[0], tmp_path / "shards", "--eval-path", str(digit_tree[1]),
                     "--shards", "7")
    args = ["--data", "tfrecord", "--set", f"data.path={shards}", "--set", "run.tensorboard=false"]
    whole = whole_split("tfrecord", digit_tree, shards)
    job = launch("mpi", 3, hvdtrain("train", "--preset", "digits-mlp", "--epochs", "1", *args,
                                    "--run-dir", str(tmp_path / "run")),
                 env=shard_log(tmp_path / "read"))
    assert_ok(job, "hvdtrain train on tfrecord at 3 ranks")
    assert_sharded(tmp_path / "read", 3, whole)
    # Control: the same launch with a pipeline that does not shard fails the check (with the
    # consistency check off, which would stop that job itself).
    wrapper = tmp_path / "not_sharded.py"
    wrapper.write_text(NOT_SHARDED)
    job = launch("mpi", 3, [sys.executable, str(wrapper), "train", "--preset", "digits-mlp",
                            "--epochs", "1", *args,
                            "--set", "train.consistency_check=false",
                            "--run-dir", str(tmp_path / "control")],
                 env=shard_log(tmp_path / "control-read"))
    assert_ok(job, "the control: not sharded")
    with pytest.raises(AssertionError, match="share samples"):
        assert_sharded(tmp_path / "control-read", 3, whole)


def convert(src: Path, dst: Path, *args: str) -> Path:
    job = convert_digits(src, dst, *args, timeout=300)
    assert job.returncode == 0, job.stderr
    return dst


@pytest.mark.beside   # no bound on time: balances the lanes
def test_converted_shards_train_to_the_same_bar(digit_tree, tmp_path):
    shards = convert(digit_tree[0], tmp_path / "shards", "--eval-path", str(digit_tree[1]))
    run_dir = tmp_path / "run"
    job = launch("mpi", 2, hvdtrain("train", "--preset", "digits", "--epochs", "5", "--data",
                                    "tfrecord", "--set", f"data.path={shards}",
                                    "--set", "run.tensorboard=false", "--run-dir", str(run_dir)),
                 env=shard_log(tmp_path / "read"))
    assert_ok(job, "hvdtrain train on converted shards")
    assert_sharded(tmp_path / "read", 2, whole_split("tfrecord", digit_tree, shards))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_samples"] == 360 and summary["final_eval_accuracy"] >= BAR, summary
    assert "tfrecord 1437 train (4 files) + 360 eval" in summary["data"]
    assert json.loads((run_dir / "model" / "classes.json").read_text())["class_names"] == SORTED


def _weights(run_dir: Path) -> list[np.ndarray]:
    return exported_model(run_dir).get_weights()


def test_stop_after_2_and_resume_to_4_on_shards_equals_4_straight(tmp_path):
    # On TFRecord shards. The trainer resumes every source alike (the epoch it starts at, into
    # the source's own stream): arrays resume at 2 ranks in test_multirank.py, and each
    # source's stream resumed equals the uninterrupted one in its unit tests (test_images.py,
    # test_data_records.py, test_data_pipelines.py).
    train, evaluation = write_digit_tree(tmp_path / "tree", limit=300)
    args = ["--data", "tfrecord", "--set", "run.tensorboard=false", "--set",
            f"data.path={convert(train, tmp_path / 'shards', '--eval-path', str(evaluation))}"]
    common = ["--preset", "digits-mlp", "--batch-size", "16", *args]
    straight, resumed, reordered = tmp_path / "straight", tmp_path / "resumed", tmp_path / "re"
    assert_ok(launch("mpi", 2, hvdtrain("train", *common, "--epochs", "4",
                                        "--run-dir", str(straight))), "4 epochs")
    assert_ok(launch("mpi", 2, hvdtrain("train", *common, "--epochs", "2",
                                        "--run-dir", str(resumed))), "2 epochs")
    shutil.copytree(resumed, reordered)
    job = launch("gloo", 2, hvdtrain("train", *common, "--epochs", "4", "--resume",
                                     "--run-dir", str(resumed)))
    assert_ok(job, "resume to 4")
    assert re.findall(r"epoch (\d)/4 +loss", job.output) == ["3", "4"]
    for a, b in zip(_weights(straight), _weights(resumed)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # Control: the same resume in another order ends elsewhere, so the check sees the order.
    assert_ok(launch("gloo", 2, hvdtrain("train", *common, "--epochs", "4", "--resume",
                                         "--set", "data.shuffle=false",
                                         "--run-dir", str(reordered))), "resume unshuffled")
    assert max(np.abs(a - b).max() for a, b in zip(_weights(straight), _weights(reordered))) \
        > 1e-3


# ---------------------------------------------------------------------------------------------
# Bad input

def _bad(root: Path, case: str) -> tuple[list[str], str]:
    train = root / "train"
    write_digits(train, range(60))
    threes = sorted((train / "three").iterdir())
    if case == "truncated jpeg":   # on one rank's share only: the other must not hang
        jpeg = next(p for p in threes if p.suffix == ".jpg")
        jpeg.write_bytes(jpeg.read_bytes()[:-40])
        return images_args(train), f"image {jpeg} cannot be decoded"
    if case == "fewer files than ranks":
        for extra in sorted((train / "two").iterdir())[1:]:
            extra.unlink()
        return (images_args(train, train),
                f"class folder {train / 'two'} holds 1 training images but 2 ranks")
    if case == "missing folder":
        return images_args(root / "nope"), f"image folder {root / 'nope'} does not exist"
    raise AssertionError(case)


# Under both launchers: a file on one rank's share only (the other rank has no problem); a
# problem every rank finds is under both in test_multirank's cases. The other messages of the
# image loader (not an image, an empty class, eval classes that differ, ...) have their unit
# tests (test_images.py, through the same sources.load); what a launch adds is here: the ways
# the ranks stop, and the world size.
BAD_IMAGES_RUNS = launcher_turns(["truncated jpeg", "fewer files than ranks", "missing folder"],
                                 under_both=["truncated jpeg"])


@pytest.mark.fault
@pytest.mark.parametrize("case, launcher", BAD_IMAGES_RUNS)
def test_bad_images_stop_every_rank_with_one_line(case, launcher, tmp_path):
    args, expected = _bad(tmp_path / "data", case)
    run_dir = tmp_path / "run"
    job = launch(launcher, 2, hvdtrain("train", *args, "--run-dir", str(run_dir)), timeout=120)
    assert_stopped_with_one_line(job, launcher, expected)
    assert not run_dir.exists()     # nothing written


@pytest.mark.fault
@pytest.mark.beside   # a rank lost mid-training: mostly the launcher's teardown
@pytest.mark.either_launcher
def test_with_verify_off_a_corrupt_image_is_named_when_first_read(launcher, tmp_path):
    args, expected = _bad(tmp_path / "data", "truncated jpeg")
    job = launch(launcher, 2, hvdtrain("train", *args, "--set", "data.verify_images=false",
                                       "--run-dir", str(tmp_path / "run")), timeout=120)
    # The rank that read it names it; its peer reports the lost rank; no one hangs.
    assert job.returncode != 0 and expected in job.output, job.output
    # (horovodrun adds its own RuntimeError traceback; the ranks must not add one.)
    assert not re.search(launchers.entry(launcher).rank_traceback, job.output, re.M), job.output
    assert job.seconds < 60 and not job.leftovers

"""``hvdtrain data convert`` without MPI: image folders and .npz files to TFRecord shards that
read back as the source's own samples, the sidecar, the refusal of an existing DST, a bad
image named, and a conversion killed half-way (no DST, no shard that looks complete)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from helpers import convert_digits, launcher_env, side_by_side
from hvdtrain.data import convert, records, sources
from hvdtrain.config import DataConfig
from hvdtrain.testing.digit_files import SORTED, write_digits
from hvdtrain.errors import UserError

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

N = 80


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("convert") / "train"
    write_digits(root, range(N))
    return root


def _quiet(total: int) -> convert.Progress:
    return convert.Progress(total, stream=io.StringIO())


def _pairs(split) -> list[tuple[int, bytes]]:
    """Every sample of a split as (label, its pixels as bytes), sorted: the split's content."""
    stream = sources.eval_dataset(split, rank=0, size=1, batch_size=64).as_numpy_iterator()
    return sorted((int(y), np.rint(x * 255).astype(np.uint8).tobytes())
                  for xs, ys in stream for x, y in zip(xs, ys))


def test_converted_folder_reads_back_as_the_image_source_with_its_split(tree, tmp_path):
    meta = convert.convert(str(tree), str(tmp_path / "shards"), shards=3, image_shape=(8, 8, 1),
                           eval_fraction=0.25, seed=3, progress=_quiet)
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == sorted(
        [*meta["train_files"], *meta["eval_files"], records.SIDECAR])
    assert json.loads((tmp_path / "shards" / records.SIDECAR).read_text()) == meta
    # No other flag: shape, classes and the eval files come from the sidecar.
    shards = sources.load(DataConfig(source="tfrecord", path=str(tmp_path / "shards")), seed=0)
    folder = sources.load(DataConfig(source="images", path=str(tree), image_shape=(8, 8, 1),
                                  eval_fraction=0.25), seed=3)
    assert shards.class_names == tuple(SORTED) and shards.input_shape == (8, 8, 1)
    assert len(shards.train.files) == 3 and sum(meta["train_counts"]) == len(folder.train)
    assert _pairs(shards.train) == _pairs(folder.train)
    assert _pairs(shards.eval) == _pairs(folder.eval)
    # Sharp: another seed holds out other images.
    other = sources.load(DataConfig(source="images", path=str(tree), image_shape=(8, 8, 1),
                                 eval_fraction=0.25), seed=4)
    assert _pairs(shards.eval) != _pairs(other.eval)


def test_every_shard_mixes_the_classes(tree, tmp_path):
    meta = convert.convert(str(tree), str(tmp_path / "s"), shards=2, image_shape=(8, 8, 1),
                           progress=_quiet)
    for name in meta["train_files"]:
        one = records.scan(str(tmp_path / "s" / name), (8, 8, 1), 10)
        labels = {y for y, _ in _pairs(one)}
        assert len(labels) >= 8, (name, labels)


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_npz_converts_to_the_same_samples(tmp_path, dtype):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (50, 4, 4, 1)).astype(np.uint8)
    y = rng.integers(0, 3, 50)
    np.savez(tmp_path / "a.npz", x=x if dtype == "uint8" else x / np.float32(255), y=y)
    convert.convert(str(tmp_path / "a.npz"), str(tmp_path / "s"), shards=2, progress=_quiet)
    shards = sources.load(DataConfig(source="tfrecord", path=str(tmp_path / "s")), seed=0)
    arrays = sources.load(DataConfig(source="npz", path=str(tmp_path / "a.npz"), num_classes=0),
                       seed=42)
    assert shards.class_names == ("0", "1", "2") and shards.input_shape == (4, 4, 1)
    assert _pairs(shards.train) == _pairs(arrays.train)
    assert _pairs(shards.eval) == _pairs(arrays.eval)
    assert _pairs(shards.train) != _pairs(arrays.eval)   # sharp: the splits differ


@pytest.mark.fault
def test_npz_floats_outside_0_1_are_refused(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.full((10, 4), 3.0, np.float32), y=np.arange(10) % 2)
    with pytest.raises(UserError, match=r"a.npz: x ranges over 3..3 but TFRecord shards store"):
        convert.convert(str(tmp_path / "a.npz"), str(tmp_path / "s"), progress=_quiet)
    assert sorted(os.listdir(tmp_path)) == ["a.npz"]      # nothing written, nothing left


@pytest.mark.fault
@pytest.mark.parametrize("existing", ["folder", "empty folder", "file"])
def test_an_existing_dst_is_refused_and_left_as_it_was(tree, tmp_path, existing):
    dst = tmp_path / "out"
    if existing == "file":
        dst.write_text("mine")
    else:
        dst.mkdir()
        if existing == "folder":
            (dst / "keep.txt").write_text("mine")
    before = sorted(os.walk(dst)) if dst.is_dir() else dst.read_text()
    job = convert_digits(tree, dst, timeout=120)
    assert job.returncode == 2 and job.stdout == "", job
    assert job.stderr == (f"hvdtrain: error: {dst} already exists: 'hvdtrain data convert' "
                          f"never overwrites; choose another DST or remove it first\n")
    assert (sorted(os.walk(dst)) if dst.is_dir() else dst.read_text()) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_control_a_new_dst_is_written_with_how_to_train_on_it(tree, tmp_path):
    done = convert_digits(tree, tmp_path / "new", timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"--data tfrecord --set data.path={tmp_path / 'new'}" in done.stdout
    assert f"{N} samples" in done.stderr.splitlines()[-1]        # the progress line's end


@pytest.mark.fault
@pytest.mark.parametrize("case", ["truncated jpeg", "no image shape", "missing source"])
def test_bad_sources_are_named_and_leave_nothing(tmp_path, case):
    train = tmp_path / "train"
    write_digits(train, range(30))
    shape, src, named = (8, 8, 1), train, ""
    if case == "truncated jpeg":
        jpeg = next(p for p in sorted((train / "three").iterdir()) if p.suffix == ".jpg")
        jpeg.write_bytes(jpeg.read_bytes()[:-40])
        named = f"image {jpeg} cannot be decoded (truncated or corrupt)"
    elif case == "no image shape":
        shape, named = None, f"{train} is an image folder: pass --image-shape"
    else:
        src = tmp_path / "nope"
        named = f"{src} does not exist"
    with pytest.raises(UserError) as info:
        convert.convert(str(src), str(tmp_path / "s"), image_shape=shape, progress=_quiet)
    assert named in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["train"]


KILLED_AFTER = 30
KILL_SCRIPT = """
import os, signal, sys
from hvdtrain.data import convert

class KilledHalfWay(convert.Progress):
    def advance(self, n=1):
        super().advance(n)
        if self.done == {after}:
            os.kill(os.getpid(), signal.SIGKILL)

convert.convert(sys.argv[1], sys.argv[2], shards=4, image_shape=(8, 8, 1),
                progress=KilledHalfWay)
"""


@pytest.mark.fault
def test_a_conversion_killed_half_way_leaves_no_shard_that_looks_complete(tree, tmp_path):
    dst = tmp_path / "shards"
    job = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(after=KILLED_AFTER),
                          str(tree), str(dst)], env=launcher_env(), capture_output=True,
                         text=True, timeout=120)
    assert job.returncode == -signal.SIGKILL, job.stderr
    assert not dst.exists()                         # the data path a user would pass
    (partial,) = tmp_path.iterdir()
    assert partial.name.startswith("shards.partial-")
    names = sorted(p.name for p in partial.iterdir())
    # 64 train samples in 4 shards of 16: shard 0 was finished, shard 1 was being written.
    assert names == ["train-00000-of-00004.tfrecord", "train-00001-of-00004.tfrecord.partial"]
    assert len(records.scan(str(partial / names[0]), (8, 8, 1), 10)) == 16  # complete indeed
    # A new conversion is not refused, and its result is whole.
    meta = convert.convert(str(tree), str(dst), shards=4, image_shape=(8, 8, 1),
                           progress=_quiet)
    assert sum(meta["train_counts"]) + sum(meta["eval_counts"]) == N


def test_progress_line_on_a_pipe_every_interval_and_at_the_end():
    stream, now = io.StringIO(), [0.0]
    progress = convert.Progress(100, stream=stream, every_s=10.0, clock=lambda: now[0])
    for _ in range(99):
        now[0] += 0.25
        progress.advance()
    now[0] += 0.25
    progress.advance()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue()   # at 10 s, 20 s, and the end
    assert lines[0].startswith("converting [") and "40/100 samples 4/s 15s left" in lines[0]
    assert "100/100 samples" in lines[-1] and "#" * 30 in lines[-1]


@pytest.mark.fault
def test_an_unreadable_sidecar_is_named(tree, tmp_path):
    convert.convert(str(tree), str(tmp_path / "s"), image_shape=(8, 8, 1), progress=_quiet)
    sidecar = tmp_path / "s" / records.SIDECAR
    sidecar.write_text(sidecar.read_text()[:-20])             # cut short
    with pytest.raises(UserError, match=f"{sidecar} is not a readable hvdtrain sidecar"):
        sources.load(DataConfig(source="tfrecord", path=str(tmp_path / "s")), seed=0)


def test_the_cli_split_follows_eval_fraction_and_seed(tree, tmp_path):
    """``hvdtrain data convert --eval-fraction --seed`` as a user runs it: the asked share of
    every class held out; the same seed the same split, another seed another."""
    def convert_with(name: str, seed: int) -> subprocess.CompletedProcess:
        return convert_digits(tree, tmp_path / name, "--eval-fraction", "0.25", "--seed",
                              str(seed), "--shards", "2", timeout=120)

    def split(name: str, done: subprocess.CompletedProcess) -> tuple[list, list]:
        assert done.returncode == 0, done.stderr[-2000:]
        shards = sources.load(DataConfig(source="tfrecord", path=str(tmp_path / name)), seed=0)
        return _pairs(shards.train), _pairs(shards.eval)

    runs = {"first": 3, "again": 3, "other": 4}
    converted = dict(zip(runs, side_by_side(*(partial(convert_with, name, seed)
                                              for name, seed in runs.items()))))
    train, held_out = split("first", converted["first"])
    count = lambda pairs, label: [y for y, _ in pairs].count(label)
    for label in range(10):   # a quarter of the class's images, rounded, at least one
        members = count(train, label) + count(held_out, label)
        assert count(held_out, label) == max(1, round(members * 0.25)), (label, members)
    assert len(train) + len(held_out) == N and not set(train) & set(held_out)
    assert split("again", converted["again"]) == (train, held_out)
    assert split("other", converted["other"])[1] != held_out

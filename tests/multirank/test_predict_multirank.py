"""``hvdtrain predict`` for real at 2 ranks under horovodrun --gloo and mpirun: the CSV equals the
model's own outputs on images, an .npz and TFRecord shards (in input order, with the class
names), from the exported model or the latest checkpoint; every bad input stops every rank with
one line, exit 2, nothing written. Without MPI: test_predict.py."""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from helpers import (assert_ok, assert_stopped_with_one_line, convert_digits, hvdtrain, launch,
                     launcher_turns)
from hvdtrain.models import registry
from hvdtrain.training import checkpoints
from hvdtrain.data import image_decoding, records
from hvdtrain.config import ModelConfig
from hvdtrain.testing.digit_files import SORTED, digits_uint8, write_digit_tree

SHAPE = (8, 8, 1)


# ---------------------------------------------------------------------------------------------
# At 2 ranks under both launchers

EVAL_IMAGES = 61   # digits 0, 5, ..., 300: odd, so the ranks' shares differ in length


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A digits-mlp run on a digit image tree (2 epochs, both checkpoints kept), and the eval
    images as a folder, an .npz file and TFRecord shards."""
    root = tmp_path_factory.mktemp("predict")
    train, evaluation = write_digit_tree(root / "tree", limit=303)
    run = root / "run"
    assert_ok(launch("mpi", 2, hvdtrain(
        "train", "--preset", "digits-mlp", "--epochs", "2", "--data", "images",
        "--set", f"data.path={train}", "--set", f"data.eval_path={evaluation}",
        "--set", "run.tensorboard=false", "--run-dir", str(run))), "training")
    x, _ = digits_uint8()
    np.savez(root / "eval.npz", x=x[: 303: 5])
    shards = root / "shards"
    done = convert_digits(train, shards, "--eval-path", str(evaluation), "--shards", "3",
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return {"run": run, "images": evaluation, "npz": root / "eval.npz", "tfrecord": shards}


def _model_outputs(model: tf.keras.Model, kind: str, where: Path) -> tuple[list[str], np.ndarray]:
    """(input names, softmax rows) of ``model`` over the inputs, computed here, in order."""
    if kind == "npz":
        with np.load(where) as f:
            x = f["x"] / np.float32(255)
        names = [str(i) for i in range(len(x))]
    elif kind == "images":
        names = sorted(str(p) for p in where.rglob("*.*"))
        x = np.stack(list(image_decoding.decoded(names, SHAPE).as_numpy_iterator()))
    else:
        meta = records.read_sidecar(str(where))
        files = sorted([*meta["train_files"], *meta["eval_files"]])
        x = np.stack([image for f in files for image, _ in tf.data.TFRecordDataset(
            str(where / f)).map(records.decoder(SHAPE)).as_numpy_iterator()])
        counts = dict(zip([*meta["train_files"], *meta["eval_files"]],
                          [*meta["train_counts"], *meta["eval_counts"]]))
        names = [f"{where / f}:{i}" for f in files for i in range(counts[f])]
    return names, tf.nn.softmax(model(x, training=False)).numpy()


def _checkpoint_model(run: Path, epoch: int) -> tf.keras.Model:
    model = registry.build(ModelConfig(name="mlp"), SHAPE, 10)   # the digits-mlp preset's
    checkpoints.restore_weights(model, run / "checkpoints" / f"epoch-{epoch:04d}")
    return model


def _csv(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    rows = list(csv.DictReader(path.open()))
    return ([r["input"] for r in rows], [r["class"] for r in rows],
            np.array([float(r["probability"]) for r in rows]))


def assert_csv_is_the_models(out: Path, kind: str, trained: dict[str, Path]) -> None:
    from hvdtrain import distributed as dist
    names, classes, probabilities = _csv(out)
    expected_names, softmax = _model_outputs(dist.load_model(trained["run"] / "model"), kind,
                                             trained[kind])
    assert names == expected_names
    assert classes == [SORTED[i] for i in softmax.argmax(axis=1)]
    np.testing.assert_allclose(probabilities, softmax.max(axis=1), rtol=0, atol=2e-6)
    # Sharp: in another order, or from the first epoch's checkpoint, the outputs differ.
    assert classes != [SORTED[i] for i in np.roll(softmax.argmax(axis=1), 1)]
    _, earlier = _model_outputs(_checkpoint_model(trained["run"], 1), kind, trained[kind])
    assert np.abs(earlier.max(axis=1) - probabilities).max() > 1e-3


@pytest.mark.multirank
@pytest.mark.parametrize("kind, launcher", launcher_turns(
    ["images", "npz", "tfrecord"],
    under_both=["images"]))  # the ranks' scores come back the same way whatever the input
def test_predict_csv_equals_the_models_own_outputs(kind, launcher, trained, tmp_path):
    out = tmp_path / "predictions.csv"
    job = launch(launcher, 2, hvdtrain("predict", "--run-dir", str(trained["run"]),
                                       str(trained[kind]), "--out", str(out)), timeout=180)
    assert_ok(job, f"predict {kind}")
    assert_csv_is_the_models(out, kind, trained)
    expected = {"images": EVAL_IMAGES, "npz": EVAL_IMAGES, "tfrecord": 303}[kind]
    assert f"wrote {out}: {expected} predictions over 10 classes" in job.output


@pytest.mark.multirank
def test_without_input_3_ranks_score_the_eval_set_from_the_latest_checkpoint(trained,
                                                                           tmp_path):
    run = tmp_path / "run"     # no exported model: the latest checkpoint (epoch 2) is the same
    shutil.copytree(trained["run"], run, ignore=shutil.ignore_patterns("model"))
    job = launch("mpi", 3, hvdtrain("predict", "--run-dir", str(run)), timeout=180)
    assert_ok(job, "predict the eval set")
    shutil.copy(run / "predictions.csv", tmp_path / "predictions.csv")
    assert_csv_is_the_models(tmp_path / "predictions.csv", "images", trained)


def _bad_predict(case: str, trained: dict[str, Path], root: Path) -> tuple[list[str], str]:
    run = str(trained["run"])
    if case == "corrupt image":   # in rank 1's share only: rank 0 must not wait for it
        folder = root / "photos"
        shutil.copytree(trained["images"], folder)
        order = sorted(folder.rglob("*.*"))
        victim = next(p for i, p in enumerate(order) if i % 2 and p.suffix == ".jpg")
        victim.write_bytes(victim.read_bytes()[:-40])
        return [run, str(folder)], f"image {victim} cannot be decoded"
    if case == "corrupt npz":
        (root / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
        return [run, str(root / "bad.npz")], f"{root / 'bad.npz'} is not a readable .npz"
    if case == "truncated records":
        shutil.copytree(trained["tfrecord"], root / "shards")
        victim = sorted((root / "shards").glob("train-*"))[0]
        victim.write_bytes(victim.read_bytes()[:-7])
        return [run, str(root / "shards")], f"{victim} is not a valid TFRecord file"
    raise AssertionError(case)


@pytest.mark.multirank
@pytest.mark.fault
@pytest.mark.parametrize("case, launcher", launcher_turns(
    ["corrupt image", "corrupt npz", "truncated records"],   # "wrong shape": test_predict.py
    under_both=["corrupt image"]))   # on one rank's share; the others every rank finds
def test_bad_input_after_horovod_starts_stops_every_rank(case, launcher, trained, tmp_path):
    args, expected = _bad_predict(case, trained, tmp_path)
    out = tmp_path / "p.csv"
    job = launch(launcher, 2, hvdtrain("predict", "--run-dir", *args, "--out", str(out)),
                 timeout=120)
    assert_stopped_with_one_line(job, launcher, expected)
    assert not out.exists() and not list(tmp_path.glob(".p.csv*"))   # nothing written


@pytest.mark.multirank
@pytest.mark.fault
@pytest.mark.parametrize("case", ["missing run dir", "no model and no checkpoint",
                                  "output exists"])
def test_bad_input_before_horovod_starts_stops_every_rank(case, trained, tmp_path):
    run, expected = trained["run"], ""
    out = tmp_path / "p.csv"
    if case == "missing run dir":
        run, expected = tmp_path / "nope", f"run dir {tmp_path / 'nope'} does not exist"
    elif case == "no model and no checkpoint":
        run = tmp_path / "run"
        run.mkdir()
        shutil.copy(trained["run"] / "config.json", run / "config.json")
        expected = f"{run} holds no exported model (model/) and no checkpoint"
    else:
        out.write_text("earlier\n")
        expected = f"{out} already exists: pass --overwrite"
    job = launch("mpi", 2, hvdtrain("predict", "--run-dir", str(run), str(trained["npz"]),
                                    "--out", str(out)), timeout=120)
    assert_stopped_with_one_line(job, "mpi", expected)
    if case == "output exists":
        assert out.read_text() == "earlier\n"
    else:
        assert not out.exists()

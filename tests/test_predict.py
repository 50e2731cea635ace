"""``hvdtrain predict``: its inputs and order without MPI, then for real at 2 ranks under
horovodrun --gloo and mpirun: the CSV equals the model's own outputs on images, an .npz and
TFRecord shards (in input order, with the class names), from the exported model or the latest
checkpoint; every bad input stops every rank with one line, exit 2, nothing written."""
from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import (assert_ok, assert_stopped_with_one_line, convert_digits, hvdtrain, launch,
                      launcher_turns)
from hvdtrain import checkpoints, models, predict
from hvdtrain.data import convert, images, predict_inputs, records
from hvdtrain.config import Config, ModelConfig
from hvdtrain.testing.digit_files import SORTED, digits_uint8, write_digit_tree, write_digits
from hvdtrain.errors import UserError

SHAPE = (8, 8, 1)


# ---------------------------------------------------------------------------------------------
# Without MPI

@pytest.mark.parametrize("total", [0, 1, 5, 7, 12])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_the_ranks_scores_go_back_in_input_order(total, size):
    rows = np.arange(total, dtype=np.float64)[:, None]
    per_rank = [rows[rank::size] for rank in range(size)]   # what sources.eval_dataset shards
    np.testing.assert_array_equal(predict.in_input_order(per_rank), rows)
    if len(per_rank[0]) != len(per_rank[-1]):  # shares out of rank order: caught, not mixed
        with pytest.raises(ValueError, match="not its share"):
            predict.in_input_order(per_rank[::-1])


def test_image_inputs_flat_or_in_class_folders_in_sorted_path_order(tmp_path):
    nested = write_digits(tmp_path / "nested", range(12))
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in nested[:5]:
        shutil.copy(path, flat / path.name)
    (flat / ".DS_Store").write_text("hidden: not data")
    got = predict_inputs.read(str(tmp_path / "nested"), SHAPE, Config())
    assert got.names == sorted(map(str, nested)) and isinstance(got.split, images.ImageFiles)
    assert predict_inputs.read(str(flat), SHAPE, Config()).names == sorted(
        str(flat / p.name) for p in nested[:5])
    one = predict_inputs.read(str(nested[3]), SHAPE, Config())
    assert one.names == [str(nested[3])]


def test_npz_and_record_inputs_are_named_by_row_and_by_file_and_record(tmp_path):
    x, y = digits_uint8()
    np.savez(tmp_path / "x.npz", x=x[:7])            # no labels needed
    got = predict_inputs.read(str(tmp_path / "x.npz"), SHAPE, Config())
    assert got.names == [str(i) for i in range(7)]
    np.testing.assert_allclose(got.split.x, x[:7] / np.float32(255))
    np.savez(tmp_path / "xy.npz", x=x[:40], y=y[:40])
    convert.convert(str(tmp_path / "xy.npz"), str(tmp_path / "shards"), shards=2,
                    progress=lambda total: convert.Progress(total, stream=io.StringIO()))
    got = predict_inputs.read(str(tmp_path / "shards"), SHAPE, Config())  # records, not images
    assert isinstance(got.split, records.Records) and len(got) == 40
    first, second = (tmp_path / "shards" / f"eval-0000{k}-of-00002.tfrecord" for k in (0, 1))
    assert got.names[:2] == [f"{first}:0", f"{first}:1"]
    assert got.names[got.split.counts[0]] == f"{second}:0"


@pytest.mark.fault
@pytest.mark.parametrize("case", ["wrong shape", "not images", "no images", "not an image"])
def test_bad_inputs_are_user_errors_naming_the_file(case, tmp_path):
    x, _ = digits_uint8()
    np.savez(tmp_path / "small.npz", x=x[:3, :4, :4])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "class").mkdir()
    write_digits(tmp_path / "mixed", range(4))
    (tmp_path / "mixed" / "two" / "notes.txt").write_text("twos")
    spec, shape, fragment = {
        "wrong shape": (tmp_path / "small.npz", SHAPE,
                        "x holds inputs of shape (4, 4, 1) but the model takes (8, 8, 1)"),
        "not images": (tmp_path / "mixed", (64,), "the model takes inputs of shape (64,)"),
        "no images": (tmp_path / "empty", SHAPE, "holds no images"),
        "not an image": (tmp_path / "mixed", SHAPE, "notes.txt is not a JPEG or PNG"),
    }[case]
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        predict_inputs.read(str(spec), shape, Config())


def _trained_layout(root: Path, *, model: bool, checkpoint: bool) -> Path:
    (root / "config.json").parent.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    if model:
        (root / "model").mkdir()
    if checkpoint:
        (root / "checkpoints/epoch-0001").mkdir(parents=True)
        (root / "checkpoints/epoch-0001/meta.json").write_text("{}")
    return root


@pytest.mark.fault
def test_request_refuses_a_run_without_model_or_checkpoint_and_an_existing_output(tmp_path):
    empty = _trained_layout(tmp_path / "empty", model=False, checkpoint=False)
    with pytest.raises(UserError, match="holds no exported model .* and no checkpoint"):
        predict.request(str(empty), "", None, overwrite=False, batch_size=8)
    run = _trained_layout(tmp_path / "run", model=False, checkpoint=True)
    req = predict.request(str(run), "", None, overwrite=False, batch_size=8)
    assert (req.model_dir, req.checkpoint.name, req.out) == (
        None, "epoch-0001", run / "predictions.csv")
    (run / "predictions.csv").write_text("earlier")
    with pytest.raises(UserError, match="already exists: pass --overwrite"):
        predict.request(str(run), "", None, overwrite=False, batch_size=8)
    assert predict.request(str(run), "", None, overwrite=True, batch_size=8).overwrite
    with pytest.raises(UserError, match="input .*nope does not exist"):
        predict.request(str(run), str(tmp_path / "nope"), str(tmp_path / "p.csv"),
                        overwrite=False, batch_size=8)


def test_the_csv_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "p.csv"
    scores = np.array([[1, 0.5], [0, 0.25]])
    predict.write_csv(out, ["a,b.png", "c.png"], ["cat", "dog"], scores, overwrite=False)
    assert list(csv.reader(out.open())) == [
        ["input", "class", "probability"], ["a,b.png", "dog", "0.500000"],
        ["c.png", "cat", "0.250000"]]
    with pytest.raises(UserError, match="already exists"):
        predict.write_csv(out, ["x"], ["cat", "dog"], scores[:1], overwrite=False)
    assert out.read_text().count("\n") == 3 and list(tmp_path.iterdir()) == [out]


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
        x = np.stack(list(images.decoded(names, SHAPE).as_numpy_iterator()))
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
    model = models.build(ModelConfig(name="mlp"), SHAPE, 10)   # the digits-mlp preset's
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
    if case == "wrong shape":
        x, _ = digits_uint8(side=16)
        np.savez(root / "big.npz", x=x[:5])
        return [run, str(root / "big.npz")], "x holds inputs of shape (16, 16, 1)"
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
    ["wrong shape", "corrupt image", "corrupt npz", "truncated records"],
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

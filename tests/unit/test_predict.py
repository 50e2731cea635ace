"""``hvdtrain predict`` without MPI: every rank's scores back in input order, the inputs it reads
(image folders, .npz, TFRecord files) and their names, bad inputs as user errors, the run it
refuses, and the CSV written whole or not at all. At 2 ranks: test_predict_multirank.py."""
from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from hvdtrain.training import predict
from hvdtrain.data import convert, images, predict_inputs, records
from hvdtrain.config import Config
from hvdtrain.testing.digit_files import digits_uint8, write_digits
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

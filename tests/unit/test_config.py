"""Config layering, validation and the CLI's handling of user mistakes (no TensorFlow, no MPI)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from hvdtrain import cli, config
from hvdtrain.config import overrides, presets
from hvdtrain.errors import UserError


def test_every_preset_is_a_valid_config():
    for name in presets.PRESETS:
        cfg = presets.preset(name)
        assert cfg.preset == name
        assert overrides.from_dict(config.to_dict(cfg)) == cfg  # survives run_dir/config.json


def test_layers_apply_in_order_toml_then_set_then_flags(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text('[optim]\nlr = 0.2\nname = "adam"\n[train]\nepochs = 7\n')
    cfg = presets.build_config("digits", str(toml), ["optim.lr=0.3", "data.image_shape=4,4,1"],
                               {"train": {"epochs": 9}})
    assert cfg.optim.lr == 0.3 and cfg.optim.name == "adam"
    assert cfg.train.epochs == 9
    assert cfg.data.image_shape == (4, 4, 1)
    assert cfg.model == presets.digits().model  # untouched sections keep the preset's values


def test_a_toml_file_can_switch_source_while_set_gives_the_path(tmp_path):
    toml = tmp_path / "npz.toml"
    toml.write_text('[data]\nsource = "npz"\n')
    cfg = presets.build_config("digits", str(toml), ["data.path=/some/file.npz"])
    assert (cfg.data.source, cfg.data.path) == ("npz", "/some/file.npz")


@pytest.mark.parametrize("assignment, fragment", [
    ("optim.lr=0", "optim.lr must be > 0"),
    ("optim.lr=-0.1", "optim.lr must be > 0"),
    ("train.batch_size=0", "train.batch_size must be > 0"),
    ("train.batch_size=-4", "train.batch_size must be > 0"),
    ("train.epochs=1.5", "expected an integer"),
    ("optim.name=adamw", "is not one of sgd, adam"),
    ("optim.lr_scaling=linaer", "did you mean 'linear'"),
    ("optim.lrr=0.1", "unknown config key optim.lrr (did you mean 'optim.lr'?)"),
    ("nosuch.key=1", "unknown config section 'nosuch'"),
    ("optim.lr", "expected section.key=value"),
    ("data.shuffle=maybe", "expected true or false"),
    ("data.image_shape=8,x", "integers separated by commas"),
    ("model.dropout=1.0", "model.dropout must be in [0.0, 1.0)"),
    ("data.source=npz", "needs a file"),
    ("run.stall_warning_s=0", "run.stall_warning_s must be > 0"),
    ("run.stall_abort_s=30", "run.stall_abort_s=30 must be 0 (never) or >= run.stall_warning_s=60"),
])
def test_bad_values_name_the_key_and_the_fix(assignment, fragment):
    with pytest.raises(UserError) as err:
        presets.build_config("digits", None, [assignment])
    assert fragment in str(err.value)


def test_config_fingerprint_and_differences():
    base = config.to_dict(presets.build_config("digits"))
    other = config.to_dict(presets.build_config("digits", None, ["optim.lr=0.02",
                                                                 "train.epochs=3"]))
    assert config.fingerprint(base) == config.fingerprint(config.to_dict(presets.digits()))
    assert config.fingerprint(base) != config.fingerprint(other)
    assert config.differences(base, other) == ["optim.lr", "train.epochs"]
    assert config.differences(base, base) == []
    assert config.differences(base, {**base, "preset": "x"}) == ["preset"]
    # Stall abort 0 (never) is allowed whatever the warning time.
    assert presets.build_config("digits", None, ["run.stall_abort_s=0"]).run.stall_abort_s == 0


def test_unknown_preset_suggests_the_close_one():
    with pytest.raises(UserError, match="unknown preset 'digit'.*did you mean 'digits'"):
        presets.preset("digit")


def test_toml_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        presets.build_config("digits", str(tmp_path / "missing.toml"))
    broken = tmp_path / "broken.toml"
    broken.write_text("[optim\nlr = ")
    with pytest.raises(UserError, match="not valid TOML"):
        presets.build_config("digits", str(broken))
    wrong_type = tmp_path / "wrong.toml"
    wrong_type.write_text('[train]\nepochs = "many"\n')
    with pytest.raises(UserError, match="train.epochs"):
        presets.build_config("digits", str(wrong_type))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[optimizer]\nlr = 0.1\n')
    with pytest.raises(UserError, match="unknown config section 'optimizer'"):
        presets.build_config("digits", str(unknown))


def test_config_is_frozen():
    cfg = presets.digits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.epochs = 3  # type: ignore[misc]


def test_help_documents_every_key():
    text = overrides.describe()
    for key in overrides.all_keys():
        assert key in text
    fields = sum(len(dataclasses.fields(c)) for c in config.SECTIONS.values())
    assert len(overrides.all_keys()) == fields


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--set", "optim.lr=-1"], "optim.lr must be > 0"),
    (["train", "--preset", "nope"], "unknown preset"),
    (["train", "--batch-size", "0"], "train.batch_size must be > 0"),
    (["train", "--epochs", "three"], "invalid int value"),
    (["train", "--model", ""], "model.name is empty"),
    (["eval", "--run-dir", "/nonexistent/run"], "run dir /nonexistent/run does not exist"),
    (["predict", "--run-dir", "/nonexistent/run"], "run dir /nonexistent/run does not exist"),
    (["predict", "--run-dir", "/tmp"], "/tmp/config.json not found"),
    (["fly"], "invalid choice"),
    (["bench", "nope"], "invalid choice: 'nope'"),
    (["train", "--set", "train.loop=fitt"], "train.loop='fitt' is not one of fit, custom"),
])
def test_cli_user_mistakes_exit_2_with_one_line(argv, fragment, capsys):
    assert cli.run(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("hvdtrain: error: ") and fragment in err[0]


def test_a_shared_error_on_rank_1_waits_for_rank_0_then_reports_it_itself(monkeypatch, capsys):
    # Rank 1 stays silent while rank 0 (slower to import TensorFlow on a loaded host) reports
    # and exits, which makes the launcher end rank 1; a rank 1 still alive after the grace
    # reports the error itself, so it is never lost.
    slept = []
    monkeypatch.setattr(cli.time, "sleep", slept.append)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert cli.run(["eval", "--run-dir", "/nonexistent/run"]) == 2
    assert slept == [cli.SHARED_ERROR_GRACE_S] and cli.SHARED_ERROR_GRACE_S >= 15
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hvdtrain: error: (rank 1) run dir /nonexistent/run does not exist: pass the "
                   "--run-dir of a training run"], err
    # Control: on rank 0 it is reported at once.
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert cli.run(["eval", "--run-dir", "/nonexistent/run"]) == 2 and len(slept) == 1


HEAVY = ("hvdtrain.bench", "tensorflow", "horovod")
LOADED = ("import sys, {imports}; print(sorted({{h for m in sys.modules for h in {heavy!r} "
          "if m == h or m.startswith(h + '.')}}))")


def _modules_after(imports: str) -> str:
    code = LOADED.format(imports=imports, heavy=HEAVY)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()


def test_the_cli_loads_no_benchmark_tensorflow_or_horovod_at_import():
    assert _modules_after("hvdtrain.cli") == "[]"
    # Control: the check sees the benchmarks when they are imported.
    assert "hvdtrain.bench" in _modules_after("hvdtrain.cli, hvdtrain.bench.suite")

"""Named starting points. Each is the base Config with a few fields changed, and says why."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

from hvdtrain.config.checks import suggest
from hvdtrain.config import Config, DataConfig, ModelConfig, OptimConfig, TrainConfig
from hvdtrain.config.overrides import load_toml, parse_assignments, with_overrides
from hvdtrain.errors import UserError


def digits() -> Config:
    """The default preset: the digits CNN on scikit-learn's digits."""
    # scikit-learn's 8x8 digits (1,437 train / 360 eval). Per-rank batch 32, lr 0.05 per rank:
    # at 2 ranks the global batch is 64 and the lr 0.1 after one warmup epoch; 10 epochs (the
    # default). The tests hold it to 0.95 eval accuracy after 5 epochs at 2 ranks.
    return Config(preset="digits")


def digits_mlp() -> Config:
    """The digits preset with the MLP instead of the CNN: quick runs on real data."""
    return dataclasses.replace(digits(), preset="digits-mlp", model=ModelConfig(name="mlp"))


def synthetic_mlp() -> Config:
    """A small MLP on synthetic 8x8 data, for smoke tests."""
    # Seconds per run: the smallest real job, for smoke tests and trying a launcher.
    return Config(preset="synthetic-mlp",
                  data=DataConfig(source="synthetic", num_samples=1024, image_shape=(8, 8, 1)),
                  model=ModelConfig(name="mlp", width=32),
                  train=TrainConfig(epochs=3, batch_size=32))


def synthetic_resnet() -> Config:
    """The small ResNet on synthetic 32x32x3 data, for scaling runs."""
    # CIFAR-sized inputs (32x32x3) through the small ResNet: a compute-bound job for scaling runs.
    return Config(preset="synthetic-resnet",
                  data=DataConfig(source="synthetic", num_samples=4096, image_shape=(32, 32, 3)),
                  model=ModelConfig(name="resnet_small", width=16),
                  optim=OptimConfig(lr=0.02),
                  train=TrainConfig(epochs=3, batch_size=64))


def synthetic_mobilenetv2() -> Config:
    """MobileNetV2 on synthetic 64x64x3 data, as in Horovod's synthetic benchmark."""
    # The benchmark model of Horovod's TF2 synthetic benchmark, at a CPU-friendly 64x64 input.
    return Config(preset="synthetic-mobilenetv2",
                  data=DataConfig(source="synthetic", num_samples=1024, image_shape=(64, 64, 3)),
                  model=ModelConfig(name="mobilenetv2"),
                  optim=OptimConfig(lr=0.01),
                  train=TrainConfig(epochs=2, batch_size=16))


PRESETS: dict[str, Callable[[], Config]] = {
    "digits": digits,
    "digits-mlp": digits_mlp,
    "synthetic-mlp": synthetic_mlp,
    "synthetic-resnet": synthetic_resnet,
    "synthetic-mobilenetv2": synthetic_mobilenetv2,
}


def preset(name: str) -> Config:
    """A fresh Config of the preset ``name``; UserError (with the closest name) if unknown."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}{suggest(name, PRESETS)}; presets are "
                        f"{', '.join(PRESETS)}")
    return PRESETS[name]()


def build_config(preset_name: str = "digits", toml_path: str | None = None,
                 assignments: Iterable[str] = (),
                 extra: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Preset, then the TOML file, then ``--set`` assignments, then ``extra`` (CLI shortcuts).

    The layers are merged first and applied once, so a TOML file may switch ``data.source``
    to ``npz`` while ``--set data.path=...`` supplies the file.
    """
    merged: dict[str, dict[str, Any]] = {}
    layers = [load_toml(toml_path) if toml_path else {}, parse_assignments(assignments),
              extra or {}]
    for layer in layers:
        for section, values in layer.items():
            if isinstance(values, Mapping):
                merged.setdefault(section, {}).update(values)
            else:
                merged[section] = values  # with_overrides rejects it with a clear message
    return with_overrides(preset(preset_name), merged)

"""The configuration, built in layers: presets, then a TOML file, then ``--set section.key=value``,
then flags (``presets.build_config``).

This module is the package's face: ``hvdtrain.config.Config`` and the rest, from the modules that
hold them: ``sections.py`` (the typed sections), ``values.py`` (a config as plain values);
``capabilities.py`` (what each Keras binding runs), ``checks.py``, ``overrides.py``,
``presets.py`` and ``model_catalog.py`` (the registered models) are imported by their own names.
"""
from __future__ import annotations

from hvdtrain.config.sections import (MB, SECTIONS, Compression, Config, DataCache,
                                      DataConfig, DataSource, Device, HorovodConfig, Loop,
                                      LrDecay, LrScaling, ModelConfig, OptimConfig,
                                      OptimizerName, Precision, ReduceOp, RunConfig,
                                      TrainConfig)
from hvdtrain.config.values import differences, fingerprint, to_dict

__all__ = ["MB", "SECTIONS", "Compression", "Config", "DataCache", "DataConfig",
           "DataSource", "Device", "HorovodConfig", "Loop", "LrDecay", "LrScaling", "ModelConfig",
           "OptimConfig", "OptimizerName", "Precision", "ReduceOp", "RunConfig", "TrainConfig",
           "differences", "fingerprint", "to_dict"]

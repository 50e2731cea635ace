"""GPUs for a machine that has none, for the SLURM test of one GPU per task: on PYTHONPATH,
Python imports this module at start-up, and it makes TensorFlow, once imported, list one GPU for
each entry of CUDA_VISIBLE_DEVICES (as CUDA would: the devices the launcher gave this process).
Pinning one of them is recorded, not done: each process writes the CUDA_VISIBLE_DEVICES it got
and the index of the GPU it pinned to REPORT_DIR/gpu-rank{SLURM_PROCID}.json. Everything else
of TensorFlow is untouched, so the rank trains on its CPU.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path


def _given() -> list[str]:
    return [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def _record(pinned: int) -> None:
    report = Path(os.environ["REPORT_DIR"]) / f"gpu-rank{os.environ.get('SLURM_PROCID', '0')}.json"
    report.write_text(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                  "pinned": pinned}))


def _fake(config) -> None:
    """Wraps ``tf.config``'s device listing and pinning for the fake GPUs."""
    real_list, real_visible = config.list_physical_devices, config.set_visible_devices
    gpus = [config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
            for i in range(len(_given()))]

    def list_physical_devices(device_type=None):
        return list(gpus) if device_type == "GPU" else real_list(device_type)

    def set_visible_devices(devices, device_type=None):
        chosen = devices if isinstance(devices, list) else [devices]
        if device_type == "GPU":
            if chosen:
                _record(gpus.index(chosen[0]))
            return None
        return real_visible(devices, device_type)

    config.list_physical_devices = list_physical_devices
    config.set_visible_devices = set_visible_devices
    config.experimental.set_memory_growth = lambda device, enable: None


class _AfterTensorFlow(importlib.abc.MetaPathFinder):
    """Runs ``_fake`` once the tensorflow package has been imported."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _fake(module.config)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterTensorFlow())

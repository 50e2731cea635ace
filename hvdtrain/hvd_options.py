"""Horovod's run-time options: which HOROVOD_* variables the config sets, what is in force, and
which option cannot work in this world. Pure: no Horovod, no TensorFlow, testable anywhere.

Horovod reads fusion threshold, cycle time, autotune and timeline from the environment once, in
``hvd.init()``; ``dist.init`` therefore sets them from the config just before it.
"""
from __future__ import annotations

import os
from typing import Mapping

from hvdtrain.config import HorovodConfig

MB = 1024 * 1024
# Horovod 0.28's own values when a variable is unset (horovod/common/operations.cc).
HOROVOD_DEFAULT_FUSION_MB = 128.0
HOROVOD_DEFAULT_CYCLE_MS = 1.0


def runtime_env(options: HorovodConfig) -> dict[str, str]:
    """The HOROVOD_* variables this config sets. Keys left at -1 / off / empty are not set, so
    a launcher's own flags (horovodrun --cycle-time-ms, --timeline-filename, ...) still work."""
    env: dict[str, str] = {}
    if options.fusion_threshold_mb >= 0:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(options.fusion_threshold_mb * MB))
    if options.cycle_time_ms > 0:
        env["HOROVOD_CYCLE_TIME"] = f"{options.cycle_time_ms:g}"
    if options.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if options.timeline:
        env["HOROVOD_TIMELINE"] = os.path.abspath(options.timeline)
    return env


def in_force(environ: Mapping[str, str]) -> str:
    """One line naming the run-time values Horovod uses, whoever set them."""
    fusion = environ.get("HOROVOD_FUSION_THRESHOLD")
    fusion_mb = int(fusion) / MB if fusion is not None else HOROVOD_DEFAULT_FUSION_MB
    cycle = float(environ.get("HOROVOD_CYCLE_TIME", HOROVOD_DEFAULT_CYCLE_MS))
    autotune = environ.get("HOROVOD_AUTOTUNE", "0").strip() not in ("", "0")
    timeline = environ.get("HOROVOD_TIMELINE") or "off"
    return (f"fusion {fusion_mb:g} MB{'' if fusion_mb else ' (off)'}, cycle {cycle:g} ms, "
            f"autotune {'on' if autotune else 'off'}, timeline {timeline}")


def world_problem(options: HorovodConfig, size: int, controller: str) -> str | None:
    """What cannot work with this many ranks on this controller, or None. The config itself
    already refused options the fit loop cannot do."""
    if options.op != "adasum":
        return None
    if size & (size - 1):
        lower = 1 << (size.bit_length() - 1)
        return (f"horovod.op=adasum needs a power-of-two number of ranks, got {size}: "
                f"launch {lower} or {lower * 2} ranks, or use horovod.op=average")
    if controller != "mpi" and size > 1:
        return ("horovod.op=adasum needs Horovod's MPI controller (Horovod implements Adasum "
                "over MPI only): launch with mpirun or horovodrun without --gloo")
    return None

"""scripts/machine_ceiling.py: each of the two side-by-side jobs is bound to its own core."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from hvdtrain_bench.shared import launch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "machine_ceiling.py"


def load_script():
    spec = importlib.util.spec_from_file_location("machine_ceiling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_job_of_the_pair_is_bound_to_its_own_core():
    ceiling = load_script()
    command = launch.launch_command("mpi", 1, ["python", "-m", "job"])
    # Control: bench's own command maps every job from core 0, so a pair would share it.
    assert command[command.index("--map-by") + 1] == "core" and "--cpu-set" not in command
    for core in (0, 1):
        pinned = ceiling.on_core(command, core)
        assert pinned[pinned.index("--cpu-set") + 1] == str(core)
        assert "--map-by" not in pinned and "--bind-to" in pinned
        assert pinned[-3:] == ["python", "-m", "job"]

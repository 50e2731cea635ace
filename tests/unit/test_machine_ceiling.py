"""scripts/machine_ceiling.py's pair: a 1-rank job's command bound to a core of its own
(``launch.launch_command``'s ``core``), which ``trainer_job.measure`` passes on."""
from __future__ import annotations

from hvdtrain.bench.shared import launch


def test_each_job_of_the_pair_is_bound_to_its_own_core():
    argv = ["python", "-m", "job"]
    command = launch.launch_command("mpi", 1, argv)
    # Control: bench's own command maps every job from core 0, so a pair would share it.
    assert command[command.index("--map-by") + 1] == "core" and "--cpu-set" not in command
    for core in (0, 1):
        pinned = launch.launch_command("mpi", 1, argv, core)
        assert pinned[pinned.index("--cpu-set") + 1] == str(core)
        assert "--map-by" not in pinned and "--bind-to" in pinned
        assert pinned[-3:] == argv

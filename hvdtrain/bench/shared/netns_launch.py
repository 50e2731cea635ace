"""A measured job's ranks across namespace hosts: one rank per host of a NetnsCluster, started from
host1 the way a user starts them across machines, all traffic on the hosts' own (shaped) link:

- mpi: ``run_scripts/mpirun_hostfile.sh`` (the user's multi-host launcher) with a hostfile of one
  slot per host and ``-i`` the hosts' interface for both MPI's data and its wiring;
- gloo: ``horovodrun --gloo -H host1:1,host2:1 --network-interface``.

No launcher binds cores here: each host's processes already run on that host's own cores
(``NetnsCluster(cores=...)``), which every rank it starts inherits.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from hvdtrain.install import shipped
from hvdtrain.launch import launchers
from hvdtrain.testing.jobs import JOB_TAG
from hvdtrain.testing.netns_cluster import NetnsCluster

LaunchWith = Callable[[Sequence[str]], list[str]]


def across_hosts(cluster: NetnsCluster, launcher: str, work_dir: Path) -> LaunchWith:
    """The function that turns a rank's command line into the command that starts one rank
    per host of ``cluster`` under ``launcher`` (mpi or gloo), run on host1."""
    if launcher == "mpi":
        hostfile = work_dir / f"hostfile-{cluster.tag}"
        hostfile.write_text("".join(f"{name} slots=1\n" for name in cluster.names))

        def mpi(argv: Sequence[str]) -> list[str]:
            # The job's tag goes to the ranks on every host: a job's end finds them by it.
            return [*cluster.inside(0), str(shipped.folder("run_scripts") / "mpirun_hostfile.sh"),
                    "-f", str(hostfile), "-i", cluster.interface, "-b", "none", "-x", JOB_TAG,
                    "-p", argv[0], "--", *argv[1:]]
        return mpi
    if launcher == "gloo":
        hosts = ",".join(f"{name}:1" for name in cluster.names)

        def gloo(argv: Sequence[str]) -> list[str]:
            return [*cluster.inside(0), str(launchers.BIN / "horovodrun"),
                    "-np", str(cluster.hosts), "-H", hosts, "--gloo",
                    "--network-interface", cluster.interface, *argv]
        return gloo
    raise ValueError(f"no launch across namespace hosts under {launcher!r}")


def environment(cluster: NetnsCluster, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A launch's environment on ``cluster``: this venv first on PATH, then the cluster's
    ``ssh`` before it (launchers call plain ``ssh``), and ``extra``."""
    return cluster.env(launchers.launch_env(extra))

"""A real SLURM cluster on the namespaced hosts of hvdtrain/testing/
netns_cluster.py, for sbatch/srun in tests.

    with SlurmCluster(hosts=3, workdir=tmp_path) as cluster:
        job = cluster.sbatch(["--nodes=3", "run_scripts/slurm.sbatch", ...], env=..., cwd=...)
        state = cluster.wait(job, timeout=300)     # scontrol's fields: JobState, ExitCode, ...

Debian's packages (slurmctld, slurmd, slurm-client, munge: SLURM 22.05), run as root: one munged
with a key made for this cluster, slurmctld on the first host, slurmd on every host (each finds
its node name from its own host name and listens on its own address), all configured by a
slurm.conf written into ``workdir``. Clients find it through SLURM_CONF (``env()`` sets it).
Every daemon runs inside the cluster's namespaces, so leaving the ``with`` block (or
``remove_stale`` after a killed run) kills them with everything else; nothing is written or
left running outside ``workdir``.

Each node also has GPUS_PER_HOST GPUs for SLURM's scheduling (gres), backed by device files
made in ``workdir`` (copies of /dev/null), so that a job asking for GPUs gets them and each
task the CUDA_VISIBLE_DEVICES that SLURM's binding gives it (tests/fake_gpus makes TensorFlow
list them). A job that asks for none gets none, as on a GPU cluster.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import textwrap
import time
from pathlib import Path

from hvdtrain.testing.netns_cluster import NetnsCluster
from hvdtrain.testing.netns_cluster import unavailable_reason as netns_unavailable_reason

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "scontrol", "sinfo")
PACKAGES = "slurmctld slurmd slurm-client munge"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
PATH_SBIN = "/usr/sbin:/sbin"   # where Debian puts the daemons (not on every user's PATH)
GPUS_PER_HOST = 2


def unavailable_reason() -> str | None:
    """Why this machine cannot host the SLURM cluster, or None when it can."""
    reason = netns_unavailable_reason(ssh=False)
    if reason:
        return reason
    search = f"{os.environ.get('PATH', '')}{os.pathsep}{PATH_SBIN}"
    missing = [p for p in PROGRAMS if not shutil.which(p, path=search)]
    if missing:
        return (f"{', '.join(missing)} not installed (apt-get install {PACKAGES}; "
                f"'make test' does it as root)")
    return None


class SlurmCluster(NetnsCluster):
    """A NetnsCluster (no SSH: SLURM starts the tasks) running munged, slurmctld and slurmd."""

    def __init__(self, hosts: int, workdir: Path, *, cpus_per_host: int = 2):
        super().__init__(hosts, workdir, ssh=False)
        self.cpus_per_host = cpus_per_host
        self.slurm_dir = self.workdir / "slurm"
        self.conf = self.slurm_dir / "slurm.conf"
        self.partition = "hvdt"

    def __enter__(self) -> "SlurmCluster":
        super().__enter__()
        try:
            self._start_slurm()
        except BaseException:
            self.close()
            raise
        return self

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` plus SLURM_CONF, which every SLURM client (sbatch, srun, ...) reads first."""
        env = super().env(base)
        env["PATH"] = f"{env['PATH']}{os.pathsep}{PATH_SBIN}"
        return {**env, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------------------------------
    def _start_slurm(self) -> None:
        d = self.slurm_dir
        munge = d / "munge"
        munge.mkdir(parents=True, mode=0o711)   # munged checks its socket directory's mode
        key = munge / "munge.key"               # one key: what makes the hosts one cluster
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket = munge / "munge.socket"
        for sub in ["state", *(f"spool-{n}" for n in self.names),
                    *(f"tmp-{n}" for n in self.names)]:
            (d / sub).mkdir()
        nodes = "".join(f"NodeName={name} NodeAddr={address} CPUs={self.cpus_per_host} "
                        f"Gres=gpu:{GPUS_PER_HOST} State=UNKNOWN\n"
                        for name, address in zip(self.names, self.addresses))
        # slurmd reads gres.conf beside slurm.conf; the files must be character devices.
        for i in range(GPUS_PER_HOST):
            os.mknod(d / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
        (d / "gres.conf").write_text(f"Name=gpu File={d}/gpu[0-{GPUS_PER_HOST - 1}]\n")
        self.conf.write_text(textwrap.dedent(f"""\
            ClusterName=hvdt
            GresTypes=gpu
            SlurmctldHost={self.names[0]}({self.addresses[0]})
            SlurmUser=root
            # munged's socket is in this directory, not the system's /run/munge.
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={socket}
            # Every path below is in this directory; %n is the node's name, so that the
            # slurmd of each host (all on one file system) has its own.
            StateSaveLocation={d}/state
            SlurmctldPidFile={d}/slurmctld.pid
            SlurmctldLogFile={d}/slurmctld.log
            SlurmdSpoolDir={d}/spool-%n
            SlurmdPidFile={d}/slurmd-%n.pid
            SlurmdLogFile={d}/slurmd-%n.log
            # PMIx puts each step's client directory under TmpFS (default /tmp): per node here,
            # or the hosts' steps collide on one /tmp ("spmix_appdir...: File exists").
            TmpFS={d}/tmp-%n
            # No cgroups: `ip netns exec` mounts a /sys without them. Processes are tracked by
            # parent pid and tasks are not bound, as on a cluster without cgroup.conf.
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_CPU
            MpiDefault=none
            ReturnToService=2
            """) + nodes + f"PartitionName={self.partition} Nodes={','.join(self.names)} "
                           f"Default=YES MaxTime=INFINITE State=UP\n")
        # slurmd 22.05 will not start without a cgroup plugin, even when nothing uses it; the
        # v1 plugin loads without touching any cgroup (none is mounted where it looks).
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        env = self.env(dict(os.environ))
        # As root, --force lets munged accept a socket under pytest's private (0700) tmp dir.
        self.run(["munged", "--force", f"--key-file={key}", f"--socket={socket}",
                  f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                  f"--seed-file={munge}/munged.seed"], env=env, timeout=30)
        self.run(["slurmctld", "-f", str(self.conf)], env=env, timeout=30)
        for host in range(self.hosts):
            self.run(["slurmd", "-f", str(self.conf)], host=host, env=env, timeout=30)
        self.wait_idle(timeout=30)

    def wait_idle(self, *, timeout: float) -> None:
        """Returns once every node is idle: up, and done with every job."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(dict(os.environ)),
                             check=False, timeout=15).stdout
            if sorted(nodes.split()) == sorted([*self.names, *["idle"] * self.hosts]):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"SLURM nodes not idle after {timeout} s: {nodes}\n"
                                   f"{self.logs()}")
            time.sleep(0.3)

    def logs(self, tail: int = 3000) -> str:
        """The end of every daemon's log, for failure messages."""
        return "\n".join(f"== {log.name}\n{log.read_text()[-tail:]}"
                         for log in sorted(self.slurm_dir.glob("**/*.log")))

    # ------------------------------------------------------------------------------------------
    def sbatch(self, argv: list[str], *, env: dict[str, str], cwd: Path) -> str:
        """Submits a batch job from the first host; returns its job id."""
        done = self.run(["sbatch", "--parsable", *argv], env=self.env(env), cwd=cwd,
                        timeout=30)
        return done.stdout.strip().split(";")[0]

    def scontrol(self, *args: str) -> str:
        return self.run(["scontrol", *args], env=self.env(dict(os.environ)), timeout=15).stdout

    def job(self, job_id: str) -> dict[str, str]:
        """scontrol's fields of the job (JobState, ExitCode, Restarts, NodeList, ...)."""
        shown = self.scontrol("-o", "show", "job", job_id)
        return dict(field.split("=", 1) for field in shown.split() if "=" in field)

    def wait(self, job_id: str, *, timeout: float, states: set[str] = ENDED) -> dict[str, str]:
        """Polls until the job's state is one of ``states``; at the time limit cancels it and
        fails."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["JobState"] in states:
                return job
            if time.monotonic() > deadline:
                self.cancel(job_id)
                raise TimeoutError(f"job {job_id} still {job['JobState']} after {timeout} s")
            time.sleep(0.2)

    def cancel(self, job_id: str, *extra: str) -> None:
        self.run(["scancel", *extra, job_id], env=self.env(dict(os.environ)), timeout=15)

    def processes(self, needle: str) -> list[tuple[str, int]]:
        """(host, pid) of every process in the cluster whose command line holds ``needle``."""
        found = []
        for name, ns in zip(self.names, self.namespaces):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                if needle.encode() in cmdline:
                    found.append((name, int(pid)))
        return found

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

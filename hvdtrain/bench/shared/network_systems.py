"""What bench network runs on each link: its systems (hvdtrain's ways to reduce, its launchers,
Horovod's own script) and its workloads, and one measured run of a system, on two namespace
hosts or on this one.

Every run is 2 ranks with one core each: on the cluster one rank per host (each host its own
core), on one host ``mpirun --bind-to core`` (or horovodrun, the ranks pinning themselves), the
same job with shared memory instead of the link.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from hvdtrain.errors import UserError
from hvdtrain.launch import rank_env
from hvdtrain.launch.launchers import LAUNCHERS, Launcher
from hvdtrain.bench.shared import horovod_synthetic, launch, netns_launch, trainer_job
from hvdtrain.bench.shared.plans import Plan
from hvdtrain.bench.shared.workloads import WORKLOADS, Workload
from hvdtrain.testing.netns_cluster import NetnsCluster

RANKS = 2   # one per host
ONE_ALLREDUCE = ("horovod.bucket_mb=0",)


@dataclass(frozen=True)
class System:
    """One way to train the workload across the link."""
    name: str
    what: str                                # its line in the results
    launcher: Launcher = "mpi"               # mpi or gloo
    settings: tuple[str, ...] = ()           # hvdtrain config settings over the workload's
    horovod_script: bool = False             # Horovod's own synthetic benchmark instead
    script_args: tuple[str, ...] = ()        # Horovod's script's own options
    script_inter_op_threads: int = 1         # TensorFlow's inter-op threads for the script
    script_with_hvdtrain_env: bool = False   # the script launched as hvdtrain launches its ranks
    # How the cost model sees it (network_projection.py): the share of the float32 gradients'
    # bytes it sends, and whether it reduces while backprop runs.
    gradient_share: float = 1.0
    overlaps_backprop: bool = False

    @property
    def transfer_hides(self) -> bool:
        """Whether its transfer can run while backprop does, on a rank of one core: under Gloo,
        which waits on its sockets in the kernel; not under mpirun, where Open MPI moves the
        data only while Horovod's thread polls, which backprop leaves a sliver of the core
        (benchmarks/results/network-thread-cpu/; polling more often did not make it hide:
        network-mpi-sleep-poll/)."""
        return self.overlaps_backprop and self.launcher == "gloo"


def systems(bucket_mb: float) -> dict[str, System]:
    """Every system, by name, in the order a round runs them."""
    return {system.name: system for system in (
        # Across hosts hvdtrain's default is buckets (horovod.bucket_mb auto): the systems of
        # one all-reduce after backprop say so.
        System("hvdtrain", "hvdtrain, one all-reduce after backprop (mpirun)",
               settings=ONE_ALLREDUCE),
        System("hvdtrain-overlap", f"hvdtrain, all-reduce in {bucket_mb:g} MB buckets "
                                   f"overlapping backprop (horovod.bucket_mb)",
               settings=(f"horovod.bucket_mb={bucket_mb:g}",), overlaps_backprop=True),
        System("hvdtrain-fp16", "hvdtrain, gradients all-reduced as float16 "
                                "(horovod.compression=fp16)",
               settings=("horovod.compression=fp16", *ONE_ALLREDUCE), gradient_share=0.5),
        System("hvdtrain-gloo", "hvdtrain under horovodrun --gloo", launcher="gloo",
               settings=ONE_ALLREDUCE),
        # Gloo waits on its sockets where Open MPI's TCP transport polls (a rank's one core
        # shared with backprop): overlap under each launcher.
        System("hvdtrain-gloo-overlap", f"hvdtrain under horovodrun --gloo, all-reduce in "
                                        f"{bucket_mb:g} MB buckets overlapping backprop",
               launcher="gloo", settings=(f"horovod.bucket_mb={bucket_mb:g}",),
               overlaps_backprop=True),
        System("horovod", "Horovod's tensorflow2_synthetic_benchmark.py on the Keras 2 venv "
                          "(per-tensor all-reduce during backprop; mpirun)",
               horovod_script=True, overlaps_backprop=True),
        # Its per-tensor reduction overlaps backprop as hvdtrain's buckets do, which run two
        # inter-op threads (placement.thread_counts): the script given the same.
        System("horovod-inter-op-2", "Horovod's script as `horovod`, two TensorFlow inter-op "
                                     "threads per rank (as hvdtrain's with buckets)",
               horovod_script=True, script_inter_op_threads=2, overlaps_backprop=True),
        # hvdtrain's ranks set launch defaults of their own (rank_env: yield the core while
        # waiting in MPI, recursive doubling on two hosts, a shorter cycle): the script given
        # the same, so that hvdtrain / it compares the training alone.
        System("horovod-hvdtrain-env", "Horovod's script as `horovod`, launched with "
                                       "hvdtrain's launch defaults (OMPI_MCA_mpi_yield_when_idle"
                                       "=1, HOROVOD_CYCLE_TIME=0.2, recursive doubling on two "
                                       "hosts)",
               horovod_script=True, script_with_hvdtrain_env=True, overlaps_backprop=True),
        # Under Gloo its per-tensor reduction can overlap backprop, as hvdtrain's buckets do.
        System("horovod-gloo", "Horovod's script under horovodrun --gloo, two inter-op "
                               "threads per rank",
               launcher="gloo", horovod_script=True, script_inter_op_threads=2,
               overlaps_backprop=True),
        System("horovod-fp16", "Horovod's script as `horovod`, gradients all-reduced as "
                               "float16 (its --fp16-allreduce)",
               horovod_script=True, script_args=("--fp16-allreduce",), gradient_share=0.5,
               overlaps_backprop=True))}


@dataclass(frozen=True)
class NetworkWorkload:
    """A workload of bench network: hvdtrain's job, and Horovod's script's model name where
    the script can train the same (it trains keras.applications at 224x224x3, 1000 classes)."""
    workload: Workload
    settings: tuple[str, ...] = ()
    horovod_model: str | None = None


HOROVOD_SHAPE = (224, 224, 3)
# MobileNetV2's 3.5 M parameters (14 MB of gradients) and ResNet-50's 25.6 M (102 MB), both at
# Horovod's script's 224x224; the MLP: seconds per job (--quick).
NETWORK_WORKLOADS = {
    "mobilenetv2": NetworkWorkload(horovod_synthetic.MODEL, horovod_model="MobileNetV2"),
    "resnet50": NetworkWorkload(replace(horovod_synthetic.MODEL, name="resnet50-224"),
                                settings=("model.name=resnet50",), horovod_model="ResNet50"),
    "mlp": NetworkWorkload(WORKLOADS["mlp"]),
}


def network_workload(name: str, image_size: int | None) -> NetworkWorkload:
    """The workload ``name`` at ``image_size`` (None: its own); UserError for an unknown name
    or a size the model does not take."""
    if name not in NETWORK_WORKLOADS:
        raise UserError(f"unknown bench network model {name!r}; choose from "
                        f"{', '.join(NETWORK_WORKLOADS)}")
    chosen = NETWORK_WORKLOADS[name]
    if image_size is None:
        return chosen
    if image_size < 32 or len(chosen.workload.image_shape) != 3:
        raise UserError(f"--image-size {image_size}: {name} takes images of 32x32 and larger")
    shape = (image_size, image_size, chosen.workload.image_shape[2])
    return replace(chosen, workload=replace(chosen.workload, image_shape=shape))


def gradient_bytes(workload: NetworkWorkload) -> int:
    """The bytes of one step's float32 gradients: 4 per trainable parameter of the workload's
    model, built here (TensorFlow loads in this process, as quietly as in a rank)."""
    from hvdtrain.launch import rank_process
    rank_process.load_tensorflow()
    from hvdtrain.config import presets
    from hvdtrain.models import registry
    chosen = workload.workload
    cfg = presets.build_config(chosen.preset, assignments=workload.settings)
    model = registry.build(cfg.model, chosen.image_shape, chosen.num_classes)
    return 4 * sum(int(v.shape.num_elements()) for v in model.trainable_variables)


def horovod_unavailable(workload: NetworkWorkload, script: Path | None,
                        python: str) -> str | None:
    """Why Horovod's script cannot run beside ``workload`` here, or None."""
    if workload.horovod_model is None or workload.workload.image_shape != HOROVOD_SHAPE:
        return (f"Horovod's script trains keras.applications models at 224x224 only, not "
                f"{workload.workload.name} at {workload.workload.image_shape}")
    return horovod_synthetic.unavailable(script, python)


def measure(system: System, workload: NetworkWorkload, plan: Plan, work_dir: Path, *,
            cluster: NetnsCluster | None, across: Mapping[str, trainer_job.LaunchWith],
            horovod: tuple[Path | None, str] | None = None) -> float:
    """One run of ``system``: total samples/s of its 2 ranks, one per host of ``cluster``
    (``across``: its launch per launcher), or both on this host (``cluster`` None).
    ``horovod``: Horovod's script and the interpreter that runs it."""
    env = netns_launch.environment(cluster) if cluster else None
    if system.horovod_script:
        script, python = horovod or (None, sys.executable)
        assert script is not None and workload.horovod_model is not None   # checked before
        argv = [*horovod_synthetic.horovod_argv(script, plan, python, workload.horovod_model,
                                                workload.workload.batch_size),
                *system.script_args]
        command = (across[system.launcher](argv) if cluster else
                   launch.launch_command(system.launcher, RANKS, pinned(system.launcher, argv)))
        if system.script_with_hvdtrain_env:
            env = {**(env or {}), **hvdtrain_launch_env(two_hosts=cluster is not None)}
        return horovod_synthetic.measure_horovod(
            script, RANKS, plan, python, command=command, env=env,
            inter_op_threads=system.script_inter_op_threads)
    job_plan = replace(plan, launcher=system.launcher)
    done = trainer_job.measure(workload.workload, RANKS, job_plan, work_dir, sys.executable,
                               settings=(*workload.settings, *system.settings),
                               launch_with=across[system.launcher] if cluster else None,
                               env=env, what=f"network: {system.name} on "
                                             f"{'two hosts' if cluster else 'one host'}")
    return done["total_samples_per_sec"]["median"]


def hvdtrain_launch_env(two_hosts: bool) -> dict[str, str]:
    """The variables an hvdtrain rank sets itself where unset (rank_env.rank_environment) on
    two ranks under mpirun, one per host where ``two_hosts``, else both on this one."""
    return {**rank_env.RANK_ENV_DEFAULTS, **(rank_env.TWO_HOSTS_ALLREDUCE if two_hosts else {})}


def pinned(launcher: Launcher, argv: Sequence[str]) -> list[str]:
    """Horovod's script's rank command on one host: where the launcher binds no cores
    (horovodrun --gloo), each rank on one core of this process's, chosen by its local rank as
    hvdtrain's ranks choose theirs there (launch.pin_to_own_core), the one-core budget mpirun
    --bind-to core gives."""
    if LAUNCHERS[launcher].binds_cores:
        return list(argv)
    cores = " ".join(map(str, sorted(os.sched_getaffinity(0))))
    local_rank = LAUNCHERS[launcher].local_rank_variable
    return ["bash", "-c", f'cores=({cores}); '
                          f'exec taskset -c "${{cores[${local_rank} % ${{#cores[@]}}]}}" "$@"',
            "horovod-rank", *argv]


def chosen_systems(text: str, bucket_mb: float) -> list[System]:
    """The systems the comma list ``text`` names; UserError for a name that is not one."""
    table = systems(bucket_mb)
    names: Sequence[str] = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in table]
    if unknown or not names:
        raise UserError(f"--systems {text!r}: choose from {', '.join(table)}")
    return [table[n] for n in names]

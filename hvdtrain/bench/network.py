"""Scaling where the network is the bottleneck: two ranks on two hosts whose link is shaped to a
rate, against the same job on one host.

The hosts are network namespaces on this machine (hvdtrain.testing.netns_cluster: each its own
address, host name, SSH server and core), joined through a bridge; each host's link is limited
by ``tc qdisc ... tbf`` to each speed of ``--speeds`` in turn (netem is not available here, so
bandwidth is limited but latency cannot be added). Before each speed's runs, one TCP stream
from host1 to host2 measures what the link achieves, so every figure is tied to a measured link.

Each round runs every setting (each speed, then one host; the reverse every other round) and at
each every system of ``--systems`` (network_systems.py; the reverse every other round), so a
drift in the machine's load falls on all. Efficiency is per round: a system's rate on the link
over its own rate on one host in that round.

    sudo hvdtrain bench network --speeds 0.1,1,10 --model mobilenetv2 \\
        --horovod-synthetic tensorflow2_synthetic_benchmark.py --horovod-venv .venv-keras2

Whatever happens (a failed or killed rank, Ctrl-C, SIGTERM), every process in the namespaces is
killed and the namespaces and links are deleted; namespaces of a run that was itself killed
(SIGKILL) are removed at the next start.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from hvdtrain.errors import UserError
from hvdtrain.bench import registry
from hvdtrain.bench.shared import (arguments, host, jobs, link_probe, netns_launch,
                                   network_figures, network_result, network_systems, report)
from hvdtrain.bench.shared.network_systems import NetworkWorkload, System
from hvdtrain.bench.shared.plans import Plan
from hvdtrain.testing import netns_cluster
from hvdtrain.testing.netns_cluster import NetnsCluster

SPEEDS, QUICK_SPEEDS = "0.1,1,10", "1"     # Gbit/s
ROUNDS, QUICK_ROUNDS = 3, 1
STEPS, QUICK_STEPS = 4, 2                  # timed steps per repeat
REPEATS, QUICK_REPEATS = 3, 2
SYSTEMS, QUICK_SYSTEMS = ",".join(network_systems.systems(2.0)), "hvdtrain,hvdtrain-overlap"
BUCKET_MB = 2.0
PROBE_SECONDS, QUICK_PROBE_SECONDS = 2.0, 1.0
HOST_CORES = [[0], [1]]   # one core per host, as one rank per core in every benchmark


@dataclass(frozen=True)
class Choices:
    """What bench network's options chose."""
    speeds: tuple[float, ...]              # Gbit/s
    rounds: int
    workload: NetworkWorkload
    systems: tuple[System, ...]
    skipped: tuple[str, ...]               # the systems left out, each with why
    plan: Plan
    probe_seconds: float
    horovod: tuple[Path | None, str]       # Horovod's script and the Python that runs it
    bucket_mb: float = BUCKET_MB            # the overlapping systems' horovod.bucket_mb


def speeds(text: str) -> list[float]:
    """--speeds ``text``, a comma list of Gbit/s such as 0.1,1,10; UserError otherwise."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise UserError(f"--speeds {text!r}: expected link speeds in Gbit/s such as 0.1,1,10")
    return values


def check_machine() -> None:
    """UserError, in one line, where this machine cannot make the hosts."""
    if os.geteuid() != 0:
        raise UserError("bench network needs root to make network namespaces (run it with sudo)")
    reason = netns_cluster.unavailable_reason()
    if reason:
        raise UserError(f"bench network cannot make its hosts here: {reason}")
    if (os.cpu_count() or 1) < len(HOST_CORES):
        raise UserError(f"bench network needs {len(HOST_CORES)} cores, one per host")


@contextmanager
def ended_by_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM ends the benchmark as Ctrl-C does (SystemExit through every
    ``with``), so that the hosts are torn down; the handler before is restored after."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)
    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextmanager
def two_hosts(work_dir: Path) -> Iterator[NetnsCluster]:
    """Two namespace hosts, one core each, torn down whole when the block ends however."""
    netns_cluster.remove_stale()   # what a killed run left
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        cluster = NetnsCluster(hosts=2, workdir=work_dir, cores=HOST_CORES).__enter__()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:   # torn down already
        why = getattr(e, "stderr", None) or e
        raise jobs.BenchError(f"bench network could not make its two hosts: {why}") from None
    try:
        yield cluster
    finally:
        cluster.close()


def one_round(i: int, how: Choices, cluster: NetnsCluster, work_dir: Path) -> dict[str, Any]:
    """Round ``i``: every system at each speed, then on one host (the reverse every other
    round), each speed's link measured first."""
    order: Sequence[System] = how.systems if i % 2 == 0 else how.systems[::-1]
    settings: list[float | None] = [*how.speeds, None]
    measured: dict[str, Any] = {"load_average": host.load_average(), "one_host": {},
                                "links": {}}
    across = {launcher: netns_launch.across_hosts(cluster, launcher, work_dir)
              for launcher in ("mpi", "gloo")}
    for setting in settings if i % 2 == 0 else settings[::-1]:
        cluster.shape(None if setting is None else setting * 1000)
        where = "one host" if setting is None else f"{setting:g} Gbit/s"
        if setting is not None:
            link = link_probe.measure(cluster, how.probe_seconds)
            report.say(f"network: round {i + 1}, {where}: the link moved "
                       f"{link['achieved_gbit_per_s']:.3g} Gbit/s one way, "
                       f"{link['both_ways_gbit_per_s']:.3g} each way at once")
            slot = measured["links"][network_figures.speed_key(setting)] = {
                "link": link, "systems": {}}
            rates = slot["systems"]
        else:
            rates = measured["one_host"]
        for system in order:
            report.say(f"network: round {i + 1}, {where}, {system.name}...")
            rates[system.name] = network_systems.measure(
                system, how.workload, how.plan, work_dir,
                cluster=None if setting is None else cluster, across=across,
                horovod=how.horovod)
            report.say(network_figures.progress_line(system.name, rates[system.name]))
    return measured


def run(out_dir: Path, how: Choices) -> dict[str, Any]:
    """Every round (``one_round``), the figures of the rounds so far written into
    network.json, .md and .png after each, so that a run ended early keeps its whole rounds."""
    machine = host.machine()   # before the work: its load is the machine's own
    gradient_bytes = network_systems.gradient_bytes(how.workload)
    rounds: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    with ended_by_sigterm(), tempfile.TemporaryDirectory(prefix="hvdtrain-network-") as tmp:
        with two_hosts(Path(tmp) / "hosts") as cluster:
            for i in range(how.rounds):
                rounds.append(one_round(i, how, cluster, Path(tmp)))
                result = result_of(how, machine, rounds, gradient_bytes)
                network_result.write(out_dir, result)
                if i + 1 < how.rounds:
                    report.say(f"network: round {i + 1} of {how.rounds} written to "
                               f"{out_dir / 'network.json'}")
    return result


def result_of(how: Choices, machine: dict[str, Any], rounds: list[dict[str, Any]],
              gradient_bytes: int) -> dict[str, Any]:
    """network.json: what ran, each link's figures with the cost model's check beside them,
    and every round's rates (``plan.rounds``: the rounds done, of ``rounds_asked``)."""
    workload = how.workload.workload
    return network_result.with_figures({
        "benchmark": "network", "machine": machine,
        "workload": {"name": workload.name, "image_shape": list(workload.image_shape),
                     "batch_size_per_rank": workload.batch_size,
                     "gradient_bytes": gradient_bytes,
                     "settings": list(how.workload.settings)},
        "plan": {"rounds": how.rounds, "repeats": how.plan.repeats,
                 "steps_per_repeat": how.plan.steps_per_repeat,
                 "warmup_epochs": how.plan.warmup_epochs},
        "rounds_asked": how.rounds, "speeds": list(how.speeds), "bucket_mb": how.bucket_mb,
        "probe_seconds": how.probe_seconds, "host_cores": HOST_CORES,
        "systems": {s.name: s.what for s in how.systems},
        "skipped": list(how.skipped), "rounds": rounds}, how.systems)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speeds", default=None,
                        help=f"link speeds in Gbit/s, a comma list (default {SPEEDS}; --quick: "
                             f"{QUICK_SPEEDS})")
    arguments.add_rounds(parser, f"interleaved rounds (default {ROUNDS}; --quick: "
                                 f"{QUICK_ROUNDS})")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"timed steps per repeat (default {STEPS}; --quick: "
                             f"{QUICK_STEPS})")
    parser.add_argument("--model", default=None,
                        help=f"{', '.join(network_systems.NETWORK_WORKLOADS)} (default "
                             f"mobilenetv2 at 224x224, as Horovod's script; --quick: mlp)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="square input side for hvdtrain's jobs (default: the model's; "
                             "Horovod's script runs at 224 only)")
    parser.add_argument("--systems", default=None,
                        help=f"comma list of {SYSTEMS} (default all; --quick: "
                             f"{QUICK_SYSTEMS})")
    parser.add_argument("--bucket-mb", type=float, default=BUCKET_MB,
                        help=f"hvdtrain-overlap's horovod.bucket_mb (default {BUCKET_MB:g})")
    parser.add_argument("--horovod-synthetic", metavar="PATH", type=Path,
                        help="Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark"
                             ".py (v0.28.1): the horovod system (skipped when absent)")
    parser.add_argument("--horovod-venv", metavar="VENV", type=Path, default=None,
                        help="the virtualenv that runs Horovod's script (.venv-keras2)")
    parser.add_argument("--render", metavar="NETWORK_JSON", type=Path, default=None,
                        help="run nothing: compute a saved network.json's figures again from "
                             "its rounds (this version's tables and cost model) into --out")


def choices(args: argparse.Namespace) -> Choices:
    """What the options chose; UserError, one line, for a mistake in them."""
    quick = args.quick
    steps = args.steps or (QUICK_STEPS if quick else STEPS)
    rounds = args.rounds or (QUICK_ROUNDS if quick else ROUNDS)
    if steps < 2 or rounds < 1:
        raise UserError("--steps must be 2 or more and --rounds 1 or more")
    workload = network_systems.network_workload(args.model or ("mlp" if quick else
                                                               "mobilenetv2"), args.image_size)
    chosen = network_systems.chosen_systems(args.systems or (QUICK_SYSTEMS if quick
                                                             else SYSTEMS), args.bucket_mb)
    python = arguments.venv_python(args.horovod_venv, "--horovod-venv") or sys.executable
    skipped = []
    if any(s.horovod_script for s in chosen):
        why = network_systems.horovod_unavailable(workload, args.horovod_synthetic, python)
        if why:
            skipped.append(f"horovod: {why}")
            chosen = [s for s in chosen if not s.horovod_script]
    if not chosen:
        raise UserError(f"no system left to run ({'; '.join(skipped)})")
    return Choices(
        speeds=tuple(speeds(args.speeds or (QUICK_SPEEDS if quick else SPEEDS))),
        rounds=rounds, workload=workload, systems=tuple(chosen), skipped=tuple(skipped),
        plan=Plan(world_sizes=(2,), warmup_epochs=1,
                  repeats=QUICK_REPEATS if quick else REPEATS, steps_per_repeat=steps),
        probe_seconds=QUICK_PROBE_SECONDS if quick else PROBE_SECONDS,
        horovod=(args.horovod_synthetic, python), bucket_mb=args.bucket_mb)


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench network``: the options checked, then the rounds."""
    if args.render:
        network_result.render(args.render, Path(args.out), BUCKET_MB)
        report.say(f"network: {args.render}'s rounds rendered into {args.out}")
        return
    how = choices(args)
    check_machine()
    for line in how.skipped:
        report.say(f"network: not run: {line}")
    started = time.monotonic()
    run(Path(args.out), how)
    report.say(f"network: {how.rounds} round(s) in {time.monotonic() - started:.0f}s")


BENCHMARK = registry.Benchmark(
    name="network", main=main, add_arguments=add_arguments,
    help="2 ranks on 2 namespace hosts whose link is shaped to each speed (root): hvdtrain's "
         "ways to reduce, its launchers and Horovod's script, against one host")

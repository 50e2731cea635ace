"""Starting each system of bench peers (hvdtrain under its launcher; tf.distribute's clusters
as processes of their own, each a job that cannot outlive the benchmark), and the figures of
one run: samples/s and the seconds to the target accuracy."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.testing.jobs import Job, JobTimedOut
from hvdtrain.bench.shared import jobs, launch, stats
from hvdtrain.bench.shared.peer_systems import LAUNCH, MODULE, WORKERS

TARGET_ACCURACY = 0.95


def epoch_rates(epoch_ends: Sequence[float], samples_per_epoch: int) -> list[float]:
    """samples/s of each epoch after the first (which includes tracing), from the times at
    which the epochs ended (seconds since training began)."""
    return [samples_per_epoch / (b - a) for a, b in zip(epoch_ends, epoch_ends[1:])]


def time_to_accuracy(epoch_ends: Sequence[float], accuracies: Sequence[float],
                     target: float = TARGET_ACCURACY) -> float | None:
    """Seconds at the end of the first epoch whose accuracy reaches ``target``, or None."""
    for seconds, accuracy in zip(epoch_ends, accuracies):
        if accuracy >= target:
            return seconds
    return None


def _start(options: dict[str, Any], python: str) -> Job:
    """A process of a tf.distribute cluster, as a job of its own (its output read as it comes:
    a pipe nobody reads could fill up and stall it)."""
    return Job(launch.rank_argv(MODULE, options, python))


def _wait_all(started: Sequence[Job], what: str, timeout: float) -> str:
    """Waits for every process; ends the rest if one fails (it would otherwise wait forever
    for its peer). Returns their output."""
    deadline = time.monotonic() + timeout
    try:
        for job in started:
            status = job.wait(deadline)
            if status != 0:
                raise jobs.BenchError(f"{what}: a process exited {status}\n"
                                      f"{jobs.tail(job.output)}")
    except JobTimedOut:
        raise jobs.BenchError(f"{what} took longer than {timeout:.0f}s") from None
    finally:
        for job in started:
            job.end()
    return "\n".join(job.output for job in started)


JOB_TIMEOUT_S = 600


def launch_system(system: str, epochs: int, work_dir: Path,
                  python: str = sys.executable) -> dict[str, Any]:
    """One run of ``system`` on the stack of ``python``: its figures."""
    work_dir = work_dir / f"{system}-{time.monotonic_ns()}"
    work_dir.mkdir(parents=True)
    out = work_dir / f"{system}.json"
    base = {"system": system, "epochs": epochs, "out": str(out)}
    started = time.perf_counter()
    if system in LAUNCH:
        launcher, ranks = LAUNCH[system]
        output = jobs.run_job(launch.launch_command(launcher, ranks, launch.rank_argv(
            MODULE, {**base, "run_dir": str(work_dir / f"run-{system}")}, python)),
            timeout=JOB_TIMEOUT_S, what=f"peers: {system}")
    elif system == "mwms":
        workers = [f"localhost:{p}" for p in launch.free_ports(WORKERS)]
        output = _wait_all([_start({**base, "workers": workers, "index": i}, python)
                            for i in range(WORKERS)], "peers: mwms", JOB_TIMEOUT_S)
    else:
        output = _run_ps(base, python)
    return _figures(jobs.read_json_output(out, f"peers: {system}", output),
                    time.perf_counter() - started)


def _run_ps(base: dict[str, Any], python: str) -> str:
    """``ps``: the parameter server and the workers, then the coordinator that drives them."""
    ports = launch.free_ports(WORKERS + 2)
    cluster = {"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}"],
               "worker": [f"localhost:{p}" for p in ports[2:]]}
    roles = [("ps", 0)] + [("worker", i) for i in range(WORKERS)]
    servers = [_start({**base, "system": "ps-server", "cluster": cluster, "kind": kind,
                       "index": i}, python) for kind, i in roles]
    try:
        return _wait_all([_start({**base, "cluster": cluster}, python)], "peers: ps",
                         JOB_TIMEOUT_S)
    finally:
        for server in servers:
            server.end()


def _figures(raw: dict[str, Any], wall: float) -> dict[str, Any]:
    """One run's figures from what its chief wrote, and its wall time with start-up."""
    rates = epoch_rates(raw["epoch_ends"], raw["samples_per_epoch"])
    return {"samples_per_sec": stats.summarize(rates)["median"] if rates else None,
            "seconds_to_95": time_to_accuracy(raw["epoch_ends"], raw["accuracies"]),
            "final_eval_accuracy": raw["accuracies"][-1], "epochs": len(raw["epoch_ends"]),
            "samples_per_epoch": raw["samples_per_epoch"], "wall_seconds_with_startup": wall,
            "raw": raw}

"""Open MPI's all-reduce algorithms on bench network's shaped link: 14 MB of float32 (MobileNetV2's
gradients) all-reduced between two namespace hosts, one rank each, under mpirun, with Open MPI's
own choice and with each algorithm forced (coll_tuned's dynamic rules), against the time the
link's measured both-ways rate gives for that many bytes.

    .venv/bin/python benchmarks/results/network-mpi-allreduce/probe.py SPEEDS ALGORITHMS

SPEEDS in Gbit/s (0.03,0.1,1), ALGORITHMS "default" or Open MPI 4.1's numbers (2 reduce then
broadcast, 3 recursive doubling, 4 ring, 5 segmented ring, 6 Rabenseifner). Run as root, nothing
else on the machine. A rank runs this file with "rank MB REPEATS".
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB, REPEATS = 14.0, 4


def rank(mb: float, repeats: int) -> None:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    send = np.ones(int(mb * 1e6 / 4), np.float32)
    got = np.empty_like(send)
    comm.Allreduce(send, got)   # the connection made, the buffers touched
    times = []
    for _ in range(repeats):
        comm.Barrier()
        began = time.perf_counter()
        comm.Allreduce(send, got)
        times.append(time.perf_counter() - began)
    if comm.rank == 0:
        print("RESULT", json.dumps(times), flush=True)


def main(speeds: list[float], algorithms: list[str]) -> None:
    from hvdtrain.bench import network
    from hvdtrain.bench.shared import link_probe, netns_launch
    with tempfile.TemporaryDirectory() as tmp, network.two_hosts(Path(tmp) / "hosts") as cluster:
        mpi = netns_launch.across_hosts(cluster, "mpi", Path(tmp))
        for speed in speeds:
            cluster.shape(speed * 1000)
            link = link_probe.measure(cluster, 3.0)
            model = MB * 8e6 / (link["both_ways_gbit_per_s"] * 1e9)
            print(f"{speed:g} Gbit/s: the link moved {link['achieved_gbit_per_s']:.4f} Gbit/s one "
                  f"way, {link['both_ways_gbit_per_s']:.4f} each way at once: {MB:g} MB in "
                  f"{model:.3f} s", flush=True)
            for algorithm in algorithms:
                forced = {} if algorithm == "default" else {
                    "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                    "OMPI_MCA_coll_tuned_allreduce_algorithm": algorithm}
                argv = mpi([sys.executable, __file__, "rank", str(MB), str(REPEATS)])
                done = subprocess.run(argv, env=netns_launch.environment(cluster, forced),
                                      capture_output=True, text=True, timeout=600)
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
                if not lines:
                    print(f"  {algorithm}: failed\n{done.stdout[-800:]}{done.stderr[-800:]}")
                    continue
                times = json.loads(lines[0].split(" ", 1)[1])
                median = statistics.median(times)
                print(f"  algorithm {algorithm}: median {median:.3f} s ({min(times):.3f} to "
                      f"{max(times):.3f}), {median / model:.2f} of the link's time", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        rank(float(sys.argv[2]), int(sys.argv[3]))
    else:
        main([float(s) for s in sys.argv[1].split(",")], sys.argv[2].split(","))

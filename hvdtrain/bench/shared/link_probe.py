"""The TCP throughput a link between two namespace hosts achieves: plain sockets, a sender as fast
as it can for a few seconds, its receiver counting what arrives (iperf3 is not installed here).
One stream host1 to host2, then one each way at once: a ring all-reduce between two ranks sends
both ways at the same time, and each host's shaped queue then carries its data and the other
stream's acknowledgements.

    python -m hvdtrain.bench.shared.link_probe receive ADDRESS PORT   (on host2)
    python -m hvdtrain.bench.shared.link_probe send ADDRESS PORT SECONDS   (on host1)

The receiver prints one JSON line: the bytes it read and the seconds from the first byte to the
end, so that the connection's start and the sender's buffers are not counted.
"""
from __future__ import annotations

import json
import socket
import sys
import time
from contextlib import ExitStack
from typing import Any

from hvdtrain.bench.shared.jobs import BenchError
from hvdtrain.testing.jobs import Job, JobTimedOut
from hvdtrain.testing.netns_cluster import NetnsCluster

MODULE = "hvdtrain.bench.shared.link_probe"
PORT = 47311
CHUNK = 1 << 20
READY = "listening"


def receive(address: str, port: int) -> dict[str, float]:
    with socket.create_server((address, port)) as server:
        print(READY, flush=True)
        connection, _ = server.accept()
        with connection:
            received, first = 0, None
            while data := connection.recv(CHUNK):
                first = first or time.perf_counter()
                received += len(data)
            seconds = time.perf_counter() - (first or time.perf_counter())
    return {"bytes": received, "seconds": seconds}


def send(address: str, port: int, seconds: float) -> None:
    payload = b"\0" * CHUNK
    with socket.create_connection((address, port), timeout=30) as connection:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            connection.sendall(payload)


def measure(cluster: NetnsCluster, seconds: float, python: str = sys.executable
            ) -> dict[str, Any]:
    """``cluster``'s link for ``seconds`` one way (host1 to host2), then as long both ways at
    once: the achieved Gbit/s of each (both ways: the slower direction), the one-way stream's
    bytes and time, and the rate the link was shaped to."""
    [(one_way, got)] = streams(cluster, seconds, python, [(0, 1)])
    both_ways = streams(cluster, seconds, python, [(0, 1), (1, 0)])
    return {"achieved_gbit_per_s": one_way, "both_ways_gbit_per_s": min(g for g, _ in both_ways),
            "bytes": got["bytes"], "seconds": got["seconds"],
            "shaped_gbit_per_s": cluster.mbit_per_s / 1000 if cluster.mbit_per_s else None}


def streams(cluster: NetnsCluster, seconds: float, python: str,
            pairs: list[tuple[int, int]]) -> list[tuple[float, dict[str, float]]]:
    """Each (sender, receiver) host pair's stream, all sending at once for ``seconds``: its
    Gbit/s and what its receiver counted."""
    deadline = time.monotonic() + seconds + 60
    try:
        with ExitStack() as stack:
            receivers = []
            for i, (_, to) in enumerate(pairs):
                job = stack.enter_context(Job([*cluster.inside(to), python, "-m", MODULE,
                                               "receive", cluster.addresses[to], str(PORT + i)]))
                line = job.next_line(deadline)
                if line is None or line.strip() != READY:
                    raise BenchError(f"the link probe's receiver did not start:\n{job.tail()}")
                receivers.append(job)
            senders = [stack.enter_context(Job([*cluster.inside(fro), python, "-m", MODULE,
                                                "send", cluster.addresses[to], str(PORT + i),
                                                str(seconds)]))
                       for i, (fro, to) in enumerate(pairs)]
            for job in senders + receivers:
                if job.wait(deadline) != 0:
                    raise BenchError(f"the link probe failed:\n{job.tail()}")
            got = [json.loads(job.lines[-1]) for job in receivers]
    except JobTimedOut:
        raise BenchError(f"the link probe took more than {seconds + 60:.0f}s") from None
    return [(g["bytes"] * 8 / g["seconds"] / 1e9 if g["seconds"] > 0 else 0.0, g) for g in got]


def main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[1] == "receive":
        print(json.dumps(receive(argv[2], int(argv[3]))), flush=True)
    elif len(argv) == 5 and argv[1] == "send":
        send(argv[2], int(argv[3]), float(argv[4]))
    else:
        sys.exit(f"usage: python -m {MODULE} receive ADDRESS PORT | send ADDRESS PORT SECONDS")


if __name__ == "__main__":
    main(sys.argv)

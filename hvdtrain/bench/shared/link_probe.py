"""The TCP throughput a link between two namespace hosts achieves: one plain socket, host1 sending
to host2 as fast as it can for a few seconds, host2 counting what arrives (iperf3 is not
installed here, and one stream is what a ring all-reduce between two ranks uses per direction).

    python -m hvdtrain.bench.shared.link_probe receive ADDRESS PORT   (on host2)
    python -m hvdtrain.bench.shared.link_probe send ADDRESS PORT SECONDS   (on host1)

The receiver prints one JSON line: the bytes it read and the seconds from the first byte to the
end, so that the connection's start and the sender's buffers are not counted.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
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
    """host1 to host2 of ``cluster`` for ``seconds``: the achieved Gbit/s, the bytes and time
    it is read from, and the rate the link was shaped to."""
    receiver = [*cluster.inside(1), python, "-m", MODULE, "receive", cluster.addresses[1],
                str(PORT)]
    deadline = time.monotonic() + seconds + 60
    try:
        with Job(receiver) as job:
            line = job.next_line(deadline)
            if line is None or line.strip() != READY:
                raise BenchError(f"the link probe's receiver did not start:\n{job.tail()}")
            sent = cluster.run([python, "-m", MODULE, "send", cluster.addresses[1], str(PORT),
                                str(seconds)], host=0, timeout=seconds + 60, check=False)
            if sent.returncode != 0 or job.wait(deadline) != 0:
                raise BenchError(f"the link probe failed:\n{sent.stdout}\n{job.tail()}")
            got = json.loads(job.lines[-1])
    except (JobTimedOut, subprocess.TimeoutExpired):
        raise BenchError(f"the link probe took more than {seconds + 60:.0f}s") from None
    gbit = got["bytes"] * 8 / got["seconds"] / 1e9 if got["seconds"] > 0 else 0.0
    return {"achieved_gbit_per_s": gbit, "bytes": got["bytes"], "seconds": got["seconds"],
            "shaped_gbit_per_s": cluster.mbit_per_s / 1000 if cluster.mbit_per_s else None}


def main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[1] == "receive":
        print(json.dumps(receive(argv[2], int(argv[3]))), flush=True)
    elif len(argv) == 5 and argv[1] == "send":
        send(argv[2], int(argv[3]), float(argv[4]))
    else:
        sys.exit(f"usage: python -m {MODULE} receive ADDRESS PORT | send ADDRESS PORT SECONDS")


if __name__ == "__main__":
    main(sys.argv)

"""A host's link limited to a rate: a token bucket (``tc qdisc ... tbf``) on the sending side of
its interface, inside its network namespace.

Why tbf: it and htb are what work in network namespaces here; netem (added latency), fq,
fq_codel and cake are not available, so a link can be made slower but not longer
(/work/shared/STACK.md, "Links between namespace hosts"). Shaping each host's own sending side
limits both directions of every path between two hosts, as a full-duplex link of that rate.
"""
from __future__ import annotations

import re
import subprocess

# The bucket holds at least this much (veth hands tbf segments of up to 64 KiB at once, GSO:
# a bucket smaller than one segment passes nothing) and at least this long at the rate, so
# that the timer's granularity does not cap a fast link below its rate.
MIN_BURST_BYTES = 256 * 1024
BURST_SECONDS = 0.004
# How long a packet may wait in the queue before it is dropped: a full queue makes TCP back
# off instead of piling up seconds of delay.
QUEUE_LATENCY_MS = 50


def burst_bytes(mbit_per_s: float) -> int:
    """The bucket's size for a link of ``mbit_per_s``."""
    return max(MIN_BURST_BYTES, int(mbit_per_s * 1e6 / 8 * BURST_SECONDS))


def tbf_command(namespace: str, interface: str, mbit_per_s: float) -> list[str]:
    """The tc command that limits what ``interface`` of ``namespace`` sends to
    ``mbit_per_s`` (replacing any limit it had)."""
    if mbit_per_s <= 0:
        raise ValueError(f"a link's rate must be positive, got {mbit_per_s} Mbit/s")
    return ["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", interface,
            "root", "tbf", "rate", f"{mbit_per_s * 1000:.0f}kbit",
            "burst", str(burst_bytes(mbit_per_s)), "latency", f"{QUEUE_LATENCY_MS}ms"]


def shape(namespace: str, interface: str, mbit_per_s: float | None) -> None:
    """Limits ``interface`` of ``namespace`` to ``mbit_per_s``, or lifts the limit (None)."""
    if mbit_per_s is None:
        subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev",
                        interface, "root"], capture_output=True, text=True)
        return
    done = subprocess.run(tbf_command(namespace, interface, mbit_per_s), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tc could not shape {interface} in {namespace} to {mbit_per_s} "
                           f"Mbit/s: {done.stderr.strip()}")


def shaped_rate(namespace: str, interface: str) -> float | None:
    """The rate (Mbit/s) that tbf limits ``interface`` of ``namespace`` to now, as tc reports
    it, or None when it has no tbf."""
    shown = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "show", "dev",
                            interface], capture_output=True, text=True).stdout
    found = re.search(r"\btbf\b.*?\brate (\d+(?:\.\d+)?)([KMG]?)bit", shown)
    if not found:
        return None
    scale = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}[found.group(2)]
    return float(found.group(1)) * scale

"""How often both directions of host1's link carried data at once, per system's run on the link:
reads each run folder's counters.txt.gz (sampler.py) and run.log (run.sh: its lines stamped
with the time), and writes directions.txt.

A system's run on the link spans from bench network's "0.2 Gbit/s, NAME..." line to its
"NAME: ... samples/s" line; its first 30% (the launch, the warmup epoch) is left out. Between
two samples a direction is busy where it moved more than 30% of the link's rate."""
from __future__ import annotations

import gzip
import re
from pathlib import Path

HERE = Path(__file__).parent
LINK_BYTES_S = 0.192e9 / 8   # every run's link probe: 0.192 Gbit/s one way
BUSY = 0.3
SKIP = 0.3


def windows(log: str) -> dict[str, tuple[float, float]]:
    """Each system's (start, end) on the link, in the log's time stamps."""
    found: dict[str, tuple[float, float]] = {}
    starts: dict[str, float] = {}
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        start = re.search(r"0\.2 Gbit/s, (\S+)\.\.\.$", text)
        if start:
            starts[start.group(1)] = float(stamp)
        end = re.match(r"\s*(\S+): [\d.]+ samples/s", text)
        if end and end.group(1) in starts and end.group(1) not in found:
            found[end.group(1)] = (starts[end.group(1)], float(stamp))
    return found


def shares(samples: list[tuple[float, float, float]], start: float, end: float) -> str:
    begin = start + SKIP * (end - start)
    rows = [s for s in samples if begin <= s[0] <= end]
    time = {"both": 0.0, "tx only": 0.0, "rx only": 0.0, "idle": 0.0}
    moved = [0.0, 0.0]
    for (t0, tx0, rx0), (t1, tx1, rx1) in zip(rows, rows[1:]):
        dt = t1 - t0
        out, into = (tx1 - tx0) / dt > BUSY * LINK_BYTES_S, (rx1 - rx0) / dt > BUSY * LINK_BYTES_S
        moved[0] += tx1 - tx0
        moved[1] += rx1 - rx0
        time["both" if out and into else "tx only" if out else "rx only" if into
             else "idle"] += dt
    total = sum(time.values())
    busy = total - time["idle"]
    return (f"{total:.1f} s sampled; host1 to host2 {moved[0] / total / 1e6:.2f} MB/s, back "
            f"{moved[1] / total / 1e6:.2f} MB/s (the link {LINK_BYTES_S / 1e6:.0f}); share of "
            f"the time: " + ", ".join(f"{k} {v / total:.2f}" for k, v in time.items())
            + f"; of the busy time, both at once {time['both'] / busy:.2f}")


def main() -> None:
    lines = []
    for run in sorted(p for p in HERE.iterdir() if (p / "counters.txt.gz").exists()):
        with gzip.open(run / "counters.txt.gz", "rt") as f:
            samples = [(float(a), float(b), float(c)) for a, b, c in
                       (line.split() for line in f if len(line.split()) == 3)]
        for system, (start, end) in windows((run / "run.log").read_text()).items():
            lines.append(f"{run.name}, {system}: {shares(samples, start, end)}")
    (HERE / "directions.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

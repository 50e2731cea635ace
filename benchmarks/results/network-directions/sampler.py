"""Run inside a namespace host (ip netns exec): its link's byte counters every 5 ms, a line
each, "time tx_bytes rx_bytes", into the file named by the first argument, until killed."""
import os
import sys
import time


def main(path: str) -> None:
    iface = next(name for name in sorted(os.listdir("/sys/class/net")) if name != "lo")
    stats = f"/sys/class/net/{iface}/statistics/"
    with open(path, "w") as out:
        while True:
            with open(stats + "tx_bytes") as tx, open(stats + "rx_bytes") as rx:
                out.write(f"{time.time():.4f} {tx.read().strip()} {rx.read().strip()}\n")
            out.flush()
            time.sleep(0.005)


if __name__ == "__main__":
    main(sys.argv[1])

"""hvdtrain's Gloo buckets on a 0.1 Gbit/s link with TensorFlow's inter-op threads at 1 and at
2 per rank (one core each), and the same job on one host, interleaved in rounds; rank 0's
Horovod timeline of every link run says when each bucket was asked for.

    sudo .venv/bin/python benchmarks/results/network-inter-op/run.py DIR [ROUNDS]

It drives bench network's pieces (its two namespace hosts, its link probe, its jobs) with
``run.inter_op_threads`` set, which bench network's own systems leave at the default. DIR gets
runs.json (rewritten after every run) and each link run's timeline.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository's hvdtrain
from hvdtrain.bench import network   # noqa: E402
from hvdtrain.bench.shared import host, link_probe, netns_launch, network_systems   # noqa: E402
from hvdtrain.bench.shared import timeline as timelines   # noqa: E402
from hvdtrain.bench.shared.network_systems import System   # noqa: E402

SPEED_MBIT = 100
# (where, bucket_mb, inter-op threads): the link runs, then one host without buckets (compute).
ARMS = [("link", 2, 1), ("link", 2, 2), ("link", 8, 1), ("link", 8, 2),
        ("one host", 0, 1), ("one host", 0, 2)]


def bucket_times(path, skip):
    """Per bucket (by name), in ms from the step's first request, medians over the steps after
    the first ``skip`` (the warmup): when the first rank asked for it, when the all-reduce
    ran; and the step's time before its first request (the update, the forward pass,
    backprop's start)."""
    events = timelines.read_timeline(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and "name" in e.get("args", {})}
    phases, sizes = timelines.tensor_phases(events), timelines.tensor_bytes(events)
    steps = max(len(p.get("ALLREDUCE", [])) for p in phases.values())
    grads = [pid for pid, p in phases.items() if len(p.get("ALLREDUCE", [])) == steps]
    per_step = []
    for k in range(max(1, skip), steps):
        first = min(phases[pid]["NEGOTIATE_ALLREDUCE"][k][0] for pid in grads)
        before = first - max(phases[pid]["ALLREDUCE"][k - 1][1] for pid in grads)
        per_step.append((before, {pid: (phases[pid]["NEGOTIATE_ALLREDUCE"][k][0] - first,
                                        *(t - first for t in phases[pid]["ALLREDUCE"][k]))
                                  for pid in grads}))
    med = statistics.median
    return {"steps": steps - skip,
            "before_first_request_ms": med(s[0] for s in per_step) / 1e3,
            "buckets": sorted(({"name": names[pid].rsplit("/", 1)[-1], "mb": sizes[pid] / 1e6,
                                "request_ms": med(s[1][pid][0] for s in per_step) / 1e3,
                                "allreduce_ms": [med(s[1][pid][i] for s in per_step) / 1e3
                                                 for i in (1, 2)]}
                               for pid in grads), key=lambda b: b["request_ms"])}


def warmup_steps(how):
    """The timeline's steps of the warmup epochs (an epoch: a repeat's steps and the one that
    starts its clock), as bench phases counts them."""
    return how.plan.warmup_epochs * (how.plan.steps_per_repeat + 1)


def main(out, rounds):
    out.mkdir(parents=True, exist_ok=True)
    how = network.choices(argparse.Namespace(
        quick=False, steps=None, rounds=1, model=None, image_size=None,
        systems="hvdtrain-gloo-overlap", bucket_mb=2.0, horovod_synthetic=None,
        horovod_venv=None, speeds=str(SPEED_MBIT / 1000)))
    network.check_machine()
    result = {"machine": host.machine(), "speed_mbit": SPEED_MBIT, "runs": []}
    timeline = {}
    plain = netns_launch.environment
    # Rank 0's timeline (Horovod reads HOROVOD_TIMELINE in hvd.init()) on the link runs.
    netns_launch.environment = lambda cluster, extra=None: {
        **plain(cluster, extra), "HOROVOD_TIMELINE": timeline["path"]}
    with network.ended_by_sigterm(), tempfile.TemporaryDirectory(prefix="inter-op-") as tmp:
        with network.two_hosts(Path(tmp) / "hosts") as cluster:
            across = {launcher: netns_launch.across_hosts(cluster, launcher, Path(tmp))
                      for launcher in ("mpi", "gloo")}
            for r in range(1, rounds + 1):
                for where, mb, inter in ARMS if r % 2 else ARMS[::-1]:
                    on_link = where == "link"
                    cluster.shape(SPEED_MBIT if on_link else None)
                    run = {"round": r, "where": where, "bucket_mb": mb, "inter_op": inter,
                           "load": os.getloadavg()[0], "start": time.strftime("%H:%M:%S")}
                    if on_link:
                        run["link"] = link_probe.measure(cluster, how.probe_seconds)
                        timeline["path"] = str(out / f"round{r}-mb{mb}-inter{inter}.timeline.json")
                    system = System(f"gloo-{mb}-inter{inter}", where, launcher="gloo",
                                    settings=(f"horovod.bucket_mb={mb}",
                                              f"run.inter_op_threads={inter}"))
                    run["samples_per_sec"] = network_systems.measure(
                        system, how.workload, how.plan, Path(tmp),
                        cluster=cluster if on_link else None, across=across)
                    if on_link:
                        run["timeline"] = bucket_times(Path(timeline["path"]), warmup_steps(how))
                    print(f"round {r}, {where}, bucket_mb {mb}, inter-op {inter}: "
                          f"{run['samples_per_sec']:.2f} samples/s, load {run['load']:.2f}",
                          flush=True)
                    result["runs"].append(run)
                    (out / "runs.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)

"""The per-round rates of a bench network run that ended before writing network.json, from its
progress lines (run.log), and per link speed hvdtrain's Gloo buckets over Horovod's script and
over hvdtrain's one all-reduce under Gloo, per round, with the median and the spread; then, per
round, bench network's cost model against each step (network_projection.round_at, fed the
round's one-host step and link) and each overlapping system's step over max(compute, transfer).

    .venv/bin/python benchmarks/results/network-gloo-horovod/from_log.py run.log GRADIENT_BYTES
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository's hvdtrain
from hvdtrain.bench.shared import network_projection, network_systems, stats   # noqa: E402

BATCH_PER_RANK = 16

LINK = re.compile(r"network: round (\d+), ([\d.]+) Gbit/s: the link moved ([\d.]+) Gbit/s one way, "
                  r"([\d.]+) each way")
START = re.compile(r"network: round (\d+), (one host|[\d.]+ Gbit/s), (\S+)\.\.\.$")
RATE = re.compile(r"^  (\S+): ([\d.]+) samples/s$")

rates, links, at = {}, {}, None
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if m := LINK.match(line):
        links[(int(m[1]), m[2])] = (float(m[3]), float(m[4]))
    elif m := START.match(line):
        at = (int(m[1]), m[2].replace(" Gbit/s", ""))
    elif (m := RATE.match(line)) and at:
        rates[(*at, m[1])] = float(m[2])


rounds = sorted({r for r, _, _ in rates})
for where in ["0.05", "0.1", "1", "one host"]:
    print(f"{where if where == 'one host' else where + ' Gbit/s'}:")
    for r in rounds:
        got = {s: v for (rr, w, s), v in rates.items() if rr == r and w == where}
        link = links.get((r, where))
        print(f"  round {r}: " + ", ".join(f"{s} {v:g}" for s, v in sorted(got.items()))
              + (f"; link {link[0]:g} one way, {link[1]:g} both ways" if link else ""))
    for ours, theirs in (("hvdtrain-gloo-overlap", "horovod"),
                         ("hvdtrain-gloo-overlap", "hvdtrain-gloo"), ("hvdtrain-gloo", "horovod")):
        per = [rates[(r, where, ours)] / rates[(r, where, theirs)] for r in rounds
               if (r, where, ours) in rates and (r, where, theirs) in rates]
        if per:
            print(f"  {ours} / {theirs}, per round: {stats.rounds_text(per)}")

systems = network_systems.systems(2.0)
print("cost model: predicted / measured step s (error); overlap: step / max(compute, transfer)")
for where in ["0.05", "0.1", "1"]:
    for name in ("hvdtrain-gloo", "hvdtrain-gloo-overlap", "horovod"):
        cells = []
        for r in rounds:
            if (r, "one host", name) not in rates or (r, where, name) not in rates:
                continue
            one_way, both = links[(r, where)]
            round_ = {"one_host": {name: rates[(r, "one host", name)]},
                      "links": {where: {"link": {"achieved_gbit_per_s": one_way,
                                                 "both_ways_gbit_per_s": both},
                                        "systems": {name: rates[(r, where, name)]}}}}
            got = network_projection.round_at(round_, where, [systems[name]], BATCH_PER_RANK,
                                              float(sys.argv[2]))[name]
            ideal = max(got["one_host_step_s"], got["transfer_s"])
            cells.append(f"{got['predicted_step_s']:.2f} / {got['measured_step_s']:.2f} "
                         f"({got['error']:+.1%})"
                         + (f", overlap {got['measured_step_s'] / ideal:.2f}"
                            if systems[name].overlaps_backprop else ""))
        print(f"  {where} Gbit/s, {name}: " + "; ".join(cells))

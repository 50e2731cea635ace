"""Each rank process's threads over the second half of its life (warm-up and timed steps), from
sample.py's samples: the share of a core the training thread (TensorFlow's busiest tf_Compute)
and the busiest other thread (Horovod's background thread) took, on the whole and while the
training thread computed (its share over 0.5 in a sample's interval).

    phases.py SAMPLES.jsonl.gz SYSTEM,SYSTEM [...]

names each run's two ranks by the order bench network ran them in one round at one speed:
each system on the link, then each on one host."""
import collections
import gzip
import json
import sys

def processes(path):
    life = collections.defaultdict(list)
    for line in gzip.open(path, "rt"):
        s = json.loads(line)
        per = collections.defaultdict(dict)
        for pid, tid, comm, cpu in s["rows"]:
            per[pid][tid] = (comm, cpu)
        for pid, threads in per.items():
            life[pid].append((s["t"], threads))
    return sorted(life.items(), key=lambda kv: kv[1][0][0])

def rates(series):
    out = []
    for (t0, a), (t1, b) in zip(series, series[1:]):
        out.append({tid: (comm, (cpu - a.get(tid, (comm, 0.0))[1]) / (t1 - t0))
                    for tid, (comm, cpu) in b.items()})
    return out

def shares(steps):
    """Each thread's mean share of a core over ``steps``, by (name, id)."""
    total = collections.Counter()
    for r in steps:
        for tid, (comm, rate) in r.items():
            total[(comm, tid)] += rate / len(steps)
    return total


def mean(rows, tid):
    return sum(r.get(tid, ("", 0.0))[1] for r in rows) / max(1, len(rows))


for path, names in zip(sys.argv[1::2], sys.argv[2::2]):
    print(path)
    systems = names.split(",")
    runs = [f"{name} on the link" for name in systems] + [f"{name} on one host"
                                                          for name in systems]
    ranks = 0
    for pid, series in processes(path):
        start, end = series[0][0], series[-1][0]
        steps = rates([x for x in series if x[0] >= start + 0.5 * (end - start)])
        total = shares(steps)
        computing = [k for k in total if k[0].startswith("tf_Compute")]
        others = [k for k in total if k[0] == "python" and k[1] != pid]
        if end - start < 20 or not computing or not others:
            continue   # the launcher, or a process too short to have trained
        compute = max(computing, key=total.get)
        other = max(others, key=total.get)
        # Up to the training thread's last busy interval: the job's end waits on no link.
        last = max(i for i, r in enumerate(steps) if r.get(compute[1], ("", 0.0))[1] > 0.5)
        steps = steps[:last + 1]
        total = shares(steps)
        busy = [r for r in steps if r[compute[1]][1] > 0.5]
        idle = [r for r in steps if r[compute[1]][1] <= 0.5]
        what = runs[ranks // 2] if ranks // 2 < len(runs) else "?"
        ranks += 1
        print(f"  {what}, rank process {pid}: training thread {total[compute]:.2f}, "
              f"background {total[other]:.2f}; while training computes "
              f"({len(busy) / len(steps):.0%} of the time): background "
              f"{mean(busy, other[1]):.2f}; otherwise: background {mean(idle, other[1]):.2f}")

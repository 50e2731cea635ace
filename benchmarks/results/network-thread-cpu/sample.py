"""Every 0.25 s, one JSON line: each rank process's threads as [pid, tid, name, CPU seconds]
(user + system), with the time. A rank process: a Python process of hvdtrain or of Horovod's
synthetic benchmark, not a launcher. Runs until killed.

    sample.py OUT.jsonl
"""
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def is_rank(cmd):
    return (b"python" in cmd[0] and any(b"hvdtrain" in c or b"synthetic" in c for c in cmd)
            and not any(b"mpirun" in c or b"horovodrun" in c for c in cmd[:2]))


def threads(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        yield [int(pid), int(tid), name, (int(fields[11]) + int(fields[12])) / TICK]


with open(sys.argv[1], "w") as out:
    while True:
        now, rows = time.time(), []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if is_rank(open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")):
                    rows.extend(threads(pid))
            except (OSError, ValueError):   # ended meanwhile
                continue
        if rows:
            out.write(json.dumps({"t": now, "rows": rows}) + "\n")
            out.flush()
        time.sleep(0.25)

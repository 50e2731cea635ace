"""A measured job's ranks: the command that launches them (one core each), the rank side's
command line and ``__main__``, a rank's own core where its launcher binds none, free ports."""
from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any, Callable, Mapping, Sequence

from hvdtrain.launch import launchers, rank_process, placement


def launch_command(launcher: str, ranks: int, argv: Sequence[str],
                   core: int | None = None) -> list[str]:
    """A measured job's command: one core per rank where the launcher binds ranks (see
    launchers.Entry.binds_cores). ``core``: a 1-rank mpirun job bound to that core instead of
    core 0, where Open MPI maps every job from (it refuses --cpu-set beside --map-by), so that
    two jobs can run side by side."""
    command = launchers.launch_command(launcher, ranks, argv, bind_to_core=True)
    if core is None:
        return command
    i = command.index("--map-by")
    return command[:i] + ["--cpu-set", str(core)] + command[i + 2:]


def rank_argv(module: str, options: Mapping[str, Any], python: str = sys.executable
              ) -> list[str]:
    """``python -m MODULE rank OPTIONS_JSON``: the rank side of a benchmark (``python``:
    another virtualenv's interpreter runs it on that stack)."""
    return [python, "-m", module, "rank", json.dumps(options)]


def rank_entry(argv: Sequence[str], rank_main: Callable[[dict], None], module: str) -> None:
    """The ``__main__`` of a module with a rank side: ``python -m MODULE rank OPTIONS_JSON``
    runs one rank of a measured job (see ``rank_argv``)."""
    if len(argv) == 3 and argv[1] == "rank":
        rank_process.whole_lines()
        rank_process.load_tensorflow()
        rank_main(json.loads(argv[2]))
        rank_process.end_rank()
    else:
        sys.exit(f"usage: python -m {module} rank OPTIONS_JSON (launched by 'hvdtrain bench')")


def pin_to_own_core() -> int | None:
    """Rank side, before TensorFlow starts: bind this process to core (local rank mod cores)
    when the launcher did not bind it (horovodrun --gloo; launchers.Entry.binds_cores), so that
    every launcher gives a rank the same one-core budget. Returns the core, or None when
    already bound."""
    available = os.sched_getaffinity(0)
    if len(available) < placement.cores_available()[1]:
        return None
    core = sorted(available)[placement.launcher_local_rank() % len(available)]
    os.sched_setaffinity(0, {core})
    return core


def free_ports(count: int) -> list[int]:
    """Ports free on localhost now (for TF_CONFIG clusters)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("localhost", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()

"""What every benchmark shares: launching ranks, statistics, the machine, and the output files.

Nothing here imports TensorFlow or Horovod: the drivers stay light, and every measured job runs
in processes of its own.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from hvdtrain import launchers, launching, placement


class BenchError(RuntimeError):
    """A measured job failed: the message carries the end of its output."""


# ---------------------------------------------------------------------------------------------
# Statistics

def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of repeated measurements: robust to the odd slow repeat that a shared
    machine produces. ``spread`` is (max - min) / median."""
    if not values:
        raise ValueError("no measurements to summarize")
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values), "n": len(values),
            "spread": (max(values) - min(values)) / median if median else 0.0}


# A ratio whose rounds spread wider than this is noise: the figure does not count.
SPREAD_LIMIT = 0.10


def ratio_summary(per_round: Sequence[float], limit: float = SPREAD_LIMIT) -> dict[str, Any]:
    """A ratio measured once per interleaved round: its median, spread, the rounds, and whether
    the spread makes it noise."""
    summary = summarize(per_round)
    return {**summary, "per_round": list(per_round), "noise": summary["spread"] > limit}


def ratio_text(ratio: Mapping[str, Any]) -> str:
    """'0.9796 (spread 9.8%)': four decimals, so that a ratio just under a target such as 0.98
    does not print as the target, and the spread to a tenth of a percent."""
    return f"{ratio['median']:.4f} (spread {ratio['spread']:.1%})"


def verdict(value: float, target: float, *, at_least: bool = True,
            noise: bool = False) -> str:
    """'meets >= 0.98', 'misses >= 0.98', or 'noise: does not count' when the figure's spread
    is past SPREAD_LIMIT (whatever its median)."""
    if noise:
        return "noise: does not count"
    met = value >= target if at_least else value <= target
    return f"{'meets' if met else 'misses'} {'>=' if at_least else '<='} {target:g}"


def ratio_cell(ratio: Mapping[str, Any], target: float | None = None, *,
               at_least: bool = True) -> str:
    """A table cell for a ``ratio_summary``: the figure, its spread, and the verdict against
    ``target`` (or 'noise' alone where there is no target)."""
    text = ratio_text(ratio)
    if target is not None:
        met = verdict(ratio["median"], target, at_least=at_least, noise=ratio["noise"])
        return f"{text}: {met}"
    return text + (" noise" if ratio["noise"] else "")


# ---------------------------------------------------------------------------------------------
# Launching

def launch_command(launcher: str, ranks: int, argv: Sequence[str]) -> list[str]:
    """A measured job's command: one core per rank where the launcher binds ranks (see
    launchers.Entry.binds_cores)."""
    return launchers.launch_command(launcher, ranks, argv, bind_to_core=True)


def rank_argv(module: str, options: Mapping[str, Any], python: str = sys.executable
              ) -> list[str]:
    """``python -m MODULE rank OPTIONS_JSON``: the rank side of a benchmark (``python``:
    another virtualenv's interpreter runs it on that stack)."""
    return [python, "-m", module, "rank", json.dumps(options)]


def rank_entry(argv: Sequence[str], rank_main: Callable[[dict], None], module: str) -> None:
    """The ``__main__`` of a benchmark module: ``python -m MODULE rank OPTIONS_JSON`` runs one
    rank of a measured job (see ``rank_argv``)."""
    if len(argv) == 3 and argv[1] == "rank":
        launching.whole_lines()
        launching.load_tensorflow()
        rank_main(json.loads(argv[2]))
        launching.end_rank()
    else:
        sys.exit(f"usage: python -m {module} rank OPTIONS_JSON (launched by 'hvdtrain bench "
                 f"{module.rsplit('.', 1)[-1]}')")


def run_job(command: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 600, what: str = "job") -> str:
    """Runs a measured job to the end; its output, or BenchError with the last lines of it."""
    try:
        proc = subprocess.run(list(command), env=launchers.launch_env(env),
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{what} took longer than {timeout:.0f}s: {' '.join(command)}") from e
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-25:])
        raise BenchError(f"{what} failed (exit {proc.returncode}): {' '.join(command)}\n{tail}")
    return proc.stdout


def read_json_output(path: Path, what: str, output: str) -> Any:
    """The JSON a job wrote to ``path``; BenchError naming ``what``, with the tail of the job's
    ``output``, if it wrote none."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        tail = "\n".join(output.splitlines()[-25:])
        raise BenchError(f"{what} wrote no result to {path}\n{tail}") from None


def pin_to_own_core() -> int | None:
    """Rank side, before TensorFlow starts: bind this process to core (local rank mod cores)
    when the launcher did not bind it (horovodrun --gloo; launchers.Entry.binds_cores), so that
    every launcher gives a rank the same one-core budget. Returns the core, or None when
    already bound."""
    available = os.sched_getaffinity(0)
    if len(available) < placement.cores_available()[1]:
        return None
    local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get(
        "OMPI_COMM_WORLD_LOCAL_RANK", "0")))
    core = sorted(available)[local_rank % len(available)]
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


# ---------------------------------------------------------------------------------------------
# The machine and the output files

def load_average() -> float:
    """The 1-minute load average now: recorded next to figures, since the machine is shared."""
    return os.getloadavg()[0]


def stack_pythons(python: str, other_python: str | None) -> dict[str, str]:
    """The stacks a comparison measures, by the names its results use: 'this' (``python``)
    and, when there is one, 'other'."""
    return {"this": python, **({"other": other_python} if other_python else {})}


def stack_rounds(what: str, rounds: int, pythons: Mapping[str, str],
                 measure: Callable[[str], dict[str, Any]]
                 ) -> tuple[list[dict[str, dict[str, Any]]], list[float]]:
    """``rounds`` interleaved rounds of ``measure(python)`` on each stack of ``pythons`` (name:
    interpreter), in the reverse order every other round so that a drift in the machine's load
    falls on all: per round each stack's figures, and the load average before each round."""
    measured, loads = [], []
    for i in range(rounds):
        loads.append(load_average())
        order = list(pythons) if i % 2 == 0 else list(pythons)[::-1]
        row = {}
        for which in order:
            say(f"{what}, round {i + 1}/{rounds}, {which} stack...")
            row[which] = measure(pythons[which])
        measured.append({which: row[which] for which in pythons})
    return measured, loads


def rounds_per_model(what: str, models: Sequence[str], rounds: int, pythons: Mapping[str, str],
                     measure: Callable[[str, Path, str], dict[str, Any]],
                     summarize: Callable[[str, list, list[float]], dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """Per model: its ``stack_rounds`` of ``measure(model, work_dir, python)``, then
    ``summarize(model, rounds, loads)``; the jobs write into a temporary ``work_dir``."""
    results = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for name in models:
            measured, loads = stack_rounds(f"{what}: {name}", rounds, pythons,
                                           lambda python: measure(name, Path(tmp), python))
            results.append(summarize(name, measured, loads))
    return results


def machine(python: str = sys.executable) -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, memory, and the versions of the stack
    measured (the virtualenv of ``python``, which need not be this driver's)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages / 2 ** 30, 1)
    except (ValueError, OSError):
        pass
    versions = dict(stack_versions(python))
    mpirun = shutil.which("mpirun")
    if mpirun:
        try:
            first = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                                   timeout=30).stdout.splitlines()
            versions["mpi"] = first[0] if first else "unknown"
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"cpu": cpu, "cores": placement.cores_available()[1], "memory_gib": memory_gib,
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "versions": versions,
            "load_average_1min_at_start": load,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC")}


STACK_PACKAGES = ("tensorflow-cpu", "tensorflow", "keras", "tf-keras", "horovod", "mpi4py",
                  "numpy")


@functools.lru_cache(maxsize=None)
def stack_versions(python: str = sys.executable) -> dict[str, str]:
    """The versions of STACK_PACKAGES installed in the virtualenv of ``python``, read from its
    package metadata by that interpreter (nothing imported), with the interpreter's path."""
    script = ("import json, sys\nfrom importlib import metadata\nv = {}\n"
              f"for p in {STACK_PACKAGES!r}:\n"
              "    try:\n        v[p] = metadata.version(p)\n"
              "    except metadata.PackageNotFoundError:\n        pass\n"
              "print(json.dumps(v))")
    try:
        found = subprocess.run([python, "-c", script], capture_output=True, text=True,
                               timeout=60, check=True).stdout
        versions = json.loads(found.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        raise BenchError(f"could not read the package versions of {python}: {e}") from None
    return {**versions, "python_executable": python}


def stack_line(versions: Mapping[str, str]) -> str:
    """'TensorFlow 2.20.0, Keras 3.15.1, Horovod 0.28.1' from ``stack_versions``."""
    tf = versions.get("tensorflow-cpu") or versions.get("tensorflow", "?")
    keras = versions.get("keras", "?")
    return f"TensorFlow {tf}, Keras {keras}, Horovod {versions.get('horovod', 'none')}"


def machine_line(info: Mapping[str, Any]) -> str:
    """One line about the machine a result came from (CPU, cores, memory, OS, versions, load,
    date), from ``info`` as machine() gathers it."""
    v = info.get("versions", {})
    return (f"{info['cpu']}, {info['cores']} cores, {info.get('memory_gib')} GiB; "
            f"{info['os']}; Python {info['python']}, {stack_line(v)}, "
            f"{v.get('mpi', 'no MPI')}; "
            f"load {_load(info.get('load_average_1min_at_start'))} at start; "
            f"{info['date_utc']}")


def _load(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table of ``rows`` under ``headers``; floats to 3 significant digits (whole
    numbers from 100), None as an empty cell."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return "" if v is None else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_outputs(out_dir: Path, name: str, result: Mapping[str, Any], markdown: str) -> None:
    """Writes OUT_DIR/NAME.json (``result``) and OUT_DIR/NAME.md (``markdown``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown.rstrip() + "\n")


def plot_lines(path: Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
               title: str, xlabel: str, ylabel: str, logx: bool = False,
               logy: bool = False, reference: tuple[Sequence[float], Sequence[float]] | None = None,
               reference_label: str = "") -> None:
    """One PNG with a line per series (matplotlib's Agg backend: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if reference:
        ax.plot(*reference, linestyle="--", color="gray", label=reference_label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    _finish(fig, ax, path, title=title, ylabel=ylabel, logy=logy)


def plot_bars(path: Path, groups: Mapping[str, Mapping[str, float]], *, title: str,
              ylabel: str, logy: bool = False, reference: float | None = None,
              reference_label: str = "") -> None:
    """One PNG of grouped bars: a group per key of ``groups``, a bar per inner key."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(k for bars in groups.values() for k in bars))
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, label in enumerate(labels):
        xs = [g + (i - (len(labels) - 1) / 2) * width for g, bars in enumerate(groups.values())
              if label in bars]
        ax.bar(xs, [bars[label] for bars in groups.values() if label in bars], width,
               label=label)
    if reference is not None:
        ax.axhline(reference, linestyle="--", color="gray", label=reference_label)
    ax.set_xticks(range(len(groups)), list(groups))
    _finish(fig, ax, path, title=title, ylabel=ylabel, logy=logy)


def _finish(fig, ax, path: Path, *, title: str, ylabel: str, logy: bool) -> None:
    """The title, labels, grid and legend every plot has; then the PNG."""
    import matplotlib.pyplot as plt
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def say(message: str) -> None:
    """Prints a progress line of the benchmarks at once (flushed)."""
    print(message, flush=True)

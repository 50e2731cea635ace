"""Horovod's own test file test/parallel/test_tensorflow2_keras.py (v0.28.1) at N ranks against
hvdtrain.horovod.tensorflow.keras, and what both parts of scripts/horovod_examples.py share:
reading a file of Horovod's repository, adapting it by exact replacements, and running it under
mpirun with a hard timeout. Not run by itself: scripts/horovod_examples.py calls run_tests().

Each rank writes its own JUnit XML (pytest expands $OMPI_COMM_WORLD_RANK in --junitxml); the
verdicts are rank 0's, the other ranks' differing verdicts are noted beside them. A failure whose
error names an API that Keras 3 removed is marked so (REMOVED_IN_KERAS3, one table).
"""
from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hvdtrain.launch.launchers import Options, mpi_cmd_env  # noqa: E402  (ROOT, put on the path above)

TAG = "v0.28.1"  # the Horovod release whose files are run
TEST_FILE = "test/parallel/test_tensorflow2_keras.py"
# The test file imports `parameterized`, which the venvs do not have: installed beside (not into)
# the venv, into the work folder, for this run only.
TEST_DEPENDENCY = "parameterized==0.9.0"


@dataclass(frozen=True)
class Edit:
    """One adaptation of a Horovod file: `old` must occur exactly once, and becomes `new`."""
    why: str
    old: str
    new: str


class AdaptError(RuntimeError):
    """A replacement's text is not in the file (exactly once): upstream changed."""


TEST_EDITS = (
    Edit("import line swapped", "import horovod.tensorflow.keras as hvd\n",
         "import hvdtrain.horovod.tensorflow.keras as hvd\n"),
    # horovod.keras is Horovod's front end for standalone Keras, the same API as
    # horovod.tensorflow.keras (both are built on horovod._keras); on TensorFlow 2.16+ Keras is
    # tf.keras, so hvdtrain's module serves it (test_partial_distributed_optimizer uses it).
    Edit("import line swapped (horovod.keras, the same API, for standalone Keras)",
         "import horovod.keras as hvd_keras\n",
         "import hvdtrain.horovod.tensorflow.keras as hvd_keras\n"),
)

# A failure whose error message (the exception's line, not the traceback) matches a pattern here
# needs an API that Keras 3 removed (first match wins); any other failure is the module's or the
# test's. Patterns are regular expressions.
REMOVED_IN_KERAS3: tuple[tuple[str, str], ...] = (
    (r"optimizers\.legacy|legacy optimizer", "tf.keras.optimizers.legacy"),
    (r"has no attribute 'get_value'", "keras.backend.get_value"),
    (r"has no attribute 'set_value'", "keras.backend.set_value"),
    (r"has no attribute 'get_session'|get_session", "keras.backend.get_session"),
    (r"experimental_run_tf_function", "compile(experimental_run_tf_function=...)"),
    (r"has no attribute 'ThresholdedReLU'", "keras.layers.ThresholdedReLU"),
    (r"has no attribute 'get_updates'|get_updates", "Optimizer.get_updates"),
    (r"has no attribute '_compute_gradients'", "OptimizerV2._compute_gradients"),
    (r"has no attribute '_aggregate_gradients'", "OptimizerV2._aggregate_gradients"),
    (r"Argument\(s\) not recognized: \{'lr'", "optimizer argument lr="),
    (r"has no attribute 'optimizer_v2'|keras\.optimizer_v2", "keras.optimizer_v2"),
    (r"losses' has no attribute 'mean_squared_error'", "tf.keras.losses.mean_squared_error"),
    (r"Optimizer.__init__\(\) missing 1 required positional argument: 'learning_rate'",
     "an Optimizer subclass without learning_rate (OptimizerV2's _build_learning_rate)"),
)
# What hvdtrain.horovod refuses by design, with a UserError saying why.
REFUSED = r"hvdtrain\.horovod: .* is not offered"
# What a test's own source uses that Keras 3 removed, looked for where hvdtrain refused the test
# before it got there.
REMOVED_IN_SOURCE: tuple[tuple[str, str], ...] = (
    (r"\.ref\(\)", "Variable.ref() (Keras 3 variables have none)"),
    (r"\._compute_gradients\(", "OptimizerV2._compute_gradients"),
)


def removed_in_source(text: str, test: str) -> list[str]:
    """The APIs of REMOVED_IN_SOURCE that the test method ``test`` (Class.method) uses."""
    name = test.rsplit(".", 1)[-1]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            body = ast.get_source_segment(text, node) or ""
            return [api for pattern, api in REMOVED_IN_SOURCE if re.search(pattern, body)]
    return []


def classify(error: str) -> str | None:
    """The API Keras 3 removed that `error` names, or None."""
    for pattern, api in REMOVED_IN_KERAS3:
        if re.search(pattern, error):
            return api
    return None


def read_source(horovod: Path, path: str) -> tuple[str, str]:
    """`path` of Horovod's repository at TAG and where it was read: with `git show TAG:path`
    where `horovod` is a git repository (bare or a work tree) that has the tag, else the file of
    the work tree as it is."""
    shown = subprocess.run(["git", "-C", str(horovod), "show", f"{TAG}:{path}"],
                           capture_output=True, text=True)
    if shown.returncode == 0:
        return shown.stdout, f"git show {TAG}:{path}"
    if (horovod / path).is_file():
        return (horovod / path).read_text(), f"{horovod / path} (work tree, its version unchecked)"
    raise FileNotFoundError(f"{path}: neither `git -C {horovod} show {TAG}:{path}` nor the file: "
                            f"{shown.stderr.strip()}")


def adapt(text: str, edits: Sequence[Edit], name: str) -> str:
    """`text` with every edit applied; AdaptError naming the first whose text is not there once."""
    for edit in edits:
        count = text.count(edit.old)
        if count != 1:
            raise AdaptError(f"{name}: the text to replace ({edit.why}) occurs {count} times, "
                             f"not once: {edit.old!r}")
        text = text.replace(edit.old, edit.new)
    return text


@dataclass
class Job:
    """One mpirun: its exit status (None: killed at the timeout), seconds and whole output."""
    rc: int | None
    seconds: float
    output: str


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def kill_job(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the job's process group and to every process below it (a rank that left the
    group too)."""
    below = descendants(process.pid)
    for kill, target in [(os.killpg, process.pid), *[(os.kill, pid) for pid in below]]:
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.wait()


def run_job(argv: Sequence[str], *, ranks: int, venv: Path, cwd: Path, timeout: float,
            log: Path, pythonpath: Sequence[Path] = (), env: dict[str, str] | None = None) -> Job:
    """`mpirun -np RANKS ARGV` as hvdtrain launches (one core per rank, tagged lines), in a
    process group of its own, killed whole after `timeout` seconds; the ranks find the venv
    first on PATH and this checkout (then `pythonpath`) on PYTHONPATH. Output into `log`."""
    extra = {"PYTHONPATH": os.pathsep.join(map(str, [ROOT, *pythonpath])),
             "PYTHONUNBUFFERED": "1", **(env or {})}
    command, environ = mpi_cmd_env(ranks, argv, Options(bind_to_core=True, tag_output=True,
                                                          env=extra))
    environ["PATH"] = f"{venv.absolute() / 'bin'}{os.pathsep}{environ['PATH']}"
    start = time.monotonic()
    with log.open("wb") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        process = subprocess.Popen(command, cwd=cwd, env=environ, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_job(process)
            rc = None
    return Job(rc, round(time.monotonic() - start, 1), log.read_text(errors="replace"))


def ranks_part(piece: str) -> str:
    """The text after a tag up to mpirun's own message, if one follows."""
    parts = re.split(r"\n(?=-{20}|\[[^\]]*:\d+\] )", piece, maxsplit=1)
    return parts[0] + ("\n" if len(parts) > 1 else "")


def rank_lines(output: str, rank: int = 0) -> list[str]:
    """The non-empty lines rank `rank` printed (stdout and stderr), untagged, escape codes
    removed. mpirun --tag-output tags each chunk a rank writes, also one that ends mid-line or
    holds a newline (a Keras progress bar, redrawn with backspaces on the pty mpirun gives): a
    tag's text runs to the next tag or to mpirun's own message (a dashed frame or a
    '[host:pid]' line); a redraw, and a switch between stdout and stderr, start a new line."""
    pieces = re.split(r"\[1,(\d+)\]<(std(?:out|err))>:", output)
    text, stream = "", ""
    for tag, name, piece in zip(pieces[1::3], pieces[2::3], pieces[3::3]):
        if int(tag) == rank:
            text += ("\n" if name != stream else "") + ranks_part(piece)
            stream = name
    lines = (re.sub(r"\x1b\[[0-9;]*m", "", line) for line in re.split(r"[\r\n\x08]+", text))
    return [line for line in lines if line.strip()]


def last_error_line(*outputs: Sequence[str]) -> str:
    """The last line that names an error or exception in the first of `outputs` that has one,
    else the last line of the first that is not empty."""
    error = re.compile(r"^\s*([\w.]*(Error|Exception|Exit|Interrupt)\b|\S+: error: )")
    for lines in outputs:
        for line in reversed(lines):
            if error.match(line):
                return line.strip()[:400]
    return next((lines[-1].strip()[:400] for lines in outputs if lines), "(no output)")


def test_dependencies(venv: Path, work: Path) -> tuple[list[Path], list[str]]:
    """PYTHONPATH entries and notes for what the test file imports that the venv lacks."""
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import parameterized"], capture_output=True).returncode == 0:
        return [], []
    target = work / "deps"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--target", str(target), TEST_DEPENDENCY], check=True)
    return [target], [f"{TEST_DEPENDENCY} (the test file imports it) installed for this run "
                      f"beside the venv, not into it"]


def junit_verdicts(path: Path) -> dict[str, dict[str, str]]:
    """{test: {verdict, detail}} from one rank's JUnit XML; {} where the rank wrote none."""
    if not path.exists():
        return {}
    verdicts = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            message = problem.get("message", "") or problem.text or ""
            first = next((line for line in message.splitlines() if line.strip()), "")
            api = classify(message)
            verdict = ("needs an API Keras 3 removed: " + api if api else
                       "refused by hvdtrain.horovod" if re.search(REFUSED, message) else "failed")
            verdicts[name] = {"verdict": verdict, "detail": first.strip()[:300]}
        elif skipped is not None:
            verdicts[name] = {"verdict": "skipped", "detail": skipped.get("message", "")[:300]}
        else:
            verdicts[name] = {"verdict": "passed", "detail": ""}
    return verdicts


def progress_verdicts(lines: Sequence[str]) -> dict[str, dict[str, str]]:
    """{test: {verdict, detail}} from rank 0's `pytest -v` lines, for a run that wrote no XML
    (killed at the timeout, or crashed): a test named without an outcome is the one that was
    running then."""
    verdicts = {}
    for line in lines:
        match = re.match(r"\S+::(\w+)::(\w+)(?:\s+(PASSED|FAILED|SKIPPED|ERROR))?", line)
        if not match or (f"{match.group(1)}.{match.group(2)}" in verdicts and not match.group(3)):
            continue
        outcome = (match.group(3) or "").lower()
        verdicts[f"{match.group(1)}.{match.group(2)}"] = {
            "verdict": {"error": "failed"}.get(outcome, outcome) or "hung or crashed",
            "detail": "" if outcome else "running when the job ended; no JUnit XML"}
    return verdicts


def merge_ranks(work: Path, ranks: int) -> list[dict[str, str]]:
    """Rank 0's verdicts, with the other ranks' differing verdicts noted in the detail."""
    per_rank = [junit_verdicts(work / f"junit-{rank}.xml") for rank in range(ranks)]
    tests = []
    for name, result in per_rank[0].items():
        others = [f"rank {rank}: {verdicts[name]['verdict']} ({verdicts[name]['detail']})"
                  for rank, verdicts in enumerate(per_rank[1:], 1)
                  if name in verdicts and verdicts[name]["verdict"] != result["verdict"]]
        detail = "; ".join(filter(None, [result["detail"], *others]))
        tests.append({"test": name, "verdict": result["verdict"], "detail": detail})
    return tests


def run_tests(horovod: Path, venv: Path, ranks: int, work: Path, logs: Path,
              timeout: float) -> dict[str, Any]:
    """Horovod's TEST_FILE, adapted, under `mpirun -np RANKS python -m pytest -v`: the outcome
    of the job, its adaptations and the verdict of every test."""
    text, source = read_source(horovod, TEST_FILE)
    folder = work / "tests"
    folder.mkdir(parents=True)
    target = folder / Path(TEST_FILE).name
    target.write_text(adapt(text, TEST_EDITS, TEST_FILE))
    pythonpath, notes = test_dependencies(venv, work)
    argv = [str(venv.absolute() / "bin" / "python"), "-m", "pytest", "-v", "-p",
            "no:cacheprovider", f"--junitxml={folder}/junit-$OMPI_COMM_WORLD_RANK.xml",
            target.name]
    print(f"== {TEST_FILE} at {ranks} ranks (timeout {timeout:.0f}s)", flush=True)
    job = run_job(argv, ranks=ranks, venv=venv, cwd=folder, timeout=timeout,
                  log=logs / "test_tensorflow2_keras.log", pythonpath=pythonpath)
    progress = progress_verdicts(rank_lines(job.output))
    tests = merge_ranks(folder, ranks) or [{"test": name, **result}
                                           for name, result in progress.items()]
    for test in tests:
        also = removed_in_source(text, test["test"]) if test["verdict"].startswith("refused") \
            else []
        if also:
            test["verdict"] += "; the test also needs an API Keras 3 removed: " + ", ".join(also)
    counts: dict[str, int] = {}
    for test in tests:
        kind = test["verdict"].split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    outcome = "timeout" if job.rc is None else f"exit {job.rc}"
    print(f"   {outcome}, {job.seconds}s: {counts}", flush=True)
    return {"file": TEST_FILE, "source": source, "outcome": outcome, "seconds": job.seconds,
            "adaptations": [asdict(edit) for edit in TEST_EDITS], "notes": notes,
            "counts": counts, "tests": tests,
            "last_error": "" if job.rc == 0 else last_error_line(
                rank_lines(job.output), rank_lines(job.output, 1), job.output.splitlines())}

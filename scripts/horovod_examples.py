"""Horovod's own TensorFlow 2 examples and its Keras test file (tag v0.28.1) against hvdtrain's
Horovod-compatible module (hvdtrain.horovod.tensorflow[.keras]) on Keras 3, at N ranks under
mpirun (`make horovod-examples HOROVOD_REPO=path`):

    scripts/horovod_examples.py --horovod PATH [--venv .venv] [--np 2]
                                [--out benchmarks/results/horovod-examples] [--timeout 300]

PATH is a checkout of github.com/horovod/horovod: a work tree or a (bare) git directory; files
are read with `git show v0.28.1:FILE` where it is a git repository. Each example is copied into a
work folder, adapted by the exact replacements listed in EXAMPLES (the import line, then only
what Keras 3 changed, the local MNIST file, and shorter runs for 2 CPU cores; each must match
once, so a changed upstream file stops the run) and run as one mpirun in its own process group,
killed whole at the timeout. The ranks run the venv's Python and this checkout's hvdtrain
(PYTHONPATH). MNIST is scikit-learn's digits, upscaled to 28x28 (nothing is downloaded here).
Then scripts/horovod_keras_tests.py runs test/parallel/test_tensorflow2_keras.py under pytest.
Writes OUT/results.json and OUT/README.md; each job's whole output goes to runs/horovod-examples.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import horovod_keras_tests as shared
from hvdtrain.bench.shared import horovod_synthetic as synthetic
from horovod_keras_tests import Edit

ROOT = shared.ROOT
EXAMPLES_DIR = "examples/tensorflow2"
LOGS = ROOT / "runs" / "horovod-examples"
# Small enough to end in about a minute on 2 CPU cores (224x224 images are fixed by the script).
BENCH_ARGS = ("--model", "MobileNetV2", "--batch-size", "8", "--num-batches-per-iter", "2",
              "--num-iters", "3", "--no-cuda")

IMPORT_TF = Edit("import line swapped", *synthetic.TF_IMPORT)
IMPORT_KERAS = Edit("import line swapped", "import horovod.tensorflow.keras as hvd\n",
                    "import hvdtrain.horovod.tensorflow.keras as hvd\n")
OPT_VARIABLES = Edit("Keras 3: Optimizer.variables is a property, not a method",
                     *synthetic.OPT_VARIABLES)
# The MNIST scripts download mnist.npz; here it is a local file of the same shape (mnist_file).
LOAD_MNIST = (
    Edit("local MNIST file (no download here): np.load, not mnist.load_data",
         "\nimport tensorflow as tf\n",
         "\nimport numpy as np\nimport tensorflow as tf\n"),
    Edit("local MNIST file (no download here): np.load, not mnist.load_data",
         "tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())",
         "(lambda f: ((f['x_train'], f['y_train']), (f['x_test'], f['y_test'])))"
         "(np.load('mnist.npz'))"),
)


@dataclass(frozen=True)
class Example:
    """One of Horovod's examples: its file in EXAMPLES_DIR, arguments and adaptations."""
    name: str
    args: tuple[str, ...]
    edits: tuple[Edit, ...]
    kind: str  # "benchmark" (img/s) or "mnist" (loss and accuracy)


EXAMPLES = (
    Example("tensorflow2_synthetic_benchmark", BENCH_ARGS + ("--num-warmup-batches", "2"),
            (IMPORT_TF, OPT_VARIABLES), "benchmark"),
    Example("tensorflow2_mnist", (), (IMPORT_TF, *LOAD_MNIST, OPT_VARIABLES, Edit(
        "shorter for 2 CPU cores: 250 steps per rank, not 5,000 (~0.26 s a step: 22 min)",
        "dataset.take(10000 // hvd.size())", "dataset.take(500 // hvd.size())")), "mnist"),
    Example("tensorflow2_keras_synthetic_benchmark", BENCH_ARGS, (IMPORT_KERAS, Edit(
        "Keras 3: compile() takes no experimental_run_tf_function",
        "optimizer=opt,\n              experimental_run_tf_function=False)",
        "optimizer=opt)")), "benchmark"),
    Example("tensorflow2_keras_mnist", (), (IMPORT_KERAS, *LOAD_MNIST, Edit(
        "Keras 3: compile() takes no experimental_run_tf_function",
        "metrics=['accuracy'],\n                        experimental_run_tf_function=False)",
        "metrics=['accuracy'])"), Edit(
        "Keras 3: ModelCheckpoint saves a whole model to .keras only, not .h5",
        "'./checkpoint-{epoch}.h5'", "'./checkpoint-{epoch}.keras'"), Edit(
        "shorter for 2 CPU cores: 5 epochs of 50 steps per rank, not 24 of 250 (26 min); "
        "the 3 warmup epochs kept",
        "steps_per_epoch=500 // hvd.size(), callbacks=callbacks, epochs=24",
        "steps_per_epoch=100 // hvd.size(), callbacks=callbacks, epochs=5")), "mnist"),
)


def mnist_file(path: Path, venv: Path) -> None:
    """An mnist.npz-shaped file at `path` (x_train uint8 (N, 28, 28), y_train, x_test, y_test)
    from scikit-learn's digits: each 8x8 image repeated 3x3 to 24x24, padded by 2 to 28x28,
    0..16 scaled to 0..255; the first 1,437 images train, the other 360 test."""
    code = f"""
import numpy as np
from sklearn.datasets import load_digits
d = load_digits()
x = np.pad(np.kron(d.images, np.ones((1, 3, 3))), ((0, 0), (2, 2), (2, 2)))
x = np.round(x * 255 / 16).astype(np.uint8)
y = d.target.astype(np.uint8)
np.savez({str(path)!r}, x_train=x[:1437], y_train=y[:1437], x_test=x[1437:], y_test=y[1437:])
"""
    subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True)


def throughput(lines: list[str]) -> dict[str, Any]:
    """img/s as the benchmarks print them: per iteration, the mean per device and the total."""
    iters = [float(x) for x in re.findall(r"Iter #\d+: ([\d.]+) img/sec", "\n".join(lines))]
    per = re.search(r"Img/sec per \w+: ([\d.]+) \+-([\d.]+)", "\n".join(lines))
    total = re.search(r"Total img/sec on \d+ \w+\(s\): ([\d.]+) \+-([\d.]+)", "\n".join(lines))
    return {"iters": iters,
            "per_device": float(per.group(1)) if per else None,
            "per_device_conf": float(per.group(2)) if per else None,
            "total": float(total.group(1)) if total else None}


def learning(lines: list[str]) -> dict[str, Any]:
    """First and last loss (and accuracy, where printed) of rank 0's training lines: the tape
    example's 'Step #N  Loss: X', Keras' progress bar at each epoch's end ('50/50 ... - accuracy:
    A - loss: L', its means over the epoch)."""
    text = "\n".join(lines)
    losses = [float(x) for x in re.findall(r"Step #\d+\s+Loss: ([\d.]+)", text)]
    epochs = [line for line in lines if re.search(r"\bloss: [\d.]", line)
              and (m := re.match(r"\s*(\d+)/(\d+) ", line)) and m.group(1) == m.group(2)]
    losses += [float(re.search(r"\bloss: ([\d.]+)", line).group(1)) for line in epochs]  # type: ignore[union-attr]
    accuracies = [float(m.group(1)) for line in epochs
                  if (m := re.search(r"\baccuracy: ([\d.]+)", line))]
    result: dict[str, Any] = {"points": len(losses)}
    if losses:  # falls, rises: None where there is one figure only
        result.update(loss_first=losses[0], loss_last=losses[-1],
                      loss_falls=losses[-1] < losses[0] if len(losses) > 1 else None)
    if accuracies:
        result.update(accuracy_first=accuracies[0], accuracy_last=accuracies[-1],
                      accuracy_rises=accuracies[-1] > accuracies[0] if len(accuracies) > 1
                      else None)
    return result


def run_example(example: Example, horovod: Path, venv: Path, ranks: int, work: Path,
                timeout: float) -> dict[str, Any]:
    """One example, adapted, at `ranks` ranks: outcome, adaptations, figures and seconds."""
    path = f"{EXAMPLES_DIR}/{example.name}.py"
    text, source = shared.read_source(horovod, path)
    folder = work / example.name
    folder.mkdir(parents=True)
    (folder / f"{example.name}.py").write_text(shared.adapt(text, example.edits, path))
    if example.kind == "mnist":
        mnist_file(folder / "mnist.npz", venv)
    argv = [str(venv.absolute() / "bin" / "python"), f"{example.name}.py", *example.args]
    print(f"== {path} at {ranks} ranks (timeout {timeout:.0f}s)", flush=True)
    job = shared.run_job(argv, ranks=ranks, venv=venv, cwd=folder, timeout=timeout,
                         log=LOGS / f"{example.name}.log")
    lines = shared.rank_lines(job.output)
    outcome = {None: "timeout", 0: "finished"}.get(job.rc, "failed")
    result: dict[str, Any] = {
        "example": path, "source": source, "args": list(example.args), "outcome": outcome,
        "exit": job.rc, "seconds": job.seconds,
        "error": "" if job.rc == 0 else shared.last_error_line(
            lines, shared.rank_lines(job.output, 1), job.output.splitlines()),
        "adaptations": [asdict(edit) for edit in example.edits]}
    if example.kind == "benchmark":
        result["throughput"] = throughput(lines)
    else:
        result["training"] = learning(lines)
    print(f"   {outcome}, {job.seconds}s {result.get('throughput') or result.get('training')}"
          + (f": {result['error']}" if result["error"] else ""), flush=True)
    return result


def context(venv: Path) -> dict[str, str]:
    """The hvdtrain commit, the venv's stack, the date and the machine's load now."""
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,
                                    text=True).stdout.strip()
    changed = git("status", "--porcelain", "--", "hvdtrain")
    stack = subprocess.run([str(venv / "bin" / "python"), "-c",  # as scripts/setup.sh says it
                            "import importlib.metadata as m; from hvdtrain.install import "
                            "horovod_install as h; print('tensorflow %s, keras %s, horovod %s' % "
                            "(h.tensorflow_version(), m.version('keras'), m.version('horovod')))"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"commit": (git("rev-parse", "--short", "HEAD") or "unknown")
            + (" with uncommitted changes in hvdtrain/" if changed else ""),
            "stack": stack, "loadavg": Path("/proc/loadavg").read_text().strip(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def figures(result: dict[str, Any]) -> str:
    """An example's figures in a few words for the table."""
    if "throughput" in result:
        t = result["throughput"]
        return (f"{t['per_device']} img/s per device, {t['total']} total"
                if t["total"] is not None else "no img/s printed")
    t = result["training"]
    words = [f"loss {t['loss_first']} -> {t['loss_last']}" if "loss_first" in t else "no loss"]
    if "accuracy_first" in t:
        words.append(f"accuracy {t['accuracy_first']} -> {t['accuracy_last']}")
    return ", ".join(words)


def render(results: dict[str, Any]) -> str:
    """README.md from results.json's content."""
    c, tests = results["context"], results["horovod_tests"]
    out = [f"# Horovod's own examples and Keras tests on hvdtrain.horovod ({results['tag']})", "",
           f"`{results['command']}`, {c['date']}, hvdtrain {c['commit']}, {c['stack']}, "
           f"{results['np']} ranks under mpirun, load at start `{c['loadavg']}`. Whole outputs: "
           f"runs/horovod-examples/ (not kept).", "",
           "## Examples", "", "| example | outcome | figures | seconds |", "|---|---|---|---|"]
    for r in results["examples"]:
        outcome = r["outcome"] + (f": `{r['error']}`" if r["error"] else "")
        out.append(f"| {Path(r['example']).name} {' '.join(r['args'])} | {outcome} | "
                   f"{figures(r)} | {r['seconds']} |")
    out += ["", "Adaptations (exact replacements, each must match once):", ""]
    for r in results["examples"]:
        out.append(f"- {Path(r['example']).name}: "
                   + "; ".join(dict.fromkeys(a["why"] for a in r["adaptations"])))
    out += ["", f"## {tests['file']}", "",
            f"`mpirun -np {results['np']} python -m pytest -v`: {tests['outcome']}, "
            f"{tests['seconds']}s; " + ", ".join(f"{n} {k}" for k, n in tests["counts"].items())
            + ". Adaptations: " + "; ".join(a["why"] for a in tests["adaptations"])
            + "".join(f"; {note}" for note in tests["notes"]) + ".", "",
            "| test | verdict | detail |", "|---|---|---|"]
    out += [f"| {t['test']} | {t['verdict']} | {t['detail'].replace('|', '/')} |"
            for t in tests["tests"]]
    return "\n".join(out) + "\n"


def command(horovod: Path) -> str:
    """How this run was started: the make target where make started it."""
    if os.environ.get("MAKELEVEL"):
        return f"make horovod-examples HOROVOD_REPO={shlex.quote(str(horovod))}"
    return " ".join(["scripts/horovod_examples.py", *map(shlex.quote, sys.argv[1:])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod", type=Path, required=True,
                        help="Horovod's repository: a work tree or a git directory")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument("--np", type=int, default=2, help="ranks")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/horovod-examples")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per example")
    parser.add_argument("--tests-timeout", type=float, default=600,
                        help="seconds for the whole test file")
    args = parser.parse_args()
    args.venv, args.horovod = args.venv.absolute(), args.horovod.absolute()
    results: dict[str, Any] = {"tag": shared.TAG, "horovod": str(args.horovod), "np": args.np,
                               "command": command(args.horovod),
                               "context": context(args.venv)}
    LOGS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="horovod-examples-") as tmp:
        try:
            results["examples"] = [run_example(example, args.horovod, args.venv, args.np,
                                               Path(tmp), args.timeout) for example in EXAMPLES]
            results["horovod_tests"] = shared.run_tests(args.horovod, args.venv, args.np,
                                                        Path(tmp), LOGS, args.tests_timeout)
        except (shared.AdaptError, FileNotFoundError) as error:
            print(f"scripts/horovod_examples.py: error: {error}", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "README.md").write_text(render(results))
    print(f"wrote {args.out}/results.json and README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

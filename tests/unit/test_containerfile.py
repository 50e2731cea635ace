"""container/Containerfile and its GPU variant, read (not built: `make image` builds the first,
minutes and gigabytes; the GPU one is built nowhere here): their syntax, a builder stage that
compiles Horovod and an image without compilers or headers that copies the built virtualenv, the
stack pins equal to scripts/setup.sh's keras3 pins, sources that a build from the repository
root finds (and .dockerignore lets through), the non-root user with the SSH server the MPI
launcher needs on the port the image exposes, and what a container runs by default. Each check
has a control: the same file with one thing wrong fails it, naming that thing."""
from __future__ import annotations

import re
import shlex

import pytest

from helpers import ROOT

pytestmark = pytest.mark.one_stack   # it reads files; the same on both stacks

CONTAINERFILE = ROOT / "container" / "Containerfile"
GPU_CONTAINERFILE = ROOT / "container" / "Containerfile.gpu"
SETUP = ROOT / "scripts" / "setup.sh"
IGNORE = ROOT / ".dockerignore"
INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "USER", "WORKDIR", "EXPOSE", "CMD",
                "ENTRYPOINT", "LABEL", "SHELL", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD"}
USER, HOME, PORT = "mpiuser", "/home/mpiuser", "2222"
# What builds Horovod and has no place in the image that runs it.
BUILD_ONLY = ("g++", "gcc", "make", "cmake", "python3-dev", "libopenmpi-dev")
TENSORFLOW = {"cpu": '"tensorflow-cpu==${TF_VERSION}"',
              "gpu": '"tensorflow[and-cuda]==${TF_VERSION}"'}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped, as
    podman/buildah read a Containerfile."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):   # a comment inside a continued RUN
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word, rest.strip()))
        pending = ""
    if pending:
        out.append(("<unterminated>", pending))
    return out


def stages(steps: list[tuple[str, str]]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, the stage it starts from, its instructions) per FROM; an unnamed stage's name is
    its index."""
    out: list[tuple[str, str, list[tuple[str, str]]]] = []
    for word, rest in steps:
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(out))
            out.append((name, parts[0] if parts else "", []))
        elif out:
            out[-1][2].append((word, rest))
    return out


def setup_pins(text: str) -> dict[str, str]:
    """The keras3 stack's TensorFlow and Keras versions, from scripts/setup.sh's case line."""
    line = re.search(r"^\s*keras3\)\s*(.*?);;", text, re.M)
    assert line, "scripts/setup.sh has no keras3) line"
    tf = re.search(r"TF_VERSION=(\S+)", line[1])
    keras = re.search(r'KERAS_PIN="keras==([^"]+)"', line[1])
    assert tf and keras, line[1]
    return {"TF_VERSION": tf[1], "KERAS_VERSION": keras[1]}


def packages(steps: list[tuple[str, str]]) -> set[str]:
    """The apt packages a stage's RUN lines install."""
    words: set[str] = set()
    for word, rest in steps:
        if word == "RUN" and "apt-get install" in rest:
            words |= set(rest.split())
    return words


def let_through(source: str, ignore_text: str) -> bool:
    """Whether .dockerignore (everything out, then '!' lines back in) lets ``source`` into the
    build context."""
    allowed = [line[1:] for line in ignore_text.splitlines() if line.startswith("!")]
    return any(source == a or source.startswith(a.rstrip("/") + "/") for a in allowed)


def context_problems(steps: list[tuple[str, str]], ignore_text: str) -> list[str]:
    """COPY sources (but --from's) that a build from the repository root would not find."""
    found = []
    for word, rest in steps:
        if word != "COPY" or rest.startswith("--from="):
            continue
        for source in rest.split()[:-1]:
            if not (ROOT / source).exists():
                found.append(f"context: COPY {source}: no such path in the repository")
            elif not let_through(source, ignore_text):
                found.append(f"context: COPY {source}: .dockerignore leaves it out")
    return found


def problems(text: str, setup_text: str, ignore_text: str, variant: str = "cpu") -> list[str]:
    """What is wrong with a Containerfile, one line each; [] for a good one."""
    found: list[str] = []
    steps = instructions(text)
    for word, rest in steps:
        if word.upper() not in INSTRUCTIONS or word != word.upper():
            found.append(f"syntax: unknown instruction {word!r} ({rest[:40]!r})")
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    if not froms or any(word not in ("ARG", "FROM") for word, _ in steps[:froms[0]]):
        found.append("syntax: the first instruction after the global ARGs must be FROM")
    by_name = {name: (parent, body) for name, parent, body in stages(steps)}
    builders = [name for name, (_, body) in by_name.items()
                if any(w == "RUN" and "hvdtrain setup horovod" in r for w, r in body)]
    if not builders:
        return found + ["stages: no stage builds Horovod (hvdtrain setup horovod)"]
    builder = by_name[builders[0]][1]
    args = dict(rest.split("=", 1) for word, rest in builder if word == "ARG" and "=" in rest)
    for name, version in setup_pins(setup_text).items():
        if args.get(name) != version:
            found.append(f"pin: ARG {name}={args.get(name)} in the image, {version} in setup.sh")
    runs = " ".join(rest for word, rest in builder if word == "RUN")
    for needed in (TENSORFLOW[variant], '"keras==${KERAS_VERSION}"', "pip install -q /src"):
        if needed not in runs:
            found.append(f"names: the builder runs nothing with {needed}")
    if variant == "gpu" and "HOROVOD_GPU_OPERATIONS=NCCL" not in runs:
        found.append("gpu: the builder does not build Horovod with NCCL")
    found += context_problems(steps, ignore_text)
    final_name, (parent, final) = list(by_name.items())[-1]
    if ("COPY", f"--from={builders[0]} /opt/hvdtrain /opt/hvdtrain") not in final:
        found.append("stages: the image does not copy the builder's /opt/hvdtrain")
    chain = final[:]   # the image and every stage it starts from
    while parent in by_name:
        parent, body = by_name[parent]
        chain += body
    installed = packages(chain)
    for package in ("python3", "openmpi-bin", "openssh-server", "openssh-client"):
        if package not in installed:
            found.append(f"names: Debian's {package} is not installed in the image")
    for package in sorted(installed & set(BUILD_ONLY)):
        found.append(f"runtime: the image installs {package}, which only the build needs")
    if not any(w == "RUN" and "sh /tmp/add_mpiuser.sh" in r for w, r in final):
        found.append("user: the image does not run container/add_mpiuser.sh")
    last = {word: rest for word, rest in final}   # the last of each instruction counts
    if last.get("USER") != USER:
        found.append(f"user: the image runs as {last.get('USER', 'root')}, not {USER}")
    if last.get("WORKDIR") != HOME:
        found.append(f"user: WORKDIR is {last.get('WORKDIR')}, not {HOME}")
    if last.get("EXPOSE", "").split() != [PORT]:
        found.append(f"ports: EXPOSE {last.get('EXPOSE')}, while sshd listens on {PORT}")
    if "ENTRYPOINT" in last:
        found.append("entrypoint: an ENTRYPOINT would wrap a pod's command; the image has none")
    command = shlex.split(last.get("CMD", "").replace("[", "").replace("]", "").replace(",", ""))
    if command != ["/usr/sbin/sshd", "-De", "-f", f"{HOME}/.sshd_config"]:
        found.append(f"sshd: the default command is {command}, not sshd on {HOME}/.sshd_config")
    return found


def check(text: str, variant: str = "cpu", setup_text: str | None = None) -> list[str]:
    return problems(text, setup_text or SETUP.read_text(), IGNORE.read_text(), variant)


@pytest.mark.parametrize("path, variant", [(CONTAINERFILE, "cpu"), (GPU_CONTAINERFILE, "gpu")])
def test_each_containerfile_builds_in_a_builder_and_runs_lean(path, variant):
    assert check(path.read_text(), variant) == []


@pytest.mark.parametrize("old, new, problem", [
    ("ARG TF_VERSION=2.21.0", "ARG TF_VERSION=2.20.0", "pin: ARG TF_VERSION=2.20.0"),
    ("ARG KERAS_VERSION=3.15.1", "ARG KERAS_VERSION=3.15.0", "pin: ARG KERAS_VERSION=3.15.0"),
    ("USER mpiuser", "USER root", "user: the image runs as root"),
    ("EXPOSE 2222", "EXPOSE 22", "ports: EXPOSE 22"),
    ("openmpi-bin openssh-server openssh-client", "openmpi-bin openssh-client",
     "names: Debian's openssh-server"),
    ("CMD [", 'ENTRYPOINT ["/bin/sh"]\nCMD [', "entrypoint:"),
    ("openssh-client ca-certificates \\\n", "openssh-client ca-certificates\n", "syntax:"),
    ("python3 openmpi-bin", "python3 g++ openmpi-bin", "runtime: the image installs g++"),
    ("COPY --from=builder /opt/hvdtrain /opt/hvdtrain", "COPY --from=builder /src /src",
     "stages: the image does not copy"),
    ("COPY docs /src/docs", "COPY benchmarks /src/docs", "context: COPY benchmarks: .dockerignore"),
    ("COPY docs /src/docs", "COPY src /src", "context: COPY src: no such path"),
    ("RUN sh /tmp/add_mpiuser.sh", "RUN true", "user: the image does not run"),
])
def test_a_containerfile_with_one_thing_wrong_fails_the_check(old, new, problem):
    text = CONTAINERFILE.read_text()
    assert text.count(old) == 1, old
    found = check(text.replace(old, new))
    assert any(line.startswith(problem) for line in found), found


def test_the_gpu_variant_builds_horovod_with_nccl():
    # Control: without the NCCL switch (or with the CPU image's TensorFlow) the check says so.
    text = GPU_CONTAINERFILE.read_text()
    assert "gpu: the builder does not build Horovod with NCCL" in check(
        text.replace("HOROVOD_GPU_OPERATIONS=NCCL", ""), "gpu")
    assert check(text, "cpu") == [
        f"names: the builder runs nothing with {TENSORFLOW['cpu']}"]


def test_the_pins_follow_setup_sh():
    # Control from the other side: setup.sh moved to another TensorFlow fails the same file.
    moved = SETUP.read_text().replace("TF_VERSION=2.21.0", "TF_VERSION=2.22.0")
    assert check(CONTAINERFILE.read_text(), setup_text=moved) == [
        "pin: ARG TF_VERSION=2.21.0 in the image, 2.22.0 in setup.sh"]


SCRIPT_NEEDS = (f"useradd --create-home --uid 1000 --shell /bin/bash {USER}", f"'Port {PORT}'",
                f"'    Port {PORT}'", f"{HOME}/.ssh/authorized_keys", f"HostKey {HOME}/.ssh/id_rsa",
                "SetEnv PATH=$PATH")


def missing_from_script(text: str) -> list[str]:
    return [needed for needed in SCRIPT_NEEDS if needed not in text]


def test_the_user_script_sets_up_sshd_for_mpiuser_on_the_port():
    script = (ROOT / "container" / "add_mpiuser.sh").read_text()
    assert missing_from_script(script) == []
    # Control: sshd left on port 22 is found.
    assert missing_from_script(script.replace("'Port 2222'", "'Port 22'")) == ["'Port 2222'"]

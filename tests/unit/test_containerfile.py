"""container/Containerfile, read (not built: `make image` builds it, minutes and gigabytes): its
syntax, the stack pins equal to scripts/setup.sh's keras3 pins, the non-root user with the SSH
server the MPI launcher needs on the port it exposes, and what a container runs by default.
Each check has a control: the same file with one thing wrong fails it, naming that thing."""
from __future__ import annotations

import re
import shlex

import pytest

from helpers import ROOT

pytestmark = pytest.mark.one_stack   # it reads files; the same on both stacks

CONTAINERFILE = ROOT / "container" / "Containerfile"
SETUP = ROOT / "scripts" / "setup.sh"
INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "USER", "WORKDIR", "EXPOSE", "CMD",
                "ENTRYPOINT", "LABEL", "SHELL", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD"}
USER, HOME, PORT = "mpiuser", "/home/mpiuser", "2222"


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


def setup_pins(text: str) -> dict[str, str]:
    """The keras3 stack's TensorFlow and Keras versions, from scripts/setup.sh's case line."""
    line = re.search(r"^\s*keras3\)\s*(.*?);;", text, re.M)
    assert line, "scripts/setup.sh has no keras3) line"
    tf = re.search(r"TF_VERSION=(\S+)", line[1])
    keras = re.search(r'KERAS_PIN="keras==([^"]+)"', line[1])
    assert tf and keras, line[1]
    return {"TF_VERSION": tf[1], "KERAS_VERSION": keras[1]}


def problems(text: str, setup_text: str) -> list[str]:
    """What is wrong with a Containerfile, one line each; [] for a good one."""
    found: list[str] = []
    steps = instructions(text)
    for word, rest in steps:
        if word.upper() not in INSTRUCTIONS or word != word.upper():
            found.append(f"syntax: unknown instruction {word!r} ({rest[:40]!r})")
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    if not froms or any(word not in ("ARG", "FROM") for word, _ in steps[:froms[0]]):
        found.append("syntax: the first instruction after the global ARGs must be FROM")
    final = steps[froms[-1]:] if froms else steps
    args = dict(rest.split("=", 1) for word, rest in final if word == "ARG" and "=" in rest)
    for name, version in setup_pins(setup_text).items():
        if args.get(name) != version:
            found.append(f"pin: ARG {name}={args.get(name)} in the image, {version} in setup.sh")
    runs = " ".join(rest for word, rest in final if word == "RUN")
    for needed in ('"tensorflow-cpu==${TF_VERSION}"', '"keras==${KERAS_VERSION}"',
                   "/tmp/wheel/hvdtrain-*.whl", "hvdtrain setup horovod",
                   f"useradd --create-home --uid 1000 --shell /bin/bash {USER}",
                   f"'Port {PORT}'", f"'    Port {PORT}'", f"{HOME}/.ssh/authorized_keys"):
        if needed not in runs:
            found.append(f"names: the final stage runs nothing with {needed}")
    packages = " ".join(rest for word, rest in steps if word == "RUN" and "apt-get install" in rest)
    for package in ("python3", "openmpi-bin", "libopenmpi-dev", "openssh-server",
                    "openssh-client"):
        if not re.search(rf"(^|\s){re.escape(package)}(\s|$)", packages):
            found.append(f"names: Debian's {package} is not installed")
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


def test_the_containerfile_has_the_pins_user_sshd_and_port_it_names():
    assert problems(CONTAINERFILE.read_text(), SETUP.read_text()) == []


@pytest.mark.parametrize("old, new, problem", [
    ("ARG TF_VERSION=2.21.0", "ARG TF_VERSION=2.20.0", "pin: ARG TF_VERSION=2.20.0"),
    ("ARG KERAS_VERSION=3.15.1", "ARG KERAS_VERSION=3.15.0", "pin: ARG KERAS_VERSION=3.15.0"),
    ("USER mpiuser", "USER root", "user: the image runs as root"),
    ("EXPOSE 2222", "EXPOSE 22", "ports: EXPOSE 22"),
    ("openssh-server openssh-client", "openssh-client", "names: Debian's openssh-server"),
    ("CMD [", 'ENTRYPOINT ["/bin/sh"]\nCMD [', "entrypoint:"),
    ("python3 python3-venv python3-dev \\", "python3 python3-venv python3-dev", "syntax:"),
])
def test_a_containerfile_with_one_thing_wrong_fails_the_check(old, new, problem):
    text = CONTAINERFILE.read_text()
    assert text.count(old) == 1, old
    found = problems(text.replace(old, new), SETUP.read_text())
    assert any(line.startswith(problem) for line in found), found


def test_the_pins_follow_setup_sh():
    # Control from the other side: setup.sh moved to another TensorFlow fails the same file.
    moved = SETUP.read_text().replace("TF_VERSION=2.21.0", "TF_VERSION=2.22.0")
    assert problems(CONTAINERFILE.read_text(), moved) == [
        "pin: ARG TF_VERSION=2.21.0 in the image, 2.22.0 in setup.sh"]

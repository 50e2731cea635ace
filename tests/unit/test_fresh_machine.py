"""`make fresh-machine` (scripts/fresh_machine.sh), read and dry-run, not run (it takes tens of
minutes and root): a target of its own outside make test, and the commands it would run in the
container are the README's quick-start block, `make test` run as `make test-fast`."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from helpers import ROOT

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

SCRIPT = ROOT / "scripts" / "fresh_machine.sh"


def rules(makefile: str) -> dict[str, str]:
    """Each target's prerequisites and recipe, as one text, by target name."""
    found: dict[str, str] = {}
    target = None
    for line in makefile.splitlines():
        if line.startswith("\t") and target:
            found[target] += "\n" + line
            continue
        rule = re.match(r"^([\w-]+):(?!=)(.*)$", line)
        target = rule[1] if rule else None
        if target:
            found[target] = rule[2]
    return found


def fresh_machine_problems(makefile: str) -> list[str]:
    """What is wrong with the fresh-machine target: missing, not running the script, or reached
    from make test or make test-fast."""
    found = rules(makefile)
    problems = []
    if "scripts/fresh_machine.sh" not in found.get("fresh-machine", ""):
        problems.append("no fresh-machine target running scripts/fresh_machine.sh")
    for name in ("test", "test-fast"):
        if re.search(r"fresh.machine", found.get(name, "")):
            problems.append(f"make {name} reaches fresh-machine")
    return problems


def test_fresh_machine_is_a_target_of_its_own_outside_make_test():
    assert fresh_machine_problems((ROOT / "Makefile").read_text()) == []


def test_control_a_missing_target_or_one_make_test_reaches_is_caught():
    makefile = (ROOT / "Makefile").read_text()
    assert fresh_machine_problems(makefile.replace("fresh-machine:", "fresh-machin:")) == [
        "no fresh-machine target running scripts/fresh_machine.sh"]
    assert fresh_machine_problems(makefile.replace("\ntest:", "\ntest: fresh-machine")) == [
        "make test reaches fresh-machine"]


def _dry_run(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_the_commands_are_the_readme_quick_start_with_make_test_fast():
    # The checkout's README (the script reads HEAD's, which is what the container clones).
    result = _dry_run(FRESH_README=str(ROOT / "README.md"))
    assert result.returncode == 0, result.stderr
    commands = [line.split("  #")[0].rstrip() for line in result.stdout.splitlines()]
    assert commands == ["apt-get update && apt-get install -y git make",
                        "git clone /src/hvdtrain.bundle hvdtrain && cd hvdtrain",
                        "make demo", "make test-fast"]


def test_control_a_readme_without_the_clone_line_stops_with_one_line(tmp_path):
    readme = (ROOT / "README.md").read_text()
    broken = tmp_path / "README.md"
    broken.write_text(re.sub(r"(?m)^git clone <repository>.*\n", "", readme, count=1))
    result = _dry_run(FRESH_README=str(broken))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "[fresh] error: README.md's quick start has no 'git clone <repository> ...' line"]


@pytest.mark.parametrize("script", ["fresh_machine.sh", "build_image.sh", "common.sh"])
def test_the_podman_scripts_parse(script):
    path = ROOT / "scripts" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", "-x", str(path)], capture_output=True, text=True,
                              cwd=ROOT)
        assert done.returncode == 0, done.stdout


def test_control_bash_n_fails_a_script_that_does_not_parse(tmp_path):
    broken = tmp_path / "broken.sh"
    broken.write_text(SCRIPT.read_text().replace("esac", "", 1))
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True).returncode != 0

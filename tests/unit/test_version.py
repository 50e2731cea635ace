"""hvdtrain's version string (hvdtrain/version.py): the version alone outside a git checkout or
without git, with the commit (and +dirty) in one, as ``hvdtrain --version`` prints it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT
from hvdtrain import __version__, cli, version

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def git(folder, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(folder), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_checkout_names_its_commit_and_its_uncommitted_changes(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "one")
    head = git(tmp_path, "rev-parse", "--short=7", "HEAD")
    assert version.commit(tmp_path) == head and len(head) == 7
    assert version.describe(tmp_path) == f"{__version__} (commit {head})"
    (tmp_path / "a.txt").write_text("2")
    version.commit.cache_clear()   # asked once a process: a new one sees the change
    assert version.commit(tmp_path) == f"{head}+dirty"
    # An untracked file alone leaves the tree clean.
    git(tmp_path, "checkout", "-q", "a.txt")
    (tmp_path / "b.txt").write_text("new")
    version.commit.cache_clear()
    assert version.commit(tmp_path) == head


def test_no_checkout_or_no_git_gives_the_version_alone(tmp_path, monkeypatch):
    # A wheel's site-packages inside some other repository: that repository is not named.
    git(tmp_path, "init", "-q")
    (tmp_path / "site").mkdir()
    assert version.commit(tmp_path / "site") is None
    assert version.describe(tmp_path / "site") == __version__
    # No git on PATH: no error, no commit.
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    version.commit.cache_clear()
    assert version.commit(tmp_path) is None
    version.commit.cache_clear()


def test_the_text_names_the_commit_only_where_there_is_one():
    assert version.text("0.2.0", "1d398bb") == "0.2.0 (commit 1d398bb)"
    assert version.text("0.2.0", None) == "0.2.0"


def test_hvdtrain_version_prints_the_version_and_this_checkouts_commit(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.run(["--version"])
    assert exited.value.code in (0, None)
    printed = capsys.readouterr().out
    if (ROOT / ".git").exists():   # the tests run from a checkout (make test does)
        head = git(ROOT, "rev-parse", "--short=7", "HEAD")
        assert printed.startswith(f"hvdtrain {__version__} (commit {head}")
    assert printed == f"hvdtrain {version.describe()}\n"
    # The same from the command line, as a user types it.
    done = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "--version"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (done.returncode, done.stdout) == (0, printed), done.stderr

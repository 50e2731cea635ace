"""hvdtrain's version and, run from a git checkout, its commit: the one string that
``hvdtrain --version``, rank 0's banner, summary.json and ``hvdtrain doctor --report`` name,
e.g. "0.2.0 (commit 1d398bb)". The version itself is ``hvdtrain.__version__`` (pyproject.toml
reads it from there). Nothing runs at import; git runs only when asked, with a short limit, and
no git or no checkout (an installed wheel) is no error: the version alone."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from hvdtrain import __version__

# The folder above the package: a checkout's root, or site-packages (no .git there).
CHECKOUT = Path(__file__).resolve().parent.parent
GIT_TIMEOUT_S = 2.0


def _git(checkout: Path, *args: str) -> str | None:
    """git's output in ``checkout``, or None when git is missing, fails or takes too long."""
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def commit(checkout: Path = CHECKOUT) -> str | None:
    """The short commit of the checkout at ``checkout`` ("1d398bb", "1d398bb+dirty" when
    tracked files have changes), or None where it is no git checkout. Asked once a process:
    the commit the process started from."""
    # Only the checkout's own .git (a worktree's is a file): a wheel installed in a venv inside
    # some other repository must not name that repository's commit.
    if not (checkout / ".git").exists():
        return None
    head = _git(checkout, "rev-parse", "--short=7", "HEAD")
    if not head:
        return None
    changed = _git(checkout, "status", "--porcelain", "--untracked-files=no")
    return f"{head}+dirty" if changed else head


def text(version: str, found: str | None) -> str:
    """"0.2.0 (commit 1d398bb)", or the version alone without a commit."""
    return f"{version} (commit {found})" if found else version


def describe(checkout: Path = CHECKOUT) -> str:
    """hvdtrain's version and the commit of ``checkout`` where it is a git checkout."""
    return text(__version__, commit(checkout))

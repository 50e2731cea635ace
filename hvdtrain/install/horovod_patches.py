"""hvdtrain's patches to Horovod 0.28.1 (scripts/patches/, shipped in the wheel; NOTICE names
them): which a source build takes, applying them, and which an install shows it took, each by
a line only it adds to an installed Python file."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from hvdtrain.errors import UserError
from hvdtrain.install import shipped

# From TensorFlow 2.19 on, Horovod 0.28.1's source needs this patch (the patch says why).
XLA_PATCH, XLA_PATCH_FROM = "horovod-0.28.1-xla-headers-gpu-only.patch", (2, 19)
# From Python 3.12 on (distutils gone), horovodrun needs this patch (the patch says why); the
# line it adds to an installed Python file shows that an install took it.
DISTUTILS_PATCH, DISTUTILS_PATCH_FROM = "horovod-0.28.1-no-distutils.patch", (3, 12)
DISTUTILS_MARKER = ("horovod/runner/js_run.py", "hvdtrain's patch: distutils left Python in 3.12")
# Every build takes this patch (the patch says why): one tensor all-reduced in place. The line
# it adds to an installed Python file shows that an install was built with it.
IN_PLACE_PATCH = "horovod-0.28.1-allreduce-in-place.patch"
IN_PLACE_MARKER = ("horovod/tensorflow/mpi_ops.py",
                   "hvdtrain's patch: the allreduce op forwards its input's buffer")
# horovodrun's build check without importing TensorFlow: seconds off every launch.
LAUNCHER_PATCH = "horovod-0.28.1-fast-build-check.patch"
# horovodrun's patches in the order they apply, each with a line only it adds, which shows it
# is applied (an install patched before the second one existed takes it at the next setup).
LAUNCHER_PATCHES = ((LAUNCHER_PATCH, "def _library_only("),
                    ("horovod-0.28.1-quiet-build-check.patch",
                     "hvdtrain's patch: the C++ libraries write to the file descriptors"))


def apply(patch: str, folder: Path) -> None:
    """``patch`` (one of hvdtrain's, shipped) applied to the source or install in ``folder``."""
    path = shipped.folder("patches") / patch
    with open(path) as diff:
        done = subprocess.run(["patch", "-s", "-p1", "-d", str(folder)], stdin=diff,
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"cannot apply {path} to {folder}: {done.stdout.strip()} "
                        f"{done.stderr.strip()}")


def horovod_site() -> Path:
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"horovod is not importable from {sys.executable} after its install")
    return Path(list(spec.submodule_search_locations)[0]).parent


def built_in_place(site: Path | None = None) -> bool:
    """Whether the Horovod installed in ``site`` (this interpreter's, by default) was built with
    IN_PLACE_PATCH: the line the patch adds is in its installed file."""
    path, marker = IN_PLACE_MARKER
    installed = (site or horovod_site()) / path
    return installed.exists() and marker in installed.read_text()


def applied_patches(site: Path | None = None) -> list[str]:
    """The patches the Horovod installed in ``site`` (this interpreter's) shows, each by the
    line only it adds: IN_PLACE_PATCH, DISTUTILS_PATCH, then LAUNCHER_PATCHES. XLA_PATCH
    changes C++ alone and leaves no such line."""
    site = site or horovod_site()
    util = site / "horovod" / "common" / "util.py"
    launcher = util.read_text() if util.exists() else ""
    js_run = site / DISTUTILS_MARKER[0]
    return ([IN_PLACE_PATCH] if built_in_place(site) else []) + (
        [DISTUTILS_PATCH] if js_run.exists() and DISTUTILS_MARKER[1] in js_run.read_text()
        else []) + [patch for patch, marker in LAUNCHER_PATCHES if marker in launcher]


def patch_launcher() -> bool:
    """horovodrun's fast and quiet build check (LAUNCHER_PATCHES), each patch once per
    install, in order; True when one was applied now."""
    site = horovod_site()
    missing = [patch for patch, _ in LAUNCHER_PATCHES if patch not in applied_patches(site)]
    for patch in missing:
        apply(patch, site)
    return bool(missing)


def source_patches(tensorflow: tuple[int, int],
                   python: tuple[int, int]) -> list[tuple[str, str]]:
    """The patches Horovod's source takes before a build against TensorFlow ``tensorflow`` on
    Python ``python`` (each (major, minor)), in order, each with the reason it applies ('' for every
    build)."""
    patches: list[tuple[str, str]] = []
    if tensorflow >= XLA_PATCH_FROM:
        patches.append((XLA_PATCH, f" for TensorFlow {tensorflow[0]}.{tensorflow[1]}"))
    if python >= DISTUTILS_PATCH_FROM:
        patches.append((DISTUTILS_PATCH, f" for Python {python[0]}.{python[1]}"))
    return patches + [(IN_PLACE_PATCH, "")]

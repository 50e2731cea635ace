"""Files hvdtrain ships beside its code: the launch scripts, Horovod's patches and the docs.

A checkout keeps them at its root (run_scripts/, scripts/patches/, docs/), where an editable
install finds them; the wheel carries copies under hvdtrain/shipped/ (setup.py copies them).
"""
from __future__ import annotations

from pathlib import Path

# name -> the folder in a checkout, relative to its root
CHECKOUT_FOLDERS = {"run_scripts": "run_scripts", "patches": "scripts/patches", "docs": "docs"}

_PACKAGE = Path(__file__).parents[1]  # hvdtrain/, above install/


def folder(name: str) -> Path:
    """The shipped folder ``name`` (a key of CHECKOUT_FOLDERS): the wheel's copy, or else the
    checkout's."""
    installed = _PACKAGE / "shipped" / name
    return installed if installed.is_dir() else _PACKAGE.parent / CHECKOUT_FOLDERS[name]

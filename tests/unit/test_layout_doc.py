"""docs/layout.md, the newcomer's map, names every module of the runtime package and of the
benchmarks' package in its folder, and names no module that is not there; and it names every
docs page, Horovod patch, script and test program (tests/*.py) by its file name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

DOC = ROOT / "docs" / "layout.md"
PACKAGES = [Path("hvdtrain")]   # its benchmarks, hvdtrain/bench/, included
MODULE = re.compile(r"(?<![\w./])(\w+\.py)\b")


def the_map(doc: str) -> list[str]:
    """The lines of the page's first code block: the tree."""
    return doc.split("```", 2)[1].splitlines()


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def region(lines: list[str], folder: str) -> list[str]:
    """The lines under the entry ``folder/`` (its own line, then every deeper-indented line
    after it); empty where the map has no such entry."""
    for i, line in enumerate(lines):
        if line.strip().split(" ", 1)[0] == f"{folder}/":
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].strip() and indent(lines[j]) <= indent(line)), len(lines))
            return lines[i:end]
    return []


def folder_region(lines: list[str], folder: Path) -> list[str]:
    for part in folder.parts:
        lines = region(lines, part)
    return lines


def unmapped(doc: str, root: Path) -> list[str]:
    """The modules under PACKAGES (package __init__.py files aside: the folder's entry names
    them) that the map does not name inside their folder's entry."""
    lines = the_map(doc)
    missing = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if path.name == "__init__.py" or "__pycache__" in relative.parts:
                continue
            named = MODULE.findall("\n".join(folder_region(lines, relative.parent)))
            if path.name not in named:
                missing.append(str(relative))
    return missing


def stale(doc: str, root: Path) -> list[str]:
    """The modules the map names inside a package's entry that the package does not hold."""
    lines = the_map(doc)
    found = []
    for package in PACKAGES:
        held = {path.name for path in (root / package).rglob("*.py")}
        for name in MODULE.findall("\n".join(folder_region(lines, package))):
            if name not in held:
                found.append(f"{package}: {name}")
    return found


def test_docs_layout_md_maps_every_module_and_no_other():
    doc = DOC.read_text()
    assert unmapped(doc, ROOT) == []
    assert stale(doc, ROOT) == []


def test_control_a_module_left_out_or_gone_is_caught(tmp_path):
    doc = DOC.read_text()
    # A module the map lost (its line cut out), and a module of the map the tree lost.
    cut = "\n".join(line for line in doc.splitlines()
                    if not line.strip().startswith("watchdog.py"))
    assert unmapped(cut, ROOT) == ["hvdtrain/distributed/watchdog.py"]
    renamed = doc.replace("watchdog.py", "stall_watch.py")
    assert stale(renamed, ROOT) == ["hvdtrain: stall_watch.py"]
    # A module named in another folder's entry does not count for its own.
    moved = doc.replace("    broadcast.py", "    broadcasts.py").replace(
        "  rank_env.py", "  rank_env.py broadcast.py")
    assert "hvdtrain/distributed/broadcast.py" in unmapped(moved, ROOT)


# The files the map names by name, beside the packages' modules.
NAMED_FILES = ("docs/*.md", "scripts/*", "scripts/patches/*.patch", "tests/*.py")


def unnamed_files(doc: str, root: Path) -> list[str]:
    """The files of NAMED_FILES that the map does not name (as a whole word: helpers.py is not
    named by bench_helpers.py)."""
    text = "\n".join(the_map(doc))
    return sorted(str(p.relative_to(root)) for pattern in NAMED_FILES
                  for p in root.glob(pattern) if p.is_file()
                  and not re.search(rf"(?<![\w.-]){re.escape(p.name)}(?![\w-])", text))


def test_docs_layout_md_names_every_docs_page_patch_script_and_test_program():
    doc = DOC.read_text()
    assert unnamed_files(doc, ROOT) == []
    # Controls: a page the map no longer names, and a name inside a longer one, are caught.
    assert unnamed_files(doc.replace("library.md", "library page"), ROOT) == ["docs/library.md"]
    cut = re.sub(r"(?<!_)helpers\.py", "the helpers", doc)   # bench_helpers.py stays
    assert "bench_helpers.py" in cut and unnamed_files(cut, ROOT) == ["tests/helpers.py"]

"""A benchmark's output: its progress lines, its Markdown tables, and NAME.json and NAME.md."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table of ``rows`` under ``headers``; floats to 3 significant digits (whole
    numbers from 100), None as an empty cell."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return "" if v is None else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_outputs(out_dir: Path, name: str, result: Mapping[str, Any], markdown: str) -> None:
    """Writes OUT_DIR/NAME.json (``result``) and OUT_DIR/NAME.md (``markdown``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown.rstrip() + "\n")


def say(message: str) -> None:
    """Prints a progress line of the benchmarks at once (flushed)."""
    print(message, flush=True)

"""JSON files written whole: flushed to the disk, or through a temporary file and a rename, so a
reader sees the old file or the new one, never half of one (checkpoints, the run directory,
data convert's sidecar)."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, obj: dict) -> None:
    """Writes ``obj`` as JSON to ``path``, flushed to the disk before it returns."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def write_json_atomic(path: str | Path, obj: dict) -> None:
    """Writes ``obj`` as JSON to ``path`` through a temporary file, so a reader sees the old file
    or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_json(tmp, obj)
    os.replace(tmp, path)

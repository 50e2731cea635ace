"""JSON files written whole: flushed to the disk, or through a temporary file and a rename, so a
reader sees the old file or the new one, never half of one (checkpoints, the run directory,
data convert's sidecar)."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def write_json(path: Path, obj: dict) -> None:
    """Writes ``obj`` as JSON to ``path``, flushed to the disk before it returns."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def written_whole(path: Path, write: Callable[[Path], T]) -> T:
    """``write(temporary)``, then the temporary moved onto ``path`` in one rename: a reader, or
    another process writing the same path, sees the old file or a whole new one, never half
    of one; a failed write leaves no temporary behind. The temporary is hidden beside ``path``
    (the same file system), named for this host and process, and ends as ``path`` ends: tools
    that pick a format by the name's ending (Keras's ``.keras``, ``.weights.h5``) pick the
    same one."""
    tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}.{path.name}")
    try:
        result = write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return result


def write_json_atomic(path: str | Path, obj: dict) -> None:
    """Writes ``obj`` as JSON to ``path`` whole (``written_whole``)."""
    written_whole(Path(path), lambda tmp: write_json(tmp, obj))

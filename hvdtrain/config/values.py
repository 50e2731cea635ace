"""A config as plain values: run_dir/config.json, and the same-config check across ranks (its
hash, the keys that differ)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping

from hvdtrain.config.sections import SECTIONS, Config


def to_dict(config: Config) -> dict[str, Any]:
    """Plain values (tuples as lists), as written to run_dir/config.json."""
    def plain(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v
    out: dict[str, Any] = {"preset": config.preset}
    for section in SECTIONS:
        fields = dataclasses.asdict(getattr(config, section))
        out[section] = {k: plain(v) for k, v in fields.items()}
    return out


def fingerprint(values: Mapping[str, Any]) -> str:
    """A short hash of a config's plain values (``to_dict``), equal on ranks that agree."""
    text = json.dumps(values, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """``section.key`` (or top-level key) of every value that differs between two ``to_dict``s."""
    out = []
    for name in sorted(set(mine) | set(theirs)):
        a, b = mine.get(name), theirs.get(name)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += [f"{name}.{key}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
        elif a != b:
            out.append(name)
    return out

"""Plain data as block-style YAML lines, quoted where a YAML reader would take a string for
something else (``true``, ``-np``, ``2``): what ``hvdtrain launch k8s`` prints. No dependency:
PyYAML is not one of hvdtrain's."""
from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./=-]*")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    plain = _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS
    return text if plain else json.dumps(text)  # a JSON string is a YAML double-quoted one


def to_yaml(value: Any, indent: int = 0) -> list[str]:
    """``value`` (dicts, lists, strings, numbers, booleans) as block-style YAML lines."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines += [f"{pad}{key}:", *to_yaml(item, indent + 2)]
            elif isinstance(item, (dict, list)):
                lines.append(f"{pad}{key}: {'{}' if isinstance(item, dict) else '[]'}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return lines
    lines = []
    for item in value:
        if isinstance(item, dict) and item:
            nested = to_yaml(item, indent + 2)
            lines += [f"{pad}- {nested[0].lstrip()}", *nested[1:]]
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return lines

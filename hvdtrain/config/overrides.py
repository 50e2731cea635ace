"""Building a Config from layers of plain values: a preset, a TOML file, ``--set section.key=value``
and the CLI's shortcut flags, or a run directory's saved config.json. Every key is checked once,
in ``with_overrides``, and every value typed by its field (``sections.py`` holds the fields).
"""
from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal, Mapping

from hvdtrain.config.checks import suggest
from hvdtrain.config import SECTIONS, Config
from hvdtrain.errors import UserError


def _section_types() -> dict[str, dict[str, Any]]:
    """{section: {key: resolved type}} for every configurable key."""
    return {name: typing.get_type_hints(cls) for name, cls in SECTIONS.items()}


def all_keys() -> list[str]:
    """Every config key as SECTION.KEY (the names an unknown key is matched against)."""
    return [f"{s}.{k}" for s, hints in _section_types().items() for k in hints]


def parse_value(key: str, text: str, kind: Any) -> Any:
    """Turns the text of ``--set key=text`` into the field's type, or says what was expected."""
    text = text.strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if typing.get_origin(kind) is tuple:
            parts = [p for p in text.strip("()[] ").split(",") if p.strip()]
            return tuple(int(p) for p in parts)
        return text
    except ValueError:
        expected = {bool: "true or false", int: "an integer", float: "a number"}.get(
            kind, "integers separated by commas, e.g. 28,28,1")
        raise UserError(f"{key}={text!r}: expected {expected}") from None


def _coerce(key: str, value: Any, kind: Any) -> Any:
    """Checks a TOML value's type (TOML already typed it) and converts lists to tuples."""
    if isinstance(value, str) and kind is not str:
        return parse_value(key, value, kind)
    if typing.get_origin(kind) is tuple and isinstance(value, list):
        value = tuple(value)
    ok = {bool: isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, (int, float)) and not isinstance(value, bool),
          str: isinstance(value, str)}.get(kind)
    if typing.get_origin(kind) is Literal:
        ok = isinstance(value, str)  # which string: _check_choices says
    if ok is None:  # tuple[int, ...]
        ok = isinstance(value, tuple) and all(isinstance(v, int) for v in value)
    if not ok:
        raise UserError(f"{key} = {value!r} has the wrong type: expected {_type_name(kind)}")
    return float(value) if kind is float else value


def _type_name(kind: Any) -> str:
    if typing.get_origin(kind) is Literal:
        return " | ".join(typing.get_args(kind))
    return getattr(kind, "__name__", "ints")


def with_overrides(base: Config, overrides: Mapping[str, Mapping[str, Any]]) -> Config:
    """Returns ``base`` with ``{section: {key: value}}`` applied, every key and value checked."""
    types = _section_types()
    sections = {}
    for section, values in overrides.items():
        if section not in types:
            raise UserError(f"unknown config section {section!r}; sections are "
                            f"{', '.join(types)}{suggest(section, types)}")
        if not isinstance(values, Mapping):
            raise UserError(f"config section [{section}] must be a table of key = value")
        changes = {}
        for key, value in values.items():
            if key not in types[section]:
                raise UserError(f"unknown config key {section}.{key}"
                                f"{suggest(f'{section}.{key}', all_keys())}; "
                                f"'hvdtrain train --help' lists them all")
            changes[key] = _coerce(f"{section}.{key}", value, types[section][key])
        sections[section] = dataclasses.replace(getattr(base, section), **changes)
    return dataclasses.replace(base, **sections)


def parse_assignments(assignments: typing.Iterable[str]) -> dict[str, dict[str, str]]:
    """``["optim.lr=0.1", ...]`` -> ``{"optim": {"lr": "0.1"}}``. The values stay text:
    ``with_overrides`` checks every key once and types each value by its field."""
    out: dict[str, dict[str, str]] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise UserError(f"--set {item!r}: expected section.key=value, e.g. "
                            f"--set optim.lr=0.1")
        out.setdefault(section, {})[name] = text.strip()
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """The TOML file at ``path`` as a dict; UserError if it is missing, unreadable or not TOML."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except OSError as e:
        raise UserError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {path} is not valid TOML: {e}") from None


def from_dict(values: Mapping[str, Any]) -> Config:
    """The inverse of ``to_dict``: a config saved in a run directory, checked again."""
    values = dict(values)
    preset = str(values.pop("preset", "custom"))
    return dataclasses.replace(with_overrides(Config(), values), preset=preset)


def describe() -> str:
    """Every key with its type, default and help, for ``--help``."""
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"  [{section}]")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            kind = _type_name(hints[f.name])
            lines.append(f"    {section}.{f.name} ({kind}, default {shown!r})")
            lines.append(f"        {f.metadata['help']}")
    return "\n".join(lines)

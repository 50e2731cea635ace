"""Checks on one config value, each a UserError that names the key and what to pass instead."""
from __future__ import annotations

import difflib
import typing

from hvdtrain.errors import UserError


def one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    """UserError naming ``key`` (and the closest choice) unless ``value`` is in ``allowed``."""
    if value not in allowed:
        raise UserError(f"{key}={value!r} is not one of {', '.join(allowed)}"
                        f"{suggest(value, allowed)}")


def positive(key: str, value: float) -> None:
    """UserError naming ``key`` unless ``value`` > 0."""
    if not value > 0:
        raise UserError(f"{key} must be > 0, got {value}: pass --set {key}=<a positive value>")


def in_range(key: str, value: float, low: float, high: float, *, open_low: bool = False,
             open_high: bool = False) -> None:
    """UserError naming ``key`` unless ``value`` lies between ``low`` and ``high`` (each end
    included unless ``open_low``/``open_high``)."""
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    if not (above and below):
        lo, hi = ("(" if open_low else "["), (")" if open_high else "]")
        raise UserError(f"{key} must be in {lo}{low}, {high}{hi}, got {value}")


def suggest(word: str, choices: typing.Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""

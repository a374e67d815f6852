"""Settings classes: frozen dataclasses whose fields carry their own check, read from
kebab-case keys (a preset file's, a node config's) and written back the same way.

One place for the checks and the reading, so the learner settings of a preset
(:mod:`fedqhd.presets`) and a node's own settings (:mod:`fedqhd.node_config`) are validated
alike; each caller words the error for its source.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from typing import Any

__all__ = ["Check", "KeyedSettings", "SettingError", "choice", "flag", "number", "setting"]

Check = Callable[[Any], "str | None"]  #: a value -> None if valid, else what was expected


class SettingError(ValueError):
    """A key's value failed its check: ``key``, ``value`` and what was ``expected``."""

    def __init__(self, key: str, value: Any, expected: str) -> None:
        super().__init__(f"key '{key}' = {value!r} is invalid: expected {expected}")
        self.key, self.value, self.expected = key, value, expected


def number(lo: float, hi: float, lo_open: bool = False, integer: bool = False) -> Check:
    """A finite number (an integer with ``integer``) in ``[lo, hi]`` (``(lo, hi]``)."""
    def check(v: Any) -> str | None:
        kind = int if integer else (int, float)
        ok = (isinstance(v, kind) and not isinstance(v, bool) and math.isfinite(v)
              and (v > lo if lo_open else v >= lo) and v <= hi)
        what = "an integer" if integer else "a number"
        return None if ok else f"{what} in {'(' if lo_open else '['}{lo}, {hi}]"
    return check


def choice(options: tuple[str, ...]) -> Check:
    return lambda v: None if v in options else f"one of {', '.join(options)}"


def flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def setting(default: Any, check: Check, doc: str) -> Any:
    """A dataclass field with its ``check`` and a one-line ``doc``."""
    return field(default=default, metadata={"check": check, "doc": doc})


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class KeyedSettings:
    """Mixin of a frozen settings dataclass: its keys, reading them and writing them."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(_kebab(f.name) for f in fields(cls))  # type: ignore[arg-type]

    @classmethod
    def from_keys(cls, values: Mapping[str, Any]) -> Any:
        """The settings of the kebab-case ``values`` (unknown keys are the caller's to
        refuse or ignore: only this class's are read), each checked
        (:class:`SettingError`); lists become tuples of floats, integers given for
        floats become floats; the rest keep their defaults."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            key = _kebab(f.name)
            if key not in values:
                continue
            value = values[key]
            problem = f.metadata["check"](value)
            if problem:
                raise SettingError(key, value, problem)
            if isinstance(value, list):
                value = tuple(float(x) for x in value)
            elif isinstance(f.default, float) and isinstance(value, int):
                value = float(value)
            kwargs[f.name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case keys, lists for tuples (what ``run_config.json`` records)."""
        return {_kebab(f.name): (list(v) if isinstance(v := getattr(self, f.name), tuple)
                                 else v)
                for f in fields(self)}  # type: ignore[arg-type]

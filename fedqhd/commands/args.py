"""Argument types and checks every ``fedqhd`` sub-command shares: a bad value is refused
by argparse in one line naming the flag (exit 2) before anything runs, and an output
path that cannot be written is refused before a long computation, not after it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer ``>= minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def at_most(maximum: int, parse: Callable[[str], int]) -> Callable[[str], int]:
    """An argparse type: what ``parse`` (e.g. :func:`at_least`) gives, ``<= maximum``."""
    def parse_bounded(text: str) -> int:
        value = parse(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value
    return parse_bounded


def path_arg(text: str) -> Path:
    """An argparse type: a path, not an empty string (``Path("")`` is ``.``: the current
    folder, where nobody meant to write)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    return Path(text)


def number_in(low: float | None = None, high: float | None = None, *,
              low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in ``[low, high]`` (an end ``None``: unbounded;
    ``low_open`` / ``high_open``: that end excluded)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if not value == value or too_low or too_high or value in (float("inf"), -float("inf")):
            left = "(" if low_open or low is None else "["
            right = ")" if high_open or high is None else "]"
            span = (f"{left}{'-inf' if low is None else f'{low:g}'}, "
                    f"{'inf' if high is None else f'{high:g}'}{right}")
            raise argparse.ArgumentTypeError(f"must be in {span}, got {text}")
        return value
    return parse


def list_of(item: Callable[[str], object]) -> Callable[[str], list]:
    """An argparse type: a non-empty comma-separated list, each part parsed by ``item``."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return [item(p) for p in parts]
    return parse


def seed_list(text: str) -> list[int]:
    """An argparse type: seeds and ranges, ``"0,1,2"`` or ``"42-61"``."""
    from fedqhd.studies.paper import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def setting_check(owner: Literal["run", "pool"], name: str) -> Callable[[Any], str | None]:
    """The range check of the run-config field (``"run"``) or POOL setting (``"pool"``)
    ``name``: a flag that sets one takes its range from there, so each range lives in one
    place (both imported when called: ``fedqhd --help`` loads neither)."""
    from dataclasses import fields

    from fedqhd.config import RunConfig
    from fedqhd.presets import PoolSettings

    owner_class = RunConfig if owner == "run" else PoolSettings
    return next(f for f in fields(owner_class) if f.name == name).metadata["check"]


def in_setting_range(owner: Literal["run", "pool"], name: str,
                     parse: type[int] | type[float]) -> Callable[[str], Any]:
    """An argparse type: ``parse`` of the text, within :func:`setting_check`'s range, a
    bad value refused naming the flag, not the key the user never typed."""
    def check(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            what = "an integer" if parse is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        problem = setting_check(owner, name)(value)
        if problem:
            raise argparse.ArgumentTypeError(f"expected {problem}, got {text}")
        return value
    return check


def writable_file(flag: str, path: Path) -> Path:
    """Refuse, before any work, an output file ``path`` that could not be written: an
    empty name, a folder, or a parent that is a file. A missing parent folder is fine
    (writers create it). Raises :class:`~fedqhd.config.ConfigError` naming ``flag``."""
    from fedqhd.config import ConfigError

    if not str(path).strip() or path.name in ("", ".", ".."):
        raise ConfigError(f"{flag} {str(path)!r}: not a file name")
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file name")
    # writers replace the file by renaming a finished copy over it: a link would be
    # replaced, not written through, and a device (/dev/null) turned into a plain file
    if path.is_symlink():
        raise ConfigError(f"{flag} {path}: is a link; give the file it points to "
                          f"({path.resolve()})")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{flag} {path}: not a regular file (a device or a pipe)")
    _check_parents(flag, path, path.parents)
    return path


def _check_parents(flag: str, path: Path, candidates: Iterable[Path]) -> None:
    """The first of ``candidates`` that exists must be a folder this process may write
    in (a missing rest is made by the writer)."""
    from fedqhd.config import ConfigError

    for candidate in candidates:
        if candidate.exists():
            if not candidate.is_dir():
                raise ConfigError(f"{flag} {path}: {candidate} is a file, not a folder")
            if not os.access(candidate, os.W_OK | os.X_OK):
                raise ConfigError(f"{flag} {path}: no permission to write in {candidate}")
            return


def writable_folder(flag: str, path: Path) -> Path:
    """Refuse, before any work, an output folder ``path`` that is a file (or under one)
    or has an empty name. Raises :class:`~fedqhd.config.ConfigError` naming ``flag``."""
    from fedqhd.config import ConfigError

    if not str(path).strip():
        raise ConfigError(f"{flag} {str(path)!r}: not a folder name")
    _check_parents(flag, path, (path, *path.parents))
    return path

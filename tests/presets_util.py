"""Online preset files for tests: the settings a test needs, written where it can read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def write_preset(folder: Path, name: str = "preset", **keys: Any) -> str:
    """A preset file in ``folder`` with ``keys`` (``snake_case`` or kebab-case; a dict value
    is an encoder table); returns its path, for ``preset``."""
    lines, tables = [], []
    for key, value in keys.items():
        key = key.replace("_", "-")
        if isinstance(value, dict):
            tables.append(f"[{key}]")
            tables += [f"{k.replace('_', '-')} = {_toml(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key} = {_toml(value)}")
    path = Path(folder) / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines + tables) + "\n")
    return str(path)

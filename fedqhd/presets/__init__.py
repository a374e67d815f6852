"""Presets: per-task settings of the learners as TOML files a user can read, copy and edit
(this folder holds the built-in tasks', the deep baselines' and POOL's).

A preset sets run-config keys (:data:`RUN_KEYS`: the encoder, the FQI solve, the round
length, the anchors) and the learner's own settings: the online FQI learner's
(:class:`OnlineSettings`: exploration, which transitions enter the buffer, the targets) or
the POOL learner's (:class:`PoolSettings`: the inventory task and POOL's zones).
Top-level keys apply to both encoders; a ``[shared]`` or ``[heterogeneous]`` table
overrides them for that encoder. The run config's ``preset`` chooses one: ``"auto"``
(the task's file here; ``dqn.toml`` and ``pool.toml`` for those learners),
``"manual"`` (the settings' defaults, the run-config keys as given) or the path of a
file.

Why each built-in value: BENCHMARKS.md, "Online presets".
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedqhd.envs.inventory import DEMANDS, MODELS
from fedqhd.pool.api import ZONINGS
from fedqhd.pool.learner import KERNELS

__all__ = ["ENCODER_TABLES", "OnlineSettings", "PoolSettings", "PresetError", "RUN_KEYS",
           "builtin_preset", "load_preset", "preset_path", "resolve_preset"]

#: the folder of the built-in presets
PRESET_DIR = Path(__file__).resolve().parent
#: run-config keys a preset may set (checked by the run config's own rules)
RUN_KEYS: tuple[str, ...] = ("hd-dim", "bandwidth", "gamma", "ridge", "proximal",
                             "local-iterations", "episodes-per-round", "anchor-source",
                             "num-anchors", "episodes-per-client", "epsilon-min",
                             "epsilon-max")
#: the tables that override the top-level keys for one encoder
ENCODER_TABLES: tuple[str, ...] = ("shared", "heterogeneous")


class PresetError(ValueError):
    """A preset file is unreadable, or names an unknown key or a value out of range; the
    message names the file and the key."""


def _number(lo: float, hi: float, lo_open: bool = False, integer: bool = False
            ) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        kind = int if integer else (int, float)
        ok = (isinstance(v, kind) and not isinstance(v, bool) and math.isfinite(v)
              and (v > lo if lo_open else v >= lo) and v <= hi)
        what = "an integer" if integer else "a number"
        return None if ok else f"{what} in {'(' if lo_open else '['}{lo}, {hi}]"
    return check


def _epsilon(v: Any) -> str | None:
    ok = (isinstance(v, list | tuple) and len(v) == 3
          and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
          and 0.0 <= v[2] <= v[0] <= 1.0 and 0.0 < v[1] <= 1.0)
    return None if ok else ("[start, decay per episode, floor] with 0 <= floor <= start <= 1 "
                            "and 0 < decay <= 1")


def _scales(v: Any) -> str | None:
    ok = (isinstance(v, list | tuple) and all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0
        for x in v))
    return None if ok else "a list of positive numbers (one per observation coordinate)"


def _flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _choice(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"one of {', '.join(options)}"


def _setting(default: Any, check: Callable[[Any], str | None], doc: str) -> Any:
    return field(default=default, metadata={"check": check, "doc": doc})


@dataclass(frozen=True)
class OnlineSettings:
    """The online FQI learner's own settings (field ``foo_bar`` is preset key ``foo-bar``);
    the defaults are what ``preset = "manual"`` runs with."""

    epsilon: tuple[float, float, float] = _setting(
        (1.0, 0.9, 0.01), _epsilon, "exploration: epsilon of the first episode, multiplied "
        "by the decay after each episode, never below the floor")
    per_episode: int = _setting(20, _number(1, 100_000, integer=True),
                                "at most this many transitions of an episode enter the buffer")
    tail: int = _setting(0, _number(0, 100_000, integer=True),
                         "the last this-many transitions of a terminated episode enter first")
    n_step: int = _setting(1, _number(1, 1000, integer=True), "n of n-step transitions")
    action_gap: float = _setting(0.0, _number(0.0, 1.0),
                                 "advantage-learning weight (0: plain FQI)")
    mc_mix: float = _setting(0.0, _number(0.0, 1.0), "weight of the realised discounted "
                             "return in the targets of the last mc-window episodes' rows")
    mc_window: int = _setting(100, _number(1, 10_000_000, integer=True),
                              "episodes whose realised returns mix into the targets")
    ucb: float = _setting(0.0, _number(0.0, 1e9), "optimism while collecting: Q plus this "
                          "times each action's relative ridge posterior std")
    act_local: bool = _setting(False, _flag, "readout averaging: each client collects with "
                               "its own last fit (the paper's clients act locally)")
    obs_scale: tuple[float, ...] = _setting((), _scales, "multipliers of the task's "
                                            "observation bounds for the encoders (the "
                                            "kernel's length scale per coordinate)")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name.replace("_", "-") for f in fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case keys, lists for tuples (what ``run_config.json`` records)."""
        return {f.name.replace("_", "-"): (list(v) if isinstance(v := getattr(self, f.name),
                                                                tuple) else v)
                for f in fields(self)}


@dataclass(frozen=True)
class PoolSettings:
    """The POOL learner's settings (``learner = "pool"``, the inventory task); the
    defaults are ``fedqhd/presets/pool.toml``."""

    delta: float = _setting(1e-5, _number(0.0, 0.5, lo_open=True),
                            "delta of the reported epsilon and of E_rho")
    products: int = _setting(2, _number(1, 8, integer=True), "w products (w + d = 2w)")
    horizon: int = _setting(7, _number(1, 100, integer=True), "H stages")
    dynamics: str = _setting("lost_sales", _choice(MODELS), "inventory dynamics")
    demand: str = _setting("uniform", _choice(DEMANDS), "demand: U[0, D_max] or bike")
    trajectories: int = _setting(1000, _number(1, 10_000_000, integer=True),
                                 "trajectories in a client's shard")
    zones: int = _setting(50, _number(1, 100_000, integer=True), "M zones")
    zoning: str = _setting("post-decision", _choice(ZONINGS),
                           "post-decision (zones over y = s + a) | norm (the paper's) | grid")
    kernel: str = _setting("auto", _choice(("auto", *KERNELS)), "next-state kernel: shared "
                           "(one demand law per stage) | zone (the paper's) | auto (shared "
                           "for post-decision zones)")
    cells: int = _setting(20, _number(1, 100_000, integer=True), "next-state cells")
    boundary: float = _setting(1.0, _number(0.0, 1.0, lo_open=True),
                               "observable boundary |lambda| per coordinate")
    trust: float = _setting(1.0, _number(0.0, 1.0), "weight of the teacher in a client's "
                            "policy")
    eval_episodes: int = _setting(2000, _number(1, 10_000_000, integer=True),
                                  "inventory episodes per evaluation (common random numbers)")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name.replace("_", "-") for f in fields(cls))

    def to_dict(self) -> dict[str, Any]:
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}


Settings = OnlineSettings | PoolSettings


def _check_settings(values: Mapping[str, Any], source: str,
                    cls: type[Settings] = OnlineSettings) -> Settings:
    """The settings ``cls`` of preset keys ``values`` (kebab-case), each checked."""
    by_key = {f.name.replace("_", "-"): f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        f = by_key[key]
        problem = f.metadata["check"](value)
        if problem:
            raise PresetError(f"{source}: key '{key}' = {value!r} is invalid: expected "
                              f"{problem}")
        if isinstance(value, list):
            value = tuple(float(x) for x in value)
        elif f.type in ("float", float) and isinstance(value, int):
            value = float(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def load_preset(path: str | Path, cls: type[Settings] = OnlineSettings) -> dict[str, Any]:
    """A preset file as a dict (top-level keys, and the encoder tables as dicts); refused
    with :class:`PresetError` naming the file (and the key) when it is unreadable, names
    an unknown key or table, or gives a learner setting out of range. Run-config keys are
    checked by the run config that takes the preset."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PresetError(f"preset {path}: not a readable TOML file ({exc})") from None
    valid = set(RUN_KEYS) | set(cls.keys())
    for table in (data, *(data.get(t, {}) for t in ENCODER_TABLES)):
        if not isinstance(table, dict):
            raise PresetError(f"preset {path}: [{table}] must be a table of keys")
        unknown = sorted(k for k in table if k not in valid and k not in ENCODER_TABLES)
        if unknown or (table is not data and any(k in ENCODER_TABLES for k in table)):
            bad = unknown or [k for k in table if k in ENCODER_TABLES]
            raise PresetError(f"preset {path}: unknown key(s) {bad}; valid keys: "
                              f"{sorted(valid)} and the tables {list(ENCODER_TABLES)}")
    for encoder in ENCODER_TABLES:  # every learner setting, as each encoder would take it
        merged = {**data, **data.get(encoder, {})}
        _check_settings({k: v for k, v in merged.items() if k in cls.keys()},
                        f"preset {path}", cls)
    return data


def preset_path(name: str) -> Path:
    """The built-in preset ``name`` (a task id, or ``dqn``)."""
    return PRESET_DIR / f"{name.replace('/', '_')}.toml"


def builtin_preset(name: str) -> Path | None:
    """The built-in preset file of ``name`` (a task id or ``dqn``), or None."""
    path = preset_path(name)
    return path if path.is_file() else None


def resolve_preset(data: Mapping[str, Any], encoder: str, source: str,
                   cls: type[Settings] = OnlineSettings) -> tuple[dict[str, Any], Any]:
    """The run-config keys and the learner settings (a ``cls``) a preset gives an
    ``encoder``."""
    merged = {k: v for k, v in data.items() if k not in ENCODER_TABLES}
    merged.update(data.get(encoder, {}))
    run_keys = {k: v for k, v in merged.items() if k in RUN_KEYS}
    settings = _check_settings({k: v for k, v in merged.items() if k in cls.keys()}, source,
                               cls)
    return run_keys, settings

"""Presets: per-task settings of the learners as TOML files a user can read, copy and edit
(this folder holds the built-in tasks', the deep baselines' and POOL's).

A preset sets run-config keys (:data:`RUN_KEYS`: the encoder, the FQI solve, the round
length, the anchors, and the strategy ``auto`` stands for: a run config that names another
keeps it) and the learner's own settings: the online FQI learner's
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

import copy
import functools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedqhd.envs.inventory import DEMANDS, MODELS
from fedqhd.online import COMPILE_TOWARD, UPDATES
from fedqhd.pool.api import ZONINGS
from fedqhd.pool.learner import KERNELS
from fedqhd.settings import KeyedSettings, SettingError, choice, number, setting

__all__ = ["ENCODER_TABLES", "OnlineSettings", "PoolSettings", "PresetError", "REMOVED_KEYS",
           "RUN_KEYS", "builtin_preset", "load_preset", "preset_path", "removed_keys_hint",
           "resolve_preset"]

#: the folder of the built-in presets
PRESET_DIR = Path(__file__).resolve().parent
#: run-config keys a preset may set (checked by the run config's own rules)
RUN_KEYS: tuple[str, ...] = ("hd-dim", "bandwidth", "gamma", "ridge", "proximal",
                             "local-iterations", "episodes-per-round", "anchor-source",
                             "num-anchors", "episodes-per-client", "epsilon-min",
                             "epsilon-max", "strategy")
#: the tables that override the top-level keys for one encoder
ENCODER_TABLES: tuple[str, ...] = ("shared", "heterogeneous")
#: online learner settings deleted with their code once no default, preset or user needed
#: them (git keeps them; BENCHMARKS.md, "Online presets"), and what they did: a preset or
#: run config that still names one is told so
REMOVED_KEYS: dict[str, str] = {
    "act-local": "readout averaging with each client collecting with its own last fit",
    "n-step": "n-step transitions",
    "action-gap": "advantage-learning targets",
    "ucb": "optimism while collecting (each action's ridge posterior std added to Q)",
}


class PresetError(ValueError):
    """A preset file is unreadable, or names an unknown key or a value out of range; the
    message names the file and the key."""


def removed_keys_hint(keys: list[str]) -> str:
    """`` ('n-step' (n-step transitions) was removed ...)`` for the keys of ``keys`` that
    were learner settings once (:data:`REMOVED_KEYS`); empty when none was."""
    gone = [f"'{k}' ({REMOVED_KEYS[k]})" for k in keys if k in REMOVED_KEYS]
    if not gone:
        return ""
    return (f" ({', '.join(gone)} {'was' if len(gone) == 1 else 'were'} removed from the "
            "online learner: no preset used it; delete the key)")


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


@dataclass(frozen=True)
class OnlineSettings(KeyedSettings):
    """The online FQI learner's own settings (field ``foo_bar`` is preset key ``foo-bar``);
    the defaults are what ``preset = "manual"`` runs with."""

    epsilon: tuple[float, float, float] = setting(
        (1.0, 0.9, 0.01), _epsilon, "exploration: epsilon of the first episode, multiplied "
        "by the decay after each episode, never below the floor")
    per_episode: int = setting(20, number(1, 100_000, integer=True),
                                "at most this many transitions of an episode enter the buffer")
    tail: int = setting(0, number(0, 100_000, integer=True),
                         "the last this-many transitions of a terminated episode enter first")
    mc_mix: float = setting(0.0, number(0.0, 1.0), "weight of the realised discounted "
                             "return in the targets of the last mc-window episodes' rows")
    mc_window: int = setting(100, number(1, 10_000_000, integer=True),
                              "episodes whose realised returns mix into the targets")
    obs_scale: tuple[float, ...] = setting((), _scales, "multipliers of the task's "
                                            "observation bounds for the encoders (the "
                                            "kernel's length scale per coordinate)")
    update: str = setting("fqi", choice(UPDATES), "how a client learns: fqi (ridge "
                          "fitted Q-iteration on its buffer, local-iterations sweeps a round) "
                          "or td (Q-learning at every step while it collects, the paper's)")
    td_rate: float = setting(0.1, number(0.0, 2.0, lo_open=True),
                              "update = td: the step, as a fraction of the TD error")
    td_replay: float = setting(0.0, number(0.0, 16.0), "update = td: after each episode, "
                                "this many updates per step it took, on transitions drawn "
                                "from the client's latest td-replay-size (0: no replay)")
    td_replay_rate: float = setting(0.05, number(0.0, 2.0, lo_open=True),
                                     "td-replay: the step of a replayed transition")
    td_replay_size: int = setting(20000, number(1, 10_000_000, integer=True),
                                   "td-replay: the latest this-many transitions are kept, raw")
    td_replay_start: int = setting(0, number(0, 10_000_000, integer=True),
                                    "td-replay: episodes a client plays before it replays "
                                    "(its near-random early transitions learnt once only)")
    compile_toward: str = setting("own", choice(COMPILE_TOWARD), "heterogeneous "
                                  "encoders: the teacher's ridge projection pulls toward the "
                                  "client's own readout (keeps what the anchors leave free) "
                                  "or zero (the teacher alone, as the authors' code does)")


@dataclass(frozen=True)
class PoolSettings(KeyedSettings):
    """The POOL learner's settings (``learner = "pool"``, the inventory task); the
    defaults are ``fedqhd/presets/pool.toml``."""

    delta: float = setting(1e-5, number(0.0, 0.5, lo_open=True),
                            "delta of the reported epsilon and of E_rho")
    products: int = setting(2, number(1, 8, integer=True), "w products (w + d = 2w)")
    horizon: int = setting(7, number(1, 100, integer=True), "H stages")
    dynamics: str = setting("lost_sales", choice(MODELS), "inventory dynamics")
    demand: str = setting("uniform", choice(DEMANDS), "demand: U[0, D_max] or bike")
    trajectories: int = setting(1000, number(1, 10_000_000, integer=True),
                                 "trajectories in a client's shard")
    zones: int = setting(50, number(1, 100_000, integer=True), "M zones")
    zoning: str = setting("post-decision", choice(ZONINGS),
                           "post-decision (zones over y = s + a) | norm (the paper's) | grid")
    kernel: str = setting("auto", choice(("auto", *KERNELS)), "next-state kernel: shared "
                           "(one demand law per stage) | zone (the paper's) | auto (shared "
                           "for post-decision zones)")
    cells: int = setting(20, number(1, 100_000, integer=True), "next-state cells")
    boundary: float = setting(1.0, number(0.0, 1.0, lo_open=True),
                               "observable boundary |lambda| per coordinate")
    trust: float = setting(1.0, number(0.0, 1.0), "weight of the teacher in a client's "
                            "policy")
    eval_episodes: int = setting(2000, number(1, 10_000_000, integer=True),
                                  "inventory episodes per evaluation (common random numbers)")


Settings = OnlineSettings | PoolSettings


def _check_settings(values: Mapping[str, Any], source: str,
                    cls: type[Settings] = OnlineSettings) -> Settings:
    """The settings ``cls`` of preset keys ``values`` (kebab-case), each checked."""
    try:
        return cls.from_keys(values)
    except SettingError as exc:
        raise PresetError(f"{source}: {exc}") from None


def load_preset(path: str | Path, cls: type[Settings] = OnlineSettings) -> dict[str, Any]:
    """A preset file as a dict (top-level keys, and the encoder tables as dicts); refused
    with :class:`PresetError` naming the file (and the key) when it is unreadable, names
    an unknown key or table, or gives a learner setting out of range. Run-config keys are
    checked by the run config that takes the preset. A file read before and unchanged
    since (its size and modification time) is not read again: every node parses the run
    config of every message."""
    path = Path(path)
    try:
        stat = path.stat()
        return copy.deepcopy(_load(str(path), stat.st_mtime_ns, stat.st_size, cls))  # type: ignore[arg-type]  # a class is hashable
    except OSError as exc:
        raise PresetError(f"preset {path}: not a readable TOML file ({exc})") from None


@functools.lru_cache(maxsize=64)
def _load(path_text: str, mtime_ns: int, size: int, cls: type[Settings]) -> dict[str, Any]:
    path = Path(path_text)
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
            raise PresetError(f"preset {path}: unknown key(s) {bad}"
                              f"{removed_keys_hint(bad)}; valid keys: "
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

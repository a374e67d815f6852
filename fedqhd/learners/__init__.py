"""The learner registry: one name per local learner, each with its strategy, client
handlers, server evaluation, log line and final report.

``fqi`` (ridge fitted Q-iteration on HD features, :mod:`fedqhd.learners.fqi`),
``pool`` (zCDP-private POOL on the inventory MDP, :mod:`fedqhd.learners.pool`) and
``dqn`` (the FedQHD paper's deep baselines, FedAvg-DQN and distillation FedDQN,
online protocol only, :mod:`fedqhd.learners.dqn`) are built in. A learner is a
module-level object implementing :class:`~fedqhd.learners.base.Learner`;
:func:`register_learner` adds one under a new name (``"module:attribute"``, imported on
first use).

:func:`parse_run_config` parses a run config as the apps, studies and commands need it:
:meth:`RunConfig.from_run_config <fedqhd.config.RunConfig.from_run_config>` and then the
learner's own :meth:`~fedqhd.learners.base.Learner.check_config`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from fedqhd.config import ConfigError, RunConfig
from fedqhd.learners.base import Learner, ServerPlan

#: name -> "module:attribute" of the learner object, imported on first use
_REGISTRY: dict[str, str] = {
    "fqi": "fedqhd.learners.fqi:LEARNER",
    "pool": "fedqhd.learners.pool:LEARNER",
    "dqn": "fedqhd.learners.dqn:LEARNER",  # the paper's deep baselines (extra dqn)
    "fqi-online": "fedqhd.learners.fqi_online:LEARNER",  # learner fqi, protocol online
}


#: entries chosen through another key (``protocol``), not by run-config ``learner``
_VARIANTS = frozenset({"fqi-online"})


def learner_names() -> tuple[str, ...]:
    """The valid values of run-config ``learner``."""
    return tuple(name for name in _REGISTRY if name not in _VARIANTS)


def get_learner(name: str) -> Learner:
    """The learner registered as ``name``."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown learner {name!r}; registered: {', '.join(_REGISTRY)}")
    module, _, attribute = _REGISTRY[name].partition(":")
    learner: Learner = getattr(importlib.import_module(module), attribute)
    return learner


def check_run_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` if its learner takes it, else :class:`~fedqhd.config.ConfigError` naming
    the key (the learner's :meth:`~fedqhd.learners.base.Learner.check_config`)."""
    problem = get_learner(cfg.learner_key).check_config(cfg)
    if problem:
        raise ConfigError(problem)
    return cfg


def parse_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """Flower's run config as a checked :class:`~fedqhd.config.RunConfig`: every key
    (:meth:`RunConfig.from_run_config <fedqhd.config.RunConfig.from_run_config>`), then
    what the run's learner needs of it; a problem is a
    :class:`~fedqhd.config.ConfigError` naming the key."""
    return check_run_config(RunConfig.from_run_config(run_config))


def register_learner(name: str, target: str) -> None:
    """Register ``"module:attribute"`` as learner ``name`` (imported on first use)."""
    if ":" not in target:
        raise ValueError(f"learner target must be 'module:attribute', got {target!r}")
    _REGISTRY[name] = target


__all__ = ["Learner", "ServerPlan", "check_run_config", "get_learner", "learner_names",
           "parse_run_config", "register_learner"]

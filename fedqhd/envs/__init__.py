"""Environments: the registry every task goes through (:mod:`fedqhd.envs.registry`), the
four built-in control tasks with specs, dynamics variants and heuristic controllers
(:mod:`fedqhd.envs.classic`), and the POOL learner's inventory MDP
(:mod:`fedqhd.envs.inventory`, an entry of kind ``pool``).

Add your own environment with :func:`register_env` (any gymnasium id or factory).
"""

from fedqhd.envs import classic, inventory, registry  # noqa: F401 (registers the entries)
from fedqhd.envs.classic import *  # noqa: F403 (the public names are classic.__all__)
from fedqhd.envs.registry import (
    EnvSpec,
    ObservationError,
    env_ids,
    get_entry,
    infer_obs_bound,
    is_registered,
    load_env_modules,
    register_env,
    space_bounds,
    spec_fingerprint,
    spec_record,
    unregister_env,
)

__all__ = list(classic.__all__) + [
    "EnvSpec",
    "ObservationError",
    "env_ids",
    "get_entry",
    "infer_obs_bound",
    "is_registered",
    "load_env_modules",
    "register_env",
    "space_bounds",
    "spec_fingerprint",
    "spec_record",
    "unregister_env",
]
__all__ = list(dict.fromkeys(__all__))

"""Environments: the registry every task goes through (:mod:`fedqhd.envs.registry`), the
four built-in control tasks with specs, dynamics variants and heuristic controllers
(:mod:`fedqhd.envs.classic`), batches of them stepped together (:mod:`fedqhd.envs.batch`),
and the POOL learner's inventory MDP (:mod:`fedqhd.envs.inventory`, an entry of kind
``pool``).

Add your own environment with :func:`register_env` (any gymnasium id or factory).
"""

from fedqhd.envs import batch, classic, inventory, registry  # noqa: F401 (registers the entries)
from fedqhd.envs.batch import *  # noqa: F403 (the public names are batch.__all__)
from fedqhd.envs.classic import *  # noqa: F403 (the public names are classic.__all__)
from fedqhd.envs.registry import *  # noqa: F403 (the public names are registry.__all__)

#: the public names of classic, batch and the registry, once each
__all__ = list(dict.fromkeys([*classic.__all__, *batch.__all__, *registry.__all__]))

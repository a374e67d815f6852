"""Environments: the four gymnasium control tasks with specs, dynamics variants and
heuristic controllers (:mod:`fedqhd.envs.classic`)."""

from fedqhd.envs import classic
from fedqhd.envs.classic import *  # noqa: F403 (the public names are classic.__all__)

__all__ = list(classic.__all__)

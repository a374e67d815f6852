"""Baselines of the FedQHD paper that are not part of fedqhd's own method.

:mod:`fedqhd.baselines.dqn` -- FedAvg-DQN and distillation FedDQN (needs the
optional ``dqn`` extra: ``pip install 'fedqhd[dqn]'``, i.e. JAX on CPU + optax).
The package imports without JAX; only calling into ``dqn`` needs it.
"""

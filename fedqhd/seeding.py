"""Every random stream of a fedqhd run, named and derived from the run seed in one place.

A run has one integer seed. Each consumer of randomness (a client's data, its
encoder, an evaluator's episodes, a POOL client's noise, ...) gets its own
stream, derived with :class:`numpy.random.SeedSequence` from the run seed, the
party it belongs to (a partition id, or :data:`SERVER`) and a tag fixed below,
so that streams never collide and a result depends only on the run seed.
Changing a tag changes every result that depends on it: the values are frozen.
"""

from __future__ import annotations

import numpy as np

#: party id of the server in per-party streams (clients use their partition ids)
SERVER = 2**31 - 1
#: party id of the shared encoder (one for the server and every client)
SHARED = -1

# stream tags (frozen: results depend on them)
_ENCODER = 0xE4C
_EVALUATION = 0xE7A1
_BEHAVIOUR = 0xBE4A
_EPISODES = 0x5EED
_DYNAMICS = 0xD1CE
_POOL_ANCHORS = 0xA2C
_HELD_OUT = 0x4E1D
_POOL_DATA = 1
_POOL_NOISE = 2
_POOL_EVALUATION = 3
_ONLINE_CLIENT = 0x0B1E
_DQN_BATCHES = 0xBA7C
_DQN_INIT = 0x1417
_DQN_OFFLINE = 0x0FF1
_PRIVATE_ONLINE = 0x9D0
_DQN_EVALUATION_OFFSET = 10**6


def _int(*entropy: int) -> int:
    return int(np.random.SeedSequence([int(e) for e in entropy]).generate_state(1)[0])


def _rng(*entropy: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(e) for e in entropy]))


def encoder_seed(seed: int, party: int) -> int:
    """Seed of a party's HD encoder (``SHARED`` for the shared encoder)."""
    return _int(seed, party + 1, _ENCODER)


def evaluation_seed(seed: int, party: int) -> int:
    """Episode seeds of a party's greedy evaluations: fixed per (run, evaluator) so rounds are
    compared on the same start states, disjoint from data collection."""
    return _int(seed, party, _EVALUATION)


def shard_seed(seed: int, partition_id: int) -> int:
    """Collection seed of a client's shard."""
    return _int(seed, partition_id)


def private_online_seed(seed: int, partition_id: int, round_index: int) -> int:
    """Collection seed of a private online client's episodes in one round."""
    return _int(seed, partition_id, _PRIVATE_ONLINE, round_index)


def behaviour_rng(seed: int) -> np.random.Generator:
    """The behaviour policy's coin flips during collection (independent of reset seeds)."""
    return _rng(seed, _BEHAVIOUR)


def episode_rng(seed: int) -> np.random.Generator:
    """Reset seeds of a sequence of episodes."""
    return _rng(seed, _EPISODES)


def dynamics_rng(seed: int) -> np.random.Generator:
    """Which client gets which physics under ``dynamics-skew``."""
    return _rng(seed, _DYNAMICS)


def anchor_seed(seed: int) -> int:
    """Anchor states of a run (FedQHDAnchor's rollouts or uniform draws)."""
    return int(seed)


def held_out_seed(seed: int) -> int:
    """Run seed of held-out data (the federation-gap study's oracle and evaluation states):
    same behaviour policies as the run's shards, other episodes."""
    return _int(seed, _HELD_OUT) % (2**31 - 1)


def pool_anchor_rng(seed: int) -> np.random.Generator:
    """POOL's (state, action) anchor points."""
    return _rng(seed, _POOL_ANCHORS)


def pool_data_seed(seed: int, partition_id: int) -> int:
    """A POOL client's private inventory trajectories."""
    return _int(seed, partition_id, _POOL_DATA)


def pool_noise_seed(seed: int, partition_id: int) -> int:
    """A POOL client's seeded (not secure) noise source."""
    return _int(seed, partition_id, _POOL_NOISE)


def pool_evaluation_seed(seed: int) -> int:
    """Simulated demands on which every POOL policy of a run is scored (common random numbers)."""
    return _int(seed, SERVER, _POOL_EVALUATION)


def online_client_rng(seed: int) -> np.random.Generator:
    """An online client's exploration, buffer sampling and batch-env resets (``seed`` is the
    client's own, e.g. :func:`shard_seed` of the run seed and its partition id)."""
    return _rng(seed, _ONLINE_CLIENT)


def dqn_client_rngs(seed: int, n_clients: int, first: int = 0) -> list[np.random.Generator]:
    """Each DQN client's exploration and environment resets (clients ``first``,
    ``first + 1``, ...: a Flower node holding client ``pid`` alone gets the stream client
    ``pid`` has in process)."""
    return [_rng(seed, first + i) for i in range(n_clients)]


def dqn_batch_rng(seed: int, n_clients: int, first: int = 0) -> np.random.Generator:
    """The replay minibatch draws of DQN clients ``first`` ... ``first + n_clients - 1``
    held together (one stream for all of them)."""
    if first == 0:
        return _rng(seed, n_clients, _DQN_BATCHES)
    return _rng(seed, n_clients, _DQN_BATCHES, first)


def dqn_offline_rng(seed: int, partition_id: int, digest: bytes) -> np.random.Generator:
    """An offline DQN client's minibatch draws of one round: from the run seed, its
    partition and ``digest`` (of the global network it received; the client keeps no
    state, and every round's network differs)."""
    return _rng(seed, partition_id, _DQN_OFFLINE, int.from_bytes(digest[:8], "little"))


def dqn_init_rng(seed: int) -> np.random.Generator:
    """The DQN networks' initial weights."""
    return _rng(seed, _DQN_INIT)


def dqn_evaluation_seed(seed: int) -> int:
    """Episode seeds of the DQN baselines' greedy evaluation."""
    return int(seed) + _DQN_EVALUATION_OFFSET


def seed_globals(seed: int) -> None:
    """Seed the global generators Flower uses for node sampling (Python's ``random``)."""
    import random

    random.seed(seed)
    np.random.seed(seed)

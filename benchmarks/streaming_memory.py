"""Peak memory of a client's FQI fit on a large CartPole shard (issue 10: 1e6 transitions
at D = 2000 within 2 GiB).

Generates ``--transitions`` CartPole-v1 transitions with a uniformly random behaviour
policy (numpy batch stepper, gymnasium's dynamics), builds the client's ``FQILearner``
(which streams: ``2 n D`` float64 features exceed its 1 GiB budget) and runs
``--sweeps`` FQI sweeps. Prints JSON: peak resident memory of the process
(``getrusage``), peak traced Python/numpy allocations (``tracemalloc``), what the
in-memory learner would need for its two feature matrices, and the times.

    PYTHONPATH=. python benchmarks/streaming_memory.py --transitions 200000 --dim 2000
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import tracemalloc

import numpy as np


def cartpole_shard(n: int, seed: int):
    from fedqhd.data import Shard
    from fedqhd.online import CartPoleBatch

    rng = np.random.default_rng(seed)
    envs = 256
    batch = CartPoleBatch(envs, rng)
    obs = batch.reset(np.arange(envs))
    steps = np.zeros(envs, dtype=np.int64)
    episode = np.arange(envs)
    next_episode = envs
    parts: dict[str, list[np.ndarray]] = {k: [] for k in (
        "observations", "actions", "next_observations", "terminated", "truncated", "ids")}
    total = 0
    while total < n:
        actions = rng.integers(0, 2, envs)
        nxt, _, terminated = batch.step(actions)
        steps += 1
        truncated = (steps >= 500) & ~terminated
        for key, value in (("observations", obs), ("actions", actions),
                           ("next_observations", nxt), ("terminated", terminated),
                           ("truncated", truncated), ("ids", episode.copy())):
            parts[key].append(value)
        total += envs
        done = np.flatnonzero(terminated | truncated)
        obs = nxt.copy()
        if done.size:
            obs[done] = batch.reset(done)
            steps[done] = 0
            episode[done] = np.arange(next_episode, next_episode + done.size)
            next_episode += done.size
    cat = {k: np.concatenate(v)[:n] for k, v in parts.items()}
    return Shard(observations=cat["observations"].astype(np.float32),
                 actions=cat["actions"].astype(np.int64),
                 rewards=np.ones(n, dtype=np.float32),
                 next_observations=cat["next_observations"].astype(np.float32),
                 terminated=cat["terminated"], truncated=cat["truncated"],
                 episode_ids=cat["ids"].astype(np.int64),
                 metadata={"env_id": "CartPole-v1", "format_version": 1})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=2000)
    parser.add_argument("--sweeps", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream", action="store_true",
                        help="stream even where the features fit the learner's budget")
    args = parser.parse_args()

    from fedqhd.encoders import shared_encoder_params
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi import FEATURE_BUDGET, FQILearner
    from fedqhd.readout import StreamingRidgeFQI

    tracemalloc.start()
    t0 = time.perf_counter()
    shard = cartpole_shard(args.transitions, args.seed)
    t_data = time.perf_counter() - t0
    spec = get_spec("CartPole-v1")
    encoder = shared_encoder_params(args.seed, args.dim, 1.0).build(spec.obs_bound)
    t0 = time.perf_counter()
    learner = FQILearner(shard, encoder, spec.n_actions, gamma=0.99, ridge=0.1, proximal=0.0,
                         chunk_size=args.chunk, streaming=True if args.stream else None)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    metrics = learner.train(args.sweeps, start=np.zeros((args.dim, spec.n_actions)))
    t_fit = time.perf_counter() - t0
    _, traced_peak = tracemalloc.get_traced_memory()
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    gib = 2.0**30
    print(json.dumps({
        "transitions": args.transitions, "dim": args.dim, "sweeps": args.sweeps,
        "chunk": args.chunk, "streamed": isinstance(learner.fqi, StreamingRidgeFQI),
        "peak-rss-gib": round(rss_peak / gib, 3),
        "peak-traced-gib": round(traced_peak / gib, 3),
        "shard-gib": round(sum(a.nbytes for a in shard.arrays().values()) / gib, 3),
        "in-memory-features-gib": round(2 * args.transitions * args.dim * 8 / gib, 2),
        "feature-budget-gib": FEATURE_BUDGET / gib,
        "data-s": round(t_data, 1), "gram-s": round(t_build, 1),
        "sweep-s": round(t_fit / args.sweeps, 1),
        "bellman-residual": metrics["bellman-residual"],
    }, indent=2))


if __name__ == "__main__":
    main()

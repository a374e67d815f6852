"""Measurements of a client's local fit: memory of a streamed fit, its flop rate
against this machine's matmul peak, and FedQHDExact against centralised ridge FQI.

Used by ``fedqhd bench --suite scale`` (:mod:`fedqhd.studies.scale`) and by the scripts
``benchmarks/streaming_memory.py`` and ``benchmarks/blas_fraction.py``.
"""

from __future__ import annotations

import resource
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

GIB = 2.0**30


def best(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` timings of ``fn()`` (seconds)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


# ------------------------------------------------------------------ BLAS fraction
def blas_fraction(dim: int, rows: int, chunk: int = 4096, repeats: int = 3) -> dict[str, Any]:
    """Flop rates of a local fit's parts as a fraction of the best float64 ``D x D @ D x D``
    product measured in the same call (run it under one BLAS thread count):

    ``gram-syrk`` the streaming fit's Gram (a rank-``chunk`` ``dsyrk`` per chunk,
    ``n D (D + 1)`` flops), ``gram-matmul`` the in-memory ``Phi^T Phi`` (same flops),
    ``cholesky`` the factor of ``G + c I`` (``D^3 / 3``), and the times of ``encode``
    (a float64 ``cos`` per entry: no BLAS) and one streaming FQI ``sweep``.
    """
    from scipy.linalg import cho_factor

    from fedqhd.encoders import shared_encoder_params
    from fedqhd.envs import get_spec
    from fedqhd.readout import StreamingRidgeFQI, _rank_update

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(dim, dim)), rng.normal(size=(dim, dim))
    peak = 2 * dim**3 / best(lambda: a @ b, repeats) / 1e9
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    peak32 = 2 * dim**3 / best(lambda: a32 @ b32, repeats) / 1e9

    spec = get_spec("CartPole-v1")
    enc = shared_encoder_params(0, dim, 1.0).build(spec.obs_bound)
    states = rng.uniform(-1, 1, size=(rows, 4)) * spec.obs_bound
    phi = enc.encode(states)
    upper = np.zeros((dim, dim))

    def syrk() -> None:
        upper[...] = 0.0
        for start in range(0, rows, chunk):
            _rank_update(upper, phi[start:start + chunk])

    gram_flops = rows * dim * (dim + 1)
    t_syrk = best(syrk, repeats)
    t_matmul = best(lambda: phi.T @ phi, repeats)
    gram = phi.T @ phi + 0.1 * np.eye(dim)
    t_chol = best(lambda: cho_factor(gram, lower=False, check_finite=False), repeats)
    t_encode = best(lambda: enc.encode(states), repeats)

    fqi = StreamingRidgeFQI(enc.encode, dim, spec.n_actions, gamma=0.99, ridge=0.1,
                            chunk_size=chunk)
    actions = rng.integers(0, spec.n_actions, rows)
    fqi.add(states, actions, np.ones(rows), states[::-1].copy(), np.zeros(rows, bool))
    fqi.fit(1)  # factor once
    w = rng.normal(size=(dim, spec.n_actions)) * 0.01
    t_sweep = best(lambda: fqi.fit(1, init=w), repeats)

    def rate(flops: float, seconds: float) -> float:
        return flops / seconds / 1e9

    return {
        "dim": dim, "rows": rows, "chunk": chunk,
        "peak-gflops": round(peak, 1), "peak-float32-gflops": round(peak32, 1),
        "gram-syrk-gflops": round(rate(gram_flops, t_syrk), 1),
        "gram-syrk-fraction": round(rate(gram_flops, t_syrk) / peak, 2),
        "gram-matmul-gflops": round(rate(gram_flops, t_matmul), 1),
        "gram-matmul-fraction": round(rate(gram_flops, t_matmul) / peak, 2),
        "cholesky-gflops": round(rate(dim**3 / 3, t_chol), 1),
        "cholesky-fraction": round(rate(dim**3 / 3, t_chol) / peak, 2),
        "encode-s": round(t_encode, 3), "gram-syrk-s": round(t_syrk, 3),
        "sweep-s": round(t_sweep, 3),
    }


# ------------------------------------------------------------------ streaming memory
def cartpole_shard(n: int, seed: int) -> Any:
    """``n`` CartPole-v1 transitions of a uniformly random policy (numpy batch stepper,
    gymnasium's dynamics, 256 episodes side by side)."""
    from fedqhd.data import Shard
    from fedqhd.envs.batch import CartPoleBatch

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


def streaming_memory(transitions: int, dim: int, sweeps: int = 2, chunk: int = 4096,
                     seed: int = 0, stream: bool | None = None) -> dict[str, Any]:
    """Peak memory of one client's ``FQILearner`` on a random CartPole shard of
    ``transitions`` (it streams where its float64 feature table exceeds its budget, or
    as ``stream`` says). The peaks are this process's: call it in a fresh process."""
    from fedqhd.encoders import shared_encoder_params
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi import FEATURE_BUDGET, FQILearner
    from fedqhd.readout import StreamingRidgeFQI

    tracemalloc.start()
    t0 = time.perf_counter()
    shard = cartpole_shard(transitions, seed)
    t_data = time.perf_counter() - t0
    spec = get_spec("CartPole-v1")
    encoder = shared_encoder_params(seed, dim, 1.0).build(spec.obs_bound)
    t0 = time.perf_counter()
    learner = FQILearner(shard, encoder, spec.n_actions, gamma=0.99, ridge=0.1, proximal=0.0,
                         chunk_size=chunk, streaming=stream)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    metrics = learner.train(sweeps, start=np.zeros((dim, spec.n_actions)))
    t_fit = time.perf_counter() - t0
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {
        "transitions": transitions, "dim": dim, "sweeps": sweeps, "chunk": chunk,
        "streamed": isinstance(learner.fqi, StreamingRidgeFQI),
        "peak-rss-gib": round(rss_peak / GIB, 3),
        "peak-traced-gib": round(traced_peak / GIB, 3),
        "shard-gib": round(sum(a.nbytes for a in shard.arrays().values()) / GIB, 3),
        "in-memory-features-gib": round(2 * transitions * dim * 8 / GIB, 2),
        "feature-budget-gib": FEATURE_BUDGET / GIB,
        "data-s": round(t_data, 1), "gram-s": round(t_build, 1),
        "sweep-s": round(t_fit / sweeps, 1),
        "bellman-residual": metrics["bellman-residual"],
    }


# ------------------------------------------------------------------ FedQHDExact
def exact_error(n_clients: int, dim: int, rounds: int, out: Path, seed: int = 0
                ) -> dict[str, Any]:
    """FedQHDExact through the real ServerApp and ClientApps (in process) against ridge
    FQI on the pooled shards, same number of sweeps: the largest readout difference
    relative to the largest readout entry."""
    from fedqhd.client.app import app as client_app
    from fedqhd.config import RunConfig
    from fedqhd.data import client_shard, pooled
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi import FQILearner, shared_encoder
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    cfg = RunConfig(hd_dim=dim, strategy="exact", num_server_rounds=rounds, eval_episodes=1,
                    seed=seed, output_dir=str(out))
    t0 = time.perf_counter()
    final, run_dir = run_federation(
        InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config()), cfg)
    seconds = time.perf_counter() - t0
    federated = np.load(run_dir / "final_model.npz")["readout"]
    shards = [client_shard(cfg.env_id, cfg.partition, i, n_clients, cfg.episodes_per_client,
                           cfg.seed, epsilon_min=cfg.epsilon_min, epsilon_max=cfg.epsilon_max)
              for i in range(n_clients)]
    ref = FQILearner(pooled(shards), shared_encoder(cfg), get_spec(cfg.env_id).n_actions,
                     cfg.gamma, cfg.ridge, proximal=0.0)
    ref.train(rounds, start=np.zeros_like(federated))
    error = float(np.abs(federated - ref.readout).max() / np.abs(ref.readout).max())
    return {"clients": n_clients, "dim": dim, "rounds": rounds, "seconds": round(seconds, 2),
            "relative-error": error, "bar": 1e-8, "equal": error <= 1e-8,
            "run-status": final["status"]}

"""The bench: federated vs pooled vs lone learners, measured the same way.

For each seed it trains, on the same client shards and with the same number of
FQI sweeps, (1) ridge FQI on all pooled data with the shared encoder, (2) every
client alone (shared encoder, and its own heterogeneous encoder), (3) FedQHDAvg
with the shared encoder and (4) FedQHDAnchor with heterogeneous encoders, and
evaluates each greedy policy on the same evaluation episodes. The federated runs
use the real ServerApp logic and ClientApp in process (no Ray), so the numbers
are those of ``flwr run`` without the transport. The command is ``fedqhd bench``
(:mod:`fedqhd.commands.bench`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.console import console_level
from fedqhd.files import atomic_write
from fedqhd.learners.base import REFERENCE


def client_shards(cfg: RunConfig, n_clients: int) -> list[Any]:
    """The shards the run's ``n_clients`` clients would generate (cached on disk)."""
    from fedqhd.data import client_shard

    return [client_shard(cfg.env_id, cfg.partition, i, n_clients, cfg.episodes_per_client,
                         cfg.seed, epsilon_min=cfg.epsilon_min, epsilon_max=cfg.epsilon_max)
            for i in range(n_clients)]


def _fit(cfg: RunConfig, shard: Any, encoder: Any) -> Any:
    """Plain ridge FQI (full ridge, no proximal term) for as many sweeps as the federation."""
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi import FQILearner

    learner = FQILearner(shard, encoder, get_spec(cfg.env_id).n_actions, cfg.gamma, cfg.ridge,
                         proximal=0.0)
    learner.train(cfg.num_server_rounds * cfg.local_iterations, start=learner.readout)
    return learner


def greedy_return(cfg: RunConfig, learner: Any) -> float:
    """Mean greedy return of a learner on the server's fixed evaluation episodes."""
    from fedqhd.learners.fqi import greedy_return as returns

    return float(returns(cfg, learner.encoder, learner.readout).mean())


def pooled_reference(cfg: RunConfig, shards: list[Any]) -> tuple[Any, np.ndarray]:
    """Ridge FQI on all clients' pooled shards with the shared encoder, and the pooled
    data states (where :func:`fidelity` compares)."""
    from fedqhd.data import pooled
    from fedqhd.learners.fqi import shared_encoder

    data = pooled(shards)
    return _fit(cfg, data, shared_encoder(cfg)), data.observations


def fidelity(reference: Any, states: np.ndarray, readout: np.ndarray) -> dict[str, float]:
    """How close a shared-encoder readout is to the pooled reference on the data states:
    relative error of the Q-values and the share of states with the same greedy action."""
    pooled_q = reference.q_values(states)
    q = reference.encoder.encode(states) @ readout
    return {"q-error-vs-pooled": float(np.linalg.norm(q - pooled_q) / np.linalg.norm(pooled_q)),
            "greedy-agreement": float(np.mean(q.argmax(1) == pooled_q.argmax(1)))}


def _lone(cfg: RunConfig, shards: list[Any]) -> dict[str, Any]:
    from fedqhd.learners.fqi import client_encoder

    hetero = cfg.replace(encoder="heterogeneous")
    lone_shared = [greedy_return(cfg, _fit(cfg, s, client_encoder(cfg.replace(
        encoder="shared"), i))) for i, s in enumerate(shards)]
    lone_hetero = [greedy_return(cfg, _fit(cfg, s, client_encoder(hetero, i)))
                   for i, s in enumerate(shards)]
    return {"lone-shared-mean": float(np.mean(lone_shared)),
            "lone-heterogeneous-mean": float(np.mean(lone_hetero)),
            "transitions": int(sum(s.n_transitions for s in shards))}


def _final_readout(run: dict[str, Any]) -> np.ndarray:
    return np.load(Path(run["run-dir"]) / "final_model.npz")["readout"]


def _federated(cfg: RunConfig, n_clients: int) -> dict[str, Any]:
    from fedqhd.client.app import app as client_app
    from fedqhd.server.app import run_federation
    from fedqhd.server.failures import RunFailed
    from fedqhd.server.inprocess import InProcessGrid

    grid = InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config())
    with console_level(logging.WARNING):  # the bench's progress bar, not each run's rounds
        final, out_dir = run_federation(grid, cfg)
    if final.get("status") == "failed":  # no return to compare: the bench fails
        raise RunFailed(f"fedqhd run failed: {final.get('reason')} (results in {out_dir})")
    return {"return-mean": final["return-mean"], "best-return-mean": final["best-return-mean"],
            REFERENCE: final[REFERENCE], "run-dir": str(out_dir)}


def run_federated_only(env_id: str, n_clients: int, seeds: list[int], rounds: int, out: Path,
                       overrides: dict[str, Any], strategy: str) -> dict[str, Any]:
    """Only one federated strategy per seed (for sweeps of its settings)."""
    from tqdm import tqdm

    encoder = "shared" if strategy == "avg" else "heterogeneous"
    rows = []
    for seed in tqdm(seeds, desc=f"{strategy} {env_id}", unit="seed"):
        cfg = RunConfig(env_id=env_id, seed=seed, num_server_rounds=rounds,
                        output_dir=str(out / "runs"), **{**overrides, "encoder": encoder})
        row = {"seed": seed, **_federated(cfg, n_clients)}
        if strategy == "avg":  # the pooled reference's Q (no rollouts: cheap)
            row.update(fidelity(*pooled_reference(cfg, client_shards(cfg, n_clients)),
                                _final_readout(row)))
        rows.append(row)
    summary = {"env-id": env_id, "clients": n_clients, "rounds": rounds, "strategy": strategy,
               "config": cfg.to_run_config(), "per-seed": rows}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"bench-{strategy}.json", json.dumps(summary, indent=2))
    return summary


def run_bench(env_id: str, n_clients: int, seeds: list[int], rounds: int,
              out: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    from tqdm import tqdm

    rows = []
    for seed in tqdm(seeds, desc=f"bench {env_id}", unit="seed"):
        base = RunConfig(env_id=env_id, seed=seed, num_server_rounds=rounds,
                         output_dir=str(out / "runs"), **overrides)
        t0 = time.time()
        shards = client_shards(base, n_clients)
        reference, states = pooled_reference(base, shards)
        row: dict[str, Any] = {"seed": seed, "pooled": greedy_return(base, reference),
                               **_lone(base, shards)}
        row["fedqhd-avg"] = _federated(base.replace(encoder="shared"), n_clients)
        row["fedqhd-avg"].update(fidelity(reference, states, _final_readout(row["fedqhd-avg"])))
        row["fedqhd-anchor"] = _federated(base.replace(encoder="heterogeneous"), n_clients)
        # what any policy must beat, on the same episodes (every run reports it)
        row[REFERENCE] = row["fedqhd-avg"].pop(REFERENCE)
        row["fedqhd-anchor"].pop(REFERENCE)
        row["wall-time-s"] = round(time.time() - t0, 1)
        rows.append(row)
    summary: dict[str, Any] = {
        "env-id": env_id, "clients": n_clients, "rounds": rounds, "seeds": seeds,
        "config": RunConfig(env_id=env_id, num_server_rounds=rounds, **overrides).to_run_config(),
        "per-seed": rows,
        "mean": {
            "pooled": float(np.mean([r["pooled"] for r in rows])),
            "fedqhd-avg": float(np.mean([r["fedqhd-avg"]["return-mean"] for r in rows])),
            "fedqhd-anchor": float(np.mean([r["fedqhd-anchor"]["return-mean"] for r in rows])),
            "lone-shared-mean": float(np.mean([r["lone-shared-mean"] for r in rows])),
            "lone-heterogeneous-mean": float(np.mean([r["lone-heterogeneous-mean"]
                                                      for r in rows])),
            "random": float(np.mean([r[REFERENCE]["random-mean"] for r in rows])),
            "best-constant": float(np.mean([r[REFERENCE]["best-constant-mean"] for r in rows])),
            "avg-q-error-vs-pooled": float(np.mean([r["fedqhd-avg"]["q-error-vs-pooled"]
                                                    for r in rows])),
            "avg-greedy-agreement": float(np.mean([r["fedqhd-avg"]["greedy-agreement"]
                                                   for r in rows])),
        },
    }
    summary["mean"]["avg-over-pooled"] = summary["mean"]["fedqhd-avg"] / summary["mean"]["pooled"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "bench.json", json.dumps(summary, indent=2))
    return summary


def fqi_speed(env_id: str, n_clients: int, dim: int, sweeps: int, seed: int = 0) -> dict[str, Any]:
    """Seconds per FQI sweep on the pooled shards: factored once (what fedqhd does) vs
    solving every action's regularised normal equations afresh in every sweep."""
    from fedqhd.data import client_shard, pooled
    from fedqhd.encoders import shared_encoder_params
    from fedqhd.envs import get_spec
    from fedqhd.readout import RidgeFQI

    spec = get_spec(env_id)
    data = pooled([client_shard(env_id, "behaviour-skew", i, n_clients, 5, seed)
                   for i in range(n_clients)])
    enc = shared_encoder_params(seed, dim, 1.0).build(spec.obs_bound)
    phi, nphi = enc.encode(data.observations), enc.encode(data.next_observations)
    t0 = time.perf_counter()
    fqi = RidgeFQI(phi, data.actions, data.rewards, nphi, data.terminated, spec.n_actions,
                   ridge=0.1)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    fqi.fit(sweeps)
    factored = (time.perf_counter() - t0) / sweeps
    readout = np.zeros((dim, spec.n_actions))
    t0 = time.perf_counter()
    for _ in range(sweeps):
        y = fqi.targets(readout)
        for a in range(spec.n_actions):
            rows = data.actions == a
            gram = phi[rows].T @ phi[rows] + 0.1 * np.eye(dim)
            readout[:, a] = np.linalg.solve(gram, phi[rows].T @ y[rows])
    naive = (time.perf_counter() - t0) / sweeps
    return {"env-id": env_id, "transitions": data.n_transitions, "D": dim,
            "setup-s": setup, "factored-sweep-s": factored, "naive-sweep-s": naive,
            "speedup": naive / factored,
            "max-readout-difference": float(np.abs(readout - fqi.readout_).max())}

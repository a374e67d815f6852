"""The FedQHD paper's own learner, as its notes describe it, on the paper's protocol.

Why: our FedQHD fits ridge FQI on each client's buffer; the paper's clients learn
by online TD(0), one update per step. Before asking whether a per-step learner would
close our LunarLander gap (ours 114.7, the paper's 224.1), this measures the paper's
settings (``../shared/notes/fedqhd.md``, "The authors' run settings") reimplemented from
that description (no code of theirs): a shared random Fourier encoder (D = 10,000,
bandwidth 1, the task's observation bounds), readouts starting as random unit vectors,
``w_a += lr (r + gamma max_b Q(s', b) - Q(s, a)) phi(s)`` on the action taken
(lr 0.2, discount 0.9; a time-limit truncation bootstraps, unlike their code), epsilon
0.8 x 0.9 per episode down to 0.01, the readouts averaged every 50 episodes. The five
clients run one episode at a time each, stepped side by side; within one step the
clients update their own readouts, so the order does not matter.

    OMP_NUM_THREADS=1 python benchmarks/paper_td_learner.py --seed 42 --out td-42.json

Prints the last-100 training return (the paper's metric) at every aggregation and
writes the seed, the settings, the curve and the CPU seconds to ``--out``.
Measured in BENCHMARKS.md, "LunarLander (ninth round)".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from fedqhd.encoders import HDEncoder
from fedqhd.online import _encode32, encoder_bound


def run_td(env_id: str = "LunarLander-v3", seed: int = 42, n_clients: int = 5,
           episodes: int = 600, dim: int = 10_000, lr: float = 0.2, gamma: float = 0.9,
           epsilon: tuple[float, float, float] = (0.8, 0.9, 0.01), every: int = 50,
           bandwidth: float = 1.0) -> dict[str, Any]:
    """``n_clients`` TD(0) learners on a shared encoder, readouts averaged every
    ``every`` episodes; returns the settings, the curve of last-100 training returns
    at each aggregation, the final one and the CPU seconds."""
    cpu0 = time.process_time()
    rng = np.random.default_rng(seed)
    bound = encoder_bound(env_id)
    encoder = HDEncoder(dim, bandwidth, scale=bound, random_state=seed).fit(
        np.zeros((1, len(bound))))
    envs = [gym.make(env_id) for _ in range(n_clients)]
    n_actions = int(envs[0].action_space.n)
    w = rng.normal(size=(n_clients, dim, n_actions))
    w = (w / np.linalg.norm(w, axis=1, keepdims=True)).astype(np.float32)
    obs = np.stack([e.reset(seed=int(rng.integers(2**31 - 1)))[0] for e in envs])
    feats = _encode32(encoder, obs)
    episode = np.zeros(n_clients, dtype=np.int64)
    running = np.zeros(n_clients)
    returns: list[list[float]] = [[] for _ in range(n_clients)]
    start, decay, floor = epsilon
    curve: list[tuple[int, float]] = []
    steps, target = 0, every
    while episode.min() < episodes:
        live = np.flatnonzero(episode < target)
        if live.size == 0:  # every client finished its share: average the readouts
            w[:] = w.mean(axis=0)
            curve.append((target, float(np.mean([np.mean(r[-100:]) for r in returns]))))
            print(f"episodes {target}: last-100 {curve[-1][1]:.1f}, "
                  f"{time.process_time() - cpu0:.0f} CPU s", flush=True)
            target += every
            continue
        phi = feats[live]
        q = np.einsum("kd,kda->ka", phi, w[live])
        eps = np.maximum(floor, start * decay ** episode[live])
        act = np.where(rng.random(live.size) < eps, rng.integers(n_actions, size=live.size),
                       q.argmax(axis=1))
        nxt = np.empty((live.size, obs.shape[1]), dtype=np.float32)
        reward = np.zeros(live.size)
        term = np.zeros(live.size, dtype=bool)
        trunc = np.zeros(live.size, dtype=bool)
        for j, i in enumerate(live):
            nxt[j], reward[j], term[j], trunc[j], _ = envs[i].step(int(act[j]))
        steps += live.size
        phi_next = _encode32(encoder, nxt)
        q_next = np.einsum("kd,kda->ka", phi_next, w[live]).max(axis=1)
        delta = reward + gamma * ~term * q_next - q[np.arange(live.size), act]
        for j, i in enumerate(live):
            w[i, :, act[j]] += np.float32(lr * delta[j]) * phi[j]
        running[live] += reward
        feats[live], obs[live] = phi_next, nxt
        for j in np.flatnonzero(term | trunc):
            i = live[j]
            returns[i].append(float(running[i]))
            running[i], episode[i] = 0.0, episode[i] + 1
            obs[i] = envs[i].reset(seed=int(rng.integers(2**31 - 1)))[0]
            feats[i] = _encode32(encoder, obs[i][None])[0]
    for e in envs:
        e.close()
    return dict(env_id=env_id, seed=seed, n_clients=n_clients, episodes=episodes, dim=dim,
                lr=lr, gamma=gamma, epsilon=list(epsilon), every=every, bandwidth=bandwidth,
                train_return_last100=float(np.mean([np.mean(r[-100:]) for r in returns])),
                curve=curve, steps=steps, cpu_s=time.process_time() - cpu0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="LunarLander-v3")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--dim", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = run_td(args.env, args.seed, episodes=args.episodes, dim=args.dim,
                    lr=args.lr, gamma=args.gamma)
    print(f"last-100 training return {result['train_return_last100']:.1f} "
          f"({result['cpu_s']:.0f} CPU s, {result['steps']} steps)")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

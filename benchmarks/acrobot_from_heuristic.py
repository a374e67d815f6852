"""Can the online table's Acrobot learner fit a good policy from a good policy's data?

Collects episodes of the one-line bang-bang policy ``a = 0 if omega_1 > 0 else 2``
(torque against the first link's angular velocity: -85.6 over 200 episodes, FedAvg-DQN's
level) with ``--eps`` random actions, offers them to one :class:`fedqhd.online.OnlineClient`
at the table's shared Acrobot settings (the same n-step transitions, per-episode quota and
tail as a collection), then fits ridge FQI two ways: the online learner's chain (rounds of
``sweeps`` sweeps, each pulled toward the last readout) and one fresh fit without the pull.
Prints the greedy return (200 episodes) and the share of visited states where the greedy
action is the heuristic's.

``--offset b`` fits ``Q - b`` instead of ``Q`` (rewards shifted by ``-b (1 - gamma c)``,
``c`` the transition's continuation factor, so the Bellman equation is the same): ridge then
shrinks what the data do not pin down toward ``Q = b`` instead of ``Q = 0``. Acrobot's
values all lie in [-100, 0], so shrinking toward 0 makes a rarely taken action look good.

    OMP_NUM_THREADS=1 python benchmarks/acrobot_from_heuristic.py --eps 0.1
    OMP_NUM_THREADS=1 python benchmarks/acrobot_from_heuristic.py --eps 0.1 --offset -100
"""

from __future__ import annotations

import argparse

import numpy as np

from fedqhd.encoders import shared_encoder_params
from fedqhd.envs import get_spec
from fedqhd.online import (
    OnlineClient,
    _n_step,
    _per_episode_subsample,
    encoder_bound,
    make_batch_env,
    online_settings,
    returns_to_go,
)

ENV = "Acrobot-v1"


def heuristic(obs: np.ndarray) -> np.ndarray:
    """Torque against the first link's angular velocity (obs[:, 4])."""
    return np.where(obs[:, 4] > 0, 0, 2)


def rollout(policy, n: int, eps: float, rng: np.random.Generator, record: bool = False):
    """``n`` episodes side by side; returns their returns and, with ``record``, the
    transitions of the live episodes step by step (episode, s, a, r, s', terminated)."""
    env = make_batch_env(ENV, n, rng)
    obs = env.reset(np.arange(n))
    alive, ret, steps = np.ones(n, bool), np.zeros(n), []
    for _ in range(get_spec(ENV).max_episode_steps):
        if not alive.any():
            break
        a = policy(obs)
        explore = rng.random(n) < eps
        a[explore] = rng.integers(3, size=int(explore.sum()))
        nobs, r, term = env.step(a)
        if record:
            steps.append((np.flatnonzero(alive), obs[alive], a[alive], r[alive], nobs[alive],
                          term[alive]))
        ret[alive] += r[alive]
        alive &= ~term
        obs = nobs
    return ret, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", type=float, default=0.1)
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--offset", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    t = online_settings(ENV, "shared")
    enc = shared_encoder_params(args.seed, t["dim"], t["enc_gamma"]).build(
        encoder_bound(ENV, t.get("obs_scale")))
    cl = OnlineClient(ENV, enc, gamma=t["gamma"], ridge=t["ridge"], proximal=t["proximal"],
                      action_gap=t["action_gap"], n_step=t["n_step"], tail=t["tail"],
                      capacity=10_000, per_episode=t["per_episode"], seed=args.seed)
    rng = np.random.default_rng(args.seed)
    print(f"heuristic: greedy {rollout(heuristic, 200, 0.0, rng)[0].mean():.1f}, "
          f"epsilon {args.eps}: {rollout(heuristic, 200, args.eps, rng)[0].mean():.1f}")
    b, g = args.offset, cl.gamma
    for batch in range(args.episodes // 50):
        _, steps = rollout(heuristic, 50, args.eps, rng, record=True)
        ep = np.concatenate([s[0] for s in steps]) + 50 * batch
        s0, a, r, s1, te = (np.concatenate([s[i] for s in steps]) for i in range(1, 6))
        keep = _per_episode_subsample(ep, cl.per_episode, cl.rng, te, cl.tail)
        to_go = returns_to_go(ep, r, g)
        rn, sn, cont = _n_step(ep, r, s1, te, cl.n_step, g)
        shift = b * (1.0 - g * cont)  # fits Q - b: the same Bellman equation
        cl.append(s0[keep], a[keep], (rn - shift)[keep], sn[keep], te[keep], cont[keep],
                  (-1.0 - b * (1 - g), -b * (1 - g)), returns_to_go=(to_go - b)[keep],
                  episodes=ep[keep])
    print(f"buffer {cl.size} rows, per action {cl.action_counts().tolist()}")

    def greedy(readout: np.ndarray) -> str:
        def policy(obs):
            return (cl.encode(obs) @ readout.astype(np.float32)).argmax(axis=1)
        ret, steps = rollout(policy, 200, 0.0, rng, record=True)
        states = np.concatenate([s[1] for s in steps])
        return (f"greedy return {ret.mean():.1f}, the heuristic's action in "
                f"{np.mean(policy(states) == heuristic(states)):.3f} of its states")

    w = np.zeros((cl.dim, cl.n_actions))
    for k in range(1, args.rounds + 1):
        w = cl.fit(10, init=w, prior=w)
        if k in (5, 10, 20, args.rounds):
            print(f"chain, {k} rounds of 10 sweeps: {greedy(w)}", flush=True)
    cl.proximal = 0.0
    print(f"fresh fit, 300 sweeps, no pull: {greedy(cl.fit(300, init=np.zeros_like(w)))}")


if __name__ == "__main__":
    main()

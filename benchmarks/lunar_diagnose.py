"""How the online learner's final LunarLander policy fails (issue 13, round 4).

Runs :func:`fedqhd.online.run_online` (table settings unless overridden), keeps the
clients, then rolls out the final greedy policy and reports how its episodes end
(landed at rest +100, crashed -100, flew off screen, hit the 1000-step limit),
their lengths, Q(s, a) of the greedy action against the realised discounted return
from that step (over- or under-estimation), the buffer's share of terminal
transitions and its action mix, and percentiles of the visited states (for the
encoder's per-coordinate ``obs_scale``). Single-threaded:

    OMP_NUM_THREADS=1 python benchmarks/lunar_diagnose.py --seed 44 --encoder shared

``--refit SWEEPS`` (shared encoder) then asks whether the federated chain or the data's own
ridge FQI solution makes the policy: greedy returns (``--greedy`` episodes per client,
every client acting with one readout) of the global readout, of ``SWEEPS`` more sweeps
from it (same proximal pull), and of ``SWEEPS`` sweeps from zero on the same buffers
without the pull and pulled toward zero (and from zero without the pull at each ridge of
``--refit-ridges``); each refit is the transition-weighted mean of
the clients' refits, as a round's average. Measured in BENCHMARKS.md, "LunarLander
(ninth round)".
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import fedqhd.online as online
from fedqhd.envs import make_env

ENV_ID = "LunarLander-v3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--encoder", default="shared", choices=["shared", "heterogeneous"])
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--greedy", type=int, default=20, help="greedy episodes per client")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    parser.add_argument("--refit", type=int, default=0, metavar="SWEEPS",
                        help="compare the global readout with refits (shared encoder)")
    parser.add_argument("--refit-ends", action="store_true",
                        help="with --refit: also roll out each refit as the final policy is")
    parser.add_argument("--refit-ridges", default="", metavar="R1,R2",
                        help="with --refit: also refit from zero without the pull at these ridges")
    args = parser.parse_args()
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    env_id = ENV_ID
    kept: list[online.OnlineClient] = []

    class Kept(online.OnlineClient):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            kept.append(self)

    online.OnlineClient = Kept  # type: ignore[misc]
    res = online.run_online(env_id, episodes=args.episodes, encoder=args.encoder,
                            seed=args.seed, verbose=True, **overrides)
    print(f"last100 {res.train_return_last100:.1f} greedy {res.greedy_return:.1f} "
          f"clients {[round(x, 1) for x in res.client_last100]} wall {res.wall_s:.1f} s "
          f"cpu {res.cpu_s:.1f} s")
    if args.refit:
        ridges = [float(r) for r in args.refit_ridges.split(",") if r.strip()]
        refit_check(kept, args.refit, args.greedy, ridges, args.seed if args.refit_ends else None)
        return
    states = greedy_rollouts(kept, args.greedy, args.seed, buffers=True)
    bound = np.asarray(online.encoder_bound(env_id))
    pct = np.percentile(np.abs(states), [50, 90, 99], axis=0) / bound
    print("visited |state| / obs_bound, percentiles 50/90/99 per coordinate:")
    for name, row in zip(("p50", "p90", "p99"), pct, strict=True):
        print(f"  {name}: {np.round(row, 3).tolist()}")


def greedy_rollouts(clients: list[online.OnlineClient], n_episodes: int, seed: int,
                    buffers: bool = False) -> np.ndarray:
    """Roll out each client's greedy policy ``n_episodes`` times (gymnasium's env, one
    step at a time) and print how the episodes end, their returns and lengths, and Q of
    the greedy action against the realised discounted return; ``buffers``: each client's
    buffer too. Returns the visited states."""
    gamma = clients[0].gamma
    ends: dict[str, int] = {}
    lengths, q_err_start, q_err_all, returns, states = [], [], [], [], []
    rng = np.random.default_rng(seed)
    for c, cl in enumerate(clients):
        for _ in range(n_episodes):
            env = make_env(ENV_ID).unwrapped
            obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
            qs, rs, term = [], [], False
            for _t in range(1000):
                q = cl.q_values(np.asarray(obs, dtype=np.float32)[None])[0]
                a = int(q.argmax())
                states.append(np.asarray(obs, dtype=float))
                qs.append(q[a])
                obs, r, term, _, _ = env.step(a)
                rs.append(float(r))
                if term:
                    break
            if not term:
                why = "time limit"
            elif not env.lander.awake:
                why = "landed"
            elif abs(obs[0]) >= 1.0:
                why = "off screen"
            else:
                why = "crashed"
            ends[why] = ends.get(why, 0) + 1
            g, disc = np.zeros(len(rs)), 0.0
            for t in range(len(rs) - 1, -1, -1):
                disc = rs[t] + gamma * disc
                g[t] = disc
            # a truncated episode's tail would bootstrap: compare only steps >= 300 from its end
            valid = len(rs) if term else max(0, len(rs) - 300)
            err = np.asarray(qs)[:valid] - g[:valid]
            if valid:
                q_err_start.append(err[0])
                q_err_all.extend(err.tolist())
            lengths.append(len(rs))
            returns.append(sum(rs))
        if not buffers:
            continue
        n = cl.size
        term_share = float(np.mean(cl.continues[:n] == 0))
        mix = np.bincount(cl.actions[:n], minlength=cl.n_actions) / n
        print(f"client {c}: buffer {n} of {cl.n_transitions} collected, terminal share "
              f"{term_share:.3f}, action mix {np.round(mix, 2).tolist()}, rewards "
              f"[{cl.r_min:.1f}, {cl.r_max:.1f}]")
    lengths_a, returns_a = np.asarray(lengths), np.asarray(returns)
    print(f"greedy episodes {len(lengths)}: ends {ends}; return mean {returns_a.mean():.1f} "
          f"median {np.median(returns_a):.1f}; length mean {lengths_a.mean():.0f} "
          f"percentiles 10/50/90 {np.percentile(lengths_a, [10, 50, 90]).round().tolist()}")
    print(f"Q(s,a) - realised discounted return: at step 0 mean {np.mean(q_err_start):.1f}; "
          f"all steps mean {np.mean(q_err_all):.1f}, median {np.median(q_err_all):.1f}, "
          f"mean |.| {np.mean(np.abs(q_err_all)):.1f}")
    return np.asarray(states)


def refit_check(clients: list[online.OnlineClient], sweeps: int, greedy: int,
                ridges: list[float], ends_seed: int | None = None) -> None:
    """Greedy returns of the global readout and of refits on the clients' final buffers;
    with ``ends_seed``, then each one's rollouts as :func:`greedy_rollouts` reports them."""
    if any(c.encoder is not clients[0].encoder for c in clients):
        raise SystemExit("--refit needs the shared encoder (one readout for every client)")
    weights = np.array([c.n_transitions for c in clients], dtype=float)
    weights /= weights.sum()
    start = clients[0].readout.copy()  # act_local off: every client holds the global readout

    def refit(init: np.ndarray, pull: bool, ridge: float | None = None) -> np.ndarray:
        fits = []
        for c in clients:
            proximal, own_ridge = c.proximal, c.ridge
            c.proximal = proximal if pull else 0.0
            c.ridge = own_ridge if ridge is None else ridge
            try:
                fits.append(c.fit(sweeps, init=init, prior=init).copy())
            finally:  # the client keeps its own settings for the next refit
                c.proximal, c.ridge = proximal, own_ridge
        return sum(w * f for w, f in zip(weights, fits, strict=True))

    def greedy_return(readout: np.ndarray) -> float:
        for c in clients:
            c.readout = readout.copy()
        out = online.collect_many(clients, [greedy] * len(clients), [0.0] * len(clients),
                                  append=False)
        return float(np.mean([o.mean() for o in out]))

    zero = np.zeros_like(start)
    rows = {"global readout": start,
            f"{sweeps} more sweeps from it (same pull)": refit(start, True),
            f"{sweeps} sweeps from zero, no pull": refit(zero, False),
            f"{sweeps} sweeps from zero, pulled toward zero": refit(zero, True)}
    for ridge in ridges:
        rows[f"{sweeps} sweeps from zero, no pull, ridge {ridge:g}"] = refit(zero, False, ridge)
    for name, readout in rows.items():
        print(f"greedy return, {name}: {greedy_return(readout):.1f}", flush=True)
    if ends_seed is not None:
        for name, readout in rows.items():
            for c in clients:
                c.readout = readout.copy()
            print(f"rollouts of {name}:")
            greedy_rollouts(clients, greedy, ends_seed)


if __name__ == "__main__":
    main()

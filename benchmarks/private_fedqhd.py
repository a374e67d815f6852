"""Private FedQHD: greedy return against epsilon (delta 1e-5) on CartPole offline shards.

Each cell is one in-process federation (the real ServerApp logic and ClientApps,
:class:`~fedqhd.server.inprocess.InProcessGrid`) of ``--clients`` clients with
``privacy = "zcdp"`` (one noisy sample-and-aggregate readout per client) at the rho whose
epsilon (delta 1e-5, by the conversion valid for the node's sampler: OpenDP's map for
``opendp``, the exact Gaussian for ``numpy``) is the column's epsilon; ``non-private`` is
the same run with the nodes' noise off (the clipped chunked readouts, a run marked
non-private) and ``exact`` is plain FedQHDExact (pooled ridge FQI from exact statistics,
10 sweeps, ridge 0.1: the first slice's non-private reference). ``--encoder
heterogeneous``: each client its own encoder, releasing its advantages on 1000 rollout
anchors; ``exact`` is then non-private FedQHDAnchor (same rounds and sweeps). Ledgers go
to a temporary folder (no real budget is spent). ``--set key=value,...`` overrides the
setting.

    python benchmarks/private_fedqhd.py --epsilons 1,2,4,8,16 --seeds 0,1,2,3,4

prints a Markdown table (mean (standard error) over the seeds, and each seed) and the
reported epsilon of every private run beside the requested one; ``--out FILE.json``
keeps every cell and ``--plot FILE.png`` draws the curve.

``--dqn`` adds the deep baseline on the same shards, seeds and clients: ``dqn`` is
offline FedAvg-DQN (:data:`DQN`: the FedAvg-DQN MLP, ``local-iterations`` Adam steps per
client per round on its shard) and ``dp-fedavg`` is the same run under Flower's
server-side fixed-clipping DP wrapper (``privacy = "dp-fedavg"``) at the rho whose epsilon
(delta, exact Gaussian curve: Flower's noise is numpy's continuous Gaussian) is the
column's. The units differ: DP-FedAvg protects a whole CLIENT (all its episodes) with a
trusted server adding the noise; private FedQHD protects ONE EPISODE with the client
adding the noise.

    python benchmarks/private_fedqhd.py --dqn --epsilons 1,2,4,8,16 --seeds 10,11,12,13,14
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
import time
from typing import Any

import numpy as np

from fedqhd.privacy.ledger import epsilon_exact, epsilon_opendp

#: the measured setting (run-config keys); see BENCHMARKS.md
#: (4000 episodes a client in 100 chunks of about 40: 500 in 50 kept 66 % of the non-private
#: return at epsilon 8, 2000 in 50 71 %, on seeds 5-9; BENCHMARKS.md)
SETTING: dict[str, Any] = {"env-id": "CartPole-v1", "hd-dim": 100, "episodes-per-client": 4000,
                           "gamma": 0.95, "num-server-rounds": 1, "local-iterations": 30,
                           "ridge": 0.3, "privacy-chunks": 100, "privacy-clip-norm": 6.0,
                           "eval-episodes": 20}
#: the non-private reference (the first slice's FedQHDExact setting); with heterogeneous
#: encoders FedQHDAnchor, the same rounds and sweeps
EXACT: dict[str, Any] = {"strategy": "exact", "num-server-rounds": 10, "ridge": 0.1,
                         "local-iterations": 3}
ANCHOR: dict[str, Any] = {**EXACT, "strategy": "anchor"}
#: the online protocol's settings (``--protocol online``): the online learner's defaults
#: (epsilon 1.0 x 0.9 a round, down to 0.01), no task preset
ONLINE: dict[str, Any] = {"protocol": "online", "preset": "manual"}
#: the heterogeneous setting's anchors (FedQHDAnchor's default rollout anchors)
HETEROGENEOUS: dict[str, Any] = {"encoder": "heterogeneous", "num-anchors": 1000}
#: offline FedAvg-DQN (with SETTING's shards, gamma and evaluation; its hd-dim, ridge and
#: chunks are unused): 8 rounds x 100 Adam steps per client, chosen on seeds 0-4 among 100,
#: 200, 500 and 1000 steps per round over up to 20 rounds (mean greedy return 346 after
#: round 8 at 100 steps; 265 after round 3 at 200; 238 after round 10 at 500); C = 1.0,
#: about the median norm of the clients' updates in those runs (1.17; 10 % below 0.88, 10 %
#: above 1.88). min-nodes is set to --clients: the DP noise is calibrated on it.
DQN: dict[str, Any] = {"learner": "dqn", "encoder": "shared", "num-server-rounds": 8,
                       "local-iterations": 100, "privacy-clip-norm": 1.0}


def rho_for_epsilon(epsilon: float, delta: float, noise: str) -> float:
    """The largest rho whose epsilon(delta) is at most ``epsilon`` (bisection, log scale)."""
    convert = epsilon_opendp if noise == "opendp" else epsilon_exact
    lo, hi = 1e-8, 1e3
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if convert(mid, delta) > epsilon else (mid, hi)
    return lo


def run_cell(seed: int, clients: int, mode: str, rho: float, noise: str,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One federation: ``mode`` is private, non-private (clipped, no noise), exact, dqn
    (offline FedAvg-DQN) or dp-fedavg (the same under DP-FedAvg at ``rho``)."""
    from fedqhd.client.app import app as client_app
    from fedqhd.config import RunConfig
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    keys: dict[str, Any] = {**SETTING, **(extra or {}), "seed": seed,
                            "output-dir": tempfile.mkdtemp()}
    if mode in ("dqn", "dp-fedavg"):
        keys.update({**DQN, "min-nodes": clients})
        if mode == "dp-fedavg":
            keys.update({"privacy": "dp-fedavg", "privacy-rho": rho})
    elif mode != "exact":
        keys.update({"privacy": "zcdp", "privacy-rho": rho, "non-private": mode != "private"})
    elif keys.get("protocol") == "online":  # non-private online FedQHD: the paper's protocol
        keys = {k: keys[k] for k in ("env-id", "seed", "output-dir", "eval-episodes",
                                     "encoder", "protocol") if k in keys}  # and its preset
    else:
        keys.update(EXACT if keys.get("encoder", "shared") == "shared" else ANCHOR)
    cfg = RunConfig.from_run_config(keys)
    # a fresh ledger folder per cell: the cells release the same shards, and one ledger
    # would (rightly) add up their rho
    # (and room for every client's encoded shard: heterogeneous references re-encode less)
    node = {"noise": noise if mode == "private" else "none", "rho": 1e6, "rho-budget": 1e6,
            "ledger-dir": tempfile.mkdtemp(), "learner-cache-mib": 8192}
    grid = InProcessGrid([client_app] * clients, run_config=cfg.to_run_config(),
                         node_configs=[dict(node) for _ in range(clients)])
    start = time.perf_counter()
    final, _ = run_federation(grid, cfg)
    ledgers = final.get("privacy-ledgers", {})
    eps = [entry.get("epsilon") for entry in ledgers.values()] if mode == "private" else []
    if mode == "dp-fedavg":
        eps = [final["dp-fedavg"]["epsilon"]]
    return {"seed": seed, "mode": mode, "rho": rho, "return": final.get("return-mean"),
            "random": final.get("reference", {}).get("random-mean"),
            "epsilon-reported": max(e for e in eps if e is not None) if eps else None,
            "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1,2,4,8,16")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--noise", choices=("opendp", "numpy"), default="opendp")
    parser.add_argument("--out", default="")
    parser.add_argument("--set", default="", help="run-config overrides, key=value,...")
    parser.add_argument("--no-reference", action="store_true", help="private columns only")
    parser.add_argument("--plot", default="", help="the privacy-utility curve, a PNG")
    parser.add_argument("--protocol", choices=("offline", "online"), default="offline",
                        help="online: the episodes collected in --rounds rounds with the "
                             "public model, a release a round at 1/rounds of the rho "
                             "(reference: non-private online FedQHD, the task's preset)")
    parser.add_argument("--rounds", type=int, default=4, help="online: rounds")
    parser.add_argument("--encoder", choices=("shared", "heterogeneous"), default="shared",
                        help="heterogeneous: each client its own encoder, advantages released "
                             "on the anchors (reference: FedQHDAnchor)")
    parser.add_argument("--dqn", action="store_true",
                        help="add offline FedAvg-DQN and DP-FedAvg-DQN at each epsilon")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    os.environ["FEDQHD_LEDGER_DIR"] = tempfile.mkdtemp()  # studies spend no real budget
    seeds = [int(s) for s in args.seeds.split(",")]
    extra: dict[str, Any] = dict(HETEROGENEOUS) if args.encoder == "heterogeneous" else {}
    if args.protocol == "online":
        extra.update(ONLINE, **{"num-server-rounds": args.rounds})
    for item in filter(None, args.set.split(",")):
        key, value = item.split("=")
        extra[key] = _value(value)
    if args.protocol == "online":  # the same episodes a client in all, a share a round
        total = int(extra.get("episodes-per-client", SETTING["episodes-per-client"]))
        extra["episodes-per-round"] = max(1, total // args.rounds)
    columns: list[tuple[str, float, float | None]] = (
        [] if args.no_reference else [("exact", 0.0, None), ("non-private", 1.0, None)])
    targets = [float(e) for e in args.epsilons.split(",")]
    for target in targets:
        columns.append(("private", rho_for_epsilon(target, args.delta, args.noise), target))
    if args.dqn:
        columns.append(("dqn", 0.0, None))
        for target in targets:  # Flower adds numpy's (continuous) Gaussian noise
            columns.append(("dp-fedavg", rho_for_epsilon(target, args.delta, "numpy"), target))
    cells: list[dict[str, Any]] = []
    rows = []
    for mode, rho, eps in columns:
        got = [run_cell(seed, args.clients, mode, rho, args.noise, extra) for seed in seeds]
        for cell in got:
            cell["epsilon"] = eps
        cells.extend(got)
        returns = [float(c["return"]) for c in got]
        mean, se = _mean_se(returns)
        label = (mode if eps is None else f"{'DP-FedAvg-DQN' if mode == 'dp-fedavg' else 'private'}"
                 f", eps {eps:g} (rho {rho:.4g})")
        reported = [c["epsilon-reported"] for c in got if c["epsilon-reported"] is not None]
        rep = f"{max(reported):.4g}" if reported else "-"
        rows.append(f"| {label} | {mean:.1f} ({se:.1f}) | "
                    f"{', '.join(f'{r:.0f}' for r in returns)} | {rep} |")
        print(rows[-1], flush=True)
    print(f"\nuniform random: {np.mean([c['random'] for c in cells]):.1f}; noise {args.noise}; "
          f"{args.clients} clients; setting {json.dumps({**SETTING, **extra})}"
          + (f"; dqn {json.dumps(DQN)} (DP-FedAvg: exact Gaussian epsilon)" if args.dqn else ""))
    print("| run | return, mean (SE) | per seed | reported epsilon (max over clients) |")
    print("|---|---:|---|---:|")
    print("\n".join(rows))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(cells, fh, indent=1)
    if args.plot:
        plot(cells, args.plot, f"{args.clients} clients, seeds {args.seeds}, delta "
                               f"{args.delta:g}, noise {args.noise}")


def _value(text: str) -> Any:
    """A ``--set`` value: an integer, a number, or else the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (0 for one value)."""
    arr = np.asarray(values, dtype=float)
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else 0.0
    return float(arr.mean()), se


def plot(cells: list[dict[str, Any]], path: str, subtitle: str) -> None:
    """Greedy return against epsilon (mean and standard error over the seeds), with the
    non-private references and a uniform random policy as horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for curve, label in (("private", "private FedQHD (zCDP, one release a client; "
                                      "unit: an episode)"),
                         ("dp-fedavg", "DP-FedAvg-DQN (Flower's wrapper; unit: a client)")):
        mine = [c for c in cells if c["mode"] == curve]
        eps = sorted({c["epsilon"] for c in mine})
        stats = [_mean_se([c["return"] for c in mine if c["epsilon"] == e]) for e in eps]
        if eps:
            ax.errorbar(eps, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o",
                        capsize=3, label=label)
    names = {"exact": "FedQHD, no privacy", "non-private": "chunked, no noise",
             "dqn": "offline FedAvg-DQN"}
    for mode, style in (("exact", "-"), ("non-private", "--"), ("dqn", "-.")):
        got = [c["return"] for c in cells if c["mode"] == mode]
        if got:
            mean, se = _mean_se(got)
            ax.axhline(mean, color="k", linestyle=style, linewidth=1,
                       label=f"{names[mode]} {mean:.0f} (SE {se:.0f})")
    ax.axhline(float(np.mean([c["random"] for c in cells])), color="grey", linestyle=":",
               label="uniform random")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("epsilon")
    ax.set_ylabel("greedy return, CartPole-v1")
    ax.set_title(f"Private FedQHD: return against epsilon\n{subtitle}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

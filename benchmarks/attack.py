"""One attacker among 10 CartPole clients, and 30% of clients failing: final greedy return
of the clean run, of plain averaging under attack, and of the safeguards (defaults) and
robust aggregation options under the same attack.

In process (the real ServerApp logic and ClientApps on :class:`InProcessGrid`, no Ray),
default run config (shared encoder, FedQHDAvg, consensus ADMM, 20 rounds) with 10
clients. The attacker is client 9; it trains honestly and then alters its reply:

* ``scale``: its readout times 1e30;
* ``claim``: it claims ``num-transitions`` = 1e12;
* ``rotate``: it sends its readout negated, under a new partition id every round
  (``FedQHDAvg(aggregate="latest")`` would keep every id as another client);
* ``fail30``: no attacker; clients 7, 8 and 9 raise in training every round
  (``fail30-evaluate``: in evaluation; ``fail30-both``: in both; these two with
  heterogeneous encoders, setting ``anchor``, whose evaluation is federated);
* ``churn30`` (``-evaluate``, ``-both``): a fresh random 3 of the 10 clients raise every
  round (:func:`churn_failing`), in training, evaluation or both: every client's data
  still reaches the federation in the rounds it is not picked;
* ``absent30``: the control, 7 honest clients only, holding shards 0..6 of the 10-client
  federation (node config ``num-partitions`` 10: the same behaviour epsilons and ridge
  share as in the failing runs), so that the only difference is that clients 7..9
  never exist: what the failing runs can at best match, the data of 3 clients is
  missing either way. (Until session 5 the control re-partitioned into 7 clients, whose
  shards are not those of clients 0..6: another data set, not a control.)

``plain`` is the behaviour before issue 11: weighted mean, no norm bound, no weight
cap, no identity binding (switched off here by patching the registry to accept every
claim). ``defaults`` is the shipped configuration; ``median`` and ``trimmed-mean`` add
``aggregation`` on top of the defaults.

    OMP_NUM_THREADS=1 python benchmarks/attack.py --seeds 0 1 2 --out attack.json
    OMP_NUM_THREADS=1 python benchmarks/attack.py --only failures --seeds 0 1 2 3 4 5
    OMP_NUM_THREADS=1 python benchmarks/attack.py --only failures --episodes-per-client 20
    OMP_NUM_THREADS=1 python benchmarks/attack.py --only churn --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedqhd.client.app import app as honest_app
from fedqhd.config import RunConfig
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C
from fedqhd.strategies.screening import Reference, Safeguards

N_CLIENTS = 10
ATTACKER = 9
PLAIN = {"clip_factor": 0.0, "norm_bound_factor": 0.0, "weight_cap_factor": 0.0}
SETTINGS: dict[str, dict[str, Any]] = {
    "plain": PLAIN,
    "defaults": {},
    "median": {"aggregation": "median"},
    "trimmed-mean": {"aggregation": "trimmed-mean"},
    # heterogeneous encoders: FedQHDAnchor, with federated evaluation
    "anchor": {"encoder": "heterogeneous"},
    "anchor-plain": {"encoder": "heterogeneous", **PLAIN},
}


def altered_app(alter: Callable[[dict, dict, int, dict], tuple[dict, dict]]) -> ClientApp:
    """A client that trains honestly and replies ``alter(arrays, metrics, round, global)``
    (``global``: the arrays the server sent)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:
        reply = honest_app(msg, context)
        if reply.has_error():
            return reply
        arrays = C.from_array_record(reply.content[C.ARRAYS])
        metrics = dict(reply.content[C.METRICS].items())
        sent = C.from_array_record(msg.content[C.ARRAYS])
        arrays, metrics = alter(arrays, metrics, int(msg.content[C.CONFIG][C.SERVER_ROUND]),
                                sent)
        return Message(RecordDict({C.ARRAYS: C.to_array_record(arrays),
                                   C.METRICS: MetricRecord(metrics)}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context) -> Message:
        return honest_app(msg, context)

    return app


def failing_app(stages: tuple[str, ...] = ("train",)) -> ClientApp:
    """A client that raises in the given stages every round and is honest otherwise."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:
        if "train" in stages:
            raise RuntimeError("this client fails in training every round")
        return honest_app(msg, context)

    @app.evaluate()
    def evaluate(msg: Message, context) -> Message:
        if "evaluate" in stages:
            raise RuntimeError("this client fails in evaluation every round")
        return honest_app(msg, context)

    return app


#: 30 % of the clients (7, 8, 9) failing in these stages every round
FAILURES: dict[str, tuple[str, ...]] = {
    "fail30": ("train",), "fail30-evaluate": ("evaluate",),
    "fail30-both": ("train", "evaluate")}
FAILING = (7, 8, 9)
#: 30 % of the clients failing in these stages every round, a fresh random 3 each round
CHURN: dict[str, tuple[str, ...]] = {
    "churn30": ("train",), "churn30-evaluate": ("evaluate",),
    "churn30-both": ("train", "evaluate")}


def churn_failing(seed: int, server_round: int) -> set[int]:
    """The 3 of the 10 clients that fail in round ``server_round`` of a churn run."""
    rng = np.random.default_rng([seed, server_round, 30])
    return {int(p) for p in rng.choice(N_CLIENTS, size=len(FAILING), replace=False)}


def churning_app(stages: tuple[str, ...]) -> ClientApp:
    """A client that raises in the given stages in the rounds :func:`churn_failing` picks
    it for, and is honest otherwise."""
    app = ClientApp()

    def fails(msg: Message, context) -> bool:
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        seed = int(context.run_config["seed"])
        return int(context.node_config["partition-id"]) in churn_failing(seed, server_round)

    @app.train()
    def train(msg: Message, context) -> Message:
        if "train" in stages and fails(msg, context):
            raise RuntimeError("this client fails in training this round")
        return honest_app(msg, context)

    @app.evaluate()
    def evaluate(msg: Message, context) -> Message:
        if "evaluate" in stages and fails(msg, context):
            raise RuntimeError("this client fails in evaluation this round")
        return honest_app(msg, context)

    return app


def _scale(arrays, metrics, rnd, sent):
    return {k: v * 1e30 for k, v in arrays.items()}, metrics


def _claim(arrays, metrics, rnd, sent):
    return arrays, {**metrics, C.NUM_TRANSITIONS: 1e12}


def _rotate(arrays, metrics, rnd, sent):
    return ({k: -v for k, v in arrays.items()},
            {**metrics, C.PARTITION_ID: 1000 + rnd})


#: the global array a reply is measured against, by the array the reply carries
CENTER_OF = {C.READOUT: C.READOUT, C.Q_ANCHORS: C.TEACHER}


#: the deviation scale of the round before (the adaptive attacker's side channel)
SEEN_SCALE: list[float | None] = [None]


def _record_scale(original):
    def round_scale(self, distances):
        scale = original(self, distances)
        SEEN_SCALE[0] = scale
        return scale
    return round_scale


Reference.round_scale = _record_scale(Reference.round_scale)  # type: ignore[method-assign]


def _against(arrays, metrics, rnd, sent):
    """The adaptive attack: knowing the default safeguards and (told by the server, the
    strongest case) the previous round's deviation scale, reply as far from where the
    honest replies are (its own honest reply) as the defaults accept, pointing against
    the global model: past the clip radius (every distance beyond it counts the same)
    and short of the refusal bound, at the geometric mean of the two factors,
    sqrt(3 x 10) = 5.5 x the scale, the most margin both ways (clipping off: 0.95 x the
    bound; both off: 100 x). In round 1, with no scale yet, it replies honestly; where the
    safeguards are off (no scale is kept) it takes its own distance from the global model
    as the scale."""
    defaults = Safeguards()
    bound, clip = defaults.norm_bound_factor, defaults.clip_factor
    factor = (math.sqrt(bound * clip) if bound and clip else 0.95 * bound if bound
              else 100.0)
    if rnd == 1:
        return arrays, metrics
    out = {}
    for key, honest in arrays.items():
        center = sent.get(CENTER_OF.get(key, key))
        if center is None or center.shape != honest.shape:
            center = np.zeros_like(honest)
        scale = SEEN_SCALE[0] or float(np.linalg.norm(honest - center))
        direction = center if np.linalg.norm(center) > 0 else honest
        out[key] = honest - factor * scale * direction / np.linalg.norm(direction)
    return out, metrics


def _against_claim(arrays, metrics, rnd, sent):
    arrays, metrics = _against(arrays, metrics, rnd, sent)
    return arrays, {**metrics, C.NUM_TRANSITIONS: 1e12}


def _against_rotate(arrays, metrics, rnd, sent):
    arrays, metrics = _against(arrays, metrics, rnd, sent)
    return arrays, {**metrics, C.PARTITION_ID: 1000 + rnd}


def _against_steal(arrays, metrics, rnd, sent):
    """The adaptive attack under the partition id of client 0 (the victim)."""
    arrays, metrics = _against(arrays, metrics, rnd, sent)
    return arrays, {**metrics, C.PARTITION_ID: VICTIM}


def _norm9(arrays, metrics, rnd, sent):
    """Issue 29's attacker: the global model's direction reversed, at 9 times the norm of
    its own honest reply (under the norm bound of the defaults before that issue)."""
    out = {}
    for key, honest in arrays.items():
        center = sent.get(CENTER_OF.get(key, key))
        direction = (center if center is not None and center.shape == honest.shape
                     and np.linalg.norm(center) > 0 else honest)
        out[key] = -9 * np.linalg.norm(honest) * direction / np.linalg.norm(direction)
    return out, metrics


VICTIM = 0
ATTACKS = {"scale": _scale, "claim": _claim, "rotate": _rotate}
#: the adaptive attacks of issue 29
ADAPTIVE = {"against": _against, "against-claim": _against_claim,
            "against-rotate": _against_rotate, "against-steal": _against_steal,
            "norm9": _norm9}


def apps_for(attack: str) -> list[ClientApp]:
    if attack == "absent30":  # the control: those 30 % never existed (7 honest clients)
        return [honest_app] * (N_CLIENTS - len(FAILING))
    apps = [honest_app] * N_CLIENTS
    if attack in ATTACKS or attack in ADAPTIVE:
        apps[ATTACKER] = altered_app({**ATTACKS, **ADAPTIVE}[attack])
    elif attack in FAILURES:
        for i in FAILING:
            apps[i] = failing_app(FAILURES[attack])
    elif attack in CHURN:
        apps = [churning_app(CHURN[attack])] * N_CLIENTS
    return apps


def expected_failures(attack: str, rounds: int, federated_evaluation: bool) -> dict[str, int]:
    """The reply counts a run with ``attack`` must record (every client sampled)."""
    stages = FAILURES.get(attack, CHURN.get(attack, ()))
    out = {"train-failed": rounds * len(FAILING) * ("train" in stages)}
    if federated_evaluation:
        out["evaluate-failed"] = rounds * len(FAILING) * ("evaluate" in stages)
    return out


def node_configs_for(attack: str) -> list[dict[str, Any]] | None:
    """The control's 7 nodes hold the shards of the 10-client federation's clients that
    are not in ``FAILING`` (0..6)."""
    if attack == "absent30":
        return [{"partition-id": p, "num-partitions": N_CLIENTS} for p in range(N_CLIENTS)
                if p not in FAILING]
    return None


def run(seed: int, attack: str, setting: str, rounds: int,
        episodes_per_client: int = 5, hd_dim: int = 2000) -> dict[str, Any]:
    overrides = {k.replace("_", "-"): v for k, v in SETTINGS[setting].items()}
    SEEN_SCALE[0] = None
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig.from_run_config({"seed": seed, "num-server-rounds": rounds,
                                         "output-dir": out, "hd-dim": hd_dim,
                                         "episodes-per-client": episodes_per_client,
                                         **overrides})
        grid = InProcessGrid(apps_for(attack), run_config=cfg.to_run_config(),
                             node_configs=node_configs_for(attack))
        started = time.time()
        final, out_dir = run_federation(grid, cfg)
        rows = json.loads((out_dir / "results.json").read_text())["rounds"]
        with np.load(out_dir / "final_model.npz") as model:
            key = C.TEACHER if C.TEACHER in model.files else C.READOUT
            norm = float(np.linalg.norm(model[key])) if key in model.files else None
    last = rows[-1]
    federated_evaluation = cfg.encoder == "heterogeneous"
    counted = {"train-failed": sum(r[C.REPLIES_FAILED] for r in rows)}
    if federated_evaluation:
        counted["evaluate-failed"] = sum(r["evaluate-" + C.REPLIES_FAILED] for r in rows)
    return {"seed": seed, "attack": attack, "setting": setting,
            "return": final["return-mean"], "status": final["status"], "model-norm": norm,
            "clients-averaged": last.get(C.CLIENTS_AVERAGED),
            # every honest reply (the victim's too) accepted in every round?
            "honest-accepted": all(r[C.REPLIES_OK] + r[C.REPLIES_NORM_REFUSED]
                                   >= r[C.REPLIES_SAMPLED] - (attack in FAILURES or
                                                              attack in CHURN) * len(FAILING)
                                   and r[C.REPLIES_REJECTED] <= (attack in ADAPTIVE
                                                                 or attack in ATTACKS)
                                   for r in rows),
            "clipped": sum(r.get(C.REPLIES_CLIPPED, 0) for r in rows),
            "failed-counted": counted,
            "counts-exact": counted == expected_failures(attack, rounds, federated_evaluation),
            "replies": final["replies"], "seconds": round(time.time() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per run (default: 8 for --only adaptive, else 20)")
    parser.add_argument("--hd-dim", type=int, default=None,
                        help="D (default: 500 for --only adaptive, else the run config's 2000)")
    parser.add_argument("--out", default="")
    parser.add_argument("--episodes-per-client", type=int, default=5,
                        help="episodes in each client's generated shard (the run config's "
                        "default: 5)")
    parser.add_argument("--only", choices=["adaptive", "attacks", "failures", "churn"],
                        default=None,
                        help="the adaptive attacks (issue 29), the fixed attack cases, the "
                        "failure cases (both strategies), or the churn cases (a fresh random "
                        "30%% failing each round)")
    args = parser.parse_args()
    adaptive = args.only == "adaptive"
    rounds = args.rounds or (8 if adaptive else 20)
    hd_dim = args.hd_dim or (500 if adaptive else 2000)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    cases: list[tuple[str, str]] = []
    if adaptive:
        for setting in ("defaults", "plain", "anchor", "anchor-plain"):
            cases += [("clean", setting)] + [(a, setting) for a in ADAPTIVE]
    if args.only in (None, "attacks"):
        shared = [s for s in SETTINGS if not s.startswith("anchor")]
        cases += [("clean", s) for s in shared] + [(a, s) for a in ATTACKS for s in shared]
    if args.only == "churn":
        cases += [("clean", "defaults"), ("churn30", "defaults"), ("clean", "anchor")]
        cases += [(c, "anchor") for c in CHURN]
    elif args.only in (None, "failures"):
        # (plain averaging treats a failed reply as the defaults do: no separate row)
        cases += [("clean", "defaults"), ("clean", "anchor")] if args.only else []
        cases += [("fail30", "defaults"), ("fail30", "median")]
        cases += [("clean", "anchor")] * (not args.only) + [(f, "anchor") for f in FAILURES]
        cases += [("absent30", "defaults"), ("absent30", "anchor")]
    results = []
    for seed in args.seeds:
        for attack, setting in cases:
            r = run(seed, attack, setting, rounds, args.episodes_per_client, hd_dim)
            results.append(r)
            print(json.dumps(r), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    print(f"\n{rounds} rounds, hd-dim {hd_dim}, seeds {args.seeds}\n")
    print("| attack | setting | " + " | ".join(f"seed {s}" for s in args.seeds)
          + " | mean | vs clean | model norm vs clean | honest replies all accepted "
          "| failures counted exactly |")
    print("|---|---|" + "---|" * (len(args.seeds) + 5))

    def clean(setting: str, key: str) -> float:
        """The clean runs of the same setting (else of the defaults of its encoder)."""
        base = setting if any(r["attack"] == "clean" and r["setting"] == setting
                              for r in results) else \
            ("anchor" if setting.startswith("anchor") else "defaults")
        return float(np.mean([r[key] for r in results
                              if r["attack"] == "clean" and r["setting"] == base]))

    for attack, setting in dict.fromkeys(cases):
        got = [r for r in results if r["attack"] == attack and r["setting"] == setting]
        rets = [r["return"] for r in got]
        mean = float(np.mean(rets))
        norm = float(np.mean([r["model-norm"] for r in got]))
        exact = "yes" if all(r["counts-exact"] for r in got) else "NO"
        honest = "yes" if all(r["honest-accepted"] for r in got) else "NO"
        print(f"| {attack} | {setting} | " + " | ".join(f"{x:.1f}" for x in rets)
              + f" | {mean:.1f} | {100 * (mean / clean(setting, 'return') - 1):+.0f}% "
              f"| {norm / clean(setting, 'model-norm'):.2f}x | {honest} | {exact} |")


if __name__ == "__main__":
    main()

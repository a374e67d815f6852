"""One paper-suite cell with one factor changed: the factor study of issue 30
(BENCHMARKS.md, "LunarLander against the authors' code").

Runs ``fedqhd.studies.paper.run_app_cell`` (the Flower apps in process, the code ``flwr
run`` executes) for FedQHD on one task, setting and seed, with

- ``--preset FILE``: a preset file instead of the task's (copy
  ``fedqhd/presets/<env-id>.toml`` and change one value);
- ``--set KEY=VALUE`` (repeatable): any run-config key, as ``flwr run --run-config``
  reads it (``--set "weighting='uniform'"``: the clients' replies averaged alike, the
  authors' plain mean; ``--set norm-bound-factor=0``), checked before the first seed runs;
- ``--truncation-terminates``: a time-limit truncation treated as termination (no
  bootstrap; the authors' code's default), for ``update = "td"`` clients;
- ``--frozen N``: what acting while learning does to the return (shared encoder). For
  each round of the last 100 episodes, the greedy return (N episodes, the server's
  evaluation seeds, every policy on the same ones) of each client's reply, frozen as its
  round's episodes left it, and of the aggregate of those replies, beside the training
  return the clients earned while they learned;
- ``--diagnose``: what aggregation does to the clients' policies. Every round's train
  replies and the aggregate the next round sends are kept; on probe states (shared: the
  states 5 greedy episodes of the final global readout visit; heterogeneous: the anchors)
  it reports, per round, the clients' pairwise greedy agreement and each client's
  agreement with the aggregate it then receives (1 - that: how much of its policy one
  aggregation overrides), and the probe states' spread.

Prints one line per seed: the paper's metric (last-100 training return), the greedy
return of the final policy, the episode at which the last-100 return first reached 0,
100 and 200 (LunarLander: landings), the value bias of the start states (Q of the
episodes' start states minus the discounted return they realised, mean of the last
rounds: a learner's over- or under-estimation) and the CPU seconds, and appends it as
JSON to ``--out``. ``--against paper.json`` (a ``fedqhd bench --suite paper`` run of the
task's preset on the same seeds) then prints the change paired by seed: each seed's
return minus the preset's, mean and standard error, which removes the spread the seeds
share (Acrobot: a paired SE of about 1 on ten seeds; LunarLander's runs part ways more: 5-7
on four).

    OMP_NUM_THREADS=1 python benchmarks/factor_cell.py --env LunarLander-v3 \
        --setting shared --seeds 100-103 --preset my-preset.toml --against OUT/td/paper.json
"""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from fedqhd import acting
from fedqhd.commands.bench import run_config_overrides
from fedqhd.config import ConfigError
from fedqhd.envs import get_spec
from fedqhd.studies import paper


def _truncation_terminates(limit: int) -> Callable[[Any], Callable[[int], tuple]]:
    """``acting._one_env_step`` whose ``limit``-th step of an episode reports termination."""
    original = acting._one_env_step

    def one_env_step(env: Any) -> Callable[[int], tuple[np.ndarray, float, bool]]:
        step, count = original(env), [0]

        def counted(action: int) -> tuple[np.ndarray, float, bool]:
            obs, reward, terminated = step(action)
            count[0] += 1
            if terminated or count[0] >= limit:  # an episode ends here either way
                count[0], terminated = 0, True
            return obs, reward, terminated
        return counted
    return one_env_step


def _capture(rounds: list[dict[str, Any]]) -> Any:
    """``InProcessGrid.send_and_receive`` that records each train call's outgoing arrays
    (the aggregate of the round before) and its replies' arrays in ``rounds``."""
    from fedqhd.server.inprocess import InProcessGrid
    from fedqhd.strategies import contract as C

    original = InProcessGrid.send_and_receive

    def arrays(msg: Any) -> dict[str, np.ndarray]:
        record = msg.content.array_records.get(C.ARRAYS) if msg.has_content() else None
        return C.from_array_record(record) if record is not None else {}

    def send_and_receive(self: Any, messages: Any, *, timeout: float | None = None) -> Any:
        messages = list(messages)
        replies = list(original(self, messages, timeout=timeout))
        if messages and messages[0].metadata.message_type.startswith("train"):
            rounds.append({"sent": arrays(messages[0]),
                           "replies": [arrays(r) for r in replies]})
        return replies
    return send_and_receive


def _agreement(q: list[np.ndarray]) -> tuple[float, list[float]]:
    """Mean pairwise greedy agreement of ``q[1:]`` (clients' Q on probes) and each one's
    agreement with ``q[0]`` (the aggregate)."""
    greedy = [x.argmax(axis=1) for x in q]
    pairs = [float(np.mean(greedy[i] == greedy[j]))
             for i in range(1, len(q)) for j in range(i + 1, len(q))]
    return float(np.mean(pairs)), [float(np.mean(g == greedy[0])) for g in greedy[1:]]


def frozen_returns(cfg_keys: dict[str, Any], rounds: list[dict[str, Any]], episodes: int,
                   last: int) -> dict[str, Any]:
    """Greedy returns of the last ``last`` rounds' replies (each client's readout, frozen)
    and of the aggregate each round's replies gave (the next round's ``sent``), each over
    the same ``episodes`` evaluation episodes (see the module docstring)."""
    from fedqhd.learners import fqi, parse_run_config
    from fedqhd.strategies import contract as C

    cfg = parse_run_config(cfg_keys).replace(eval_episodes=episodes)
    if cfg.encoder != "shared":
        raise ValueError("--frozen evaluates readouts: the shared encoder only")
    encoder = fqi.client_encoder(cfg, 0)

    def mean_return(readout: np.ndarray) -> float:
        return float(fqi.greedy_return(cfg, encoder, readout).mean())

    replies, aggregates = [], []
    for r in range(max(0, len(rounds) - 1 - last), len(rounds) - 1):
        aggregates.append(mean_return(rounds[r + 1]["sent"][C.READOUT]))
        replies += [mean_return(a[C.READOUT]) for a in rounds[r]["replies"]]
    return {"rounds": len(aggregates), "episodes": episodes,
            "replies": round(float(np.mean(replies)), 1),
            "aggregates": round(float(np.mean(aggregates)), 1)}


def diagnose(env_id: str, setting: str, cfg_keys: dict[str, Any],
             rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per round: clients' pairwise greedy agreement and their agreement with the next
    aggregate, on probe states (see the module docstring)."""
    import gymnasium

    from fedqhd.learners import fqi, parse_run_config
    from fedqhd.strategies import contract as C

    cfg = parse_run_config(cfg_keys)
    if setting == "shared":
        encoder = fqi.client_encoder(cfg, 0)
        final = rounds[-1]["sent"][C.READOUT]  # the aggregate of the round before the last
        env = gymnasium.make(env_id)
        probes = []
        for episode in range(5):
            obs, _ = env.reset(seed=10_000 + episode)
            for _ in range(get_spec(env_id).max_episode_steps):
                probes.append(np.asarray(obs, dtype=np.float64))
                q = encoder.encode32(np.asarray(obs)[None]).astype(np.float64) @ final
                obs, _, terminated, truncated, _ = env.step(int(q.argmax()))
                if terminated or truncated:
                    break
        feats = encoder.encode32(np.array(probes)).astype(np.float64)

        def q_of(arrays: dict[str, np.ndarray]) -> np.ndarray:
            return feats @ arrays[C.READOUT]
        spread = np.array(probes).std(axis=0)
    else:
        def q_of(arrays: dict[str, np.ndarray]) -> np.ndarray:
            return arrays[C.TEACHER] if C.TEACHER in arrays else arrays[C.Q_ANCHORS]
        anchors = rounds[1]["sent"][C.ANCHORS]
        probes, spread = list(anchors), anchors.std(axis=0)
    rows = []
    for r in range(len(rounds) - 1):  # round r's replies, then the aggregate round r + 1 sends
        replies, aggregate = rounds[r]["replies"], rounds[r + 1]["sent"]
        if not replies or any(not a for a in replies):
            continue
        pair, own = _agreement([q_of(aggregate), *(q_of(a) for a in replies)])
        rows.append({"round": r + 1, "pairwise": round(pair, 3),
                     "with-aggregate": [round(x, 3) for x in own]})
    return {"probe-states": len(probes), "probe-std": [round(float(x), 3) for x in spread],
            "rounds": rows}


def run(env_id: str, setting: str, seed: int, preset: str | None,
        truncation_terminates: bool, diagnose_policies: bool = False,
        frozen_episodes: int = 0, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """One cell with the factors given (``overrides``: run-config keys, kebab-case);
    returns what it printed."""
    base = paper.app_run_config

    def run_config(*args: Any, **kwargs: Any) -> dict[str, Any]:
        keys = base(*args, **kwargs)
        if preset:
            keys["preset"] = preset
        keys.update(overrides or {})
        return keys

    patches: list[Any] = [mock.patch.object(paper, "app_run_config", run_config)]
    rounds: list[dict[str, Any]] = []
    if diagnose_policies or frozen_episodes:
        from fedqhd.server.inprocess import InProcessGrid
        patches.append(mock.patch.object(InProcessGrid, "send_and_receive", _capture(rounds)))
    if truncation_terminates:
        limit = get_spec(env_id).max_episode_steps
        patches.append(mock.patch.object(acting, "_one_env_step",
                                         _truncation_terminates(limit)))
    for p in patches:
        p.start()
    try:
        cell = paper.run_app_cell("fedqhd", env_id, setting, seed)
    finally:
        for p in patches:
            p.stop()
    def first_episode(level: float) -> int | None:
        return next((e for e, v in cell["curve"] if v >= level), None)

    late_bias = [b for _, b in cell["value-bias"]][-5:]
    keys = run_config("fedqhd", env_id, setting, seed)
    extra: dict[str, Any] = {}
    if frozen_episodes:
        from fedqhd.learners import parse_run_config

        # the rounds of the last 100 episodes (the training return's)
        last = -(-100 // parse_run_config(keys).episodes_per_round)
        extra["frozen"] = {"train-return-last100": round(cell["train-return-last100"], 1),
                           **frozen_returns(keys, rounds, frozen_episodes, last)}
    if diagnose_policies:
        extra["policies"] = diagnose(env_id, setting, keys, rounds)
    return {"env": env_id, "setting": setting, "seed": seed, "preset": preset,
            "weighting": keys.get("weighting", "transitions"),
            "truncation-terminates": truncation_terminates,
            **({"set": overrides} if overrides else {}),
            "train-return-last100": round(cell["train-return-last100"], 1),
            "greedy-return": round(cell["greedy-return"], 1),
            "episode-reaching": {str(v): first_episode(v) for v in (0, 100, 200)},
            "value-bias-last-rounds": round(float(np.mean(late_bias)), 2),
            "replies-rejected": cell["replies-rejected"],
            "cpu-s": round(cell["cpu-s"], 1), **extra}


def paired_difference(rows: list[dict[str, Any]],
                      cells: list[dict[str, Any]]) -> dict[str, float]:
    """Each row's last-100 return minus the FedQHD cell of the same task, setting and seed
    in ``cells`` (a paper suite's), over the seeds both have: their number, the mean
    difference and its standard error (nan for one seed)."""
    base = {(c["env-id"], c["setting"], c["seed"]): c["train-return-last100"]
            for c in cells if c["method"] == "fedqhd"}
    diffs = np.array([r["train-return-last100"] - base[key] for r in rows
                      if (key := (r["env"], r["setting"], r["seed"])) in base])
    if not diffs.size:
        raise ValueError("none of these seeds is in the baseline's cells")
    se = float(diffs.std(ddof=1) / np.sqrt(diffs.size)) if diffs.size > 1 else float("nan")
    return {"seeds": int(diffs.size), "difference": float(diffs.mean()), "se": se}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="LunarLander-v3")
    p.add_argument("--setting", default="shared", choices=paper.SETTINGS)
    p.add_argument("--seeds", default="42,43,44", help="comma-separated, or ranges: 42-44")
    p.add_argument("--preset", help="a preset file instead of the task's")
    p.add_argument("--truncation-terminates", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a run-config key, as flwr run --run-config reads it (repeatable)")
    p.add_argument("--frozen", type=int, default=0, metavar="N",
                   help="greedy returns (N episodes) of the last 100 episodes' replies and "
                        "aggregates, frozen (shared encoder)")
    p.add_argument("--diagnose", action="store_true",
                   help="clients' greedy agreement, and with each aggregate, per round")
    p.add_argument("--out", type=Path, default=Path("factor-cells.jsonl"))
    p.add_argument("--against", type=Path,
                   help="a paper suite's paper.json on the same seeds: print the paired change")
    args = p.parse_args()
    # `kill PID` unwinds as Ctrl-C does: the running cell removes its scratch folder
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.frozen < 0 or (args.frozen and args.setting != "shared"):
        p.error("--frozen takes a positive number of episodes, with --setting shared")
    try:
        overrides = run_config_overrides(args.set)
    except ConfigError as exc:
        p.error(str(exc))
    cells = json.loads(args.against.read_text())["cells"] if args.against else None
    rows = []
    for seed in paper.parse_seeds(args.seeds):
        row = run(args.env, args.setting, seed, args.preset,
                  args.truncation_terminates, args.diagnose, args.frozen, overrides)
        print(json.dumps(row), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
    if cells is not None:
        d = paired_difference(rows, cells)
        print(f"paired with {args.against}: {d['seeds']} seeds, difference "
              f"{d['difference']:+.1f} (SE {d['se']:.1f})")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the rows of the seeds that ended are in --out already
        raise SystemExit("factor_cell.py: stopped") from None

"""One paper-suite cell with one factor changed: the factor study of issue 30
(BENCHMARKS.md, "LunarLander against the authors' code").

Runs ``fedqhd.studies.paper.run_app_cell`` (the Flower apps in process, the code ``flwr
run`` executes) for FedQHD on one task, setting and seed, with

- ``--preset FILE``: a preset file instead of the task's (copy
  ``fedqhd/presets/<env-id>.toml`` and change one value);
- ``--weighting uniform``: the clients' replies averaged alike (the authors' plain
  mean) instead of by their transitions;
- ``--truncation-terminates``: a time-limit truncation treated as termination (no
  bootstrap; the authors' code's default), for ``update = "td"`` clients.

Prints one line per seed: the paper's metric (last-100 training return), the greedy
return of the final policy, the episode at which the last-100 return first reached 0,
100 and 200 (LunarLander: landings), the value bias of the start states (Q of the
episodes' start states minus the discounted return they realised, mean of the last
rounds: a learner's over- or under-estimation) and the CPU seconds, and appends it as
JSON to ``--out``.

    OMP_NUM_THREADS=1 python benchmarks/factor_cell.py --env LunarLander-v3 \
        --setting shared --seeds 42,43,44 --preset my-preset.toml
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from fedqhd import acting
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


def run(env_id: str, setting: str, seed: int, preset: str | None, weighting: str | None,
        truncation_terminates: bool) -> dict[str, Any]:
    """One cell with the factors given; returns what it printed."""
    base = paper.app_run_config

    def run_config(*args: Any, **kwargs: Any) -> dict[str, Any]:
        keys = base(*args, **kwargs)
        if preset:
            keys["preset"] = preset
        if weighting:
            keys["weighting"] = weighting
        return keys

    patches = [mock.patch.object(paper, "app_run_config", run_config)]
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
    return {"env": env_id, "setting": setting, "seed": seed, "preset": preset,
            "weighting": weighting or "transitions",
            "truncation-terminates": truncation_terminates,
            "train-return-last100": round(cell["train-return-last100"], 1),
            "greedy-return": round(cell["greedy-return"], 1),
            "episode-reaching": {str(v): first_episode(v) for v in (0, 100, 200)},
            "value-bias-last-rounds": round(float(np.mean(late_bias)), 2),
            "cpu-s": round(cell["cpu-s"], 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="LunarLander-v3")
    p.add_argument("--setting", default="shared", choices=paper.SETTINGS)
    p.add_argument("--seeds", default="42,43,44", help="comma-separated, or ranges: 42-44")
    p.add_argument("--preset", help="a preset file instead of the task's")
    p.add_argument("--weighting", choices=("uniform", "transitions"))
    p.add_argument("--truncation-terminates", action="store_true")
    p.add_argument("--out", type=Path, default=Path("factor-cells.jsonl"))
    args = p.parse_args()
    for seed in paper.parse_seeds(args.seeds):
        row = run(args.env, args.setting, seed, args.preset, args.weighting,
                  args.truncation_terminates)
        print(json.dumps(row), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

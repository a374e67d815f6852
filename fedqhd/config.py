"""The run configuration, parsed and validated in one place.

Keys are Flower's kebab-case run-config keys (``[tool.flwr.app.config]`` in
``pyproject.toml`` holds the same defaults). ServerApp and ClientApp both build
a :class:`RunConfig` from ``context.run_config``; under the deprecated
``run_simulation`` that dict is empty and the defaults below apply.

The checks here are those of the keys themselves and of keys against each other; what
one learner needs of a run (its tasks, its strategies) is that learner's
``check_config``, which :func:`fedqhd.learners.parse_run_config` adds: the apps,
studies and commands parse with it (this module sits below the learners and knows only
their names, :data:`LEARNERS`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedqhd.anchors import ANCHOR_FILE_SUFFIXES, ANCHOR_SOURCES
from fedqhd.data.partition import PARTITIONS
from fedqhd.encoders import ENCODER_KINDS
from fedqhd.envs import env_ids, get_entry, get_spec, load_env_modules
from fedqhd.online import default_capacity
from fedqhd.presets import (
    REMOVED_KEYS,
    OnlineSettings,
    PoolSettings,
    PresetError,
    builtin_preset,
    load_preset,
    removed_keys_hint,
    resolve_preset,
)
from fedqhd.presets.derive import DeriveError, derived_preset
from fedqhd.strategies.base import WEIGHTINGS
from fedqhd.strategies.screening import AGGREGATIONS

#: the function-space strategy: auto (the preset's, else avg for a shared encoder, anchor
#: otherwise), avg, anchor, exact (pooled ridge FQI from sufficient statistics; shared
#: encoder, fqi, offline), and the FedQHD paper's baselines (fqi, online): none (independent
#: learners, never aggregated), truncate (truncate-and-average of readouts of different D_i),
#: pooled (the pooled-data oracle: ridge FQI on the union of the buffers, from sufficient
#: statistics; shared encoder)
STRATEGIES: tuple[str, ...] = ("auto", "avg", "anchor", "exact", "independent", "truncate",
                                "pooled")
#: strategies that exist only as the paper's online baselines
BASELINE_STRATEGIES: tuple[str, ...] = ("independent", "truncate", "pooled")
#: numbers of a node learner's in-memory feature table (float32: half the bytes, rounded)
FEATURE_DTYPES: tuple[str, ...] = ("float64", "float32")
#: the local learners, run-config ``learner``; the registry (:mod:`fedqhd.learners`) holds
#: one entry per name (a test keeps the two in step) and checks each learner's own keys
LEARNERS: tuple[str, ...] = ("fqi", "pool", "dqn")
#: run-config ``privacy``: none, zcdp (private FedQHD: one noisy readout per client), or
#: dp-fedavg (offline FedAvg-DQN under Flower's server-side fixed-clipping DP wrapper)
PRIVACY_MODES: tuple[str, ...] = ("none", "zcdp", "dp-fedavg")
#: where the data come from: fixed private shards, or episodes collected every round
PROTOCOLS: tuple[str, ...] = ("offline", "online")
#: online protocol: "auto" takes the task's preset file (:mod:`fedqhd.presets`), "manual"
#: the keys as given and the online learner's defaults; any other value is a preset's path
PRESET_MODES: tuple[str, ...] = ("auto", "manual")


class ConfigError(ValueError):
    """A run-config key has a bad value; the message names the key and the valid range."""


def _anchor_source(v: Any) -> str | None:
    if v in ANCHOR_SOURCES or (isinstance(v, str) and v.endswith(ANCHOR_FILE_SUFFIXES)):
        return None
    return ("rollouts, uniform, or the path of a .npy or .npz anchor file"
            f"{did_you_mean(v, ANCHOR_SOURCES)}")


def _preset(v: Any) -> str | None:
    if v in PRESET_MODES or (isinstance(v, str) and v.endswith(".toml")):
        return None
    return "auto, manual, or the path of a preset file (.toml)"


def did_you_mean(word: Any, options: Any) -> str:
    """`` (did you mean 'x'?)`` naming the near matches of ``word`` among ``options``
    (difflib), or empty: a misspelling should name its fix, not only the valid list."""
    if not isinstance(word, str):
        return ""
    near = difflib.get_close_matches(word, [str(o) for o in options], n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""


def _choice(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda v: (None if v in options
                      else f"one of {', '.join(options)}{did_you_mean(v, options)}")


def _int_range(lo: int, hi: int) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"an integer in [{lo}, {hi}]"


def _float_range(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False
                 ) -> Callable[[Any], str | None]:
    def check(v: float) -> str | None:
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        return None if ok else (f"a number in {'(' if lo_open else '['}{lo}, {hi}"
                                f"{')' if hi_open else ']'}")
    return check


def _registered_env(v: Any) -> str | None:
    """fedqhd's ids and any usable one gymnasium knows; else why not, with near matches."""
    try:
        get_entry(v)
    except ValueError as exc:
        return f"a registered env id: {exc}"
    return None


def _key(check: Callable[[Any], str | None], doc: str) -> dict[str, Any]:
    return {"check": check, "doc": doc}


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a fedqhd run (field ``foo_bar`` is run-config key ``foo-bar``)."""

    seed: int = field(default=0, metadata=_key(_int_range(0, 2**31 - 1),
                                                "seeds data, encoders, anchors, sampling"))
    num_server_rounds: int = field(default=20, metadata=_key(_int_range(1, 100_000),
                                                            "federated rounds"))
    env_module: str = field(default="", metadata=_key(
        lambda v: None, "module(s) imported first in every process (comma-separated); "
        "importing registers the user's environments"))
    env_id: str = field(default="CartPole-v1", metadata=_key(
        _registered_env, "a registered task (pool: the inventory)"))
    data_dir: str = field(default="", metadata=_key(lambda v: None,
                                                    "shard folder; empty: generate"))
    partition: str = field(default="behaviour-skew",
                           metadata=_key(_choice(PARTITIONS), "how clients differ"))
    episodes_per_client: int = field(default=5, metadata=_key(_int_range(1, 1_000_000),
                                                              "episodes in a generated shard"))
    epsilon_min: float = field(default=0.8, metadata=_key(_float_range(0.0, 1.0),
                                                          "behaviour randomness, lowest"))
    epsilon_max: float = field(default=1.0, metadata=_key(_float_range(0.0, 1.0),
                                                          "behaviour randomness, highest"))
    encoder: str = field(default="shared", metadata=_key(_choice(ENCODER_KINDS),
                                                         "one encoder for all or one each"))
    hd_dim: int = field(default=2000, metadata=_key(_int_range(8, 200_000),
                                                    "D of the shared encoder"))
    bandwidth: float = field(default=1.0, metadata=_key(_float_range(0.0, 1e6, lo_open=True),
                                                        "RBF gamma (base gamma if heterogeneous)"))
    learner: str = field(default="fqi", metadata=_key(
        _choice(LEARNERS), "local learner: fqi, pool (private) or dqn (the paper's "
        "deep baselines: FedAvg-DQN, strategy anchor: distillation FedDQN; online protocol, "
        "or offline FedAvg-DQN on the shards; extra dqn)"))
    gamma: float = field(default=0.99, metadata=_key(_float_range(0.0, 1.0, hi_open=True),
                                                     "discount"))
    ridge: float = field(default=0.1, metadata=_key(_float_range(0.0, 1e9, lo_open=True),
                                                    "ridge penalty of FQI and compilation"))
    local_iterations: int = field(default=3, metadata=_key(_int_range(1, 10_000),
                                                           "FQI sweeps per round; offline dqn: "
                                                           "Adam steps per round"))
    proximal: float = field(default=0.3, metadata=_key(
        _float_range(0.0, 1e9), "pull toward the global readout (online readout averaging) "
        "or the compiled teacher (anchor)"))
    admm_penalty: float = field(default=2.5e-4, metadata=_key(
        _float_range(0.0, 1e6, lo_open=True), "per-transition ADMM penalty (offline readout "
        "averaging: consensus ADMM, whose fixed point is pooled FQI)"))
    strategy: str = field(default="auto", metadata=_key(
        _choice(STRATEGIES), "auto: the preset's (MountainCar shared: anchor), else avg if "
        "shared, anchor otherwise; online baselines: independent (independent learners), "
        "truncate (truncate-and-average)"))
    weighting: str = field(default="transitions", metadata=_key(_choice(WEIGHTINGS),
                                                                "client weights"))
    fraction_train: float = field(default=1.0, metadata=_key(
        _float_range(0.0, 1.0, lo_open=True), "fraction of nodes trained per round"))
    anchor_source: str = field(default="rollouts", metadata=_key(_anchor_source, (
        "where anchors come from: short random rollouts, uniform in the observation bounds, "
        "or your file (a .npy of shape (m, obs_dim), or a .npz with key 'anchors')")))
    num_anchors: int = field(default=1000, metadata=_key(_int_range(1, 1_000_000),
                                                         "m, anchor states"))
    min_nodes: int = field(default=2, metadata=_key(_int_range(1, 100_000),
                                                    "nodes to wait for before a round"))
    output_dir: str = field(default="outputs", metadata=_key(
        lambda v: None if v else "a folder path", "results go to <output-dir>/<date>/<time>/"))
    feature_dtype: str = field(default="float64", metadata=_key(_choice(FEATURE_DTYPES), (
        "numbers of a node learner's in-memory features: float64 (exact) or float32 (half "
        "the bytes, 10x cheaper encode; readouts move about 1e-7 relative)")))
    round_timeout: float = field(default=600.0, metadata=_key(
        _float_range(0.0, 1e6, lo_open=True),
        "seconds to wait for a round's replies; late or lost ones count as timed out"))
    resume_from: str = field(default="", metadata=_key(
        lambda v: None, "a stopped run's folder: continue it from its last checkpoint "
        "(same config but num-server-rounds, output-dir, round-timeout, node-wait-timeout, "
        "verbose); offline fqi only; empty: a new run"))
    verbose: bool = field(default=False, metadata=_key(
        lambda v: None, "show Flower's full log on the console (per-round metrics, its "
        "results dump, known-harmless warnings); it always goes to run.log in the run "
        "folder"))
    # ---- safeguards against faulty or malicious clients ----
    aggregation: str = field(default="mean", metadata=_key(
        _choice(AGGREGATIONS), "how replies (readouts, anchor Q-values, evaluation metrics) "
        "are combined: weighted mean, coordinate-wise median, trimmed mean (of the clipped "
        "replies)"))
    trim_fraction: float = field(default=0.1, metadata=_key(
        _float_range(0.0, 0.5, hi_open=True),
        "trimmed-mean: drop ceil(trim-fraction * n) lowest and highest values per coordinate"))
    clip_factor: float = field(default=3.0, metadata=_key(
        _float_range(0.0, 1e12), "pull replies further than this multiple of the deviation "
        "scale (the median distance of the round's replies from their coordinate-wise median, "
        "growing at most 2x a round) back to that distance (0: off)"))
    norm_bound_factor: float = field(default=10.0, metadata=_key(
        _float_range(0.0, 1e12), "refuse replies further than this multiple of the "
        "deviation scale from the replies' coordinate-wise median (0: off)"))
    weight_cap_factor: float = field(default=10.0, metadata=_key(
        _float_range(0.0, 1e12), "cap a client's weight at this multiple of the round's "
        "median claimed num-transitions (0: off)"))
    stale_rounds: int = field(default=10, metadata=_key(
        _int_range(0, 1_000_000), "a client (its node) and its stored reply (aggregate "
        "latest) are forgotten after this many rounds without an accepted reply (0: never)"))
    min_success_fraction: float = field(default=0.5, metadata=_key(
        _float_range(0.0, 1.0), "the run fails if fewer than this fraction of the sampled "
        "train replies is accepted (and always if no round aggregated anything)"))
    node_wait_timeout: float = field(default=300.0, metadata=_key(
        _float_range(0.0, 1e6), "seconds to wait for min-nodes nodes before a round; then "
        "the run fails"))
    protocol: str = field(default="offline", metadata=_key(
        _choice(PROTOCOLS), "offline: fixed private shards; online: clients collect "
        "episodes-per-round episodes with their current policy every round (fqi)"))
    online_episodes: int = field(default=600, metadata=_key(
        _int_range(1, 10_000_000), "online, preset = auto: episodes each client "
        "collects in the run (the paper: 600); sets num-server-rounds to "
        "ceil(online-episodes / episodes-per-round)"))
    episodes_per_round: int = field(default=20, metadata=_key(
        _int_range(1, 100_000), "online: episodes each client collects per round"))
    preset: str = field(default="auto", metadata=_key(
        _preset, "auto = the task's preset (fedqhd/presets/<env-id>.toml, online runs; "
        "dqn.toml, pool.toml for those learners), or settings derived for an env without "
        "one; it sets hd-dim, bandwidth, gamma, ridge, proximal, local-iterations, "
        "episodes-per-round and the learner's own settings, and online as many rounds as "
        "online-episodes take; a path = your own preset file; manual = the keys as given "
        "and the learner's defaults"))
    #: the online learner's own settings, from the preset (not a run-config key)
    online: OnlineSettings = field(default=OnlineSettings(), init=False,
                                   metadata={"check": lambda v: None, "key": False})
    eval_episodes: int = field(default=10, metadata=_key(_int_range(1, 100_000),
                                                         "greedy episodes per evaluation"))
    eval_every: int = field(default=1, metadata=_key(_int_range(1, 100_000), (
        "evaluate the greedy policy every this-many rounds and after the last (greedy "
        "evaluation is ~15 % of an online run's CPU)")))
    # ---- pool learner (learner = "pool", env-id = fedqhd/Inventory-v0; its rho: privacy-rho) ----
    non_private: bool = field(default=False, metadata=_key(
        lambda v: None, "mark the run non-private: only then are noise-free clients (node "
        "config noise = none) accepted; it switches no node's noise off"))
    # ---- private FedQHD (learner = "fqi", offline or online; strategy avg, or anchor with
    # heterogeneous encoders) ----
    privacy: str = field(default="none", metadata=_key(_choice(PRIVACY_MODES), (
        "none; zcdp: private FedQHD, each client's one noisy release (sample-and-aggregate "
        "over episode chunks, advantages clipped: the readout with a shared encoder, its values "
        "on the anchors with heterogeneous ones) under rho-zCDP per trajectory (the budget "
        "and the noise are the node's); dp-fedavg: offline "
        "FedAvg-DQN under Flower's server-side fixed-clipping wrapper, rho-zCDP per client "
        "(all its trajectories; the trusted server adds the noise; needs fraction-train 1, "
        "aggregation mean; averages uniformly, no screening; noise calibrated on min-nodes "
        "clients)")))
    privacy_rho: float = field(default=1.0, metadata=_key(
        _float_range(0.0, 1e6, lo_open=True), "zCDP rho of one client's release (its "
        "only one: privacy = zcdp, or learner = pool), at most the node config's 'rho' (a "
        "higher one is lowered to it; the budget and the noise are the node's); dp-fedavg: "
        "rho of the whole run (noise multiplier sqrt(num-server-rounds / (2 rho)))"))
    privacy_chunks: int = field(default=50, metadata=_key(_int_range(1, 1_000_000), (
        "privacy = zcdp: m, the chunks a client's episodes are hashed into; each chunk fits "
        "FQI alone (ridge, local-iterations sweeps); the release's sensitivity is 2 R / m "
        "(2 R sqrt(M) / m on M anchors); more chunks, less noise, but each needs about 40 "
        "episodes (docs/private-fedqhd.md)")))
    privacy_clip_norm: float = field(default=5.0, metadata=_key(
        _float_range(0.0, 1e9, lo_open=True), "privacy = zcdp: R, the Frobenius norm each "
        "chunk's advantage readout (centred over actions) is clipped to (on M anchors its "
        "advantages to R sqrt(M)); dp-fedavg: C, the L2 norm each client's network update "
        "is clipped to"))
    #: the POOL learner's settings, from the preset (not a run-config key)
    pool: PoolSettings = field(default=PoolSettings(), init=False,
                               metadata={"check": lambda v: None, "key": False})

    def __post_init__(self) -> None:
        if not isinstance(self.env_module, str):
            raise ConfigError(f"run-config key 'env-module' = {self.env_module!r} is invalid: "
                              "expected a module name (str)")
        try:  # before any check: the module registers the environments env-id may name
            load_env_modules(self.env_module)
        except ImportError as exc:
            raise ConfigError(f"run-config key 'env-module' = {self.env_module!r} is invalid: "
                              f"{exc}") from None
        for f in fields(self):
            value = getattr(self, f.name)
            problem = f.metadata["check"](value)
            if problem:
                raise ConfigError(f"run-config key '{_kebab(f.name)}' = {value!r} is invalid: "
                                  f"expected {problem}")
        # the keys as given are checked above; a preset's values replace them
        self._take_preset()
        if self.epsilon_min > self.epsilon_max:
            raise ConfigError(f"run-config keys 'epsilon-min' ({self.epsilon_min}) and "
                              f"'epsilon-max' ({self.epsilon_max}): need min <= max")
        if self.strategy == "avg" and self.encoder != "shared":
            raise ConfigError("run-config key 'strategy' = 'avg' needs 'encoder' = 'shared': "
                              "readouts of different encoders cannot be averaged; use 'anchor'")
        if self.privacy == "zcdp":
            self._check_private()
        if self.privacy == "dp-fedavg":
            self._check_dp_fedavg()
        if self.resolved_strategy == "exact":
            if self.encoder != "shared":
                raise ConfigError("run-config key 'strategy' = 'exact' needs 'encoder' = "
                                  "'shared': sufficient statistics of different encoders "
                                  "cannot be summed; use 'anchor'")
            if self.learner != "fqi" or self.protocol != "offline":
                raise ConfigError("run-config key 'strategy' = 'exact' needs 'learner' = 'fqi' "
                                  f"and 'protocol' = 'offline', got {self.learner!r} and "
                                  f"{self.protocol!r}")
            if self.fraction_train != 1.0:
                raise ConfigError("run-config key 'strategy' = 'exact' needs 'fraction-train' "
                                  f"= 1 (the pooled sweep needs every client), got "
                                  f"{self.fraction_train}")
            if self.aggregation != "mean":
                raise ConfigError("run-config key 'strategy' = 'exact' sums sufficient "
                                  "statistics exactly: 'aggregation' must be 'mean', got "
                                  f"{self.aggregation!r}")
        if self.strategy in BASELINE_STRATEGIES and (self.learner != "fqi"
                                                     or self.protocol != "online"):
            raise ConfigError(f"run-config key 'strategy' = {self.strategy!r} (a baseline of "
                              "the FedQHD paper's online protocol) needs 'learner' = 'fqi' and "
                              f"'protocol' = 'online', got {self.learner!r} and "
                              f"{self.protocol!r}")
        if self.strategy == "pooled":
            self._check_pooled()
        if self.protocol == "online" and self.learner not in ("fqi", "dqn"):
            raise ConfigError(f"run-config key 'protocol' = 'online' needs 'learner' = 'fqi' "
                              f"or 'dqn', got {self.learner!r}")
        if self.online.obs_scale and len(self.online.obs_scale) != get_spec(self.env_id).obs_dim:
            raise ConfigError(f"online setting 'obs-scale' = {list(self.online.obs_scale)} "
                              f"needs {get_spec(self.env_id).obs_dim} multipliers for "
                              f"{self.env_id}, got {len(self.online.obs_scale)}")
        if self.online.td_replay and self.online.update != "td":
            raise ConfigError(f"online setting 'td-replay' = {self.online.td_replay} replays a "
                              "td client's transitions: it needs 'update' = 'td', got "
                              f"{self.online.update!r} (an fqi client refits on its buffer)")
        if self.online.td_replay_start and not self.online.td_replay:
            raise ConfigError(f"online setting 'td-replay-start' = "
                              f"{self.online.td_replay_start} delays replay, but 'td-replay' "
                              "is 0: set td-replay (updates per step) too, or leave it out")
        if self.resume_from and (self.protocol == "online" or self.learner != "fqi"):
            raise ConfigError(
                f"run-config key 'resume-from' needs 'learner' = 'fqi' and 'protocol' = "
                f"'offline', got {self.learner!r} and {self.protocol!r}: "
                + ("online clients' buffers live in their node states, which the server's "
                   "checkpoint does not hold"
                   if self.protocol == "online" else
                   "a POOL client's release lives only in its node state, and releasing "
                   "again would spend its privacy budget again"))

    def _check_private(self) -> None:
        """Private FedQHD: one noisy release per client (a readout with a shared encoder,
        anchor advantages with heterogeneous ones), averaged; offline fqi."""
        wanted = "avg" if self.encoder == "shared" else "anchor"
        if self.resolved_strategy != wanted:
            raise ConfigError(f"run-config key 'privacy' = 'zcdp' with 'encoder' = "
                              f"{self.encoder!r} needs 'strategy' = {wanted!r} (or 'auto'), "
                              f"got {self.strategy!r}: a private client releases one "
                              f"{'readout' if wanted == 'avg' else 'set of anchor values'}")
        if self.learner != "fqi":
            raise ConfigError("run-config key 'privacy' = 'zcdp' needs 'learner' = 'fqi', got "
                              f"{self.learner!r}")
        if self.resume_from:
            raise ConfigError("run-config key 'resume-from' cannot continue a private run "
                              "(privacy = 'zcdp'): its releases live in the node states, and "
                              "releasing again would spend the budget again")

    def _check_dp_fedavg(self) -> None:
        """DP-FedAvg: offline FedAvg-DQN, every client every round, a plain mean."""
        if self.learner != "dqn" or self.protocol != "offline":
            raise ConfigError("run-config key 'privacy' = 'dp-fedavg' needs 'learner' = 'dqn' "
                              f"and 'protocol' = 'offline', got {self.learner!r} and "
                              f"{self.protocol!r} (private FedQHD is privacy = 'zcdp')")
        if self.resolved_strategy != "avg":
            raise ConfigError("run-config key 'privacy' = 'dp-fedavg' averages networks: it "
                              "needs 'strategy' = 'avg' (or 'auto') and 'encoder' = 'shared', "
                              f"got {self.strategy!r} and {self.encoder!r}")
        if self.fraction_train != 1.0:
            raise ConfigError("run-config key 'privacy' = 'dp-fedavg' accounts for every "
                              "client in every round: it needs 'fraction-train' = 1, got "
                              f"{self.fraction_train}")
        if self.aggregation != "mean":
            raise ConfigError("run-config key 'privacy' = 'dp-fedavg' calibrates its noise to "
                              "a mean of clipped updates: 'aggregation' must be 'mean', got "
                              f"{self.aggregation!r}")
        if self.non_private:
            raise ConfigError("run-config key 'non-private' = true marks zcdp runs whose nodes "
                              "add no noise; dp-fedavg's noise is the server's: for a "
                              "non-private run set 'privacy' = 'none'")

    def _check_pooled(self) -> None:
        """The pooled oracle sums the statistics of one feature space, of every client, in
        primal form (per-action Grams, D x D)."""
        if self.online.update != "fqi":
            raise ConfigError("run-config key 'strategy' = 'pooled' (the pooled-data oracle) "
                              "sums the clients' buffers' statistics: it needs the preset's "
                              f"update = 'fqi', got {self.online.update!r}")
        if self.encoder != "shared":
            raise ConfigError("run-config key 'strategy' = 'pooled' (the pooled-data oracle) "
                              "needs 'encoder' = 'shared': the statistics of different "
                              f"encoders cannot be summed, got {self.encoder!r}")
        if self.fraction_train != 1.0:
            raise ConfigError("run-config key 'strategy' = 'pooled' needs 'fraction-train' = "
                              "1 (the oracle pools every client's buffer), got "
                              f"{self.fraction_train}")
        if self.aggregation != "mean":
            raise ConfigError("run-config key 'strategy' = 'pooled' sums sufficient "
                              "statistics exactly: 'aggregation' must be 'mean', got "
                              f"{self.aggregation!r}")
        capacity = default_capacity(self.hd_dim)
        if self.hd_dim > capacity:
            raise ConfigError(f"run-config key 'strategy' = 'pooled' needs 'hd-dim' <= the "
                              f"buffer's capacity (primal Grams), got hd-dim {self.hd_dim} "
                              f"and capacity {capacity} (min(20000, 1e7 / hd-dim))")

    def _take_preset(self) -> None:
        """Take the settings ``preset`` names: a preset's (or the derived) run-config keys
        (refused when given with another value: the preset would replace them without a
        word; its ``strategy`` only replaces ``auto``, and not in a private run), its learner
        settings, and as many rounds as ``online-episodes`` take."""
        if self.preset == "manual":
            return
        pool = self.learner == "pool"
        cls = PoolSettings if pool else OnlineSettings
        try:
            if self.preset == "auto":
                path = builtin_preset("pool" if pool else "dqn" if self.learner == "dqn"
                                      else self.env_id)
                if (path is None and self.learner == "fqi"
                        and self.env_id in env_ids("discrete")):  # an env nobody tuned
                    data = derived_preset(self.env_id, self.protocol, self.online_episodes)
                    source = f"the settings derived for {self.env_id}"
                elif path is None or (self.protocol == "offline" and not pool):
                    return  # the built-in tasks' presets are their online settings
                else:
                    data, source = load_preset(path, cls), f"preset {path}"
            else:
                path = Path(self.preset).expanduser()
                data, source = load_preset(path, cls), f"preset {path}"
            run_keys, settings = resolve_preset(data, self.encoder, source, cls)
        except (PresetError, DeriveError) as exc:
            raise ConfigError(f"run-config key 'preset' = {self.preset!r}: {exc}") from None
        if self.strategy != "auto" or self.privacy != "none":
            # the preset's strategy is what auto stands for; a private release fixes its own
            run_keys.pop("strategy", None)
        by_key = {_kebab(f.name): f for f in fields(self)}
        values: dict[str, Any] = {}
        for key, value in run_keys.items():
            f = by_key[key]
            try:
                value = _coerce(key, value, type(f.default))
            except ConfigError:
                raise ConfigError(f"{source}: key '{key}' = {value!r} has type "
                                  f"{type(value).__name__}, expected "
                                  f"{type(f.default).__name__}") from None
            problem = f.metadata["check"](value)
            if problem:
                raise ConfigError(f"{source}: key '{key}' = {value!r} is invalid: "
                                  f"expected {problem}")
            values[f.name] = value
        replaced = [f"'{_kebab(name)}' = {getattr(self, name)!r} (preset: {v!r})"
                    for name, v in values.items()
                    if getattr(self, name) not in (v, _field_default(name))]
        if replaced:
            raise ConfigError(
                f"run-config key(s) {', '.join(replaced)} would be replaced by {source} "
                f"under 'preset' = {self.preset!r}: leave them out, "
                "set them in your own preset file, or set 'preset' = 'manual' to "
                "take every key as given")
        for name, v in values.items():
            object.__setattr__(self, name, v)
        object.__setattr__(self, "pool" if pool else "online", settings)
        if self.protocol != "online":
            return
        # the paper's protocol is counted in episodes: as many rounds as they take; a
        # num-server-rounds other than its default that disagrees is a mistake, not a wish
        rounds = math.ceil(self.online_episodes / self.episodes_per_round)
        given = self.num_server_rounds
        if given not in (rounds, _field_default("num_server_rounds")):
            raise ConfigError(
                f"run-config key 'num-server-rounds' = {given} disagrees with "
                f"'preset' = {self.preset!r}, which runs "
                f"ceil(online-episodes / episodes-per-round) = ceil({self.online_episodes} / "
                f"{self.episodes_per_round}) = {rounds} rounds (episodes-per-round of the "
                f"preset): set 'online-episodes' = {given * self.episodes_per_round}"
                f" for {given} rounds, or 'preset' = 'manual'")
        object.__setattr__(self, "num_server_rounds", rounds)

    def evaluates(self, server_round: int) -> bool:
        """Whether round ``server_round`` evaluates (``eval-every``, and always the last)."""
        return server_round % self.eval_every == 0 or server_round == self.num_server_rounds

    @property
    def learner_key(self) -> str:
        """The registry entry of this run: the learner, under its protocol."""
        return "fqi-online" if self.learner == "fqi" and self.protocol == "online" else self.learner

    @property
    def resolved_strategy(self) -> str:
        """``avg``, ``anchor``, ``exact``, ``none``, ``truncate`` or ``pooled`` after
        resolving ``auto``."""
        if self.strategy != "auto":
            return self.strategy
        if self.learner == "pool":
            return "anchor"
        return "avg" if self.encoder == "shared" else "anchor"

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Parse Flower's run config: unknown keys and wrong types are errors. The
        ``env-module`` is imported first (it may register the ``env-id``). The learner's
        own checks are not made here: :func:`fedqhd.learners.parse_run_config` makes both."""
        by_key = {_kebab(f.name): f for f in run_config_fields()}
        unknown = sorted(set(run_config) - set(by_key))
        if unknown:
            raise ConfigError(unknown_keys_message(unknown, by_key))
        kwargs = {}
        for key, value in run_config.items():
            f = by_key[key]
            kwargs[f.name] = _coerce(key, value, type(f.default))
        return cls(**kwargs)

    def to_run_config(self) -> dict[str, Any]:
        """The run-config keys as a kebab-case dict (what a run is started with)."""
        return {_kebab(f.name): getattr(self, f.name) for f in run_config_fields()}

    def record(self) -> dict[str, Any]:
        """The run-config keys and the online learner's settings (``online``), what
        ``run_config.json`` records."""
        return {**self.to_run_config(), "online": self.online.to_dict(),
                "pool": self.pool.to_dict()}

    def with_pool(self, **changes: Any) -> RunConfig:
        """A copy with POOL settings changed (``PoolSettings`` field names), for studies in
        this process; nodes of a Flower run see only run-config keys (give them a preset
        file instead)."""
        out = dataclasses.replace(self)
        object.__setattr__(out, "pool", dataclasses.replace(self.pool, **changes))
        return out

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(self.record(), indent=2, sort_keys=True)


def run_config_fields() -> list[dataclasses.Field]:
    """The fields of :class:`RunConfig` that are run-config keys."""
    return [f for f in fields(RunConfig) if f.metadata.get("key", True)]


def unknown_keys_message(unknown: list[str], known: Any) -> str:
    """``unknown run-config key(s) 'a' (did you mean 'b'?)...; valid keys: ...``: what
    every refusal of a key says (the run config here, ``fedqhd check``)."""
    def hint(k: str) -> str:  # a moved or removed key is explained below instead
        if k in RENAMED_KEYS:
            return renamed_key_hint(k)
        return "" if _node_keys_hint([k]) or k in REMOVED_KEYS else did_you_mean(k, known)

    named = ", ".join(f"'{k}'{hint(k)}" for k in unknown)
    return (f"unknown run-config key(s) {named}{_node_keys_hint(unknown)}"
            f"{removed_keys_hint(unknown)}; valid keys: {', '.join(sorted(known))}")


#: former run-config keys merged into another one: a run config that names one is told which
RENAMED_KEYS = {"pool-rho": "renamed: use 'privacy-rho'",
                "anchor-file": "merged: give the file's path as 'anchor-source'"}


def renamed_key_hint(key: str) -> str:
    """`` (renamed: use 'b')`` for a former key merged into another; empty for the rest."""
    return f" ({RENAMED_KEYS[key]})" if key in RENAMED_KEYS else ""


#: former run-config keys that are now the node's own, and the node-config key that took over
MOVED_TO_NODE_CONFIG = {"pool-rho-budget": "rho-budget", "pool-noise": "noise",
                        "reproducible-noise": "reproducible-noise"}


def _node_keys_hint(unknown: list[str]) -> str:
    """Why a run config cannot set a node's own keys (its privacy and data limits), and where
    they are set instead; empty when no such key is among ``unknown``."""
    from fedqhd.node_config import NodeSettings  # imports the privacy package: only on error

    node_keys = set(NodeSettings.keys())
    moved = {k: MOVED_TO_NODE_CONFIG.get(k, k) for k in unknown
             if k in MOVED_TO_NODE_CONFIG or k in node_keys}
    if not moved:
        return ""
    where = ", ".join(f"'{k}' -> node-config '{v}'" for k, v in moved.items())
    return (f" ({where}: a node's privacy and data limits are set by the node's operator, in "
            "each SuperNode's --node-config, never by the run; a run may only ask for more "
            "privacy, with a lower privacy-rho)")


def _field_default(name: str) -> Any:
    """The default of the :class:`RunConfig` field ``name``."""
    return next(f.default for f in fields(RunConfig) if f.name == name)


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Accept what TOML and ``--run-config`` give (ints for floats); refuse the rest."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"run-config key '{key}' = {value!r} has type "
                          f"{type(value).__name__}, expected bool (true or false)")
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    raise ConfigError(f"run-config key '{key}' = {value!r} has type {type(value).__name__}, "
                      f"expected {kind.__name__}")


#: how to regenerate docs/run-config.md (a test compares the committed page with the output)
RUN_CONFIG_DOC_COMMAND = ('python -c "from fedqhd.config import run_config_markdown as m; '
                          'print(m(), end=\'\')" > docs/run-config.md')


def _doc_value(value: Any) -> str:
    """A default as it is written in ``pyproject.toml`` or a preset file (TOML)."""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(repr(x) for x in value) + "]`"
    return f"`{value!r}`"


def _doc_valid(check: Callable[[Any], str | None]) -> str:
    """What ``check`` accepts, in its own words: the message it gives a value no key accepts
    (the registry's env ids are left out: they depend on what a process imported)."""
    if check is _registered_env:
        return "a registered env id (a built-in task or one of `env-module`'s)"
    for probe in (None, "\x00", float("nan"), 10**30):
        try:
            problem = check(probe)
        except (TypeError, ValueError):
            continue
        if problem:
            return problem
    return "any"


def _doc_table(rows: list[dataclasses.Field]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")
    lines = ["| key | default | valid | meaning |", "|---|---|---|---|"]
    for f in rows:
        lines.append(f"| `{_kebab(f.name)}` | {cell(_doc_value(f.default))} | "
                     f"{cell(_doc_valid(f.metadata['check']))} | "
                     f"{cell(f.metadata.get('doc', ''))} |")
    return lines


def run_config_markdown() -> str:
    """docs/run-config.md: every run-config key (:class:`RunConfig`), every preset key
    (:data:`fedqhd.presets.RUN_KEYS`, :class:`OnlineSettings`, :class:`PoolSettings`) and
    every node-config key (:class:`fedqhd.node_config.NodeSettings`), with its default, what
    it accepts and its help text, from their one definition."""
    from fedqhd.node_config import NodeSettings  # imports the privacy package: only here
    from fedqhd.presets import RUN_KEYS

    lines = [
        "<!-- generated from fedqhd/config.py, fedqhd/presets and fedqhd/node_config.py by "
        "fedqhd.config.run_config_markdown(); do not edit: regenerate with",
        f"     {RUN_CONFIG_DOC_COMMAND} -->",
        "# Run configuration",
        "",
        "## Run-config keys",
        "",
        "Set in `[tool.flwr.app.config]` of the app's `pyproject.toml`, or per run with "
        "`--run-config \"key=value ...\"` (strings in single quotes). Every key is validated "
        "when the run starts (`fedqhd.config.RunConfig`); a bad value stops the run with a "
        "message naming the key and what it accepts.",
        "",
        *_doc_table(run_config_fields()),
        "",
        "## Preset keys",
        "",
        "A preset file (`preset = \"auto\"`: `fedqhd/presets/<env-id>.toml`; or the path of "
        "your own) may set these run-config keys: "
        + ", ".join(f"`{k}`" for k in RUN_KEYS) + ". "
        "Top-level keys apply to both encoders; a `[shared]` or `[heterogeneous]` table "
        "overrides them for that encoder. A key the preset sets, given in the run config "
        "with another value, is refused; but a preset's `strategy` is what `auto` stands "
        "for (outside private runs), and a run config that names another strategy keeps it.",
        "",
        "### The online learner's settings (`protocol = \"online\"`, `learner = \"fqi\"`)",
        "",
        *_doc_table(list(fields(OnlineSettings))),
        "",
        "### POOL's settings (`learner = \"pool\"`, `fedqhd/presets/pool.toml`)",
        "",
        *_doc_table(list(fields(PoolSettings))),
        "",
        "## Node-config keys",
        "",
        "A node's own settings, never the run submitter's: `flower-supernode --node-config "
        "\"key=value ...\"` (or `node_configs` of the in-process grid), besides "
        "`partition-id`, `num-partitions` and `data-dir` (its data). A bad value fails that "
        "node's reply with a message naming the key.",
        "",
        *_doc_table(list(fields(NodeSettings))),
    ]
    return "\n".join(lines) + "\n"

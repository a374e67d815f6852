"""Server side of ``learner = "pool"``: anchors in (state, action) space, a privacy
screen in front of the anchor strategy, the federated policy's gap, the ledgers.

The server never sees counts: it receives each client's POOL values on the
anchor points (post-processing of that client's one noisy release) with the
client's ledger numbers in the reply metrics. A reply that does not declare
``private = 1`` is refused unless the run is marked ``non-private``; the count
of refused replies is a round metric. The federated policy is the teacher
compiled into POOL's zones with a zero (pessimistic) prior, scored by the
relative gap against the reference optimum c*.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common.logger import log

from fedqhd.client import pool_learner as pl
from fedqhd.config import RunConfig
from fedqhd.envs.inventory import generate_dataset
from fedqhd.strategies import FedQHDAnchor
from fedqhd.strategies import contract as C

LEDGER_KEYS = (C.PRIVATE, C.RHO_SPENT, C.RHO_BUDGET, C.DELTA, C.EPSILON_CKS, C.EPSILON_EXACT,
               C.NOISE_SIGMA, C.NOISE_SECURE, C.NUM_TRANSITIONS)


def pool_anchors(cfg: RunConfig) -> np.ndarray:
    """``num-anchors`` (state, action) points in [0, 1]^(w+d).

    ``uniform``: uniform in the cube; ``rollouts``: (s, a) pairs of uniform-random
    orders in the public simulator (the behaviour distribution, no client data);
    ``file``: a .npy array of shape (m, w + d) with values in [0, 1].
    """
    w, m = cfg.pool_products, cfg.num_anchors
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xA2C]))
    if cfg.anchor_source == "uniform":
        return rng.random((m, 2 * w))
    if cfg.anchor_source == "rollouts":
        per = math.ceil(m / cfg.pool_horizon)
        data = generate_dataset(pl.inventory_model(cfg), per, random_state=int(rng.integers(2**31)))
        b = np.concatenate([data.states[:, :-1], data.actions], axis=-1).reshape(-1, 2 * w)
        return b[rng.permutation(len(b))[:m]]
    anchors = np.load(cfg.anchor_file, allow_pickle=False).astype(np.float64)
    if anchors.ndim != 2 or anchors.shape[1] != 2 * w or not np.all((anchors >= 0)
                                                                    & (anchors <= 1)):
        raise ValueError(f"anchor file {cfg.anchor_file}: expected (m, {2 * w}) values in "
                         f"[0, 1] for pool-products = {w}, got shape {anchors.shape}")
    return anchors


def declares_private(msg: Message) -> bool:
    """Whether a reply's metrics say its values come from a noisy release."""
    metrics = msg.content.get(C.METRICS) if not msg.has_error() else None
    return isinstance(metrics, MetricRecord) and metrics.get(C.PRIVATE) == 1


class PrivateAnchor(FedQHDAnchor):
    """:class:`FedQHDAnchor` that refuses non-private replies (unless allowed) and
    keeps every client's latest ledger by partition id."""

    def __init__(self, anchors: np.ndarray, horizon: int, allow_non_private: bool,
                 **kwargs: Any) -> None:
        super().__init__(anchors, horizon, **kwargs)
        self.allow_non_private = allow_non_private
        #: latest ledger numbers per partition id (every client that ever replied)
        self.ledgers: dict[int, dict[str, Any]] = {}

    def _screen(self, replies: Iterable[Message], label: str) -> tuple[list[Message], int]:
        """Replies that may be used, and how many were refused as non-private."""
        kept, refused = [], 0
        for msg in replies:
            if msg.has_error() or self.allow_non_private or declares_private(msg):
                kept.append(msg)
                continue
            refused += 1
            log(WARNING, "PrivateAnchor %s: reply of node %s refused: it does not declare a "
                "private release and the run is not marked non-private", label,
                msg.metadata.src_node_id)
        return kept, refused

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Client gaps of private releases only; counts prefixed ``evaluate-`` so that a
        round's row keeps the train counts too."""
        kept, refused = self._screen(replies, f"evaluate round {server_round}")
        metrics = super().aggregate_evaluate(server_round, kept)
        if metrics is None:
            return None
        out = MetricRecord({k: v for k, v in metrics.items() if k != C.PRIVATE})
        for key in (C.REPLIES_OK, C.REPLIES_FAILED, C.REPLIES_REJECTED, C.NUM_TRANSITIONS):
            if key in out:
                out[f"evaluate-{key}"] = out.pop(key)
        out[f"evaluate-{C.REPLIES_REFUSED_NON_PRIVATE}"] = refused
        self.last_evaluate_metrics = out
        return out

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        kept, refused = self._screen(replies, f"train round {server_round}")
        record, metrics = super().aggregate_train(server_round, kept)
        metrics = metrics if metrics is not None else MetricRecord({})
        metrics[C.REPLIES_REFUSED_NON_PRIVATE] = refused
        self.last_train_metrics = metrics
        for node, m in self.last_client_metrics.items():
            pid = int(m.get(C.PARTITION_ID, -1))
            entry = {k: m[k] for k in LEDGER_KEYS if k in m}
            entry[C.PRIVATE] = bool(entry.get(C.PRIVATE, 0))
            if not entry[C.PRIVATE]:  # exact counts: no finite epsilon exists
                entry.update({C.EPSILON_CKS: None, C.EPSILON_EXACT: None})
            self.ledgers[pid] = {"node-id": node, "round": server_round, **entry}
        return record, metrics


class TeacherEvaluator:
    """Gap of the federated policy: the teacher compiled into POOL's zones."""

    def __init__(self, cfg: RunConfig, anchors: np.ndarray) -> None:
        self.anchors = anchors
        self.prior = pl.empty_learner(cfg)
        self.gap = pl.GapEvaluator(cfg)

    def __call__(self, arrays: ArrayRecord) -> MetricRecord | None:
        if C.TEACHER not in arrays:
            return None
        policy, residual = pl.adopt_teacher(self.prior, self.anchors, arrays[C.TEACHER].numpy())
        return MetricRecord({**self.gap(policy), C.PROJECTION_RESIDUAL: residual})


def pool_setup(cfg: RunConfig, **strategy_kwargs: Any
               ) -> tuple[PrivateAnchor, TeacherEvaluator, dict[str, Any]]:
    """Strategy, server-side evaluator and run-info extras of a pool run."""
    anchors = pool_anchors(cfg)
    strategy = PrivateAnchor(anchors, cfg.pool_horizon, cfg.non_private,
                             fraction_evaluate=1.0, **strategy_kwargs)
    extra = {"anchors-shape": list(anchors.shape),
             "anchor-columns": "(state, action) in [0, 1]^(w+d); q-anchors[:, h] = Qbar_h",
             "non-private-run": cfg.non_private}
    return strategy, TeacherEvaluator(cfg, anchors), extra

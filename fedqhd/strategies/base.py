"""What the fedqhd strategies share: sampling and messaging from Flower's FedAvg (with
a bounded wait for nodes), reply screening and safeguards, client identities,
weighting, reply accounting and metric-only evaluation."""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Iterable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from . import contract as C
from .identity import IdentityRegistry
from .screening import Reference, Safeguards, ScreenedReplies, Shape, screen_replies

WEIGHTINGS = ("transitions", "uniform")


def global_readout(arrays: ArrayRecord, shape: tuple[int, int], strategy: str) -> np.ndarray:
    """The global ``readout`` of a round's record as float64, refused (``ValueError``
    naming ``strategy``) when missing or not of ``shape``: the strategies that solve
    for the readout themselves (FedQHDExact, FedQHDPooled) need the one they sent."""
    if C.READOUT not in arrays:
        raise ValueError(f"{strategy} needs the global '{C.READOUT}' array in its "
                         f"ArrayRecord; got keys {list(arrays.keys())}")
    readout = arrays[C.READOUT].numpy().astype(np.float64)
    if readout.shape != shape:
        raise ValueError(f"global readout has shape {readout.shape}, expected {shape}")
    return readout


class NodeWaitTimeout(RuntimeError):
    """Fewer nodes than the strategy needs connected within ``node_wait_timeout``."""


class FunctionSpaceStrategy(FedAvg):
    """Base of :class:`FedQHDAvg` and :class:`FedQHDAnchor` (not used directly).

    Parameters
    ----------
    weighting : {"transitions", "uniform"}
    fraction_train, min_train_nodes, min_evaluate_nodes, min_available_nodes
        As in Flower's ``FedAvg``.
    fraction_evaluate : float
        Fraction of nodes sent an ``evaluate`` message each round. 0 (the default of every
        fedqhd strategy): no federated evaluation, so a train-only ClientApp works as is;
        set it > 0 when the ClientApp answers ``evaluate`` messages.
    aggregation, trim_fraction, clip_factor, norm_bound_factor, weight_cap_factor
        The screening safeguards and aggregation rule, see
        :class:`~fedqhd.strategies.screening.Safeguards` (defaults: weighted mean of
        replies clipped at 3 x the deviation scale from their coordinate-wise median,
        refused beyond 10 x, weights capped at 10 x the median claim).
    stale_rounds : int
        A client (a node id) is forgotten, and in ``FedQHDAvg(aggregate="latest")`` its
        stored reply dropped, after this many rounds without an accepted reply; 0: never.
    node_wait_timeout : float
        Seconds to wait for ``min_available_nodes`` before a round (Flower's ``FedAvg``
        waits forever); then :class:`NodeWaitTimeout` is raised.
    evaluate_rounds : callable, optional
        ``server_round -> bool``: the rounds that send evaluate messages (None: every
        round with ``fraction_evaluate > 0``).
    evaluate_with_next_train : callable, optional
        ``server_round -> bool``: evaluated rounds whose evaluation rides on the next
        round's train messages instead of evaluate messages (never the last round). Those
        messages ask the client (config ``evaluate-received``) to evaluate the global
        model it receives, the round's result, before it trains, and to send the metrics
        an evaluate reply would carry, prefixed ``evaluated-``; :attr:`deferred_evaluation`
        then holds them aggregated as :meth:`aggregate_evaluate` would. One trip through
        the clients a round instead of two (on a Ray cluster, where every message carries
        the node's state, 3 s of a 25 s run). Only with ``fraction_train`` and
        ``fraction_evaluate`` 1 (every node trains, so every node evaluates); with a
        ClientApp whose evaluation draws no randomness of its own, the numbers are those
        of evaluate messages. None: off.
    """

    def __init__(
        self,
        weighting: str = "transitions",
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        *,
        aggregation: str = "mean",
        trim_fraction: float = 0.1,
        clip_factor: float = 3.0,
        norm_bound_factor: float = 10.0,
        weight_cap_factor: float = 10.0,
        stale_rounds: int = 10,
        node_wait_timeout: float = 300.0,
        evaluate_rounds: Callable[[int], bool] | None = None,
        evaluate_with_next_train: Callable[[int], bool] | None = None,
    ) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        if stale_rounds < 0:
            raise ValueError(f"stale_rounds must be >= 0 (0: never), got {stale_rounds}")
        if not node_wait_timeout >= 0:
            raise ValueError(f"node_wait_timeout must be >= 0, got {node_wait_timeout}")
        super().__init__(
            fraction_train=fraction_train,
            # FedAvg warns when given 0.0; here 0.0 is the documented default (set below)
            fraction_evaluate=fraction_evaluate or 1.0,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=C.NUM_TRANSITIONS,
            arrayrecord_key=C.ARRAYS,
            configrecord_key=C.CONFIG,
        )
        if fraction_evaluate == 0.0:  # FedAvg's own handling of 0.0, without the warning
            self.fraction_evaluate, self.min_evaluate_nodes = 0.0, 0
        self.weighting = weighting
        self.safeguards = Safeguards(aggregation, trim_fraction, clip_factor,
                                     norm_bound_factor, weight_cap_factor)
        #: the deviation scale of the previous round (train replies are measured by it)
        self.reference = Reference()
        self.node_wait_timeout = float(node_wait_timeout)
        #: which rounds send evaluate messages (None: every round)
        self.evaluate_rounds = evaluate_rounds
        #: which evaluated rounds the next round's train messages evaluate (None: none)
        self.evaluate_with_next_train = evaluate_with_next_train
        #: (round, aggregated metrics) of the evaluation the last train replies carried
        self.deferred_evaluation: tuple[int, MetricRecord] | None = None
        #: node -> position among the evaluate messages a deferred round would have sent
        self._evaluation_order: dict[int, int] = {}
        self.identities = IdentityRegistry(stale_rounds)
        #: the latest aggregated train / evaluate metrics, for per-round reporting
        self.last_train_metrics: MetricRecord | None = None
        self.last_evaluate_metrics: MetricRecord | None = None
        #: the latest accepted train replies' own metrics, by node id (per-client reports)
        self.last_client_metrics: dict[int, dict[str, float]] = {}
        #: messages sent by the last configure_train / configure_evaluate (None: unknown)
        self._sampled: dict[str, int | None] = {"train": None, "evaluate": None}

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything this strategy remembers between rounds that a later round depends on
        (arrays, numbers, strings, tuples, lists, dicts), for the run's checkpoint;
        subclasses with more memory extend it."""
        return {"identities": self.identities.checkpoint_state(),
                "reference-scale": self.reference.scale}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`checkpoint_state` (a resumed run)."""
        self.identities.restore_state(state["identities"])
        self.reference.scale = state["reference-scale"]

    @property
    def aggregation(self) -> str:
        return self.safeguards.aggregation

    def summary(self) -> None:
        super().summary()
        g = self.safeguards
        log(INFO, "\t└──> Weighting of client replies: %s", self.weighting)
        if self.fraction_evaluate == 0.0:
            log(INFO, "\t└──> Federated evaluation: off (fraction_evaluate = 0; pass "
                "fraction_evaluate > 0 if the ClientApp answers evaluate messages)")
        log(INFO, "\t└──> Aggregation: %s (trim %g); clipping %s; norm bound %s (distances "
            "from the replies' median); weight cap %s; silent clients forgotten after "
            "%s rounds; node wait %gs", g.aggregation, g.trim_fraction,
            f"{g.clip_factor:g} x deviation scale" if g.clip_factor else "off",
            f"{g.norm_bound_factor:g} x deviation scale" if g.norm_bound_factor else "off",
            f"{g.weight_cap_factor:g} x median claim" if g.weight_cap_factor else "off",
            self.identities.stale_rounds or "never", self.node_wait_timeout)

    # ------------------------------------------------------------ sampling and messages
    def _sample(self, grid: Grid, fraction: float, min_nodes: int) -> list[int]:
        """Flower's ``FedAvg`` sampling (same calls to Python's ``random``), with the wait
        for ``min_available_nodes`` bounded by ``node_wait_timeout``."""
        num_nodes = int(len(list(grid.get_node_ids())) * fraction)
        sample_size = max(num_nodes, min_nodes)
        needed = max(self.min_available_nodes, sample_size)
        deadline = time.monotonic() + self.node_wait_timeout
        while len(all_nodes := list(grid.get_node_ids())) < needed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NodeWaitTimeout(
                    f"{len(all_nodes)} node(s) connected, {needed} needed (min-nodes "
                    f"{self.min_available_nodes}, sample {sample_size}); gave up after "
                    f"{self.node_wait_timeout:g}s (node-wait-timeout)")
            log(INFO, "Waiting for nodes to connect: %d connected (minimum required: %d), "
                "%.0fs left.", len(all_nodes), needed, left)
            time.sleep(min(1.0, left))
        self.identities.set_connected(all_nodes)
        return random.sample(all_nodes, sample_size)

    def _evaluates(self, server_round: int) -> bool:
        """Whether ``server_round``'s global model is evaluated by the clients."""
        return self.fraction_evaluate > 0.0 and (
            self.evaluate_rounds is None or self.evaluate_rounds(server_round))

    def _defers(self, server_round: int) -> bool:
        """Whether ``server_round``'s evaluation rides on the next round's train messages:
        only when both stages sample every node, so the same nodes evaluate."""
        return (server_round >= 1 and self.evaluate_with_next_train is not None
                and self.fraction_train >= 1.0 and self.fraction_evaluate >= 1.0
                and self._evaluates(server_round)
                and self.evaluate_with_next_train(server_round))

    def _messages(self, stage: str, server_round: int, arrays: ArrayRecord,
                  config: ConfigRecord, grid: Grid, fraction: float, min_nodes: int,
                  message_type: str) -> list[Message]:
        self._sampled[stage] = 0
        if fraction == 0.0 or (stage == "evaluate" and not self._evaluates(server_round)):
            return []
        node_ids = self._sample(grid, fraction, min_nodes)
        if stage == "evaluate" and self._defers(server_round):
            # sampled all the same: the rounds after it sample as they would with evaluate
            # messages (training is not changed by it), and the evaluation is aggregated
            # in the order these messages would have been sent (the same sums)
            self._evaluation_order = {node: i for i, node in enumerate(node_ids)}
            log(INFO, "configure_evaluate: round %d is evaluated with round %d's train "
                "messages", server_round, server_round + 1)
            return []
        log(INFO, "configure_%s: Sampled %s nodes", stage, len(node_ids))
        config["server-round"] = server_round
        if stage == "train":
            if self._defers(server_round - 1):
                config[C.EVALUATE_RECEIVED] = True
            else:
                config.pop(C.EVALUATE_RECEIVED, None)
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        messages = list(self._construct_messages(record, node_ids, message_type))
        self._sampled[stage] = len(messages)
        return messages

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._messages("train", server_round, arrays, config, grid,
                              self.fraction_train, self.min_train_nodes, MessageType.TRAIN)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._messages("evaluate", server_round, arrays, config, grid,
                              self.fraction_evaluate, self.min_evaluate_nodes,
                              MessageType.EVALUATE)

    # ------------------------------------------------------------------ screening
    def _screen(self, stage: str, server_round: int, replies: Iterable[Message],
                array_key: str | None, expected_shape: Shape | None
                ) -> ScreenedReplies:
        if stage == "train":
            self.deferred_evaluation = None
            if self._defers(server_round - 1):
                replies = self._take_evaluation(server_round, replies)
        sampled, self._sampled[stage] = self._sampled[stage], None
        label = f"{type(self).__name__} {stage} round {server_round}"
        reference = self.reference if stage == "train" and array_key is not None else None
        return screen_replies(replies, array_key, expected_shape, self.weighting == "uniform",
                              label, self.safeguards, sampled, self.identities.labels,
                              reference)

    def _record_clients(self, screened: ScreenedReplies, server_round: int) -> None:
        """Note the accepted replies' nodes (a client is its node id; a claimed partition
        id is only a label), forget silent or departed ones."""
        label = f"{type(self).__name__} train round {server_round}"
        for node, metrics in zip(screened.nodes, screened.metrics, strict=True):
            self.identities.seen(node, metrics.get(C.PARTITION_ID), server_round, label)
        self.identities.expire(server_round)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The clients' evaluation metrics aggregated by the strategy's rule; the reply
        counts (and the sizes, ``metrics-missing``) are prefixed ``evaluate-`` so that a
        round's row keeps the train counts too. A round whose replies were all left out
        still returns its counts (``evaluate-replies-ok`` = 0), so Flower's ``Result``
        keeps it; ``None`` only when no message was sent."""
        replies = list(replies)
        if not replies and not self._sampled["evaluate"]:  # no evaluation this round
            self._sampled["evaluate"] = None
            self.last_evaluate_metrics = None
            return None
        screened = self._screen("evaluate", server_round, replies, None, None)
        self.last_evaluate_metrics = _evaluation_metrics(screened)
        return self.last_evaluate_metrics

    def _take_evaluation(self, server_round: int, replies: Iterable[Message]
                         ) -> list[Message]:
        """Split train replies that carry the previous round's evaluation (``evaluated-``
        metrics): the evaluation is screened and aggregated as evaluate replies would be
        (into :attr:`deferred_evaluation`); the replies come back without those metrics."""
        train, evaluation = [], []
        n = len(C.EVALUATED_PREFIX)
        for msg in replies:
            metrics = None if msg.has_error() else msg.content.get(C.METRICS)
            if not isinstance(metrics, MetricRecord):
                train.append(msg)
                evaluation.append(msg)  # counted as evaluate replies are: failed, refused
                continue
            own = MetricRecord({k: v for k, v in metrics.items()  # type: ignore[misc]
                                if not k.startswith(C.EVALUATED_PREFIX)})
            evaluated = MetricRecord({k[n:]: v for k, v in metrics.items()  # type: ignore[misc]
                                      if k.startswith(C.EVALUATED_PREFIX)})
            train.append(_with_metrics(msg, own))
            evaluation.append(_with_metrics(msg, evaluated))
        order = self._evaluation_order
        evaluation.sort(key=lambda m: order.get(m.metadata.src_node_id, len(order)))
        screened = screen_replies(
            evaluation, None, None, self.weighting == "uniform",
            f"{type(self).__name__} evaluate round {server_round - 1} (train round "
            f"{server_round}'s replies)", self.safeguards, self._sampled["train"],
            self.identities.labels)
        self.deferred_evaluation = (server_round - 1, _evaluation_metrics(screened))
        return train


def _evaluation_metrics(screened: ScreenedReplies) -> MetricRecord:
    """An evaluation round's metrics: the replies' aggregated, the counts (and sizes,
    ``metrics-missing``) prefixed ``evaluate-`` so that a round's row keeps the train
    counts too."""
    out = MetricRecord({})
    for key, value in screened.round_metrics().items():
        out[f"{C.EVALUATE_PREFIX}{key}" if key in C.EVALUATE_PREFIXED else key] = value
    return out


def _with_metrics(msg: Message, metrics: MetricRecord) -> Message:
    """A copy of reply ``msg`` (same metadata: node, round, ids) whose content is its
    other records and ``metrics``."""
    content = RecordDict({k: v for k, v in msg.content.items() if k != C.METRICS})
    content[C.METRICS] = metrics
    out = copy.copy(msg)
    out.content = content
    return out

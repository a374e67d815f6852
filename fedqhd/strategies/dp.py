"""DP-FedAvg: Flower's server-side fixed-clipping wrapper around a fedqhd strategy, and its
accounting (run-config ``privacy = "dp-fedavg"``, offline FedAvg-DQN).

Each round Flower's :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideFixedClipping`
clips every reply's update (reply minus the global arrays the round sent, all of its
ArrayRecord's arrays as one vector) to L2 norm ``C``, lets the wrapped strategy average
the clipped replies and adds Gaussian noise of standard deviation ``z C / n`` to every
averaged array (``numpy.random.normal``, the global stream, which the run seeds).

Accounting (client-level DP, add/remove one client; every client sampled every round, the
number of clients ``n`` public, as Flower's wrapper and the fixed-denominator estimator of
McMahan et al. 2018 treat it): a round releases ``(sum of clipped updates + N(0, (z C)^2
I)) / n``, a Gaussian mechanism of L2 sensitivity ``C`` with noise ``z C``, so
``rho = 1 / (2 z^2)`` per round (zero-concentrated DP) and ``T`` rounds compose to
``rho_total = T / (2 z^2)``; for a target ``rho_total``, ``z = sqrt(T / (2 rho_total))``
(:func:`noise_multiplier`). T composed Gaussians are one Gaussian of the same rho, so
epsilon(delta) is the exact Gaussian curve (:func:`fedqhd.privacy.ledger.epsilon_exact`).

The unit differs from private FedQHD's (``privacy = "zcdp"``): DP-FedAvg protects a
whole CLIENT (all of its trajectories, its participation itself), with a TRUSTED server
that sees the clients' exact networks and adds the noise; private FedQHD protects ONE
TRAJECTORY of a client, whose own node adds the noise (the server sees only noisy
releases). The same epsilon is the same number with different units.

What the guarantee covers: the global networks (every round's release). The round
metrics the strategy keeps (reply counts, ``num-transitions``) are the trusted server's
own and are not noised (as Flower's wrapper says of metrics). Noise calibrated on ``n``
assumes ``n`` replies: fewer (a failed or refused reply) average fewer clipped updates
under the same noise (Flower warns), more (more nodes than ``n`` sampled) add more noise
than needed (still private). A reply equal to the global arrays (a zero update) fails the
round: Flower 1.42's clipping divides by the update's norm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

from . import contract as C
from .base import FunctionSpaceStrategy

#: ``results.json``'s ``final`` entry of a DP-FedAvg run (:func:`accounting`)
DP_FEDAVG = "dp-fedavg"


def noise_multiplier(rho_total: float, rounds: int) -> float:
    """``z = sqrt(T / (2 rho_total))``: the noise multiplier whose ``T`` rounds spend
    ``rho_total`` (zCDP)."""
    if not rho_total > 0 or rounds < 1:
        raise ValueError(f"need rho_total > 0 and rounds >= 1, got {rho_total}, {rounds}")
    return math.sqrt(rounds / (2.0 * rho_total))


def rho_spent(z: float, rounds: int) -> float:
    """``T / (2 z^2)``: the zCDP rho of ``rounds`` releases with noise multiplier ``z``."""
    return rounds / (2.0 * z * z)


def accounting(z: float, clipping_norm: float, n: int, rounds: int, delta: float) -> dict:
    """The run's privacy in its final entry: settings, rho, epsilon(delta) and the unit."""
    from fedqhd.privacy.ledger import epsilon_exact

    rho = rho_spent(z, rounds)
    return {"noise-multiplier": z, "clipping-norm": clipping_norm,
            "num-sampled-clients": n, "rounds": rounds, "rho": rho, "delta": delta,
            "epsilon": epsilon_exact(rho, delta), "conversion": "exact-gaussian",
            "unit": "client (all its trajectories), trusted server adds the noise"}


class DPFedAvg(DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side fixed-clipping wrapper, as fedqhd's server loop reads a
    strategy: the wrapped strategy's round metrics (``last_train_metrics``,
    ``last_evaluate_metrics``, ``last_client_metrics``), and a round Flower's wrapper
    skips (a reply with an error: it aggregates nothing) counted as such instead of
    showing the previous round's counts. Clipping, averaging and noise are Flower's.

    ``strategy`` must average uniformly with no data-dependent screening (weighting
    uniform, aggregation mean, clip and norm-bound factors 0): the noise is calibrated to
    a uniform mean of updates each of norm at most ``clipping_norm``.
    """

    def __init__(self, strategy: FunctionSpaceStrategy, noise_multiplier: float,
                 clipping_norm: float, num_sampled_clients: int) -> None:
        g = strategy.safeguards
        if (strategy.weighting != "uniform" or g.aggregation != "mean" or g.clip_factor
                or g.norm_bound_factor):
            raise ValueError("DP-FedAvg needs a uniform mean of the clipped replies: weighting "
                             "'uniform', aggregation 'mean', clip_factor 0, "
                             "norm_bound_factor 0")
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients)
        self.inner = strategy

    @property
    def last_train_metrics(self) -> MetricRecord | None:
        return self.inner.last_train_metrics

    @property
    def last_evaluate_metrics(self) -> MetricRecord | None:
        return self.inner.last_evaluate_metrics

    @property
    def last_client_metrics(self) -> dict[int, dict[str, float]]:
        return self.inner.last_client_metrics

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        self.inner.last_train_metrics = None
        try:
            arrays, metrics = super().aggregate_train(server_round, replies)
        except ZeroDivisionError:  # Flower 1.42's clip divides by the update's norm
            raise ValueError(f"DP-FedAvg round {server_round}: a reply equals the global "
                             "arrays (a zero update), which Flower's fixed clipping cannot "
                             "scale (it divides by the update's norm)") from None
        if self.inner.last_train_metrics is None:  # Flower's wrapper skipped the round
            failed = sum(1 for r in replies if r.has_error())
            self.inner.last_train_metrics = MetricRecord({
                C.REPLIES_SAMPLED: len(replies), C.REPLIES_RECEIVED: len(replies),
                C.REPLIES_OK: 0, C.REPLIES_FAILED: failed,
                C.REPLIES_REJECTED: len(replies) - failed, C.CLIENTS_AVERAGED: 0})
            self.inner.last_client_metrics = {}
        return arrays, metrics

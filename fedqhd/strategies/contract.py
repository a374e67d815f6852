"""The message contract between fedqhd strategies and ClientApps, in one place.

Every record name and key used on the wire is a named constant here, used by
both sides; ``docs/strategies.md`` is the full contract (types, required or
optional, how each key aggregates, what happens when replies are left out).
In short:

* Server -> client: ``arrays`` (ArrayRecord: the global model) and ``config``
  (ConfigRecord with ``server-round``), the same for ``train`` and ``evaluate``.
* Client -> server: ``Message(content=RecordDict(...), reply_to=msg)`` with
  ``metrics`` (MetricRecord) and, for ``train``, ``arrays`` built with
  :func:`to_array_record`. Every reply needs a size, ``num-transitions`` or else
  ``num-examples`` (finite, > 0): the reply's weight, summed per round. Every other
  numeric metric is optional and aggregated by weighted mean over the replies
  that carry it (omissions warned about and counted in ``metrics-missing``);
  ``partition-id`` is never averaged: it names the client.
* Federated evaluation is off by default (``fraction_evaluate = 0``); an evaluate
  reply needs only the size; its counts come back prefixed ``evaluate-``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from fedqhd.gram import pack_upper, unpack_upper  # noqa: F401 (the GRAM key's packing)

# record names inside a Message's RecordDict
ARRAYS = "arrays"    #: ArrayRecord: the global model (server -> client) or a reply's arrays
CONFIG = "config"    #: ConfigRecord: per-round settings sent to clients
METRICS = "metrics"  #: MetricRecord: a reply's numbers

# array keys
READOUT = "readout"      #: (D, |A|) readout of a shared encoder (FedQHDAvg: required both ways)
ANCHORS = "anchors"      #: (m, obs_dim) anchor states fixed by the server (FedQHDAnchor)
TEACHER = "teacher"      #: (m, |A|) weighted mean of client Q-values on the anchors
Q_ANCHORS = "q-anchors"  #: (m, |A|) one client's Q-values on the anchors (required reply)
#: (d, |A|) server -> client (FedQHDTruncate): the weighted mean of the first d = min_i D_i rows
#: of the clients' readouts; each client puts it in its first d rows and keeps the rest. Its
#: replies are READOUT of its own shape (D_i, |A|)
READOUT_HEAD = "readout-head"
#: (P,) FedAvg-DQN (learner = "dqn", FedQHDAvg(array_key=NETWORK)): the MLP's parameters
#: W1, b1, W2, b2, W3, b3 flattened in that order, both ways
NETWORK = "network"
# FedQHDExact (shared encoder, pooled ridge FQI from sufficient statistics; see exact.py)
STATS_REQUEST = "stats-request"  #: (2,) server -> client: [transitions of this client already
#                                   in the server's Gram, 1 if phi-y is wanted this round else 0]
Q_RANGE = "q-range"              #: (2,) server -> client: pooled [lo, hi] the targets are kept in
GRAM = "gram"                    #: (|A|, D(D+1)/2) reply: packed upper triangles of the per-action
#                                   Gram of the client's transitions after the server's count
PHI_Y = "phi-y"                  #: (D, |A|) reply: Phi_a^T y_a for the global readout's targets
ACTION_COUNTS = "action-counts"  #: (|A|,) reply: the client's transitions per action
REWARD_RANGE = "reward-range"    #: (2,) reply: [min, max] of the client's rewards; FedQHDPooled's
#                                   sweep request: the pooled [min, max] the targets are kept in
# FedQHDPooled (online pooled-data oracle, shared encoder; see pooled.py): the train reply holds
# GRAM (all the client's buffer), ACTION_COUNTS and REWARD_RANGE; then each sweep of the round is
# one message of this type carrying READOUT and REWARD_RANGE, answered with PHI_Y
POOLED_SWEEP_ACTION = "pooled_sweep"  #: the ClientApp's ``@app.train(...)`` action of a sweep
POOLED_SWEEP = f"train.{POOLED_SWEEP_ACTION}"  #: message type of a pooled sweep request
LAST_REPLY = "last-reply"  #: (D, |A|) server -> client, first round after a resume only: the
#                            client's latest accepted reply (FedQHDAvg aggregate="latest"), the
#                            memory an ADMM client lost with its process
# with learner = "pool" the anchors are (state, action) points (m, w + d) in [0, 1]^(w+d), and
# TEACHER / Q_ANCHORS are (m, H): column h is the pessimistic Q_h at the point (scaled reward)

# config keys (server -> client)
SERVER_ROUND = "server-round"
#: train message config, true: before training, evaluate the global model the message
#: carries (the previous round's) as an evaluate message would, and send those metrics
#: in the train reply, each key prefixed EVALUATED_PREFIX (FunctionSpaceStrategy's
#: ``evaluate_with_next_train``: the round that model came from sends no evaluate messages)
EVALUATE_RECEIVED = "evaluate-received"
EVALUATED_PREFIX = "evaluated-"

# metric keys
NUM_TRANSITIONS = "num-transitions"  #: reply, required (or NUM_EXAMPLES): shard size, int/float > 0
NUM_EXAMPLES = "num-examples"        #: reply without NUM_TRANSITIONS (non-RL apps): size > 0
#: the keys a reply's size (and weight) is read from, first present wins; summed per round
SIZE_KEYS = (NUM_TRANSITIONS, NUM_EXAMPLES)
# optional reply metrics of fedqhd's ClientApp (a round reports their weighted means)
BELLMAN_RESIDUAL = "bellman-residual"        #: reply: RMS Bellman residual after local FQI
CONSENSUS_GAP = "consensus-gap"              #: reply (admm): ||w_i - W|| / max(||w_i||, ||W||)
PROJECTION_RESIDUAL = "projection-residual"  #: reply: ||X_i W_i - T||_F of the compilation
RETURN_MEAN = "return-mean"                  #: evaluate reply: mean greedy return
RETURN_STD = "return-std"                    #: evaluate reply: std of greedy return (the round
#                                               reports the weighted mean of the stds)
GRAM_THROUGH = "gram-through"                #: reply (exact): transitions its Grams now cover
EXACT_CLIENTS = "exact-clients"              #: round (exact): clients in the pooled system
EXACT_STALE = "exact-stale"                  #: round (exact): clients whose phi-y is an old one
POOLED_SWEEPS = "pooled-sweeps"              #: round (pooled): sweep exchanges run (restarts too)
POOLED_DROPPED = "pooled-dropped"            #: round (pooled): clients left out of the round's
#                                               sweeps because a sweep reply failed or was refused
VALUE_FLAGS = "value-flags"                  #: reply: fields of the client's shard flagged far
#                                               outside the env's bounds (value-check = warn);
#                                               round: their sum
REPLIES_OK = "replies-ok"                    #: round metric: replies aggregated
REPLIES_FAILED = "replies-failed"            #: round metric: replies carrying an error
REPLIES_REJECTED = "replies-rejected"        #: round metric: replies refused by screening
REPLIES_SAMPLED = "replies-sampled"          #: round metric: messages sent (nodes sampled)
REPLIES_RECEIVED = "replies-received"        #: round metric: replies that came back in time
REPLIES_TIMED_OUT = "replies-timed-out"      #: round metric: sampled - received (lost, late)
REPLIES_NORM_REFUSED = "replies-norm-refused"  #: round metric: rejected for their norm
REPLIES_WEIGHT_CAPPED = "replies-weight-capped"  #: round metric: kept with a capped weight
REPLIES_CLIPPED = "replies-clipped"          #: round metric: pulled back to the clip radius
CLIENTS_AVERAGED = "clients-averaged"        #: round metric: clients in the aggregate
METRICS_MISSING = "metrics-missing"          #: round metric: metric keys some replies omitted
#: the reply counts of a round; evaluation reports them prefixed ``evaluate-``
REPLY_COUNTS = (REPLIES_SAMPLED, REPLIES_RECEIVED, REPLIES_OK, REPLIES_FAILED, REPLIES_REJECTED,
                REPLIES_TIMED_OUT, REPLIES_NORM_REFUSED, REPLIES_WEIGHT_CAPPED,
                REPLIES_CLIPPED, CLIENTS_AVERAGED)
EVALUATE_PREFIX = "evaluate-"
#: the round metrics that evaluation reports prefixed ``evaluate-`` (counts, not results)
EVALUATE_PREFIXED = (*REPLY_COUNTS, *SIZE_KEYS, METRICS_MISSING)
BLAS_THREADS = "blas-threads"  #: reply: BLAS threads of the ClientApp's process (Ray: its CPUs)

# privacy metric keys (learner = "pool": every train reply carries its client's ledger)
PARTITION_ID = "partition-id"    #: reply, optional: the client's partition id (names it in logs;
#                                   FedQHDAvg(aggregate="latest") keys clients by it); not averaged
PRIVATE = "private"              #: reply: 1 if the released values come from noisy counts, else 0
RHO_SPENT = "rho-spent"          #: reply: zCDP rho the client has spent (ledger total)
RHO_BUDGET = "rho-budget"        #: reply: the client's rho budget
DELTA = "delta"                  #: reply: delta at which epsilon is reported
EPSILON_CKS = "epsilon-cks"      #: reply: epsilon(delta) by the CKS zCDP conversion
EPSILON_EXACT = "epsilon-exact"  #: reply: epsilon(delta) of the exact (analytic) Gaussian
EPSILON = "epsilon"              #: reply: epsilon(delta) by the conversion valid for its noise
NOISE_SECURE = "noise-secure"    #: reply: 1 if the noise sampler is fit for real data
NOISE_SIGMA = "noise-sigma"      #: reply: Gaussian noise scale of every released count
NOISE_REPRODUCIBLE = "noise-reproducible"  #: reply: 1 if any release was seeded
REPLIES_REFUSED_NON_PRIVATE = "replies-refused-non-private"  #: round: non-private replies left out
GAP = "gap-percent"              #: round: (c - c*) / c* * 100 of the federated policy
COST = "cost"                    #: round: mean episode cost of the federated policy
C_STAR = "c-star"                #: round: mean episode cost of the reference policy
GAP_OWN = "gap-own-percent"      #: evaluate reply: gap of the client's own POOL policy (alone)
GAP_INFORMED = "gap-informed-percent"  #: evaluate reply: gap of its teacher-informed policy

#: the reply metrics that make up a client's privacy-ledger report
LEDGER_KEYS = (PRIVATE, RHO_SPENT, RHO_BUDGET, DELTA, EPSILON_CKS, EPSILON_EXACT, EPSILON,
               NOISE_SIGMA,
               NOISE_SECURE, NOISE_REPRODUCIBLE, NUM_TRANSITIONS)


def to_array_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Wrap named numpy arrays (``ArrayRecord({"k": ndarray})`` raises in flwr 1.42)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def from_array_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Unwrap an ArrayRecord into named numpy arrays."""
    return {k: record[k].numpy() for k in record.keys()}

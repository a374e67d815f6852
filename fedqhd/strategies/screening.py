"""Reply screening and aggregation rules shared by the fedqhd strategies.

Nothing a client sends can make :func:`screen_replies` raise. A reply is aggregated
only if it carries no error, has the expected array, decodable as a ``.npy`` of a
real floating dtype (``float16/32/64``; integers, booleans, complex, strings and
object or pickled arrays are refused: no honest client sends them) whose bytes
hold exactly the data its header claims and whose shape is the expected one,
only finite values, and a finite positive size (``num-transitions``, or
``num-examples`` when it sends no ``num-transitions``). Every other reply is left
out, logged with its reason under its node id (and the partition id its node claims)
and counted in the round's metrics; the round goes on.

Then the safeguards (:class:`Safeguards`), measured from a center a minority cannot move,
the coordinate-wise median of the round's replies (unweighted: a claimed size does not
move it either), against a deviation *scale*: the median distance of the replies from
it, which may grow at most :data:`SCALE_GROWTH` times per round (a scale free to follow
the replies is one that clients integrating an attacker's pull, as ADMM's duals do,
inflate round after round):

* a reply further than ``norm_bound_factor`` x scale from the center is refused
  (``replies-rejected``, ``replies-norm-refused``);
* a reply further than ``clip_factor`` x scale is pulled back onto that sphere
  (``replies-clipped``): what the server aggregates, and what FedQHDAvg keeps as the
  client's latest reply, is the clipped one;
* a client's weight is capped at ``weight_cap_factor`` x the round's median claimed
  size (``replies-weight-capped``), and lowered further where its pull on the
  aggregate, n x weight share x distance from the center, is above
  :data:`PULL_FACTOR` x the scale: a claimed size buys no influence.

The aggregation rule (:data:`AGGREGATIONS`) then combines the accepted arrays and the
replies' numeric metrics: each metric over the replies that carry it (a metric some
replies omit is named in a warning and counted in ``metrics-missing``; none is
dropped), the sizes summed.

What one client can do, whatever it sends and claims: in round ``t`` it moves the
aggregate at most ``(PULL_FACTOR / n) * scale_t`` toward where it points, plus its weight
share times the honest replies' own spread (at most ``clip_factor * scale_t``); over
``R`` rounds the scale is at most ``SCALE_GROWTH ** (R - 1) * scale_1``, so the distance
of the global model from the honest clients' trajectory adds up to at most the sum of
those per-round bounds (plus what the honest clients' own dynamics do with a displaced
model). Honest replies are untouched (the aggregate is exactly the weighted mean) while
each is within ``clip_factor`` x the scale of the center and its ``n x share x distance``
within ``PULL_FACTOR`` x the scale.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.common.logger import log

from . import contract as C

#: how accepted replies are combined (coordinate-wise for median and trimmed mean)
AGGREGATIONS = ("mean", "median", "trimmed-mean")
#: the most the deviation scale may grow from one round to the next
SCALE_GROWTH = 2.0
#: the only serialization type accepted: Flower's numpy ``.npy`` bytes
NUMPY_STYPE = "numpy.ndarray"
#: elements an array of unknown expected shape may have (2 GiB of float64)
MAX_ELEMENTS = 2**28
#: a required shape; ``None`` in a dimension accepts any size there (readouts of different
#: ``D_i``: ``(None, n_actions)``)
Shape = tuple[int | None, ...]


def shape_fits(shape: tuple[int, ...], expected: Shape) -> bool:
    """Whether ``shape`` is ``expected``, a ``None`` dimension matching any size."""
    return len(shape) == len(expected) and all(
        e is None or s == e for s, e in zip(shape, expected, strict=True))


@dataclass(frozen=True)
class Safeguards:
    """The screening and aggregation settings of a strategy.

    Parameters
    ----------
    aggregation : {"mean", "median", "trimmed-mean"}
        ``mean``: weighted mean (FedAvg). ``median``: coordinate-wise weighted median.
        ``trimmed-mean``: coordinate-wise, the ``ceil(trim_fraction * n)`` lowest and
        highest values dropped, weighted mean of the rest.
    trim_fraction : float in [0, 0.5)
    clip_factor : float >= 0
        Pull replies further than this multiple of the deviation scale from the center
        back onto that distance (centered clipping); 0 turns clipping off.
    norm_bound_factor : float >= 0
        Refuse replies further than this multiple of the deviation scale from the
        center; 0 turns the bound off.
    weight_cap_factor : float >= 0
        Cap each client's weight at this multiple of the round's median claimed
        size; 0 turns the cap off.
    """

    aggregation: str = "mean"
    trim_fraction: float = 0.1
    clip_factor: float = 3.0
    norm_bound_factor: float = 10.0
    weight_cap_factor: float = 10.0

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, "
                             f"got {self.aggregation!r}")
        if not 0.0 <= self.trim_fraction < 0.5:
            raise ValueError(f"trim_fraction must be in [0, 0.5), got {self.trim_fraction}")
        for name in ("clip_factor", "norm_bound_factor", "weight_cap_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0 (0: off), got {value}")

    def combine(self, arrays: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        """Aggregate equally shaped arrays with this rule."""
        return aggregate(arrays, weights, self.aggregation, self.trim_fraction)


#: no safeguards and plain weighted means: the behaviour before screening had them
OFF = Safeguards(clip_factor=0.0, norm_bound_factor=0.0, weight_cap_factor=0.0)


@dataclass
class Reference:
    """What a round's replies are measured against, kept by the strategy from round to
    round: the previous round's deviation scale (None: no earlier round)."""

    scale: float | None = None

    def round_scale(self, distances: np.ndarray) -> float:
        """The median distance, at most :data:`SCALE_GROWTH` x the previous scale."""
        scale = float(np.median(distances))
        if self.scale is not None and self.scale > 0:
            scale = min(scale, SCALE_GROWTH * self.scale)
        return scale


def robust_center(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """The coordinate-wise (unweighted) median of equally shaped arrays, which a minority
    cannot move beyond the majority's own spread, nor a claimed weight at all; None for
    arrays of different shapes (readouts of different D_i: measured from zero)."""
    if len({a.shape for a in arrays}) != 1:
        return None
    return np.median(np.stack(arrays), axis=0)


# ------------------------------------------------------------------ aggregation rules
def weighted_mean(arrays: Sequence[np.ndarray], weights: Sequence[float] | np.ndarray
                  ) -> np.ndarray:
    """``sum_i w_i a_i / sum_i w_i`` over equally shaped arrays.

    Summed first and divided once: with equal weights, float32 replies (DQN networks and
    Q-values) sum exactly in float64, so the mean does not depend on the order the
    replies arrived in, which an in-process run (summing in client order) then matches
    bit for bit. Normalising the weights first rounded every term, and where the mean
    is near zero the reply order showed in its float32 rounding (5 of 400 anchor Q-values).
    """
    w = np.asarray(weights, dtype=np.float64)
    return np.tensordot(w, np.stack(arrays), axes=1) / w.sum()


def weighted_median(stack: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Coordinate-wise weighted median of ``stack`` (n, ...); with equal weights it is
    ``np.median`` (the two middle values averaged for even n)."""
    order = np.argsort(stack, axis=0, kind="stable")
    values = np.take_along_axis(stack, order, axis=0)
    wb = np.broadcast_to(weights.reshape((-1,) + (1,) * (stack.ndim - 1)), stack.shape)
    cum = np.cumsum(np.take_along_axis(wb, order, axis=0), axis=0)
    half = cum[-1] / 2
    tol = 1e-12 * cum[-1]
    lower = np.argmax(cum >= half - tol, axis=0)
    upper = np.argmax(cum > half + tol, axis=0)
    pick = np.take_along_axis
    return 0.5 * (pick(values, lower[None], axis=0)[0] + pick(values, upper[None], axis=0)[0])


def trim_count(n: int, trim_fraction: float) -> int:
    """Values dropped at each end by the trimmed mean of ``n``: ``ceil(trim * n)``, at
    most ``(n - 1) // 2`` so that one value is always kept."""
    return min(math.ceil(trim_fraction * n - 1e-9), (n - 1) // 2)


def aggregate(arrays: Sequence[np.ndarray], weights: Sequence[float], rule: str = "mean",
              trim_fraction: float = 0.1) -> np.ndarray:
    """Combine equally shaped arrays (or scalars) by ``rule`` (:data:`AGGREGATIONS`)."""
    if rule == "mean":
        return weighted_mean(arrays, weights)
    stack = np.stack([np.asarray(a, dtype=np.float64) for a in arrays])
    w = np.asarray(weights, dtype=np.float64)
    if rule == "median":
        return weighted_median(stack, w)
    if rule == "trimmed-mean":
        k = trim_count(len(stack), trim_fraction)
        if k == 0:
            return weighted_mean(list(stack), w)
        order = np.argsort(stack, axis=0, kind="stable")
        values = np.take_along_axis(stack, order, axis=0)[k:len(stack) - k]
        wb = np.broadcast_to(w.reshape((-1,) + (1,) * (stack.ndim - 1)), stack.shape)
        kept_w = np.take_along_axis(wb, order, axis=0)[k:len(stack) - k]
        return np.asarray((values * kept_w).sum(axis=0) / kept_w.sum(axis=0))
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {rule!r}")


# ---------------------------------------------------------------------- screening
@dataclass
class ScreenedReplies:
    """Arrays, weights and metrics of the accepted replies, plus the counts of the rest."""

    arrays: list[np.ndarray] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    received: int = 0
    failed: int = 0
    rejected: int = 0
    norm_refused: int = 0
    weight_capped: int = 0
    clipped: int = 0
    #: sum of the ``value-flags`` every readable reply claims, refused ones included (a
    #: flagged shard often yields a reply the norm bound refuses); None: none claimed any
    value_flags: int | None = None
    #: messages sent this round (None: unknown, taken as ``received``)
    sampled: int | None = None
    safeguards: Safeguards = OFF
    #: prefix of log lines (the strategy, stage and round)
    label: str = ""

    def weighted_mean(self) -> np.ndarray:
        return weighted_mean(self.arrays, self.weights)

    def combine(self) -> np.ndarray:
        """The accepted arrays aggregated by the strategy's rule."""
        return self.safeguards.combine(self.arrays, self.weights)

    def receive(self, msg: Message, labels: Mapping[int, int] | None = None
                ) -> bool:
        """Count ``msg`` as received; True when it is an error reply (then counted as
        failed and logged), for strategies that screen their replies themselves."""
        self.received += 1
        if not msg.has_error():
            return False
        self.failed += 1
        log(WARNING, "%s: %s replied with an error: %s", self.label,
            describe(msg.metadata.src_node_id, None, labels), msg.error.reason)
        return True

    def drop(self, index: int) -> None:
        """Leave accepted reply ``index`` out."""
        for items in (self.arrays, self.weights, self.metrics, self.nodes):
            if len(items) > index:
                del items[index]

    def per_node_metrics(self) -> dict[int, dict[str, float]]:
        """Each accepted reply's own metrics, by source node id (for per-client reports)."""
        return dict(zip(self.nodes, self.metrics, strict=True))

    def counts(self) -> dict[str, int]:
        """The round's reply accounting."""
        sampled = self.received if self.sampled is None else self.sampled
        return {C.REPLIES_SAMPLED: sampled, C.REPLIES_RECEIVED: self.received,
                C.REPLIES_OK: len(self.metrics), C.REPLIES_FAILED: self.failed,
                C.REPLIES_REJECTED: self.rejected, C.REPLIES_NORM_REFUSED: self.norm_refused,
                C.REPLIES_WEIGHT_CAPPED: self.weight_capped, C.REPLIES_CLIPPED: self.clipped,
                C.REPLIES_TIMED_OUT: max(sampled - self.received, 0)}

    def missing_metrics(self) -> dict[str, list[int]]:
        """Metric key -> indices of the accepted replies that lack it (for the keys that
        some, but not all, accepted replies sent)."""
        keys = set().union(*self.metrics) - set(C.SIZE_KEYS) - {C.PARTITION_ID}
        return {key: [i for i, m in enumerate(self.metrics) if key not in m]
                for key in sorted(keys) if not all(key in m for m in self.metrics)}

    def round_metrics(self) -> MetricRecord:
        """The numeric reply metrics aggregated by the strategy's rule, each over the
        replies that carry it (omissions logged and counted), the sizes summed, plus the
        counts."""
        # MetricRecord's value type (dict is invariant, so spell it out)
        out: dict[str, int | float | list[int] | list[float]] = {}
        missing = self.missing_metrics() if self.metrics else {}
        for key, lacking in missing.items():
            log(WARNING, "%s: metric '%s' missing from %d of %d replies (%s); aggregated over "
                "the replies that sent it", self.label, key, len(lacking), len(self.metrics),
                ", ".join(describe(self.nodes[i], self.metrics[i]) for i in lacking))
        if self.metrics:
            # a sum is kept for the sizes; a mean of ids means nothing
            keys = (set().union(*self.metrics) - set(C.SIZE_KEYS)
                    - {C.PARTITION_ID, C.VALUE_FLAGS})
            for key in sorted(keys):
                w, values = zip(*((wi, m[key]) for wi, m in
                                  zip(self.weights, self.metrics, strict=True) if key in m),
                                strict=True)
                out[key] = float(self.safeguards.combine(
                    [np.asarray(v, dtype=np.float64) for v in values],
                    list(np.asarray(w) / np.sum(w))))
            for key in C.SIZE_KEYS:
                if any(key in m for m in self.metrics):
                    out[key] = int(sum(m.get(key, 0) for m in self.metrics))
        out[C.METRICS_MISSING] = len(missing)
        flags = self.value_flags
        if flags is None and any(C.VALUE_FLAGS in m for m in self.metrics):
            flags = int(sum(m.get(C.VALUE_FLAGS, 0) for m in self.metrics))
        if flags is not None:
            out[C.VALUE_FLAGS] = flags
        out.update(self.counts())
        return MetricRecord(out)


def reply_size(metrics: Mapping[str, Any]) -> tuple[str, Any] | None:
    """``(key, value)`` of a reply's size: ``num-transitions``, else ``num-examples``
    (Flower's ``FedAvg`` key, what a non-RL app sends); ``None`` when it has neither."""
    for key in C.SIZE_KEYS:
        if key in metrics:
            return key, metrics[key]
    return None


def describe(node: int, metrics: Any, labels: Mapping[int, int] | None = None) -> str:
    """``node 7``, ``node 7 (partition-id 3)`` (claimed by this reply's metrics) or
    ``node 7 (partition-id 3 earlier)`` (claimed by an earlier reply, in ``labels``), for
    log lines; never raises."""
    try:
        pid = metrics.get(C.PARTITION_ID) if metrics is not None else None
        if pid is not None:
            return f"node {node} (partition-id {pid!r})"
        earlier = (labels or {}).get(node)
        return f"node {node}" + (f" (partition-id {earlier} earlier)" if earlier is not None
                                 else "")
    except Exception:  # noqa: BLE001 - a log line must not fail on a crafted record
        return f"node {node}"


def screen_replies(
    replies: Iterable[Message],
    array_key: str | None,
    expected_shape: Shape | None,
    uniform: bool,
    label: str,
    safeguards: Safeguards = OFF,
    sampled: int | None = None,
    labels: Mapping[int, int] | None = None,
    reference: Reference | None = None,
) -> ScreenedReplies:
    """Split replies into usable ones and counted refusals; never raises on a reply.

    Parameters
    ----------
    replies : iterable of Message
    array_key : str or None
        Key of the array each reply must carry in its ``arrays`` record; ``None``
        for metric-only replies (evaluation).
    expected_shape : tuple or None
        Required shape of that array, a ``None`` entry accepting any size in its dimension
        (``None``: the shape most well-formed replies have, so that a first reply of
        another shape cannot set it).
    uniform : bool
        Weight accepted replies equally instead of by ``num-transitions``.
    label : str
        Prefix for log lines (the strategy and stage).
    safeguards : Safeguards
        Norm bound, weight cap and aggregation rule (default: all off, plain mean).
    sampled : int or None
        Messages sent for this round (replies not received count as timed out).
    labels : mapping of node id to partition id, optional
        The partition ids nodes claimed earlier (``IdentityRegistry.labels``), so that a
        log line names the partition of a node whose reply does not say it (an error).
    reference : Reference, optional
        The previous round's deviation scale (None: none); updated to this round's.
    """
    out = ScreenedReplies(safeguards=safeguards, sampled=sampled, label=label)
    claims: list[float] = []
    replies = list(replies)
    if expected_shape is None and array_key is not None:
        expected_shape = _majority_shape(replies, array_key)
    for msg in replies:
        out.received += 1
        node: Any = "?"
        try:
            node = msg.metadata.src_node_id
            if msg.has_error():
                out.failed += 1
                log(WARNING, "%s: %s replied with an error: %s", label,
                    describe(node, None, labels), msg.error.reason)
                continue
            _count_value_flags(out, msg)
            reason, array, metrics = _check(msg, array_key, expected_shape)
        except Exception as exc:  # noqa: BLE001 - whatever a reply holds, the round goes on
            reason, array, metrics = f"unreadable reply ({type(exc).__name__}: {exc})", None, {}
        if reason is not None:
            out.rejected += 1
            log(WARNING, "%s: reply of %s left out: %s", label,
                describe(node, _metrics_or_none(msg), labels), reason)
            continue
        if array is not None:
            out.arrays.append(array)
        out.metrics.append(metrics)
        out.nodes.append(node)
        size = reply_size(metrics)
        assert size is not None  # _check refuses a reply without one
        claims.append(float(size[1]))
    measured = _bound(out, claims, label, reference if reference is not None else Reference())
    _cap_weights(out, claims, uniform, label)
    if measured is not None:
        _clip(out, claims, *measured, label)
    log(INFO, "%s: %d replies aggregated, %d failed, %d rejected (%d over the norm bound), "
        "%d clipped, %d weights capped", label, len(out.metrics), out.failed, out.rejected,
        out.norm_refused, out.clipped, out.weight_capped)
    return out


def _majority_shape(replies: list[Message], array_key: str) -> tuple[int, ...] | None:
    """The shape most replies' well-formed finite ``array_key`` arrays have (ties: the
    first seen); ``None`` if there is none. Never raises."""
    shapes: Counter[tuple[int, ...]] = Counter()
    for msg in replies:
        try:
            if msg.has_error():
                continue
            record = msg.content.get(C.ARRAYS)
            if not isinstance(record, ArrayRecord) or array_key not in record:
                continue
            reason, array = decode_array(record[array_key], None)
            if reason is None and array is not None and np.all(np.isfinite(array)):
                shapes[array.shape] += 1
        except Exception:  # noqa: BLE001 - a crafted reply is simply not counted
            continue
    return shapes.most_common(1)[0][0] if shapes else None


def _count_value_flags(out: ScreenedReplies, msg: Message) -> None:
    """Add the reply's claimed ``value-flags`` (a count >= 0; anything else is ignored)."""
    record = _metrics_or_none(msg)
    value = record.get(C.VALUE_FLAGS) if record is not None else None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 2**31:
        out.value_flags = (out.value_flags or 0) + int(value)


def _metrics_or_none(msg: Message) -> Any:
    try:
        record = msg.content.get(C.METRICS)
        return record if isinstance(record, MetricRecord) else None
    except Exception:  # noqa: BLE001
        return None


def _bound(out: ScreenedReplies, claims: list[float], label: str, reference: Reference
           ) -> tuple[np.ndarray, float, np.ndarray | None] | None:
    """Refuse replies further than ``norm_bound_factor`` x the scale from the robust
    center; sets the round's scale (``reference.scale``). Returns the kept
    replies' distances, the scale and the center (None: zero), or None without a scale."""
    guards = out.safeguards
    if len(out.arrays) < 2 or not (guards.norm_bound_factor or guards.clip_factor):
        return None
    center = robust_center(out.arrays)
    distances = np.array([float(np.linalg.norm(a if center is None else a - center))
                          for a in out.arrays])
    scale = reference.round_scale(distances)
    if not scale > 0:  # an all-equal majority gives no scale
        return None
    reference.scale = scale
    bound = guards.norm_bound_factor * scale
    for i in reversed(range(len(distances))):
        if guards.norm_bound_factor and distances[i] > bound:
            log(WARNING, "%s: reply of %s left out: %.4g from %s, above the bound %.4g "
                "(%g x the deviation scale %.4g)", label,
                describe(out.nodes[i], out.metrics[i]), distances[i], _from(center), bound,
                guards.norm_bound_factor, scale)
            out.drop(i)
            del claims[i]
            out.rejected += 1
            out.norm_refused += 1
            distances = np.delete(distances, i)
    return distances, scale, center


def _from(center: np.ndarray | None) -> str:
    return "zero" if center is None else "the replies' coordinate-wise median"


#: a client's pull on the aggregate, n x weight share x distance, is held to this many
#: times the deviation scale (a client of average weight at the default clip radius
#: pulls 3): honest clients of 10x the median size among 4 keep their weight unless they
#: lie further than ~1.5x the scale from the center
PULL_FACTOR = 5.0


def _clip(out: ScreenedReplies, claims: list[float], deviations: np.ndarray, scale: float,
          center: np.ndarray | None, label: str) -> None:
    """Pull each reply further than ``clip_factor`` x the scale from the center back onto
    that radius; then lower the weight of any client whose pull on the aggregate, ``n``
    x its weight share x its distance, is above :data:`PULL_FACTOR` x the scale, to the
    weight that makes it equal (its reply unchanged). A claimed size cannot buy
    influence, and a heavy honest client close to the others keeps its whole weight."""
    factor = out.safeguards.clip_factor
    if not factor or not out.arrays:
        return
    radius = factor * scale
    distances = np.array(deviations, dtype=np.float64)
    for i, deviation in enumerate(deviations):
        if deviation > radius:
            base = 0.0 if center is None else center
            out.arrays[i] = base + (out.arrays[i] - base) * (radius / deviation)
            distances[i] = radius
            out.clipped += 1
            log(WARNING, "%s: reply of %s clipped: %.4g from %s, pulled back to %.4g (%g x "
                "the deviation scale)", label, describe(out.nodes[i], out.metrics[i]),
                deviation, _from(center), radius, factor)
    n, pull = len(distances), PULL_FACTOR * scale
    weights = np.asarray(out.weights, dtype=np.float64)
    for _ in range(len(weights)):  # each pass settles one more client at most
        total = weights.sum()
        over = n * weights * distances > pull * total * (1 + 1e-12)
        if not over.any():
            break
        i = int(np.argmax(np.where(over, weights * distances, -np.inf)))
        others = total - weights[i]
        weights[i] = pull * others / (n * distances[i] - pull)
    capped = np.asarray(out.weights) < np.asarray(claims)  # counted already
    for j in map(int, np.flatnonzero(weights < np.asarray(out.weights))):
        log(WARNING, "%s: weight of %s lowered from %.4g to %.4g: %d x its share x its "
            "distance %.4g was above %g x the deviation scale", label,
            describe(out.nodes[j], out.metrics[j]), out.weights[j], weights[j], n,
            distances[j], PULL_FACTOR)
        out.weights[j] = float(weights[j])
        out.weight_capped += int(not capped[j])


def _cap_weights(out: ScreenedReplies, claims: list[float], uniform: bool, label: str) -> None:
    """Weights: the claimed sizes (or 1), each capped at ``weight_cap_factor`` x the
    median claim; the capped size also replaces the claim in the reply's metrics."""
    if uniform:
        out.weights = [1.0] * len(claims)
        return
    factor = out.safeguards.weight_cap_factor
    cap = factor * float(np.median(claims)) if factor > 0 and claims else math.inf
    out.weights = []
    for i, claim in enumerate(claims):
        if claim > cap:
            key = (reply_size(out.metrics[i]) or (C.NUM_TRANSITIONS,))[0]
            log(WARNING, "%s: weight of %s capped: claims %.4g %s, cap %.4g (%g x the "
                "median claim)", label, describe(out.nodes[i], out.metrics[i]), claim,
                key, cap, factor)
            out.weight_capped += 1
            out.metrics[i] = {**out.metrics[i], key: cap}
            claim = cap
        out.weights.append(claim)


def decode_array(obj: Any, expected_shape: Shape | None
                 ) -> tuple[str | None, np.ndarray | None]:
    """``(None, float64 array)`` for a well-formed real-float numpy ``Array``, else
    ``(reason, None)``. Reads the ``.npy`` header first and never unpickles, never
    allocates more than the bytes received."""
    if not isinstance(obj, Array):
        return f"not a flwr Array ({type(obj).__name__})", None
    if obj.stype != NUMPY_STYPE:
        return f"serialization type {obj.stype!r} is not {NUMPY_STYPE!r}", None
    data = obj.data
    if not isinstance(data, bytes | bytearray):
        return f"array data of type {type(data).__name__}, expected bytes", None
    buffer = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buffer)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(buffer)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(buffer)
        else:
            return f"unsupported .npy version {version}", None
    except Exception as exc:  # noqa: BLE001 - any header problem is a refusal
        return f"undecodable array bytes ({type(exc).__name__}: {exc})", None
    if dtype.hasobject or dtype.fields is not None or dtype.kind != "f":
        return f"dtype {dtype} is not a real floating type", None
    shape = tuple(int(s) for s in shape)
    if expected_shape is not None and not shape_fits(shape, tuple(expected_shape)):
        return f"shape {shape}, expected {tuple(expected_shape)}", None
    n = math.prod(shape)
    if n > MAX_ELEMENTS:
        return f"shape {shape} has {n} elements, more than {MAX_ELEMENTS}", None
    if tuple(int(s) for s in obj.shape) != shape:
        return f"Array.shape {tuple(obj.shape)} differs from its data's shape {shape}", None
    offset = buffer.tell()
    if len(data) - offset != n * dtype.itemsize:
        return (f"array data has {len(data) - offset} bytes, its header claims "
                f"{n * dtype.itemsize}"), None
    flat = np.frombuffer(data, dtype=dtype, count=n, offset=offset)
    array = flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)
    return None, np.array(array, dtype=np.float64)


def decode_reward_range(record: Any) -> tuple[str | None, np.ndarray | None]:
    """``(None, [min, max])`` of a reply's ``reward-range`` (finite, min <= max), else
    ``(reason, None)``: the statistic FedQHDExact and FedQHDPooled agree value ranges by."""
    if not isinstance(record, ArrayRecord):
        return f"no '{C.ARRAYS}' ArrayRecord", None
    if C.REWARD_RANGE not in record:
        return f"no '{C.REWARD_RANGE}' array", None
    # decoded as screening does: real floats only, bytes as the header claims
    reason, extremes = decode_array(record[C.REWARD_RANGE], (2,))
    if reason is not None or extremes is None:
        return f"'{C.REWARD_RANGE}': {reason}", None
    if not np.all(np.isfinite(extremes)) or extremes[0] > extremes[1]:
        return f"'{C.REWARD_RANGE}' must be finite [min, max]", None
    return None, extremes


def decode_action_counts(record: ArrayRecord, n_actions: int
                         ) -> tuple[str | None, np.ndarray | None]:
    """``(None, counts)`` of a reply's ``action-counts`` (finite, >= 0), else a reason."""
    if C.ACTION_COUNTS not in record:
        return f"no '{C.ACTION_COUNTS}' array", None
    reason, counts = decode_array(record[C.ACTION_COUNTS], (n_actions,))
    if reason is not None or counts is None:
        return f"'{C.ACTION_COUNTS}': {reason}", None
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        return f"'{C.ACTION_COUNTS}' must be finite and >= 0", None
    return None, counts


def _check(
    msg: Message, array_key: str | None, expected_shape: Shape | None
) -> tuple[str | None, np.ndarray | None, dict[str, float]]:
    content = msg.content
    metrics_record = content.get(C.METRICS)
    if not isinstance(metrics_record, MetricRecord):
        return f"no '{C.METRICS}' MetricRecord", None, {}
    metrics = {k: v for k, v in metrics_record.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    size = reply_size(metrics)
    n = None if size is None else size[1]
    if n is None or not np.isfinite(n) or n <= 0:
        return (f"'{C.NUM_TRANSITIONS}' (or '{C.NUM_EXAMPLES}') missing or not positive "
                f"({n!r})"), None, {}
    if not all(np.isfinite(v) for v in metrics.values()):
        return "non-finite metric values", None, {}
    if array_key is None:
        return None, None, metrics
    record = content.get(C.ARRAYS)
    if not isinstance(record, ArrayRecord) or array_key not in record:
        return f"no '{array_key}' array in ArrayRecord '{C.ARRAYS}'", None, {}
    reason, array = decode_array(record[array_key], expected_shape)
    if reason is not None or array is None:
        return f"'{array_key}': {reason}", None, {}
    if not np.all(np.isfinite(array)):
        return f"'{array_key}' holds non-finite values", None, {}
    return None, array, metrics

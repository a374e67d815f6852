"""Reply screening shared by the fedqhd strategies.

A reply is aggregated only if it carries no error, has the expected array with
the expected shape, only finite values, and a positive transition count. Every
other reply is left out, logged with its reason and counted in the round's
metrics, and the round goes on with the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common.logger import log

from . import contract as C


def weighted_mean(arrays: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """``sum_i w_i a_i / sum_i w_i`` over equally shaped arrays."""
    w = np.asarray(weights, dtype=np.float64)
    return np.tensordot(w / w.sum(), np.stack(arrays), axes=1)


@dataclass
class ScreenedReplies:
    """Arrays, weights and metrics of the accepted replies, plus the counts of the rest."""

    arrays: list[np.ndarray] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    failed: int = 0
    rejected: int = 0

    def weighted_mean(self) -> np.ndarray:
        return weighted_mean(self.arrays, self.weights)

    def per_node_metrics(self) -> dict[int, dict[str, float]]:
        """Each accepted reply's own metrics, by source node id (for per-client reports)."""
        return dict(zip(self.nodes, self.metrics, strict=True))

    def round_metrics(self) -> MetricRecord:
        """Weighted means of the numeric reply metrics plus the screening counts."""
        # MetricRecord's value type (dict is invariant, so spell it out)
        out: dict[str, int | float | list[int] | list[float]] = {}
        if self.metrics:
            w = np.asarray(self.weights, dtype=np.float64)
            w = w / w.sum()
            # a sum is kept for the counts; a mean of ids means nothing
            keys = set.intersection(*(set(m) for m in self.metrics)) - {C.NUM_TRANSITIONS,
                                                                        C.PARTITION_ID}
            for key in sorted(keys):
                out[key] = float(sum(wi * m[key] for wi, m in zip(w, self.metrics, strict=True)))
            out[C.NUM_TRANSITIONS] = int(sum(m.get(C.NUM_TRANSITIONS, 0) for m in self.metrics))
        out[C.REPLIES_OK] = len(self.metrics)
        out[C.REPLIES_FAILED] = self.failed
        out[C.REPLIES_REJECTED] = self.rejected
        return MetricRecord(out)


def screen_replies(
    replies: Iterable[Message],
    array_key: str | None,
    expected_shape: tuple[int, ...] | None,
    uniform: bool,
    label: str,
) -> ScreenedReplies:
    """Split replies into usable ones and counted failures.

    Parameters
    ----------
    replies : iterable of Message
    array_key : str or None
        Key of the array each reply must carry in its ``arrays`` record; ``None``
        for metric-only replies (evaluation).
    expected_shape : tuple or None
        Required shape of that array (``None``: any shape, but all equal).
    uniform : bool
        Weight accepted replies equally instead of by ``num-transitions``.
    label : str
        Prefix for log lines (the strategy and stage).
    """
    out = ScreenedReplies()
    for msg in replies:
        node = msg.metadata.src_node_id
        if msg.has_error():
            out.failed += 1
            log(WARNING, "%s: node %s replied with an error: %s", label, node, msg.error.reason)
            continue
        reason, array, metrics = _check(msg, array_key, expected_shape)
        if reason is not None:
            out.rejected += 1
            log(WARNING, "%s: reply of node %s left out: %s", label, node, reason)
            continue
        if expected_shape is None and array is not None:
            expected_shape = array.shape
        if array is not None:
            out.arrays.append(array)
        out.metrics.append(metrics)
        out.nodes.append(node)
        out.weights.append(1.0 if uniform else float(metrics[C.NUM_TRANSITIONS]))
    log(INFO, "%s: %d replies aggregated, %d failed, %d rejected", label,
        len(out.metrics), out.failed, out.rejected)
    return out


def _check(
    msg: Message, array_key: str | None, expected_shape: tuple[int, ...] | None
) -> tuple[str | None, np.ndarray | None, dict[str, float]]:
    content = msg.content
    metrics_record = content.get(C.METRICS)
    if not isinstance(metrics_record, MetricRecord):
        return f"no '{C.METRICS}' MetricRecord", None, {}
    metrics = {k: v for k, v in metrics_record.items() if isinstance(v, int | float)}
    n = metrics.get(C.NUM_TRANSITIONS)
    if n is None or not np.isfinite(n) or n <= 0:
        return f"'{C.NUM_TRANSITIONS}' missing or not positive ({n!r})", None, {}
    if not all(np.isfinite(v) for v in metrics.values()):
        return "non-finite metric values", None, {}
    if array_key is None:
        return None, None, metrics
    record = content.get(C.ARRAYS)
    if record is None or array_key not in record:
        return f"no '{array_key}' array in record '{C.ARRAYS}'", None, {}
    # the "arrays" entry of a reply is an ArrayRecord by the message contract
    array = cast(ArrayRecord, record)[array_key].numpy()
    if expected_shape is not None and tuple(array.shape) != tuple(expected_shape):
        return (f"'{array_key}' has shape {tuple(array.shape)}, expected "
                f"{tuple(expected_shape)}"), None, {}
    if not np.issubdtype(array.dtype, np.number) or not np.all(np.isfinite(array)):
        return f"'{array_key}' holds non-finite or non-numeric values", None, {}
    return None, np.asarray(array, dtype=np.float64), metrics

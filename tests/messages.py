"""Reply messages for strategy tests: what a node would send back to the server."""

from __future__ import annotations

import time

from flwr.app import Error, Message, Metadata, MetricRecord, RecordDict

from fedqhd.strategies import contract as C


def reply(node: int, arrays: dict | None = None, metrics: dict | None = None,
          error: str | None = None) -> Message:
    """A train reply of ``node`` carrying ``arrays`` and ``metrics``, or an ``error``."""
    meta = Metadata(run_id=1, message_id=f"r{node}", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="q", group_id="1", created_at=time.time(), ttl=60,
                    message_type="train")
    if error is not None:
        return Message(metadata=meta, error=Error(code=0, reason=error))
    content = RecordDict()
    if arrays is not None:
        content[C.ARRAYS] = C.to_array_record(arrays)
    if metrics is not None:
        content[C.METRICS] = MetricRecord(metrics)
    return Message(metadata=meta, content=content)

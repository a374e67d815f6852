"""An in-process Flower Grid for tests: strategies talk to real ClientApps without Ray.

Each node is a ``ClientApp`` plus its own ``Context`` (node config with
``partition-id``; state kept across rounds), and ``send_and_receive`` calls the
app directly, so a whole ``strategy.start`` runs in milliseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

RUN_ID = 4242


class LoopbackGrid(Grid):
    def __init__(self, apps: list[ClientApp], run_config: dict | None = None) -> None:
        TaskIdentity.run_id = RUN_ID
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 1
        self.apps = {1000 + i: app for i, app in enumerate(apps)}
        self.contexts = {
            node: Context(run_id=RUN_ID, node_id=node,
                          node_config={"partition-id": i, "num-partitions": len(apps)},
                          state=RecordDict(), run_config=dict(run_config or {}))
            for i, node in enumerate(self.apps)
        }
        self.down: set[int] = set()  # nodes that answer with an error
        self._ids = itertools.count()

    # --- the parts of the Grid API strategies use ---
    def get_node_ids(self) -> Iterable[int]:
        return list(self.apps)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            node = msg.metadata.dst_node_id
            replies.append(self.apps[node](msg, self.contexts[node]))
        return replies

    # --- not needed in process ---
    def create_message(self, *a, **k):  # pragma: no cover
        raise NotImplementedError

    def push_messages(self, messages):  # pragma: no cover
        raise NotImplementedError

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError

    def get_nodes(self):  # pragma: no cover
        raise NotImplementedError

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def set_run(self, run_id: int) -> None:  # pragma: no cover
        raise NotImplementedError

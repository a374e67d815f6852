"""An in-process Flower Grid: strategies talk to real ClientApps without Ray.

Each node is a ``ClientApp`` plus its own ``Context`` (node config with
``partition-id``; state kept across rounds), and ``send_and_receive`` calls the
app directly in this process. Tests and benchmarks use it to run the very same
ServerApp logic, strategies and ClientApps as ``flwr run`` without Ray's start-up
cost; it is not a deployment (no isolation between clients).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedqhd.server.failures import reply_error

RUN_ID = 4242


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApps called in this process.

    Parameters
    ----------
    apps : list of ClientApp
        One per node; node ``i`` gets ``partition-id = i``.
    run_config : dict, optional
        The run config every node's Context carries.
    node_configs : list of dict, optional
        Extra node-config entries per node (for example ``data-dir``).
    """

    #: every node exists from the start (no node joins later): the preflight refuses a
    #: ``min-nodes`` above their count instead of waiting ``node-wait-timeout`` for them
    fixed_nodes = True

    def __init__(self, apps: list[ClientApp], run_config: dict | None = None,
                 node_configs: list[dict] | None = None) -> None:
        TaskIdentity.run_id = RUN_ID
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 1
        self.apps = {1000 + i: app for i, app in enumerate(apps)}
        self.contexts = {
            node: Context(run_id=RUN_ID, node_id=node,
                          node_config={"partition-id": i, "num-partitions": len(apps),
                                       **(node_configs[i] if node_configs else {})},
                          state=RecordDict(), run_config=dict(run_config or {}))
            for i, node in enumerate(self.apps)
        }
        self._ids = itertools.count()
        self._replies: dict[str, Message] = {}

    # --- the parts of the Grid API strategies use ---
    def get_node_ids(self) -> Iterable[int]:
        return list(self.apps)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return [self._handle(msg) for msg in messages]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Handle each message now; its reply waits for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            reply = self._handle(msg)
            self._replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def _handle(self, msg: Message) -> Message:
        msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
        node = msg.metadata.dst_node_id
        try:
            return self.apps[node](msg, self.contexts[node])
        except Exception as exc:  # as Flower does: a crashing ClientApp replies an error
            return reply_error(msg, exc)

    # --- not needed in process ---
    def create_message(self, *a, **k):  # pragma: no cover
        raise NotImplementedError

    def get_nodes(self):  # pragma: no cover
        raise NotImplementedError

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def set_run(self, run: Run) -> None:  # pragma: no cover
        raise NotImplementedError

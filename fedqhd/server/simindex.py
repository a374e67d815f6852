"""A per-node index for the link state Flower's simulation engine polls.

Why: in Flower 1.42's simulation runtime a thread calls
``InMemoryLinkState.get_message_ins(node_id, limit=1)`` for every simulated node every
0.1 s, and each call checks every stored message (expiry, federation) before it finds
the node's own: O(nodes x stored) checks per poll. With ``sim-window`` messages stored
that is still 32,000 checks per poll at 1000 nodes and 320,000 at 10,000: the poll
alone kept 0.6 of a core busy in a 1000-client ``flwr run`` (py-spy, BENCHMARKS.md),
in the process that also runs the ServerApp, and at 10,000 nodes it cannot dispatch
more than a few dozen messages a second.

:func:`index_messages` gives that one state object (the simulation grid's, which the
engine shares) an index from node to the ids of its stored messages, recorded as
messages are stored, and a ``get_message_ins`` that applies Flower's own checks and
selection to that node's messages only. The messages returned, their order, the
``delivered_at`` marks and the expiry of a node's messages are those of Flower's
method; only other nodes' expired messages are dropped at their own node's poll
instead of at every node's. The ServerApp installs it on Flower's simulation grid
only (``sim-index``, default on), and only on the state class and Flower version it
was written against (the body mirrors ``InMemoryLinkState.get_message_ins`` of flwr
1.42); anything else is left alone, with a log line.
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

from flwr.app import Message
from flwr.common.logger import log
from flwr.supercore.date import now

#: the Flower versions whose InMemoryLinkState.get_message_ins the replacement mirrors
FLOWER_VERSIONS = ("1.42.",)


def index_messages(state: Any) -> bool:
    """Install the per-node index on ``state`` (a simulation's ``InMemoryLinkState``);
    returns whether it was installed (False: another state or Flower version)."""
    import flwr
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    if getattr(state, "_fedqhd_index", None) is not None:
        return True
    version = str(getattr(flwr, "__version__", ""))
    if type(state) is not InMemoryLinkState or not version.startswith(FLOWER_VERSIONS):
        log(WARNING, "fedqhd: simulation link state not indexed (%s, flwr %s): the engine "
            "scans every stored message per node", type(state).__name__, version)
        return False
    by_node: dict[int, list[str]] = {}
    store = state.store_message_ins

    def store_message_ins(message: Message) -> str | None:
        msg_id = store(message)
        if msg_id:
            with state.lock:
                by_node.setdefault(message.metadata.dst_node_id, []).append(str(msg_id))
        return msg_id

    def get_message_ins(node_id: int, limit: int | None, *,
                        run_id: int | None = None) -> list[Message]:
        # InMemoryLinkState.get_message_ins (flwr 1.42) over this node's messages only
        if limit is not None and limit < 1:
            raise AssertionError("`limit` must be >= 1")
        found: list[Message] = []
        with state.lock:
            ids = by_node.get(node_id)
            if not ids:
                return found
            for msg_id in list(ids):
                state._check_stored_messages({msg_id})
                if (
                    (msg_ins := state.message_ins_store.get(msg_id))
                    and msg_ins.metadata.dst_node_id == node_id
                    and (run_id is None or msg_ins.metadata.run_id == run_id)
                    and msg_ins.metadata.delivered_at == ""
                ):
                    found.append(msg_ins)
                if limit and len(found) == limit:
                    break
            live = [i for i in ids if i in state.message_ins_store]  # drop deleted ones
            if live:
                by_node[node_id] = live
            else:
                del by_node[node_id]
        if found:
            delivered_at = now().isoformat()
            for msg_ins in found:
                msg_ins.metadata.delivered_at = delivered_at
        return found

    target: Any = state  # the instance's methods are replaced, not the class's
    with state.lock:
        for msg_id, msg in state.message_ins_store.items():  # stored before: indexed too
            by_node.setdefault(msg.metadata.dst_node_id, []).append(msg_id)
        target.store_message_ins = store_message_ins
        target.get_message_ins = get_message_ins
        target._fedqhd_index = by_node
    log(INFO, "fedqhd: simulation link state indexed by node (sim-index)")
    return True


def simulation_state(nodes: int, indexed: bool = True) -> tuple[Any, Any, list[int]]:
    """Flower's simulation link state and grid as ``flwr-simulation`` builds them (flwr
    1.42): ``nodes`` registered nodes, one run; with ``indexed``, the state indexed. For
    the index's tests and for timing the engine's per-node poll (docs/scale.md). Returns
    (state, grid, node ids)."""
    from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                               ObjectStoreFactory())
    state: Any = factory.state()  # an InMemoryLinkState: its stores are set directly
    run = Run.create_empty(run_id=7)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    state.run_ids[7] = RunRecord(run=run)
    state.task_store[1] = Task(task_id=1, run_id=7)
    mapping = _register_nodes(num_nodes=nodes, state_factory=factory)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    if indexed:
        index_messages(state)
    return state, grid, list(mapping)

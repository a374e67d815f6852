"""A bounded number of messages in flight under Flower's simulation engine.

Why: in Flower 1.42's simulation runtime (``flwr run`` on a ``--simulation``
SuperLink) a thread polls the in-memory link state every 0.1 s with one
``get_message_ins(node_id)`` call per simulated node, and each call scans every
stored message (``InMemoryLinkState``). A round that pushes all N messages at once
therefore costs O(N^2) Python work per poll for as long as the round lasts, in the
process that also runs the ServerApp and feeds the Ray actors: at 1000 nodes that
scan, not the clients, sets the round time. Keeping at most ``window`` messages
stored (pushing the next one as each reply is pulled) makes a poll O(N x window)
while the actors stay busy.

The simulation's :class:`~flwr.superlink.grid.inmemory_grid.InMemoryGrid` is windowed
(:func:`for_simulation`); a deployed ServerApp's grid is not (its SuperNodes pull their
own messages, a window would only delay them), but it is made to pull replies promptly
(:func:`for_deployment`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

from fedqhd.server.simindex import index_messages
from fedqhd.server.wrapped_grid import WrappedGrid

#: messages kept in the simulation's link state at once (a few per Ray actor is enough
#: to keep them busy between 0.1 s polls; far fewer than the nodes of a large run)
SIMULATION_WINDOW = 32


class ReplySignal:
    """Counts the replies the simulation engine stores in the link state and wakes a
    waiting :class:`WindowedGrid` at each: it pulls a reply when it arrives instead of
    at its next poll (0.025 s later on average, every round)."""

    def __init__(self) -> None:
        self.stored = 0  #: replies stored so far
        self._cond = threading.Condition()

    def install(self, state: Any) -> ReplySignal:
        """Wrap ``state.store_message_res`` (the one the engine's thread calls) to signal;
        returns self."""
        store = state.store_message_res

        def store_message_res(*args: Any, **kwargs: Any) -> Any:
            try:
                return store(*args, **kwargs)
            finally:
                with self._cond:
                    self.stored += 1
                    self._cond.notify_all()

        state.store_message_res = store_message_res
        return self

    def wait(self, seen: int, timeout: float) -> None:
        """Until more than ``seen`` replies were stored, at most ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self.stored != seen, timeout)


class WindowedGrid(WrappedGrid):
    """A Grid that keeps at most ``window`` of a ``send_and_receive`` call's messages
    pushed and unanswered; everything else is the wrapped grid's. With ``arrivals``
    (the link state's :class:`ReplySignal`) it pulls as soon as a reply is stored, else
    every ``pull_interval`` seconds."""

    def __init__(self, grid: Grid, window: int = SIMULATION_WINDOW,
                 pull_interval: float = 0.05, arrivals: ReplySignal | None = None,
                 max_interval: float | None = None) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        super().__init__(grid)
        self.window = int(window)
        self.pull_interval = float(pull_interval)
        #: pulls that find nothing wait 1.5x longer each time, up to this (None: no growth);
        #: a reply brings the wait back to ``pull_interval``
        self.max_interval = self.pull_interval if max_interval is None else float(max_interval)
        self.arrivals = arrivals
        self.max_in_flight = 0  #: the most messages pushed and unanswered at once (tests)
        self.pulls = 0  #: pull requests made (tests)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push up to ``window`` messages, then one more per reply pulled, until every
        reply is in or ``timeout`` seconds (for the whole call) have passed; messages
        not yet pushed by then get no reply, as if lost. Replies come back in the order
        of their messages (not of arrival), so aggregation sums in a fixed order."""
        pending = list(messages)
        pending.reverse()  # pop() from the end keeps the caller's order
        in_flight: set[str] = set()
        order: dict[str, int] = {}
        replies: list[Message] = []
        end = None if timeout is None else time.monotonic() + timeout
        interval = self.pull_interval
        while pending or in_flight:
            if end is not None and time.monotonic() >= end:
                break
            room = self.window - len(in_flight)
            if room > 0 and pending:
                batch = [pending.pop() for _ in range(min(room, len(pending)))]
                ids = list(self.grid.push_messages(batch))
                base = len(order)
                order.update((i, base + k) for k, i in enumerate(ids))
                in_flight.update(ids)
                self.max_in_flight = max(self.max_in_flight, len(in_flight))
            seen = self.arrivals.stored if self.arrivals is not None else 0
            got = list(self.grid.pull_messages(in_flight)) if in_flight else []
            self.pulls += bool(in_flight)
            replies.extend(got)
            in_flight.difference_update(m.metadata.reply_to_message_id for m in got)
            interval = (self.pull_interval if got
                        else min(self.max_interval, interval * 1.5))
            if not got and in_flight:
                wait = interval if end is None else max(
                    0.0, min(interval, end - time.monotonic()))
                if self.arrivals is not None:
                    self.arrivals.wait(seen, wait)  # a reply stored since: at once
                else:
                    time.sleep(wait)
        replies.sort(key=lambda m: order.get(m.metadata.reply_to_message_id, len(order)))
        return replies


def for_deployment(grid: Grid) -> Grid:
    """``grid`` pulling replies promptly if it is the grid of a deployed ServerApp
    (Flower 1.42's ``HttpGrid``, whose ``send_and_receive`` pulls every 3 s): every
    message pushed at once, as Flower does, then pulls 0.05 s apart, 1.5x longer after
    each that finds nothing, at most 1 s apart. Measured on a LocalDeployment (3 TLS
    SuperNodes, offline): a round 3.7-6.7 s instead of 6.25-7.3 s (BENCHMARKS.md,
    "Checkpoint and resume"). Replies come back in the order of their messages. Else
    ``grid``."""
    from flwr.superlink.grid.http_grid import HttpGrid

    if not isinstance(grid, HttpGrid):
        return grid
    return WindowedGrid(grid, window=10**9, pull_interval=0.05, max_interval=1.0)


def for_simulation(grid: Grid, window: int = SIMULATION_WINDOW, index: bool = True) -> Grid:
    """``grid`` windowed if it is Flower's simulation grid (and ``window`` > 0), else
    ``grid`` itself; with ``index``, the simulation's link state also gets its per-node
    message index (:func:`fedqhd.server.simindex.index_messages`)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    if not isinstance(grid, InMemoryGrid):
        return grid
    if index:
        index_messages(grid.state)
    if window <= 0:
        return grid
    return WindowedGrid(grid, window, arrivals=ReplySignal().install(grid.state))

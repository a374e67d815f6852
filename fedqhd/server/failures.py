"""Failures that say so, at once: a run whose every reply fails the same way stops with
that error, and each failure reaches the console as one line.

Why: a ClientApp that raises costs a Ray traceback per client per round, and the
strategies treat a failed reply as one to leave out, so a run whose every client fails
(an empty ``data-dir``, shards of another env) used to run all its rounds, evaluate the
zero model and end with a plausible-looking return. Here:

* :func:`reply_error` is what the ClientApp replies when it raises: one line, the
  exception's type and message, no traceback;
* :class:`FailFastGrid` raises :class:`RoundFailed` as soon as every reply of a
  ``send_and_receive`` call failed with the same error (up to numbers: a partition id or
  a file name differs between clients);
* :func:`reported` marks an exception that fedqhd has already logged in one line, and
  :func:`quiet_reported` drops Flower's traceback of it (Flower 1.42 logs every
  ServerApp exception with its traceback before marking the run failed).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TypeVar

from flwr.app import Error, Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedqhd.server.wrapped_grid import WrappedGrid

__all__ = ["FailFastGrid", "RoundFailed", "RunFailed", "error_reason", "fail_fast",
           "quiet_reported", "reply_error", "reported"]

E = TypeVar("E", bound=BaseException)

#: attribute set on an exception fedqhd has logged in one line (:func:`reported`)
_REPORTED = "_fedqhd_reported"
#: Flower's own reason of a ClientApp exception: ``<class 'pkg.Type'>:<'message'>``
_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]*\.)?(\w+)'>:<'(.*)'>$", re.DOTALL)


class RunFailed(RuntimeError):
    """The run ended without a usable federation (``final.status = "failed"``)."""


class RoundFailed(RunFailed):
    """Every reply of a round failed with the same error: more rounds cannot help."""

    def __init__(self, reason: str, replies: int) -> None:
        super().__init__(f"all {replies} replies of a round failed with the same error: "
                         f"{reason}")
        self.reason = reason
        self.replies = replies


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (newlines folded), what a reply or log carries."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def reply_error(msg: Message, exc: BaseException) -> Message:
    """The error reply of a ClientApp handler that raised ``exc``: its type and message in
    one line, as the in-process grid and the server's logs show them."""
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=one_line(exc)),
                   reply_to=msg)


def error_reason(reply: Message) -> str:
    """The reason of an error reply, Flower's ``<class '...'>:<'...'>`` form shortened to
    ``Type: message``."""
    reason = str(reply.error.reason or f"error code {reply.error.code}")
    match = _FLOWER_REASON.match(reason)
    return f"{match.group(1)}: {match.group(2)}" if match else reason


def _same(reason: str) -> str:
    """The key under which two reasons count as the same error: numbers (partition ids,
    file names, counts) blanked."""
    return re.sub(r"\d+", "#", reason)


class FailFastGrid(WrappedGrid):
    """A Grid that raises :class:`RoundFailed` when every reply of a ``send_and_receive``
    call is an error with the same reason (at least two replies, or the only message's);
    everything else is the wrapped grid's."""

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        sent = list(messages)
        replies = list(self.grid.send_and_receive(sent, timeout=timeout))
        if len(replies) >= min(2, len(sent)) and replies and all(m.has_error()
                                                                 for m in replies):
            reasons = [error_reason(m) for m in replies]
            if len({_same(r) for r in reasons}) == 1:
                raise RoundFailed(reasons[0], len(replies))
        return replies



def fail_fast(grid: Grid) -> Grid:
    """``grid`` wrapped in :class:`FailFastGrid` (once)."""
    return grid if isinstance(grid, FailFastGrid) else FailFastGrid(grid)


def reported(exc: E) -> E:
    """Mark ``exc`` as logged by fedqhd in one line; returns it (``raise reported(exc)``)."""
    try:
        setattr(exc, _REPORTED, True)
    except AttributeError:  # an exception type with __slots__: Flower's traceback stays
        pass
    return exc


def is_reported(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or the exception it was raised from) was :func:`reported`."""
    while exc is not None:
        if getattr(exc, _REPORTED, False):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _DropReportedTracebacks(logging.Filter):
    """Drop a log record whose exception fedqhd has already reported in one line: Flower's
    ``ServerApp raised an exception`` / ``Simulation raised an exception`` and its
    traceback, then the ``Exit Code: ...`` block Flower logs as that process exits ("an
    unhandled exception occurred": it was handled, and said)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = False  #: a reported exception's record was dropped in this process

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info and info[1] is not None and is_reported(info[1]):
            self.dropped = True
            return False
        if self.dropped and str(record.msg).startswith("Exit Code: "):
            self.dropped = False
            return False
        return True


_FILTER = _DropReportedTracebacks()


def quiet_reported(logger: logging.Logger | None = None) -> None:
    """Install the filter on Flower's logger (idempotent); the ServerApp calls it first."""
    if logger is None:
        from flwr.common.logger import FLOWER_LOGGER

        logger = FLOWER_LOGGER
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)

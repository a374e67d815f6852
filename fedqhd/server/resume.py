"""Continuing a stopped run (run-config ``resume-from``) from its checkpoint.

:func:`open_resume` checks that the run config is the checkpointed one (up to
:data:`~fedqhd.server.checkpoint.RESUMABLE_CHANGES`), reads the rounds recorded up
to the checkpoint and cuts ``rounds.jsonl`` back to them (a round that ended after
the checkpoint, or a line torn by the kill, is run again). :class:`RoundOffset`
lets Flower's ``Strategy.start``, which numbers rounds from 1, run rounds
``k + 1, k + 2, ...`` of the checkpointed strategy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedqhd.config import RunConfig
from fedqhd.files import fsync_dir
from fedqhd.server.checkpoint import Checkpoint, CheckpointError, config_differences
from fedqhd.server.results import ROUNDS, merge_lines


@dataclass
class Resume:
    """A checkpointed run about to continue."""

    run_dir: Path
    checkpoint: Checkpoint
    rows: list[dict[str, Any]]  #: the rounds 1..checkpoint.round as recorded


def open_resume(cfg: RunConfig) -> Resume:
    """The checkpoint of ``cfg.resume_from``, checked against ``cfg``; ``rounds.jsonl``
    is cut back to the rows the checkpoint covers. :class:`CheckpointError` says why a
    run cannot be resumed (missing or corrupt checkpoint, other config)."""
    run_dir = Path(cfg.resume_from).expanduser().resolve()
    checkpoint = Checkpoint.load(run_dir)
    current = cfg.to_run_config()
    differing = config_differences(checkpoint.config, current)
    retired = [k for k in differing if k not in current]
    if retired:
        raise CheckpointError(f"resume-from {run_dir}: the checkpoint was written by an "
                              f"older fedqhd whose run config had {retired}, keys this "
                              "version no longer has; a resumed run must be the same run, "
                              "so start it again instead")
    if differing:
        detail = "; ".join(f"{k}: checkpoint {checkpoint.config.get(k)!r}, now "
                           f"{current.get(k)!r}" for k in differing)
        raise CheckpointError(f"resume-from {run_dir}: the run config differs from the "
                              f"checkpointed run's in {differing} ({detail}); a resumed run "
                              "must use the same config")
    if checkpoint.round > cfg.num_server_rounds:
        raise CheckpointError(f"resume-from {run_dir}: the checkpoint is of round "
                              f"{checkpoint.round}, beyond num-server-rounds "
                              f"{cfg.num_server_rounds}")
    rows = _recorded_rows(run_dir / ROUNDS, checkpoint)
    return Resume(run_dir, checkpoint, rows)


def _recorded_rows(path: Path, checkpoint: Checkpoint) -> list[dict[str, Any]]:
    """The first ``checkpoint.rows`` rows of ``rounds.jsonl`` (its lines merged by round,
    :func:`~fedqhd.server.results.merge_lines`); the file is truncated to them."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(checkpoint.rows_bytes)
        rows = merge_lines([json.loads(line) for line in data.decode().splitlines()])
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"resume-from: {path} is missing or corrupt "
                              f"({type(exc).__name__}: {exc})") from None
    if (len(data) != checkpoint.rows_bytes or len(rows) != checkpoint.rows
            or (rows and rows[-1].get("round") != checkpoint.round)):
        raise CheckpointError(f"resume-from: {path} holds {len(rows)} complete row(s) in its "
                              f"first {len(data)} bytes; the checkpoint of round "
                              f"{checkpoint.round} expects {checkpoint.rows} in "
                              f"{checkpoint.rows_bytes}")
    if os.path.getsize(path) != checkpoint.rows_bytes:  # rows written after the checkpoint
        os.truncate(path, checkpoint.rows_bytes)
        fsync_dir(path.parent)
    return rows


class RoundOffset(Strategy):
    """Present rounds ``1, 2, ...`` of Flower's ``Strategy.start`` to ``strategy`` as
    ``offset + 1, offset + 2, ...`` (the rounds after a checkpoint)."""

    def __init__(self, strategy: Strategy, offset: int) -> None:
        super().__init__()
        self.strategy = strategy
        self.offset = int(offset)

    def summary(self) -> None:
        log(INFO, "\t├──> Resumed after round %d: rounds below are counted from there",
            self.offset)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_train(server_round + self.offset, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round + self.offset, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round + self.offset, arrays, config,
                                                grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round + self.offset, replies)

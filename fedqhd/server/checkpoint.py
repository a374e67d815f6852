"""The run's checkpoint: what the ServerApp needs to continue a stopped run exactly.

After every round the ServerApp writes ``checkpoint.npz`` in the run folder
(atomically, :func:`fedqhd.files.atomic_write`): the global arrays, the
strategy's memory (:meth:`checkpoint_state` of the fedqhd strategies), the round,
the global random states (Python's ``random``, which Flower's node sampling uses,
and numpy's legacy global stream), the run config, and how many rows and bytes of
``rounds.jsonl`` belonged to the run at that point.

The file is a plain ``.npz`` read with ``allow_pickle=False``: nested state is
stored as a JSON tree (entry ``__state__``) whose arrays are separate entries, so
loading a checkpoint never runs code from it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.files import atomic_save

CHECKPOINT = "checkpoint.npz"   #: file name in the run folder
FORMAT = 1                      #: bump when the layout changes
_STATE = "__state__"
#: run-config keys a resumed run may change: they do not change any round's result
RESUMABLE_CHANGES = frozenset({"resume-from", "num-server-rounds", "output-dir",
                               "round-timeout", "node-wait-timeout", "verbose"})


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not match the run config."""


# ------------------------------------------------------------------ the codec
def _pack(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    """A JSON tree for ``obj``; its arrays go to ``arrays`` (tagged single-key dicts keep
    tuples, non-string keys and arrays apart from plain values)."""
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, np.ndarray):
        name = f"a{len(arrays)}"
        arrays[name] = obj
        return {"a": name}
    if isinstance(obj, np.generic):
        return _pack(obj.item(), arrays)
    if isinstance(obj, int | float):
        return obj
    if isinstance(obj, tuple):
        return {"t": [_pack(v, arrays) for v in obj]}
    if isinstance(obj, list):
        return {"l": [_pack(v, arrays) for v in obj]}
    if isinstance(obj, dict):
        return {"d": [[_pack(k, arrays), _pack(v, arrays)] for k, v in obj.items()]}
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _unpack(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    if not isinstance(tree, dict):
        return tree
    (tag, value), = tree.items()
    if tag == "a":
        return arrays[value]
    if tag == "t":
        return tuple(_unpack(v, arrays) for v in value)
    if tag == "l":
        return [_unpack(v, arrays) for v in value]
    if tag == "d":
        return {_unpack(k, arrays): _unpack(v, arrays) for k, v in value}
    raise ValueError(f"unknown tag {tag!r}")


# ------------------------------------------------------------------ random states
def capture_rng() -> dict[str, Any]:
    """The global random states a run's rounds draw from."""
    return {"python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])


# ------------------------------------------------------------------ the checkpoint
@dataclass
class Checkpoint:
    """One round's checkpoint (see the module docstring)."""

    round: int
    config: dict[str, Any]
    arrays: dict[str, np.ndarray]
    strategy: Any
    rng: dict[str, Any]
    rows: int                 #: rows of rounds.jsonl that belong to rounds 1..round
    rows_bytes: int           #: their length in bytes
    resumes: list[int] = field(default_factory=list)  #: rounds this run was resumed at

    def save(self, run_dir: Path) -> Path:
        arrays: dict[str, np.ndarray] = {}
        tree = _pack({"format": FORMAT, "round": self.round, "config": self.config,
                      "arrays": self.arrays, "strategy": self.strategy, "rng": self.rng,
                      "rows": self.rows, "rows-bytes": self.rows_bytes,
                      "resumes": self.resumes}, arrays)
        arrays[_STATE] = np.frombuffer(json.dumps(tree).encode(), dtype=np.uint8)
        path = Path(run_dir) / CHECKPOINT
        payload: dict[str, Any] = arrays  # typed Any: numpy's stub vs. ** of arrays
        atomic_save(path, lambda fh: np.savez(fh, **payload))
        return path

    @classmethod
    def load(cls, run_dir: Path) -> Checkpoint:
        """The checkpoint of ``run_dir``; :class:`CheckpointError` if missing or corrupt."""
        path = Path(run_dir) / CHECKPOINT
        if not Path(run_dir).is_dir():
            raise CheckpointError(f"resume-from: {run_dir} is not a run folder")
        if not path.is_file():
            raise CheckpointError(f"resume-from: no {CHECKPOINT} in {run_dir} (the run "
                                  "stopped before its first round ended, or predates "
                                  "checkpoints); start it again instead")
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            state = _unpack(json.loads(arrays.pop(_STATE).tobytes().decode()), arrays)
            if state["format"] != FORMAT:
                raise CheckpointError(f"resume-from: {path} has format {state['format']}, "
                                      f"this fedqhd reads format {FORMAT}")
            return cls(round=int(state["round"]), config=dict(state["config"]),
                       arrays=dict(state["arrays"]), strategy=state["strategy"],
                       rng=state["rng"], rows=int(state["rows"]),
                       rows_bytes=int(state["rows-bytes"]), resumes=list(state["resumes"]))
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - any damage reads as a corrupt file
            raise CheckpointError(f"resume-from: {path} is corrupt or unreadable "
                                  f"({type(exc).__name__}: {exc})") from None


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Run-config keys whose values differ between a checkpoint and a resuming run, other
    than those a resume may change (:data:`RESUMABLE_CHANGES`)."""
    keys = (set(saved) | set(current)) - RESUMABLE_CHANGES
    return sorted(k for k in keys if saved.get(k, object()) != current.get(k, object()))

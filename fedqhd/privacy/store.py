"""A node's privacy ledgers on disk, one per data set, so the budget holds across runs.

zCDP composes by adding rho over every release of the same data, whichever run
or process made it. A ledger kept only in memory restarts at zero with each run
(or node restart) and lets the same trajectories be released again and again.
:class:`LedgerStore` keeps one JSON ledger per data fingerprint (a SHA-256 of the
shard's arrays) in a node-local directory; :meth:`LedgerStore.open` loads it
under an exclusive file lock, lets the caller check and spend, and writes it back
atomically (temporary file, fsync, rename), so concurrent clients of one node
and crashes never lose a spend.

Where: node-config key ``ledger-dir``, else the environment variable
``FEDQHD_LEDGER_DIR``, else ``~/.fedqhd/ledgers``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.files import atomic_write, tight_folder
from fedqhd.privacy.ledger import PrivacyLedger

LEDGER_DIR_KEY = "ledger-dir"           #: node-config key naming the node's ledger directory
LEDGER_DIR_ENV = "FEDQHD_LEDGER_DIR"    #: environment variable used when the key is absent
DEFAULT_LEDGER_DIR = "~/.fedqhd/ledgers"


class LedgerFileError(RuntimeError):
    """A stored ledger cannot be read; releases of that data are refused until it is fixed."""


#: a ledger file's fields: the types each may hold, and their name in a message
LEDGER_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "budget_rho": ((int, float), "a number"), "delta": ((int, float), "a number"),
    "client_id": ((str,), "a string"), "entries": ((list,), "a list")}


def ledger_problem(record: Any) -> str | None:
    """What makes a parsed ledger file unusable, by field (``None``: nothing), checked
    before use so a wrong schema is named ("missing field 'budget_rho'") instead of
    surfacing as a bare ``KeyError`` or a crash in the epsilon conversion."""
    if not isinstance(record, dict):
        return f"not a JSON object: {json.dumps(record)[:40]}"
    for key, (kinds, what) in LEDGER_FIELDS.items():
        if key not in record:
            return f"missing field {key!r}"
        if not isinstance(record[key], kinds) or isinstance(record[key], bool):
            return f"field {key!r} = {record[key]!r} is not {what}"
    if not 0 < record["delta"] < 1:
        return f"field 'delta' = {record['delta']!r} is not in (0, 1)"
    for i, entry in enumerate(record["entries"]):
        rho = entry.get("rho") if isinstance(entry, dict) else None
        if not isinstance(rho, (int, float)) or isinstance(rho, bool) or not rho >= 0:
            return f"entry {i} has no non-negative number 'rho'"
    return None


def data_fingerprint(*arrays: np.ndarray) -> str:
    """SHA-256 over the dtype, shape and bytes of every array: the same shard, the same key."""
    digest = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape};".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def ledger_dir(node_config: Mapping[str, Any]) -> Path:
    """The node's ledger directory: node config, then environment, then the default."""
    raw = node_config.get(LEDGER_DIR_KEY) or os.environ.get(LEDGER_DIR_ENV) or DEFAULT_LEDGER_DIR
    return Path(str(raw)).expanduser()


class LedgerStore:
    """One ledger file per data fingerprint under ``directory``: made (or tightened to)
    0700 when opened, whatever the umask or its earlier mode, and refused when another
    user owns it."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    def path(self, fingerprint: str) -> Path:
        return self.directory / f"{fingerprint}.json"

    def read(self, fingerprint: str) -> PrivacyLedger | None:
        """The stored ledger of this data, or ``None`` (no lock: for reporting only)."""
        path = self.path(fingerprint)
        return self._load(path) if path.exists() else None

    @staticmethod
    def _load(path: Path) -> PrivacyLedger:
        record: Any = None
        problem: str | None = "empty file"
        try:
            text = path.read_text()
            if text.strip():
                record = json.loads(text)
                problem = ledger_problem(record)
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
            problem = str(exc)
        if problem is not None:
            raise LedgerFileError(f"privacy ledger {path} is unreadable ({problem}); releases "
                                  "of this data are refused until it is repaired or restored")
        return PrivacyLedger.from_dict(record)

    @contextlib.contextmanager
    def open(self, fingerprint: str, budget_rho: float, delta: float, client_id: str
             ) -> Iterator[PrivacyLedger]:
        """The data's ledger (new or stored) with the node's current budget, locked.

        Whatever the caller spends is written back atomically when the block ends,
        also when it ends with an exception (a spend may precede a failed draw).
        """
        try:  # 0700 and ours: another local user must not delete a ledger (a fresh budget)
            tight_folder(self.directory)
        except PermissionError as exc:
            raise LedgerFileError(f"privacy ledger folder: {exc}; releases are refused until "
                                  "it is this node's own") from None
        path = self.path(fingerprint)
        lock_fd = os.open(self.directory / f".{fingerprint}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            stored = self._load(path) if path.exists() else None
            ledger = PrivacyLedger(budget_rho, delta, client_id,
                                   stored.entries if stored is not None else [])
            before = len(ledger.entries)
            try:
                yield ledger
            finally:
                if len(ledger.entries) != before:
                    record = {**ledger.to_dict(), "fingerprint": fingerprint}
                    atomic_write(path, json.dumps(record, indent=1), private=True)
        finally:
            os.close(lock_fd)  # closing releases the lock

"""File-access audit for the server side of a deployment: proves no shard leaves its node.

:func:`audit_env` returns environment variables that make every Python process
started with them (SuperLink, the ServerApp's SuperExec, and the ServerApp it
spawns) log each file it opens or lists, through a ``sitecustomize`` module and
``sys.addaudithook``. :func:`read_audit` collects those logs; a test then asserts
that no logged path lies under a shard folder, and that the log is not empty (the
hook really ran: it sees the ServerApp write ``results.json``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fedqhd.files import atomic_write

LOG_DIR_VAR = "FEDQHD_AUDIT_DIR"

#: audit events whose first argument is a path being read, written or listed
_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.rename", "os.remove",
                     "shutil.copyfile", "shutil.copytree", "os.chdir", "glob.glob"})

_SITECUSTOMIZE = '''"""fedqhd file-access audit (written by fedqhd.deploy.audit)."""
from fedqhd.deploy.audit import install

install()
'''


def install() -> None:
    """Log every path event of this process to ``$FEDQHD_AUDIT_DIR/<pid>.log``."""
    folder = os.environ.get(LOG_DIR_VAR)
    if not folder:
        return
    fd = os.open(os.path.join(folder, f"{os.getpid()}.log"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, f"# argv {sys.argv!r}\n".encode(errors="replace"))

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event not in _EVENTS or not args:
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return
        try:
            path = os.path.abspath(path)
        except Exception:  # noqa: BLE001 - an audit hook must never raise
            pass
        os.write(fd, f"{event}\t{path}\n".encode(errors="replace"))

    sys.addaudithook(hook)


def audit_env(log_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Environment that enables the audit (prepends a ``sitecustomize`` to PYTHONPATH)."""
    log_dir = Path(log_dir).resolve()
    site = log_dir / "site"
    site.mkdir(parents=True, exist_ok=True)
    atomic_write(site / "sitecustomize.py", _SITECUSTOMIZE)
    path = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {LOG_DIR_VAR: str(log_dir), "PYTHONPATH": os.pathsep.join(path)}


def read_audit(log_dir: str | os.PathLike[str]) -> dict[str, list[tuple[str, str]]]:
    """``{process argv: [(event, path), ...]}`` from every log in ``log_dir``."""
    out: dict[str, list[tuple[str, str]]] = {}
    for log in sorted(Path(log_dir).glob("*.log")):
        argv, events = log.stem, []
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("# argv "):
                argv = line[len("# argv "):]
            elif "\t" in line:
                event, path = line.split("\t", 1)
                events.append((event, path))
        out.setdefault(argv, []).extend(events)
    return out


def touched_under(log_dir: str | os.PathLike[str], roots: list[Path]
                  ) -> list[tuple[str, str, str]]:
    """(process, event, path) for every logged path under one of ``roots``."""
    resolved = [str(Path(r).resolve()) for r in roots]
    hits = []
    for argv, events in read_audit(log_dir).items():
        for event, path in events:
            if any(path == r or path.startswith(r + os.sep) for r in resolved):
                hits.append((argv, event, path))
    return hits

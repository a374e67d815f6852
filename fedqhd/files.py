"""Crash-safe file writes (a run folder, a node's privacy ledgers, every output file of the
commands and studies): a reader (or a resumed run) sees either the old file or the new
one, never a torn one, even after a power cut or a full disk.

``atomic_write`` writes a temporary file in the same folder, flushes and fsyncs it,
renames it over the target and fsyncs the folder (so the rename itself is durable).
``append_line`` appends one line and fsyncs it; a line torn by a crash is the last
one, and whoever reads the file back (``fedqhd.server.checkpoint``) truncates it to
the length its checkpoint recorded.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def fsync_dir(folder: Path) -> None:
    """Make renames and new files in ``folder`` durable (a no-op where folders cannot be
    opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platform without directory handles
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tight_folder(path: Path, mode: int = 0o700, own: bool = True) -> Path:
    """Create ``path`` (and its parents) or take it as it is, then give it exactly ``mode``,
    whatever the umask or its earlier mode: ``mkdir(mode=...)`` is masked by the umask and
    leaves an existing folder alone, so a folder made under umask 000 (or chmod 0777 since)
    would let any local user delete or swap what is in it. ``own``: refuse
    (:class:`PermissionError`) a folder another user owns, which could be loosened again
    behind our back."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    info = path.stat()
    if own and info.st_uid != os.geteuid():
        raise PermissionError(f"{path} is owned by uid {info.st_uid}, not by this user "
                              f"(uid {os.geteuid()}): refused, whoever owns it can change what "
                              "is in it")
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode)
    return path


def atomic_write(path: Path, data: bytes | str, private: bool = False,
                 mode: int | None = None) -> None:
    """Replace ``path`` by ``data`` atomically and durably; ``private``: the file is
    created 0600 (never readable by others, not even for a moment); ``mode``: created
    with exactly this mode, whatever the umask (else 0666 less the umask)."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    exact = 0o600 if private else mode
    tmp = path.with_name(f"{path.name}.tmp")  # one writer per file (run folder: the ServerApp)
    try:
        tmp.unlink(missing_ok=True)  # a leftover of a crash may have other permissions
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if exact is None else exact)
        with os.fdopen(fd, "wb") as fh:
            if exact is not None:
                os.fchmod(fh.fileno(), exact)  # the umask may have taken bits away
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_save(path: Path, writer: Callable[[IO[bytes]], Any]) -> None:
    """``atomic_write`` of what ``writer`` writes to a binary buffer (e.g. ``np.savez``)."""
    buffer = io.BytesIO()
    writer(buffer)
    atomic_write(path, buffer.getvalue())


def pyplot() -> Any:
    """matplotlib's ``pyplot`` on the Agg backend (image files, no display), imported on
    first use: every plot of fedqhd's takes it from here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def atomic_figure(fig: Any, path: Path, **savefig: Any) -> Path:
    """Save a matplotlib figure atomically (format from the suffix): a full disk leaves the
    old image or none, never a torn one."""
    path = Path(path)
    atomic_save(path, lambda fh: fig.savefig(fh, format=path.suffix.lstrip("."), **savefig))
    return path


def append_line(path: Path, line: str) -> int:
    """Append ``line`` (no newline in it) and a newline durably; returns the file's size
    after the append."""
    if "\n" in line:
        raise ValueError("a JSON Lines record must not contain a newline")
    new = not Path(path).exists()
    with open(path, "ab") as fh:
        fh.write(line.encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
        size = fh.tell()
    if new:
        fsync_dir(Path(path).parent)
    return size

"""The stale-ClientApp trap of a local simulation SuperLink, detected from the ServerApp.

Ray puts the folder its driver runs in on every worker's ``sys.path``. Under ``flwr run``
with a local simulation SuperLink that driver is the SuperLink's simulation process, and
its folder is the one the SuperLink was started from (for ``address = ":local:"``: where
the first ``flwr run`` was typed). A later app with modules of the same name (``task.py``)
then runs the ClientApp with the OLD folder's modules and the server with the new ones,
silently. The ServerApp runs in that same process, so its ``os.getcwd()`` is the folder
Ray hands to the ClientApps: :func:`warn_if_stale_clientapp` compares the two.
"""

from __future__ import annotations

import os
from logging import WARNING
from pathlib import Path

from flwr.common.logger import log


def _top_level_modules(folder: Path) -> set[str]:
    """Importable top-level names in ``folder``: ``name.py`` files and packages."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return set()
    names = {p.stem for p in entries if p.suffix == ".py" and p.is_file()}
    names |= {p.name for p in entries if p.is_dir() and (p / "__init__.py").is_file()}
    return names


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except OSError:  # a package (no name.py) or unreadable: count it as different
        return False


def warn_if_stale_clientapp(app_dir: str | Path, cwd: str | Path | None = None) -> list[str]:
    """Warn when the folder this process runs in (``cwd``, default ``os.getcwd()``: under a
    local simulation SuperLink, the folder it was started from) is not ``app_dir`` and
    holds modules of the same names as ``app_dir``'s with other contents: those would
    shadow the app's own in every Ray-simulated ClientApp. Returns their names (empty:
    no risk).

    Call it first in a ServerApp, with the ServerApp module's folder:
    ``warn_if_stale_clientapp(Path(__file__).parent)``.
    """
    app = Path(app_dir).resolve()
    here = Path(os.getcwd() if cwd is None else cwd).resolve()
    if here == app:
        return []
    # the same files are no risk: a SuperLink started in the app's own folder runs the
    # app from its installed copy ($FLWR_HOME/apps/...), with that folder on sys.path
    clash = sorted(name for name in _top_level_modules(app) & _top_level_modules(here)
                   if not _same_file(app / f"{name}.py", here / f"{name}.py"))
    if clash:
        log(WARNING, "The SuperLink runs in %s, which holds modules of the same names as "
            "this app's (%s). Ray puts that folder on every simulated ClientApp's sys.path, "
            "so the ClientApps may import those instead of this app's: stop that SuperLink "
            "and start it from an empty folder (docs/simulation.md, \"A stale ClientApp\")",
            here, ", ".join(f"{n}.py" if (app / f"{n}.py").is_file() else n for n in clash))
    return clash

"""The ``fedqhd`` command: one entry point, one sub-command per module.

Each sub-command lives in its own module, which exposes ``register(subparsers)``
adding a parser whose ``func`` default takes the parsed arguments and returns an
exit code. Modules are imported lazily so ``fedqhd --help`` stays fast.

A sub-command that raises a config error (:class:`fedqhd.config.ConfigError`) exits
with code 2, a failed run (:class:`fedqhd.server.failures.RunFailed`) or a file the
system refused (``OSError``) or memory it could not get with code 1, Ctrl-C with 130
and SIGTERM with 143 (both unwind as an interrupt: what the command started is
stopped, what it staged removed); each prints one line, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

#: sub-command modules, in the order ``--help`` lists them
SUBCOMMAND_MODULES = (
    "fedqhd.commands.check",
    "fedqhd.commands.data",
    "fedqhd.commands.bench",
    "fedqhd.commands.pool",
    "fedqhd.commands.privacy",
    "fedqhd.commands.deploy",
)

#: top-level modules of the ``full`` extra (pyproject.toml): one missing means the light
#: install (``pip install fedqhd``: the strategies only), not a broken checkout
FULL_EXTRA_MODULES = frozenset({"gymnasium", "Box2D", "scipy", "sklearn", "matplotlib", "tqdm",
                                "dp_accounting", "opendp", "ray"})
INSTALL_FULL = 'pip install "fedqhd[full]"  (from a checkout: pip install -e ".[full]")'


class MissingExtra(RuntimeError):
    """A sub-command needs a dependency of the ``full`` extra that is not installed."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedqhd", description="Federated RL with hyperdimensional encoders on Flower."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a part not installed in this checkout
            if exc.name and name.startswith(exc.name):
                continue
            if (exc.name or "").split(".")[0] in FULL_EXTRA_MODULES:
                raise MissingExtra(
                    f"the fedqhd command needs the 'full' extra ({exc.name!r} is not "
                    f"installed; this looks like the light install, which has the "
                    f"strategies only). Install it with: {INSTALL_FULL}") from exc
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except MissingExtra as exc:
        print(f"fedqhd: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if on_main_thread else None
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        stopped = isinstance(exc, Terminated)
        print(f"fedqhd {args.command}: {'terminated' if stopped else 'interrupted'}",
              file=sys.stderr)
        return TERMINATED if stopped else INTERRUPTED
    except Exception as exc:
        known = failure(exc)
        if known is None:
            raise
        code, word = known
        print(f"fedqhd {args.command}: {word}: {exc}", file=sys.stderr)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``), raised where the command is, so what it started and the
    files it staged are cleaned up as after Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


#: exit codes of the failures a sub-command reports in one line (a signal: the shell's
#: 128 + its number)
CONFIG_ERROR, RUN_FAILED, SYSTEM_REFUSED, INTERRUPTED, TERMINATED = 2, 1, 1, 130, 143


def failure(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and word of a failure reported in one line: a config error (2,
    "error"), a failed run (1, "failed"), a file the system refused (``OSError``: a path
    that exists, is missing, is a folder, is not writable; 1, "error"), an allocation
    too large for the machine (1, "out of memory"); ``None`` for
    anything else (a bug: its traceback stays). Imported here, lazily: both modules need
    the full install."""
    from fedqhd.config import ConfigError
    from fedqhd.server.failures import RunFailed

    if isinstance(exc, ConfigError):
        return CONFIG_ERROR, "error"
    if isinstance(exc, RunFailed):
        return RUN_FAILED, "failed"
    if isinstance(exc, OSError):
        return SYSTEM_REFUSED, "error"
    if isinstance(exc, MemoryError):  # a count too large for this machine
        return SYSTEM_REFUSED, "out of memory"
    return None


if __name__ == "__main__":
    sys.exit(main())

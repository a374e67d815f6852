"""The ``fedqhd`` command: one entry point, one sub-command per module.

Each sub-command lives in its own module, which exposes ``register(subparsers)``
adding a parser whose ``func`` default takes the parsed arguments and returns an
exit code. Modules are imported lazily so ``fedqhd --help`` stays fast.

A sub-command that raises a config error (:class:`fedqhd.config.ConfigError`) exits
with code 2, a failed run (:class:`fedqhd.server.failures.RunFailed`) or a file the
system refused (``OSError``) with code 1, an interrupt (Ctrl-C) with 130; each prints
one line, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"fedqhd {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        known = failure(exc)
        if known is None:
            raise
        code, word = known
        print(f"fedqhd {args.command}: {word}: {exc}", file=sys.stderr)
        return code


#: exit codes of the failures a sub-command reports in one line (an interrupt: the
#: shell's 128 + SIGINT)
CONFIG_ERROR, RUN_FAILED, FILE_ERROR, INTERRUPTED = 2, 1, 1, 130


def failure(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and word of a failure reported in one line: a config error (2,
    "error"), a failed run (1, "failed"), a file the system refused (``OSError``: a path
    that exists, is missing, is a folder, is not writable; 1, "error"); ``None`` for
    anything else (a bug: its traceback stays). Imported here, lazily: both modules need
    the full install."""
    from fedqhd.config import ConfigError
    from fedqhd.server.failures import RunFailed

    if isinstance(exc, ConfigError):
        return CONFIG_ERROR, "error"
    if isinstance(exc, RunFailed):
        return RUN_FAILED, "failed"
    if isinstance(exc, OSError):
        return FILE_ERROR, "error"
    return None


if __name__ == "__main__":
    sys.exit(main())

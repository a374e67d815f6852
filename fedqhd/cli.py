"""The ``fedqhd`` command: one entry point, one sub-command per module.

Each sub-command lives in its own module, which exposes ``register(subparsers)``
adding a parser whose ``func`` default takes the parsed arguments and returns an
exit code. Modules are imported lazily so ``fedqhd --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: sub-command modules, in the order ``--help`` lists them
SUBCOMMAND_MODULES = (
    "fedqhd.data.cli",
    "fedqhd.bench",
    "fedqhd.pool.cli",
    "fedqhd.privacy.cli",
    "fedqhd.deploy.cli",
)


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
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

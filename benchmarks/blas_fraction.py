"""How close a client's local fit runs to this machine's dense matrix-multiply peak.

For each D, in one run and with one BLAS thread count (threadpoolctl), prints
:func:`fedqhd.studies.perf.blas_fraction` as JSON (also part of ``fedqhd bench --suite scale``).

    PYTHONPATH=. python benchmarks/blas_fraction.py --dims 1024 2000 --rows 16384
"""

from __future__ import annotations

import argparse
import json

from threadpoolctl import threadpool_limits

from fedqhd.studies.perf import blas_fraction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[1024, 2000])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with threadpool_limits(limits=args.threads, user_api="blas"):
        for dim in args.dims:
            print(json.dumps({"threads": args.threads,
                              **blas_fraction(dim, args.rows, args.chunk, args.repeats)}),
                  flush=True)


if __name__ == "__main__":
    main()

"""Peak memory of a client's FQI fit on a large CartPole shard (issue 10: 1e6 transitions
at D = 2000 within 2 GiB).

Prints :func:`fedqhd.studies.perf.streaming_memory` as JSON: a random-policy CartPole shard of
``--transitions``, the client's ``FQILearner`` (which streams: ``2 n D`` float64 features
exceed its 1 GiB budget) and ``--sweeps`` FQI sweeps; peak resident memory of this
process and peak traced allocations (also part of ``fedqhd bench --suite scale``).

    PYTHONPATH=. python benchmarks/streaming_memory.py --transitions 200000 --dim 2000
"""

from __future__ import annotations

import argparse
import json

from fedqhd.studies.perf import streaming_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=2000)
    parser.add_argument("--sweeps", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream", action="store_true",
                        help="stream even where the features fit the learner's budget")
    args = parser.parse_args()
    print(json.dumps(streaming_memory(args.transitions, args.dim, args.sweeps, args.chunk,
                                      args.seed, True if args.stream else None), indent=2))


if __name__ == "__main__":
    main()

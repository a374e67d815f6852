"""How close :func:`fedqhd.memory.fit_memory` (what a client's memory refusal rests on) is
to what the fit really allocates (issue 11: "the learner refuses, with an estimate of
the memory it would need, a shard it cannot fit in memory").

For each ``N:D`` given, generates ``N`` CartPole-v1 transitions (uniformly random
behaviour, as ``benchmarks/streaming_memory.py``), then builds the client's
``FQILearner`` in memory and streamed, and runs one FQI sweep, under ``tracemalloc``
(the shard is made before tracing starts); prints JSON lines: estimate, traced peak
and their ratio.

    PYTHONPATH=. python benchmarks/fit_memory_estimate.py 10000:2000 50000:500 --seed 0
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="+", help="N:D pairs (transitions : features)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from fedqhd.encoders import shared_encoder_params
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi import FQILearner
    from fedqhd.memory import fit_memory
    from fedqhd.readout import distinct_state_count
    from fedqhd.studies.perf import cartpole_shard

    spec = get_spec("CartPole-v1")
    for case in args.cases:
        n, dim = (int(float(v)) for v in case.split(":"))
        shard = cartpole_shard(n, args.seed)
        encoder = shared_encoder_params(args.seed, dim, 1.0).build(spec.obs_bound)
        for streaming in (False, True):
            start = time.perf_counter()
            tracemalloc.start()
            try:
                learner = FQILearner(shard, encoder, spec.n_actions, streaming=streaming,
                                     memory_cap=1 << 50)
                learner.train(1)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            del learner
            states = distinct_state_count(shard.observations, shard.next_observations)
            estimate = fit_memory(n, dim, spec.n_actions, streaming, obs_dim=spec.obs_dim,
                                  states=states)
            print(json.dumps({"transitions": n, "dim": dim, "states": states,
                              "streaming": streaming,
                              "estimate_bytes": estimate, "traced_peak_bytes": peak,
                              "peak_over_estimate": round(peak / estimate, 3),
                              "seconds": round(time.perf_counter() - start, 1),
                              "seed": args.seed}), flush=True)


if __name__ == "__main__":
    main()

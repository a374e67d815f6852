"""How close a client's local fit runs to this machine's dense matrix-multiply peak.

For each D, in one run and with one BLAS thread count (threadpoolctl): the peak is the
best of ``--repeats`` float64 ``D x D @ D x D`` products (2 D^3 flops); then the parts
of a local fit are timed, best of ``--repeats`` each, and their flop rates are given as
a fraction of that peak:

* ``gram-syrk``: the streaming fit's Gram, a rank-``chunk`` ``dsyrk`` update per chunk
  (``n D (D + 1)`` flops for n rows);
* ``gram-matmul``: the in-memory fit's primal Gram ``Phi^T Phi`` (numpy; same flops);
* ``cholesky``: the factor of ``G + c I`` (``D^3 / 3`` flops);
* ``encode``: random Fourier features of n states (a cos per entry: no BLAS; time only);
* ``sweep``: one streaming FQI sweep over n transitions (two encodes, ``Phi' W`` and
  ``Phi^T y`` per chunk, one triangular solve pair per action).

    PYTHONPATH=. python benchmarks/blas_fraction.py --dims 1024 2000 --rows 16384
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
from scipy.linalg import cho_factor
from threadpoolctl import threadpool_limits


def best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(dim: int, rows: int, chunk: int, repeats: int) -> dict[str, float]:
    from fedqhd.encoders import shared_encoder_params
    from fedqhd.envs import get_spec
    from fedqhd.readout import StreamingRidgeFQI, _rank_update

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(dim, dim)), rng.normal(size=(dim, dim))
    t_peak = best(lambda: a @ b, repeats)
    peak = 2 * dim**3 / t_peak / 1e9
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    peak32 = 2 * dim**3 / best(lambda: a32 @ b32, repeats) / 1e9

    spec = get_spec("CartPole-v1")
    enc = shared_encoder_params(0, dim, 1.0).build(spec.obs_bound)
    states = rng.uniform(-1, 1, size=(rows, 4)) * spec.obs_bound
    phi = enc.encode(states)
    upper = np.zeros((dim, dim))

    def syrk() -> None:
        upper[...] = 0.0
        for start in range(0, rows, chunk):
            _rank_update(upper, phi[start:start + chunk])

    gram_flops = rows * dim * (dim + 1)
    t_syrk = best(syrk, repeats)
    t_matmul = best(lambda: phi.T @ phi, repeats)
    gram = phi.T @ phi + 0.1 * np.eye(dim)
    t_chol = best(lambda: cho_factor(gram, lower=False, check_finite=False), repeats)
    t_encode = best(lambda: enc.encode(states), repeats)

    fqi = StreamingRidgeFQI(enc.encode, dim, spec.n_actions, gamma=0.99, ridge=0.1,
                            chunk_size=chunk)
    actions = rng.integers(0, spec.n_actions, rows)
    fqi.add(states, actions, np.ones(rows), states[::-1].copy(), np.zeros(rows, bool))
    fqi.fit(1)  # factor once
    w = rng.normal(size=(dim, spec.n_actions)) * 0.01
    t_sweep = best(lambda: fqi.fit(1, init=w), repeats)
    return {
        "dim": dim, "rows": rows, "chunk": chunk,
        "peak-gflops": round(peak, 1), "peak-float32-gflops": round(peak32, 1),
        "gram-syrk-gflops": round(gram_flops / t_syrk / 1e9, 1),
        "gram-syrk-fraction": round(gram_flops / t_syrk / 1e9 / peak, 2),
        "gram-matmul-gflops": round(gram_flops / t_matmul / 1e9, 1),
        "gram-matmul-fraction": round(gram_flops / t_matmul / 1e9 / peak, 2),
        "cholesky-gflops": round(dim**3 / 3 / t_chol / 1e9, 1),
        "cholesky-fraction": round(dim**3 / 3 / t_chol / 1e9 / peak, 2),
        "encode-s": round(t_encode, 3), "gram-syrk-s": round(t_syrk, 3),
        "sweep-s": round(t_sweep, 3),
    }


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
                              **measure(dim, args.rows, args.chunk, args.repeats)}), flush=True)


if __name__ == "__main__":
    main()

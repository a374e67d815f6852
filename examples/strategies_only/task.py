"""The regression task: every client's synthetic data and its ridge fit (numpy only)."""

from __future__ import annotations

import numpy as np


def client_data(partition_id: int, seed: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A client's private (X, y): one true weight vector, shards of different sizes
    and input scales, so that a weighted average differs from the pooled fit."""
    truth = np.random.default_rng(seed).normal(size=dim)
    rng = np.random.default_rng([seed, partition_id])
    n = 40 + 30 * partition_id
    x = rng.normal(scale=1.0 + 0.5 * partition_id, size=(n, dim))
    y = x @ truth + rng.normal(scale=0.3, size=n)
    return x, y


def ridge_fit(x: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    """``argmin ||X w - y||^2 + ridge ||w||^2`` as a (dim, 1) readout."""
    w = np.linalg.solve(x.T @ x + ridge * np.eye(x.shape[1]), x.T @ y)
    return w[:, None]


def mse(x: np.ndarray, y: np.ndarray, readout: np.ndarray) -> float:
    return float(np.mean((x @ readout[:, 0] - y) ** 2))

"""Anchor states for function-space aggregation across heterogeneous encoders.

The server fixes ``m`` states once per run; every client reports its Q-values
on them and compiles the averaged teacher back into its own features. Where the
anchors lie decides what the teacher constrains, so three sources are offered:
short random-action rollouts of a server-side environment copy (the FedQHD
paper's choice), uniform draws inside the per-environment bounds, or an array
the user provides.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
from gymnasium.spaces import Discrete

from fedqhd.envs import get_spec, make_env

ROLLOUT_LENGTH = 50  #: steps per short random rollout
#: the generated anchor sets; any other ``anchor-source`` is the path of a .npy or .npz file
ANCHOR_SOURCES: tuple[str, ...] = ("rollouts", "uniform")
#: the file suffixes an ``anchor-source`` path may have
ANCHOR_FILE_SUFFIXES: tuple[str, ...] = (".npy", ".npz")


def anchor_digest(anchors: np.ndarray) -> str:
    """A key of an anchor set (its float64 bytes): what a client caches per anchor set."""
    return hashlib.sha1(np.ascontiguousarray(anchors, dtype=np.float64).tobytes()).hexdigest()


def rollout_anchors(env_id: str, m: int, seed: int, length: int = ROLLOUT_LENGTH) -> np.ndarray:
    """``m`` states visited by uniform-random actions in short rollouts (<= ``length`` steps)."""
    env = make_env(env_id)
    rng = np.random.default_rng(seed)
    states: list[np.ndarray] = []
    try:
        action_space = env.action_space
        assert isinstance(action_space, Discrete), f"{env_id}: rollouts need discrete actions"
        while len(states) < m:
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            states.append(obs)
            for _ in range(length - 1):
                if len(states) >= m:
                    break
                obs, _, terminated, truncated, _ = env.step(int(rng.integers(action_space.n)))
                states.append(obs)
                if terminated or truncated:
                    break
    finally:
        env.close()
    return np.asarray(states[:m], dtype=np.float64).reshape(m, -1)


def uniform_anchors(env_id: str, m: int, seed: int) -> np.ndarray:
    """``m`` states uniform in the per-environment bounds ``center +- bound`` (the
    centre is zero for the built-in tasks)."""
    spec = get_spec(env_id)
    bound = spec.obs_bound
    states = np.random.default_rng(seed).uniform(-bound, bound, size=(m, len(bound)))
    if spec.obs_center is not None:
        states += spec.obs_center
    return states


#: the array an ``.npz`` anchor file must hold
ANCHOR_KEY = "anchors"


def load_anchors(path: str | Path, env_id: str) -> np.ndarray:
    """Anchors from a ``.npy`` file of shape (m, obs_dim), or an ``.npz`` holding that
    array under the key ``"anchors"``: real numbers, finite, m >= 1.

    Raises
    ------
    ValueError
        Naming the file and the problem (unreadable, not an array or archive, a
        missing key, wrong shape or dtype, non-finite values).
    """
    path = Path(path)
    members: list[str] | None = None  # the .npz's arrays; None: a .npy
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                members = list(loaded.files)
                anchors = loaded[ANCHOR_KEY] if ANCHOR_KEY in members else None
        else:
            anchors = loaded
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"anchor file {path}: cannot read a .npy array or .npz archive "
                         f"({exc})") from exc
    if anchors is None:
        raise ValueError(f"anchor file {path}: the .npz has no {ANCHOR_KEY!r} array (it has: "
                         f"{', '.join(members or []) or 'none'})")
    if anchors.dtype.kind not in "iuf":
        raise ValueError(f"anchor file {path}: dtype {anchors.dtype}, expected real numbers")
    obs_dim = get_spec(env_id).obs_dim
    if anchors.ndim != 2 or anchors.shape[1] != obs_dim or len(anchors) == 0:
        raise ValueError(f"anchor file {path}: expected shape (m, {obs_dim}) for {env_id}, "
                         f"got {anchors.shape}")
    out = anchors.astype(np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"anchor file {path}: values must be finite numbers ({int(bad.sum())} "
                         f"non-finite, the first in row {row})")
    return out


def make_anchors(source: str, env_id: str, m: int, seed: int) -> np.ndarray:
    """Anchors from ``source``: "rollouts", "uniform" (``m`` of them, from ``seed``) or the
    path of a .npy / .npz file (:func:`load_anchors`; ``m`` and ``seed`` unused)."""
    if source == "rollouts":
        return rollout_anchors(env_id, m, seed)
    if source == "uniform":
        return uniform_anchors(env_id, m, seed)
    if source.endswith(ANCHOR_FILE_SUFFIXES):
        return load_anchors(source, env_id)
    raise ValueError(f"anchor source must be rollouts, uniform or the path of a .npy or "
                     f".npz file, got {source!r}")

"""Hyperdimensional (random Fourier feature) state encoders.

An encoder maps a state ``s`` to ``phi(s) = sqrt(2/D) cos(Omega (s / scale) + b)``
with ``Omega`` rows drawn from ``N(0, 2 bandwidth I)`` and ``b ~ U[0, 2 pi]``, so that
``phi(x) . phi(y)`` approximates the RBF kernel ``exp(-bandwidth ||x - y||^2)`` on
scaled states. Q-functions built on it are nonlinear in the state but linear in
the readout, which is what makes closed-form federated aggregation possible.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedqhd.memory import UPCAST_ROWS
from fedqhd.seeding import SHARED, encoder_seed

#: encoder dimensions cycled over clients in the heterogeneous setting (FedQHD paper)
HETEROGENEOUS_DIMS: tuple[int, ...] = (500, 1000, 2000, 5000)
#: every feature vector's squared norm is at most this: (2 / D) sum_k cos^2(.) <= 2 (what
#: FedQHDExact checks a client's Gram trace against)
MAX_FEATURE_SQ_NORM = 2.0
#: encoder settings of a federation: one encoder for all, or one per client
ENCODER_KINDS: tuple[str, ...] = ("shared", "heterogeneous")


class HDEncoder:
    """Random Fourier feature encoder, a scikit-learn transformer like ``RBFSampler``.

    It follows scikit-learn's estimator protocol (``get_params``/``set_params``, ``fit``
    returning ``self``, fitted attributes ending in ``_``, ``__sklearn_tags__``; it
    passes ``check_estimator``) without inheriting from its base classes: importing
    scikit-learn costs about 0.6 s, which every ClientApp process would pay per run
    for encoders it builds with :meth:`EncoderParams.build`. scikit-learn is imported
    only by the methods scikit-learn itself calls, and by ``fit``/``transform``'s input
    checks.

    Parameters
    ----------
    hd_dim : int
        Feature dimension ``D`` (run-config key ``hd-dim``).
    bandwidth : float
        RBF bandwidth on scaled states: the kernel is ``exp(-bandwidth ||x - y||^2)``
        (run-config key ``bandwidth``; scikit-learn's ``RBFSampler`` calls it ``gamma``,
        which fedqhd keeps for the discount).
    scale : array-like of shape (n_features,), "auto" or None
        Per-dimension divisor applied before encoding (per-environment bounds, so
        scaled states lie roughly in ``[-1, 1]``); positive and finite (anything
        else is refused with a message). ``"auto"``: learned from the rows given
        to :meth:`fit` (a robust half-range per coordinate,
        :func:`fedqhd.envs.infer_obs_bound`; constant coordinates get 1).
        ``None`` means no scaling.
    random_state : int, RandomState or None
        Seed for ``Omega`` and ``b``; two encoders with the same seed, dimension,
        bandwidth and input width are identical.

    Attributes
    ----------
    omega_ : ndarray of shape (n_features, hd_dim)
    offset_ : ndarray of shape (hd_dim,)
    scale_ : ndarray of shape (n_features,)
    n_features_in_ : int
    """

    def __init__(
        self,
        hd_dim: int = 2000,
        bandwidth: float = 1.0,
        scale: np.ndarray | None = None,
        random_state: int | np.random.RandomState | None = None,
    ) -> None:
        self.hd_dim = hd_dim
        self.bandwidth = bandwidth
        self.scale = scale
        self.random_state = random_state

    # ---------------------------------------------- scikit-learn's estimator protocol
    @classmethod
    def _get_param_names(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's parameters (none of them an estimator: ``deep`` changes
        nothing)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> HDEncoder:
        """Set constructor parameters; an unknown name is a ``ValueError``."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}; "
                                 f"valid parameters: {valid}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    def __sklearn_tags__(self) -> Any:
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False),
                    transformer_tags=TransformerTags(), input_tags=InputTags())

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "omega_")

    def fit(self, X: np.ndarray, y: None = None) -> HDEncoder:
        """Draw the random projection; only the width of ``X`` is used (and its rows,
        with ``scale="auto"``)."""
        from sklearn.utils.validation import validate_data

        X = validate_data(self, X, dtype=np.float64)
        return self._draw(X)

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Encode states: rows of ``X`` -> rows of features, shape (n, D)."""
        from sklearn.utils.validation import check_is_fitted, validate_data

        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self.encode(X)

    def fit_transform(self, X: np.ndarray, y: None = None) -> np.ndarray:
        """:meth:`fit`, then :meth:`transform` of the same rows."""
        return self.fit(X, y).transform(X)

    def _draw(self, X: np.ndarray) -> HDEncoder:
        """:meth:`fit` on rows already checked (float64, 2-d)."""
        if int(self.hd_dim) < 1:
            raise ValueError(f"hd_dim must be >= 1, got {self.hd_dim}")
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0, got {self.bandwidth}")
        d = X.shape[1]
        if self.scale is None:
            scale = np.ones(d)
        elif isinstance(self.scale, str):
            if self.scale != "auto":
                raise ValueError(f"scale must be numbers, 'auto' or None, got {self.scale!r}")
            from fedqhd.envs.registry import infer_obs_bound

            scale = infer_obs_bound(X)
        else:
            scale = check_scale(self.scale, d)
        rng = _random_state(self.random_state)
        self.omega_ = rng.normal(0.0, np.sqrt(2.0 * self.bandwidth), size=(d, int(self.hd_dim)))
        self.offset_ = rng.uniform(0.0, 2.0 * np.pi, size=int(self.hd_dim))
        self.scale_ = scale
        self.n_features_in_ = d
        return self

    def encode(self, X: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """:meth:`transform` without input checks, for hot loops (one state per step).

        ``dtype=np.float32``: features in float32 (half the bytes; ``feature-dtype``), the
        projection still in float64 and only the cosine in float32 (about 20 times faster
        than float64's, here), ``UPCAST_ROWS`` rows at a time so no float64 copy of the whole
        output exists: each feature within about 1e-6 (5.1e-7 measured) of the float64 one
        (the rounding of the projection to float32 and of float32's cosine), times
        ``sqrt(2 / D)``.
        """
        if dtype == np.float64:
            proj = (np.asarray(X, dtype=np.float64) / self.scale_) @ self.omega_
            proj += self.offset_
            np.cos(proj, out=proj)
            proj *= np.sqrt(2.0 / self.omega_.shape[1])
            return proj
        if dtype != np.float32:
            raise ValueError(f"dtype must be float64 or float32, got {dtype}")
        X = np.asarray(X, dtype=np.float64)
        out = np.empty((len(X), self.omega_.shape[1]), dtype=np.float32)
        work = np.empty((min(len(X), UPCAST_ROWS), self.omega_.shape[1]))  # one block, reused
        for start in range(0, len(X), UPCAST_ROWS):
            rows = X[start:start + UPCAST_ROWS]
            proj = np.matmul(rows / self.scale_, self.omega_, out=work[:len(rows)])
            proj += self.offset_
            block = out[start:start + UPCAST_ROWS]
            block[...] = proj
            np.cos(block, out=block)
        out *= np.float32(np.sqrt(2.0 / self.omega_.shape[1]))
        return out


    def encode32(self, X: np.ndarray) -> np.ndarray:
        """Float32 features with the projection in float32 too: what online clients act,
        fit and are evaluated with (float32's ``cos`` is ~20x cheaper than float64's).
        The float32 copy of the projection is kept on the encoder."""
        cache = self.__dict__.get("_f32")
        if cache is None:
            cache = ((self.omega_ / self.scale_[:, None]).astype(np.float32),
                     self.offset_.astype(np.float32),
                     np.float32(np.sqrt(2.0 / self.omega_.shape[1])))
            self.__dict__["_f32"] = cache
        omega, offset, amp = cache
        proj = np.asarray(X, dtype=np.float32) @ omega
        proj += offset
        np.cos(proj, out=proj)
        proj *= amp
        return proj


def _random_state(seed: int | np.random.RandomState | None) -> np.random.RandomState:
    """scikit-learn's ``check_random_state``: None, an int or a RandomState."""
    if seed is None:
        return np.random.mtrand._rand
    if isinstance(seed, np.random.RandomState):
        return seed
    if isinstance(seed, int | np.integer):
        return np.random.RandomState(seed)
    raise ValueError(f"random_state must be None, an int or a numpy RandomState; got {seed!r}")


def check_scale(scale: object, d: int) -> np.ndarray:
    """``scale`` as ``d`` positive finite float64 numbers, or a ``ValueError`` saying
    which entries are not (an infinite scale would encode every state alike: a
    constant policy; zero or negative ones divide by zero or flip coordinates)."""
    try:
        arr = np.asarray(scale, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be {d} positive finite numbers, got {scale!r}") from None
    if arr.shape != (d,):
        raise ValueError(f"scale must be {d} positive finite numbers (one per input "
                         f"coordinate), got {arr.size}: {scale!r}")
    bad = ~np.isfinite(arr) | ~(arr > 0)
    if bad.any():
        idx = np.flatnonzero(bad).tolist()
        raise ValueError(f"scale must be positive and finite; coordinates {idx} are "
                         f"{arr[bad].tolist()} (an unbounded observation space needs a scale "
                         "from data: scale='auto', or register the env with obs_bound='data')")
    return arr


@dataclass(frozen=True)
class EncoderParams:
    """What defines one client's encoder: enough to rebuild it anywhere."""

    hd_dim: int
    bandwidth: float
    seed: int

    def build(self, scale: np.ndarray) -> HDEncoder:
        """Fit an encoder for states of width ``len(scale)``."""
        enc = HDEncoder(self.hd_dim, self.bandwidth, scale=scale, random_state=self.seed)
        return enc._draw(np.zeros((1, len(scale))))


def shared_encoder_params(seed: int, hd_dim: int, bandwidth: float) -> EncoderParams:
    """The one encoder every client (and the server) uses in the shared setting."""
    return EncoderParams(hd_dim, bandwidth, encoder_seed(seed, SHARED))


def heterogeneous_encoder_params(
    seed: int,
    partition_id: int,
    base_bandwidth: float,
    dims: tuple[int, ...] = HETEROGENEOUS_DIMS,
) -> EncoderParams:
    """Client ``partition_id``'s own encoder: its own seed, ``D_i`` cycled from ``dims``
    and ``bandwidth_i = base_bandwidth * U(0.5, 1.5)`` (the FedQHD paper's protocol)."""
    enc_seed = encoder_seed(seed, partition_id)
    bandwidth = base_bandwidth * np.random.default_rng(enc_seed).uniform(0.5, 1.5)
    return EncoderParams(dims[partition_id % len(dims)], float(bandwidth), enc_seed)


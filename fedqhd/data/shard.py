"""Trajectory shards: the in-memory :class:`Shard` and its validated ``.npz`` file.

A shard is one client's private offline data: transitions of one environment,
grouped into episodes. On disk it is a NumPy ``.npz`` archive (written with
``numpy.savez``, read with ``allow_pickle=False``) holding exactly these arrays,
with ``N`` transitions and ``d = obs_dim``:

=====================  =========  =======  ==============================================
key                    shape      dtype    meaning
=====================  =========  =======  ==============================================
``observations``       (N, d)     float32  state s_t, finite
``actions``            (N,)       int64    a_t in ``0 .. n_actions - 1``
``rewards``            (N,)       float32  r_t, finite
``next_observations``  (N, d)     float32  s_{t+1} as returned by ``env.step``, finite
``terminated``         (N,)       bool     s_{t+1} is terminal: do not bootstrap
``truncated``          (N,)       bool     time limit hit at s_{t+1}: DO bootstrap
``episode_ids``        (N,)       int64    >= 0; transitions of one episode share an id
``metadata``           ()         str      a JSON object, see below
=====================  =========  =======  ==============================================

``N >= 1``. Truncation is not termination: a time-limited episode ends with
``truncated=True, terminated=False`` and its last ``next_observations`` row is a
real, non-terminal state. Both flags may be true on the same step.

``metadata`` (JSON object). Required: ``format_version`` (int, currently
:data:`FORMAT_VERSION`) and ``env_id`` (a registered env, :data:`fedqhd.envs.ENV_IDS`;
a user's env is registered by importing the module that registers it, see
``env-module``). Written by :func:`fedqhd.data.collect_shard` and
:func:`fedqhd.data.shards_from_arrays` (and checked when present): ``env_spec``
(object: ``env_id``, ``obs_shape``, ``n_actions``, ``obs_bound`` and their
``fingerprint``, :func:`fedqhd.envs.spec_record`; a shard is refused when the
env it is loaded with has another spec),
``n_episodes`` (int, must equal the number of distinct episode ids),
``behaviour`` (object, e.g. ``{"kind": "epsilon-heuristic", "epsilon": 0.9}``),
``seed`` (int, the collection seed), ``dynamics`` (object, every physical
parameter of the env). Client shards add ``partition``, ``partition_id``,
``num_partitions``, ``base_seed`` (the run seed), ``epsilon_min`` and
``epsilon_max``.

Observations (and next observations) must lie in the env's observation space
where its bounds are finite: data of another environment labelled with this
env's id is refused.

Values far outside the env's bounds (:data:`VALUE_TOLERANCE`) are refused, or
only flagged, as ``value_check`` (run-config ``value-check``, :data:`VALUE_CHECKS`)
says: observations of a coordinate whose bound is known (the built-in tasks, or
``obs_bound`` given to ``register_env``) beyond ``center +- bound`` by more than
``VALUE_TOLERANCE`` times the width ``2 x bound``, and rewards beyond the env's
``reward_range`` by more than ``VALUE_TOLERANCE`` times its width. Non-finite
values are always refused.

Loading (:func:`load_shard`) validates all of the above; any violation raises
:class:`ShardError` naming the file and the problem. Nothing is dropped, cast
or repaired. Before any array is decompressed, the archive's declared sizes are
checked (:class:`ShardLimits`): at most ``max_transitions`` rows per array, and a
compressed archive may expand at most ``max_compression_ratio`` times its file
size (a zip bomb is refused before it is expanded).
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
import warnings
import zipfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.envs import get_spec, space_bounds, spec_record

__all__ = [
    "FORMAT_VERSION",
    "ARRAY_SCHEMA",
    "MAX_COMPRESSION_RATIO",
    "MAX_TRANSITIONS",
    "VALUE_CHECKS",
    "VALUE_TOLERANCE",
    "Shard",
    "ShardError",
    "ShardLimits",
    "load_shard",
    "pooled",
    "read_npz",
    "save_shard",
]

#: version of the on-disk schema, stored in ``metadata["format_version"]``
FORMAT_VERSION = 1

#: array key -> (ndim, dtype); observation-shaped arrays have ndim 2
ARRAY_SCHEMA: dict[str, tuple[int, np.dtype]] = {
    "observations": (2, np.dtype(np.float32)),
    "actions": (1, np.dtype(np.int64)),
    "rewards": (1, np.dtype(np.float32)),
    "next_observations": (2, np.dtype(np.float32)),
    "terminated": (1, np.dtype(np.bool_)),
    "truncated": (1, np.dtype(np.bool_)),
    "episode_ids": (1, np.dtype(np.int64)),
}

_FLOAT_KEYS = ("observations", "rewards", "next_observations")

#: what validation does with values far outside the env's bounds: refuse (default),
#: warn (flag them: a warning, :attr:`Shard.value_flags`, the client's reply metrics), off
VALUE_CHECKS: tuple[str, ...] = ("refuse", "warn", "off")
#: "far outside": beyond the bound range by more than this multiple of its width
VALUE_TOLERANCE = 10.0
#: default cap of the rows of any array of a shard file
MAX_TRANSITIONS = 10_000_000
#: default cap of (declared uncompressed size) / (file size) of a shard file
MAX_COMPRESSION_RATIO = 100.0
#: archives declaring less than this (uncompressed) are never refused for their ratio
RATIO_FLOOR_BYTES = 1 << 24
#: the members of a shard file: the schema's arrays and the metadata
SHARD_MEMBERS = frozenset({*ARRAY_SCHEMA, "metadata"})


@dataclass(frozen=True)
class ShardLimits:
    """How strictly :func:`load_shard` treats a file (run-config keys ``value-check``,
    ``max-shard-transitions``, ``max-compression-ratio``).

    Attributes
    ----------
    value_check : {"refuse", "warn", "off"}
        Values far outside the env's bounds (:data:`VALUE_TOLERANCE`) are refused,
        flagged (loaded, with a warning and :attr:`Shard.value_flags`) or not checked.
    max_transitions : int
        Most rows any array may declare (checked on the archive, before loading).
    max_compression_ratio : float
        Most the archive may expand: declared uncompressed bytes over file bytes
        (archives declaring under 16 MiB are exempt).
    """

    value_check: str = "refuse"
    max_transitions: int = MAX_TRANSITIONS
    max_compression_ratio: float = MAX_COMPRESSION_RATIO

    def __post_init__(self) -> None:
        if self.value_check not in VALUE_CHECKS:
            raise ValueError(f"value_check must be one of {', '.join(VALUE_CHECKS)}, "
                             f"got {self.value_check!r}")
        if isinstance(self.max_transitions, bool) or not (
                isinstance(self.max_transitions, int) and self.max_transitions >= 1):
            raise ValueError(f"max_transitions must be a positive integer, "
                             f"got {self.max_transitions!r}")
        if not self.max_compression_ratio >= 1.0:
            raise ValueError(f"max_compression_ratio must be >= 1, "
                             f"got {self.max_compression_ratio!r}")


class ShardError(ValueError):
    """A shard file or object violates the schema; the message names file and problem."""


@dataclass(eq=False)
class Shard:
    """One client's offline transitions (see the module docstring for the schema).

    Attributes
    ----------
    observations, next_observations : np.ndarray
        ``(N, obs_dim)`` float32.
    actions : np.ndarray
        ``(N,)`` int64.
    rewards : np.ndarray
        ``(N,)`` float32.
    terminated, truncated : np.ndarray
        ``(N,)`` bool; only ``terminated`` stops bootstrapping.
    episode_ids : np.ndarray
        ``(N,)`` int64.
    metadata : dict
        JSON-serialisable; at least ``env_id`` and ``format_version``.
    """

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_ids: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    #: values far outside the env's bounds, flagged (not refused) by ``value_check="warn"``
    value_flags: list[str] = field(default_factory=list)

    @property
    def n_transitions(self) -> int:
        """Number of transitions ``N``."""
        return int(self.actions.shape[0])

    @property
    def n_episodes(self) -> int:
        """Number of distinct episode ids."""
        return int(np.unique(self.episode_ids).size)

    @property
    def env_id(self) -> str:
        """The ``env_id`` recorded in the metadata."""
        return str(self.metadata["env_id"])

    def arrays(self) -> dict[str, np.ndarray]:
        """The schema's arrays by key (no metadata)."""
        return {key: getattr(self, key) for key in ARRAY_SCHEMA}

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of each episode, in order of first appearance of its id."""
        _, first, inverse = np.unique(self.episode_ids, return_index=True, return_inverse=True)
        sums = np.bincount(inverse, weights=self.rewards.astype(np.float64))
        return sums[np.argsort(first)]

    def validate(self, source: str = "<shard>", expected_env_id: str | None = None,
                 value_check: str = "refuse") -> None:
        """Check this shard against the schema.

        Parameters
        ----------
        source : str
            Name used in error messages (the file path when loading).
        expected_env_id : str or None
            If given, the shard must be of this environment.
        value_check : {"refuse", "warn", "off"}
            What values far outside the env's bounds do (:data:`VALUE_CHECKS`); with
            ``"warn"`` they are recorded in :attr:`value_flags`.

        Raises
        ------
        ShardError
            On the first violation found.
        """
        self.value_flags = _validate(self.arrays(), self.metadata, source, expected_env_id,
                                     value_check)


def _fail(source: str, problem: str) -> ShardError:
    return ShardError(f"{source}: {problem}")


def _validate_metadata(meta: Any, source: str, expected_env_id: str | None) -> int:
    """Check metadata; return the env's number of actions."""
    if not isinstance(meta, dict):
        raise _fail(source, f"metadata must be a JSON object, got {type(meta).__name__}")
    for key in ("format_version", "env_id"):
        if key not in meta:
            raise _fail(source, f"metadata lacks required key {key!r}")
    if meta["format_version"] != FORMAT_VERSION:
        raise _fail(
            source,
            f"unsupported format_version {meta['format_version']!r} (this code reads "
            f"{FORMAT_VERSION})",
        )
    env_id = meta["env_id"]
    try:
        spec = get_spec(env_id)
    except ValueError as exc:
        raise _fail(source, f"metadata env_id: {exc}") from None
    if expected_env_id is not None and env_id != expected_env_id:
        raise _fail(source, f"env mismatch: shard is {env_id!r}, expected {expected_env_id!r}")
    for key, kind in (("behaviour", dict), ("dynamics", dict), ("n_episodes", int),
                      ("env_spec", dict)):
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            raise _fail(source, f"metadata {key!r} must be a JSON {kind.__name__}")
    if "env_spec" in meta:
        _check_env_spec(meta["env_spec"], env_id, source)
    return spec.n_actions


def _check_env_spec(recorded: dict[str, Any], env_id: str, source: str) -> None:
    """Refuse a shard made for another spec than the one ``env_id`` has here."""
    current = spec_record(env_id)
    if recorded.get("fingerprint") == current["fingerprint"]:
        return
    differ = [k for k in ("env_id", "obs_shape", "n_actions", "obs_bound")
              if recorded.get(k) != current[k]]
    detail = "; ".join(f"{k}: shard {recorded.get(k)!r}, env {current[k]!r}" for k in differ)
    raise _fail(source, f"env spec mismatch: the shard was made for env spec "
                        f"{recorded.get('fingerprint')!r}, but {env_id} here has "
                        f"{current['fingerprint']!r} ({detail or 'fingerprint differs'})")


def _check_in_space(arrays: dict[str, np.ndarray], env_id: str, source: str) -> None:
    """Observations outside the env's finite Box bounds are not of this env."""
    low, high = space_bounds(env_id)
    if low.shape != (arrays["observations"].shape[1],):
        return
    tol_low = low - 1e-5 * (1.0 + np.abs(low))
    tol_high = high + 1e-5 * (1.0 + np.abs(high))
    for key in ("observations", "next_observations"):
        out = (arrays[key] < tol_low) | (arrays[key] > tol_high)
        if out.any():
            row, col = (int(i) for i in np.argwhere(out)[0])
            raise _fail(source, f"{key} outside {env_id}'s observation space: "
                                f"{int(out.sum())} values (first: row {row}, coordinate {col}: "
                                f"{float(arrays[key][row, col]):.6g} not in "
                                f"[{low[col]:.6g}, {high[col]:.6g}]); is this data of "
                                f"another environment?")


def _value_ranges(env_id: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The known bound range of each float field: (lo, hi) per coordinate."""
    spec = get_spec(env_id)
    ranges = {}
    if spec.obs_bound_source == "given":
        lo, hi = spec.center - spec.obs_bound, spec.center + spec.obs_bound
        ranges["observations"] = ranges["next_observations"] = (lo, hi)
    if spec.reward_range is not None:
        ranges["rewards"] = (np.array([spec.reward_range[0]]), np.array([spec.reward_range[1]]))
    return ranges


def _check_values(arrays: dict[str, np.ndarray], env_id: str, source: str,
                  value_check: str) -> list[str]:
    """Values beyond a known bound range by more than :data:`VALUE_TOLERANCE` widths:
    refused, or returned as flags (and warned about) with ``value_check="warn"``."""
    if value_check not in VALUE_CHECKS:
        raise ValueError(f"value_check must be one of {', '.join(VALUE_CHECKS)}, "
                         f"got {value_check!r}")
    if value_check == "off":
        return []
    flags = []
    for key, (lo, hi) in _value_ranges(env_id).items():
        values = arrays[key].reshape(len(arrays[key]), -1)
        if values.shape[1] != lo.shape[0]:
            continue
        width = hi - lo
        low, high = lo - VALUE_TOLERANCE * width, hi + VALUE_TOLERANCE * width
        out = (values < low) | (values > high)
        if not out.any():
            continue
        row, col = (int(i) for i in np.argwhere(out)[0])
        where = f"row {row}" + (f", coordinate {col}" if key != "rewards" else "")
        problem = (f"{key} far outside {env_id}'s bounds: {int(out.sum())} values (first: "
                   f"{where}: {float(values[row, col]):.6g} not in [{low[col]:.6g}, "
                   f"{high[col]:.6g}], the bound range [{lo[col]:.6g}, {hi[col]:.6g}] widened "
                   f"by {VALUE_TOLERANCE:g} x its width)")
        if value_check == "refuse":
            raise _fail(source, f"{problem}; to load it anyway set run-config "
                                f"value-check = \"warn\" (flag) or \"off\"")
        warnings.warn(f"{source}: {problem} (value-check = \"warn\": kept)", stacklevel=3)
        flags.append(problem)
    return flags


def _validate(
    arrays: dict[str, np.ndarray], meta: Any, source: str, expected_env_id: str | None,
    value_check: str = "refuse",
) -> list[str]:
    """Check arrays and metadata (raises :class:`ShardError`); returns the value flags."""
    n_actions = _validate_metadata(meta, source, expected_env_id)
    obs_dim = get_spec(meta["env_id"]).obs_dim
    missing = [k for k in ARRAY_SCHEMA if k not in arrays]
    if missing:
        raise _fail(source, f"missing arrays: {', '.join(missing)}")
    unexpected = sorted(set(arrays) - set(ARRAY_SCHEMA))
    if unexpected:
        raise _fail(source, f"unexpected arrays: {', '.join(unexpected)}")
    n = None
    for key, (ndim, dtype) in ARRAY_SCHEMA.items():
        arr = arrays[key]
        if not isinstance(arr, np.ndarray):
            raise _fail(source, f"{key} is a {type(arr).__name__}, not a numpy array")
        if arr.ndim != ndim:
            raise _fail(source, f"{key} has shape {arr.shape}, expected {ndim} dimensions")
        if arr.dtype != dtype:
            raise _fail(source, f"{key} has dtype {arr.dtype}, expected {dtype}")
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise _fail(
                source, f"inconsistent lengths: {key} has {arr.shape[0]} rows, observations {n}"
            )
        if ndim == 2 and arr.shape[1] != obs_dim:
            raise _fail(
                source,
                f"{key} has obs_dim {arr.shape[1]}, but {meta['env_id']} observations have "
                f"{obs_dim}",
            )
    if n == 0:
        raise _fail(source, "shard has no transitions")
    for key in _FLOAT_KEYS:
        bad = ~np.isfinite(arrays[key])
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise _fail(
                source, f"{key} has {int(bad.sum())} non-finite values (first in row {row})"
            )
    _check_in_space(arrays, meta["env_id"], source)
    flags = _check_values(arrays, meta["env_id"], source, value_check)
    actions = arrays["actions"]
    out = (actions < 0) | (actions >= n_actions)
    if out.any():
        row = int(np.flatnonzero(out)[0])
        raise _fail(
            source,
            f"actions out of range: {int(out.sum())} outside 0..{n_actions - 1} "
            f"(first: {int(actions[row])} in row {row})",
        )
    if (arrays["episode_ids"] < 0).any():
        raise _fail(source, "episode_ids must be >= 0")
    if "n_episodes" in meta:
        found = int(np.unique(arrays["episode_ids"]).size)
        if meta["n_episodes"] != found:
            raise _fail(
                source, f"metadata n_episodes={meta['n_episodes']} but episode_ids hold {found}"
            )
    return flags


def save_shard(shard: Shard, path: str | os.PathLike[str], value_check: str = "refuse") -> Path:
    """Validate a shard and write it to ``path`` atomically.

    The file appears complete or not at all (written to a temporary file in the
    same directory, then renamed), so concurrent clients sharing a cache never
    read a half-written shard.

    Parameters
    ----------
    shard : Shard
        Data to write; must pass :meth:`Shard.validate`.
    path : str or PathLike
        Destination, used verbatim (no ``.npz`` is appended); parent folders
        are created.
    value_check : {"refuse", "warn", "off"}
        As in :meth:`Shard.validate` (a flagged shard loads again only with the same).

    Returns
    -------
    Path
        The written path.
    """
    path = Path(path)
    shard.validate(str(path), value_check=value_check)
    try:
        meta_json = json.dumps(shard.metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(str(path), f"metadata is not JSON-serialisable ({exc})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            # typed as Any: numpy's stub would match ** of arrays against allow_pickle: bool
            arrays: dict[str, Any] = shard.arrays()
            np.savez(fh, **arrays, metadata=np.array(meta_json))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_shard(path: str | os.PathLike[str], expected_env_id: str | None = None,
               limits: ShardLimits | None = None) -> Shard:
    """Read and validate a shard file.

    Parameters
    ----------
    path : str or PathLike
        A ``.npz`` written by :func:`save_shard` (or by hand, to the schema).
    expected_env_id : str or None
        If given, a shard of another environment is an error.
    limits : ShardLimits or None
        Value check, row cap and compression-ratio cap (default :class:`ShardLimits()`:
        refuse far-out values, at most :data:`MAX_TRANSITIONS` rows, at most
        :data:`MAX_COMPRESSION_RATIO` expansion).

    Returns
    -------
    Shard
        With :attr:`Shard.value_flags` set under ``value_check="warn"``.

    Raises
    ------
    ShardError
        If the file is missing or unreadable, declares more rows or more expansion
        than ``limits`` allow (checked before anything is decompressed), the metadata
        is not a JSON object of the schema, or any array is missing, unexpected, of
        the wrong shape, dtype or length, non-finite, out of range, or far outside
        the env's bounds. The message starts with the path.
    """
    source = str(path)
    limits = ShardLimits() if limits is None else limits
    contents = read_npz(path, limits, members=SHARD_MEMBERS)
    raw = contents.pop("metadata", None)
    if raw is None:
        raise _fail(source, "missing arrays: metadata")
    if raw.ndim != 0 or raw.dtype.kind != "U":
        raise _fail(source, f"metadata must be a 0-d string array, got {raw.dtype} {raw.shape}")
    try:
        meta = json.loads(str(raw), parse_constant=_reject_constant)
    except ValueError as exc:
        raise _fail(source, f"metadata is not valid JSON ({exc})") from None
    flags = _validate(contents, meta, source, expected_env_id, limits.value_check)
    return Shard(**contents, metadata=meta, value_flags=flags)


def read_npz(path: str | os.PathLike[str], limits: ShardLimits,
             members: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` archive at ``path``, loaded without pickles (shard
    files, and the arrays ``fedqhd data import`` reads). ``members``: the only array
    names allowed (``None``: any).

    Raises :class:`ShardError`, its message starting with the path, for anything that is
    not a readable ``.npz`` archive (missing, a folder, not a zip, truncated, a bad CRC,
    pickled arrays) and for what ``limits`` or ``members`` refuse, checked before
    anything is decompressed.
    """
    source = str(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(source)
        if not stat.S_ISREG(mode):  # a device or pipe: reading it never ends or blocks
            raise _fail(source, "not a regular file (a device, pipe or socket?); not read")
        _check_archive(path, source, limits, members)
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise _fail(source, "no such file") from None
    except IsADirectoryError:
        raise _fail(source, "is a directory, not a .npz file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, ShardError):
            raise
        raise _fail(source, f"cannot read as a .npz archive ({exc})") from None
    except MemoryError:  # the checks above bound what a header may declare; a last guard
        raise _fail(source, "too large to load into memory") from None


def _check_archive(path: str | os.PathLike[str], source: str, limits: ShardLimits,
                   members: Collection[str] | None) -> None:
    """Refuse a file that is not a zip archive (numpy would take it for a pickle and
    say so, which is wrong about a text file and points at unsafe loading), and, from
    the zip directory and the ``.npy`` headers alone, an archive with members not in
    ``members``, more rows than ``limits.max_transitions``, an expansion above
    ``limits.max_compression_ratio``, or an array whose header declares more bytes than
    its member holds.

    numpy allocates an array from its header's shape before reading a byte of it, so a
    300-byte member declaring a (1, 10**12) array would be a MemoryError: every header's
    total size is checked against its member's declared size, which the ratio check bounds
    by the file size. The declared sizes bind: :mod:`zipfile` never inflates a member
    beyond its declared size (more data fails its CRC check)."""
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as fh:
            if fh.read(6) == b"\x93NUMPY":
                raise _fail(source, "not a .npz archive (a single .npy array?)")
        raise _fail(source, "not a .npz archive (no zip directory: not a zip file, or a "
                            "truncated one)")
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        keys = [info.filename.removesuffix(".npy") for info in infos]
        unexpected = sorted(set(keys) - set(members)) if members is not None else []
        if unexpected:
            raise _fail(source, f"unexpected arrays: {', '.join(unexpected)}")
        declared = sum(info.file_size for info in infos)
        on_disk = max(os.path.getsize(path), 1)
        if declared > RATIO_FLOOR_BYTES and declared > limits.max_compression_ratio * on_disk:
            raise _fail(source, f"the archive would expand {declared / on_disk:.0f}-fold "
                                f"({declared} bytes from a {on_disk}-byte file), more than "
                                f"max-compression-ratio = {limits.max_compression_ratio:g}; "
                                "refused before decompressing (a zip bomb?)")
        for info, key in zip(infos, keys, strict=True):
            with archive.open(info) as member:
                header = _declared_array(member)
            if header is None:
                continue  # no readable header: np.load reports it
            shape, nbytes, header_bytes = header
            if shape and shape[0] > limits.max_transitions:
                raise _fail(source, f"{key} declares {shape[0]} rows, more than "
                                    f"max-shard-transitions = {limits.max_transitions}; "
                                    "split the data into more shards or raise the cap")
            if nbytes > info.file_size - header_bytes:
                raise _fail(source, f"{key} declares shape {shape} ({nbytes} bytes) but its "
                                    f"member holds {max(info.file_size - header_bytes, 0)} "
                                    "bytes of data; refused before allocating (truncated "
                                    "or forged header)")


def _declared_array(member: Any) -> tuple[tuple[int, ...], int, int] | None:
    """What a ``.npy`` header declares: (shape, bytes of data, bytes of the header);
    ``None`` for no readable header."""
    try:
        version = np.lib.format.read_magic(member)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(member, max_header_size=10_000)
        header_bytes = member.tell()
    except Exception:  # noqa: BLE001 - a bad header is np.load's to report
        return None
    return tuple(int(n) for n in shape), math.prod(shape) * dtype.itemsize, header_bytes


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON constant {name}")


def pooled(shards: list[Shard]) -> Shard:
    """Concatenate shards of one environment into one (the centralised baseline).

    Episode ids are renumbered ``0 .. total - 1`` in order (shard by shard,
    episode by first appearance), so episodes of different shards never merge.

    Parameters
    ----------
    shards : list of Shard
        At least one; all of the same ``env_id``.

    Returns
    -------
    Shard
        Metadata: ``env_id``, ``format_version``, ``n_episodes``,
        ``behaviour = {"kind": "pooled"}`` and ``pooled_from`` (the sources'
        metadata, in order).
    """
    if not shards:
        raise ValueError("pooled() needs at least one shard")
    env_ids = sorted({s.env_id for s in shards})
    if len(env_ids) > 1:
        raise ValueError(f"cannot pool shards of different environments: {', '.join(env_ids)}")
    episode_ids, offset = [], 0
    for shard in shards:
        _, first, inverse = np.unique(shard.episode_ids, return_index=True, return_inverse=True)
        rank = np.empty_like(first)
        rank[np.argsort(first)] = np.arange(first.size)  # number episodes by appearance
        episode_ids.append(rank[inverse].astype(np.int64) + offset)
        offset += first.size
    arrays: dict[str, Any] = {  # Any: ** must not look like it could fill value_flags
        key: np.concatenate([getattr(s, key) for s in shards])
        for key in ARRAY_SCHEMA
        if key != "episode_ids"
    }
    metadata: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "env_id": env_ids[0],
        "n_episodes": offset,
        "behaviour": {"kind": "pooled"},
        "pooled_from": [s.metadata for s in shards],
    }
    return Shard(**arrays, episode_ids=np.concatenate(episode_ids), metadata=metadata)

"""The light install: ``fedqhd.strategies`` works with flwr and numpy alone.

The fast test runs the strategies in a subprocess where the ``full`` extra's modules
cannot be imported (a ``sys.meta_path`` finder refuses them), so an import of any of
them anywhere below ``fedqhd.strategies`` fails it; the slow test asks pip what a
plain ``pip install`` of this project would bring.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the ``full`` extra's modules (and Ray, JAX): none may be needed by the strategies
HEAVY = ("gymnasium", "Box2D", "opendp", "matplotlib", "scipy", "sklearn", "dp_accounting",
         "tqdm", "ray", "jax", "optax")

CHECK = textwrap.dedent('''
    import sys, time
    HEAVY = set(sys.argv[1].split(","))

    class Blocker:
        """Refuse the heavy modules as if they were not installed."""
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Blocker())

    import numpy as np
    from flwr.app import ConfigRecord, Message, Metadata, MetricRecord, RecordDict
    from fedqhd.strategies import FedQHDAnchor, FedQHDAvg, FedQHDExact, FedQHDPooled
    from fedqhd.strategies import contract as C

    def reply(node, arrays, metrics):
        meta = Metadata(run_id=1, message_id=f"r{node}", src_node_id=node, dst_node_id=0,
                        reply_to_message_id="q", group_id="1", created_at=time.time(),
                        ttl=60, message_type="train")
        return Message(metadata=meta, content=RecordDict(
            {C.ARRAYS: C.to_array_record(arrays), C.METRICS: MetricRecord(metrics)}))

    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # a ServerApp's

    class Grid:  # what the strategies ask a Grid for when they sample
        def get_node_ids(self):
            return [1, 2, 3]

    rng = np.random.default_rng(0)
    counts = [10, 30, 60]
    w = np.array(counts) / sum(counts)

    readouts = [rng.normal(size=(5, 2)) for _ in counts]
    out, metrics = FedQHDAvg(readout_shape=(5, 2)).aggregate_train(1, [
        reply(i + 1, {C.READOUT: r}, {C.NUM_TRANSITIONS: n})
        for i, (r, n) in enumerate(zip(readouts, counts))])
    expected = sum(wi * r for wi, r in zip(w, readouts))
    assert np.abs(out[C.READOUT].numpy() - expected).max() < 1e-12
    assert metrics[C.REPLIES_OK] == 3 and metrics[C.NUM_TRANSITIONS] == 100

    anchors = rng.normal(size=(4, 3))
    q = [rng.normal(size=(4, 2)) for _ in counts]
    out, _ = FedQHDAnchor(anchors, n_actions=2).aggregate_train(1, [
        reply(i + 1, {C.Q_ANCHORS: qi}, {C.NUM_TRANSITIONS: n})
        for i, (qi, n) in enumerate(zip(q, counts))])
    assert np.abs(out[C.TEACHER].numpy() - sum(wi * qi for wi, qi in zip(w, q))).max() < 1e-12

    # FedQHDExact: one sweep from a zero readout = pooled ridge regression on the rewards
    dim, n_actions, ridge = 6, 2, 0.5
    exact = FedQHDExact(dim, n_actions, gamma=0.9, ridge=ridge)
    sent = exact.configure_train(1, C.to_array_record({C.READOUT: np.zeros((dim, n_actions))}),
                                 ConfigRecord(), Grid())
    assert sorted(m.metadata.dst_node_id for m in sent) == [1, 2, 3]
    data = [(rng.normal(size=(n, dim)), rng.integers(n_actions, size=n), rng.normal(size=n))
            for n in counts]
    replies = []
    for node, (phi, actions, rewards) in enumerate(data, start=1):
        grams = np.stack([phi[actions == a].T @ phi[actions == a] for a in range(n_actions)])
        phi_y = np.stack([phi[actions == a].T @ rewards[actions == a]
                          for a in range(n_actions)], axis=1)
        replies.append(reply(node, {
            C.GRAM: C.pack_upper(grams), C.PHI_Y: phi_y,
            C.ACTION_COUNTS: np.bincount(actions, minlength=n_actions).astype(float),
            C.REWARD_RANGE: np.array([rewards.min(), rewards.max()])},
            {C.NUM_TRANSITIONS: len(rewards), C.GRAM_THROUGH: len(rewards)}))
    out, metrics = exact.aggregate_train(1, replies)
    phi, actions, rewards = (np.concatenate(x) for x in zip(*data))
    pooled = np.stack([np.linalg.solve(phi[actions == a].T @ phi[actions == a]
                                       + ridge * np.eye(dim), phi[actions == a].T
                                       @ rewards[actions == a]) for a in range(n_actions)],
                      axis=1)
    assert np.abs(out[C.READOUT].numpy() - pooled).max() < 1e-8, "exact != pooled ridge"
    assert metrics[C.EXACT_CLIENTS] == 3
    assert metrics[C.REPLIES_SAMPLED] == metrics[C.REPLIES_RECEIVED] == 3

    # FedQHDPooled: one sweep from a zero readout, the sweep answered by the grid; without
    # scipy its factors are numpy's
    phi_ys = {node: C.from_array_record(r.content[C.ARRAYS])[C.PHI_Y]
              for node, r in enumerate(replies, start=1)}

    class SweepGrid(Grid):
        def send_and_receive(self, messages, timeout=None):
            return [reply(m.metadata.dst_node_id, {C.PHI_Y: phi_ys[m.metadata.dst_node_id]},
                          {C.NUM_TRANSITIONS: 1}) for m in messages]

    oracle = FedQHDPooled(dim, n_actions, ridge=ridge, proximal=0.0, sweeps=1)
    oracle.configure_train(1, oracle.initial_arrays(), ConfigRecord(), SweepGrid())
    out, metrics = oracle.aggregate_train(1, replies)
    assert np.abs(out[C.READOUT].numpy() - pooled).max() < 1e-8, "pooled oracle != ridge"
    assert metrics[C.CLIENTS_AVERAGED] == 3 and metrics[C.POOLED_SWEEPS] == 1

    from fedqhd.commands import main as cli
    assert cli.main(["--help"]) == 2  # a clear message, not a traceback
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    assert not loaded, loaded
    print("light ok")
''')


def test_strategies_run_without_the_full_extra(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHECK, ",".join(HEAVY)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "light ok" in proc.stdout
    assert "needs the 'full' extra" in proc.stderr and 'fedqhd[full]' in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_pip_install_without_extras_brings_no_heavy_package(tmp_path: Path) -> None:
    """What ``pip install fedqhd`` resolves to, from PyPI, without installing it (a real
    install into a fresh venv took 3 min 51 s on 2 busy cores; the resolution ~20 s)."""
    project = tmp_path / "fedqhd-src"  # a copy: pip builds a local project in place
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "fedqhd", project / "fedqhd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run",
                           "--ignore-installed", "--quiet", "--report", str(report),
                           str(project)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {item["metadata"]["name"].lower().replace("_", "-")
             for item in json.loads(report.read_text())["install"]}
    assert {"fedqhd", "flwr", "numpy"} <= names, sorted(names)
    heavy = {"gymnasium", "opendp", "matplotlib", "scipy", "scikit-learn", "tqdm",
             "dp-accounting", "ray", "jax", "box2d"}
    assert not names & heavy, sorted(names & heavy)

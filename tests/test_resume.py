"""Checkpoint and resume: a run killed in the middle of a round and resumed from its run
folder ends exactly as the uninterrupted run; bad resumes are refused with the reason."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.server.app import run_federation
from fedqhd.server.checkpoint import (
    CHECKPOINT,
    Checkpoint,
    CheckpointError,
    _pack,
    _unpack,
    capture_rng,
    restore_rng,
)
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.server.results import RESULTS, ROUNDS, read_rounds
from fedqhd.server.resume import open_resume

ROOT = Path(__file__).resolve().parents[1]
N_CLIENTS = 4
ROUNDS_TOTAL, KILLED_IN = 4, 3  # killed while round 3 runs: the checkpoint is round 2's
# the default client update (consensus ADMM: clients keep memory between rounds) with half
# the nodes sampled per round (the sampling draws from Python's random, which resumes too)
TINY = dict(env_id="CartPole-v1", seed=5, hd_dim=64, episodes_per_client=2, eval_episodes=2,
            num_server_rounds=ROUNDS_TOTAL, fraction_train=0.5, min_nodes=2)

# the killed run: a client sleeps in round KILLED_IN after touching a marker file
_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fedqhd.client.app import app
    from fedqhd.config import RunConfig
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    cfg = RunConfig.from_run_config(__import__("json").loads(sys.argv[1]))
    marker, stall_round = Path(sys.argv[2]), int(sys.argv[3])

    def stalling(msg, context):
        if msg.content["config"]["server-round"] == stall_round:
            marker.touch()
            time.sleep(600)
        return app(msg, context)

    run_federation(InProcessGrid([stalling] * {n}, run_config=cfg.to_run_config()), cfg)
""").format(n=N_CLIENTS)


def _run(cfg: RunConfig) -> tuple[dict, Path]:
    grid = InProcessGrid([client_app] * N_CLIENTS, run_config=cfg.to_run_config())
    return run_federation(grid, cfg)


def _rows(run_dir: Path) -> list[dict]:
    """The rounds of results.json without their wall times and BLAS thread counts (facts
    about the process that ran them, not results)."""
    rows = json.loads((run_dir / RESULTS).read_text())["rounds"]
    return [{k: v for k, v in r.items() if k not in ("wall-time-s", "blas-threads")}
            for r in rows]


def test_resume_after_kill_equals_uninterrupted_run(tmp_path):
    cfg = RunConfig(output_dir=str(tmp_path / "killed"), **TINY)
    marker = tmp_path / "stalled"
    # the killed run's threads as this process's (BLAS sums in another order differ in
    # the last bits)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(cfg.to_run_config()), str(marker),
         str(KILLED_IN)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, child.stderr.read().decode()[-3000:]  # type: ignore
            assert time.monotonic() < deadline, "the killed run never reached its stall"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    (run_dir,) = (tmp_path / "killed").glob("*/*")
    assert not (run_dir / RESULTS).exists()  # it never finished
    assert Checkpoint.load(run_dir).round == KILLED_IN - 1
    with open(run_dir / ROUNDS, "a") as fh:  # a row torn by the kill: cut on resume
        fh.write('{"round": 3, "return-me')
    assert [r["round"] for r in read_rounds(run_dir)] == list(range(1, KILLED_IN))

    seen: list[int] = []  # the rounds the resumed run's clients are told

    def recording(msg, context):
        seen.append(int(msg.content["config"]["server-round"]))
        return client_app(msg, context)

    resumed = cfg.replace(resume_from=str(run_dir))
    final, resumed_dir = run_federation(
        InProcessGrid([recording] * N_CLIENTS, run_config=resumed.to_run_config()), resumed)
    _, reference_dir = _run(RunConfig(output_dir=str(tmp_path / "reference"), **TINY))

    assert resumed_dir == run_dir
    assert sorted(set(seen)) == list(range(KILLED_IN, ROUNDS_TOTAL + 1))
    assert final["resumed-after-rounds"] == [KILLED_IN - 1]
    assert final["status"] == "completed" and final["round"] == ROUNDS_TOTAL
    assert _rows(resumed_dir) == _rows(reference_dir)
    lines = (run_dir / ROUNDS).read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == list(range(1, ROUNDS_TOTAL + 1))
    with np.load(resumed_dir / "final_model.npz") as a, \
            np.load(reference_dir / "final_model.npz") as b:
        assert a.files == b.files
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
    assert Checkpoint.load(run_dir).round == ROUNDS_TOTAL


@pytest.mark.parametrize("changes", [
    dict(strategy="exact", fraction_train=1.0),                 # Grams and phi-y held
    dict(encoder="heterogeneous", num_anchors=40),               # anchors, client compiles
])
def test_stopped_run_extended_by_resume_equals_longer_run(tmp_path, changes):
    """A finished 2-round run resumed with num-server-rounds 3 is the 3-round run."""
    tiny = {**TINY, "num_server_rounds": 3, **changes}
    _, reference_dir = _run(RunConfig(output_dir=str(tmp_path / "a"), **tiny))
    short = RunConfig(output_dir=str(tmp_path / "b"), **{**tiny, "num_server_rounds": 2})
    _, run_dir = _run(short)
    final, _ = _run(short.replace(num_server_rounds=3, resume_from=str(run_dir)))
    assert final["resumed-after-rounds"] == [2]
    assert _rows(run_dir) == _rows(reference_dir)
    with np.load(run_dir / "final_model.npz") as a, \
            np.load(reference_dir / "final_model.npz") as b:
        for key in b.files:
            np.testing.assert_array_equal(a[key], b[key])


def _checkpoint(run_dir: Path, cfg: RunConfig, rounds: int = 1) -> Checkpoint:
    """A checkpoint and its rounds.jsonl, written as a run writes them."""
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"round": r}) + "\n" for r in range(1, rounds + 1))
    (run_dir / ROUNDS).write_text(text)
    ckpt = Checkpoint(round=rounds, config=cfg.to_run_config(),
                      arrays={"readout": np.zeros((2, 2))}, strategy={}, rng=capture_rng(),
                      rows=rounds, rows_bytes=len(text))
    ckpt.save(run_dir)
    return ckpt


def test_resume_of_another_config_is_refused_naming_the_keys(tmp_path):
    cfg = RunConfig(**TINY)
    _checkpoint(tmp_path, cfg)
    other = cfg.replace(seed=6, hd_dim=32, num_server_rounds=9, round_timeout=5.0,
                        resume_from=str(tmp_path))
    with pytest.raises(CheckpointError, match=r"differs .* in \['hd-dim', 'seed'\]"):
        open_resume(other)
    # a longer run and other timeouts are a resume of the same run
    assert open_resume(cfg.replace(num_server_rounds=9, round_timeout=5.0,
                                   resume_from=str(tmp_path))).checkpoint.round == 1


def test_a_checkpoint_naming_a_retired_key_is_refused_as_an_older_versions(tmp_path):
    """privacy-delta left the run config; a checkpoint that records it cannot be resumed,
    and the error says why instead of asking for a key no run config may give."""
    cfg = RunConfig(**TINY)
    ckpt = _checkpoint(tmp_path, cfg)
    ckpt.config = {**ckpt.config, "privacy-delta": 1e-5}
    ckpt.save(tmp_path)
    with pytest.raises(CheckpointError, match=r"older fedqhd .*\['privacy-delta'\]"):
        open_resume(cfg.replace(resume_from=str(tmp_path)))


def test_missing_or_corrupt_checkpoint_is_refused(tmp_path):
    cfg = RunConfig(**TINY).replace(resume_from=str(tmp_path))
    with pytest.raises(CheckpointError, match="no checkpoint.npz"):
        open_resume(cfg)
    with pytest.raises(CheckpointError, match="not a run folder"):
        open_resume(cfg.replace(resume_from=str(tmp_path / "nowhere")))
    _checkpoint(tmp_path, cfg.replace(resume_from=""))
    path = tmp_path / CHECKPOINT
    path.write_bytes(path.read_bytes()[:-40])  # torn
    with pytest.raises(CheckpointError, match="corrupt"):
        open_resume(cfg)
    _checkpoint(tmp_path, cfg.replace(resume_from=""), rounds=2)
    (tmp_path / ROUNDS).write_text('{"round": 1}\n')  # rows the checkpoint needs are gone
    with pytest.raises(CheckpointError, match="expects 2"):
        open_resume(cfg)


@pytest.mark.parametrize("changes, fragment", [
    (dict(protocol="online"), "online clients' buffers"),
    (dict(learner="pool", env_id="fedqhd/Inventory-v0"), "privacy budget again"),
])
def test_resume_is_refused_where_client_memory_cannot_be_restored(changes, fragment):
    with pytest.raises(ConfigError, match=fragment):
        RunConfig(resume_from="somewhere", **changes)


def test_state_codec_and_random_states_round_trip():
    state = {("partition", 3): (np.arange(6.0).reshape(2, 3), 0.1 + 0.2), 7: [None, True, "x"],
             "empty": {}}
    arrays: dict[str, np.ndarray] = {}
    back = _unpack(json.loads(json.dumps(_pack(state, arrays))), arrays)
    assert back.keys() == state.keys()
    np.testing.assert_array_equal(back[("partition", 3)][0], state[("partition", 3)][0])
    assert back[("partition", 3)][1] == 0.1 + 0.2 and back[7] == [None, True, "x"]
    saved = _pack(capture_rng(), arrays)
    expected = (random.random(), np.random.random())
    restore_rng(_unpack(json.loads(json.dumps(saved)), arrays))
    assert (random.random(), np.random.random()) == expected


def test_clients_and_the_deviation_scale_survive_a_checkpoint():
    """The clients heard from (node ids, their claimed labels, when last seen) and the
    deviation scale a resumed round is bounded by come back from the checkpoint."""
    # mutation checked: restore_state not restoring "reference-scale" fails this
    from fedqhd.strategies import FedQHDAvg

    before = FedQHDAvg(aggregate="latest")
    before.identities.set_connected([1001, 1002])
    before.identities.seen(1001, 0, 3, "test")
    before.reference.scale = 2.5
    arrays: dict[str, np.ndarray] = {}
    state = _unpack(json.loads(json.dumps(_pack(before.checkpoint_state(), arrays))), arrays)
    after = FedQHDAvg(aggregate="latest")
    after.restore_state(state)
    assert after.identities.labels == {1001: 0} and after.identities.last_seen == {1001: 3}
    assert after.identities.connected == {1001, 1002} and after.reference.scale == 2.5


def test_exact_refuses_to_continue_with_other_node_ids():
    """FedQHDExact keys Grams by node id: after a resume under new ids it would count every
    client twice, so it stops with the reason."""
    from fedqhd.strategies import FedQHDExact

    before = FedQHDExact(4, 2, gamma=0.9, ridge=1.0)
    before._have = {1000: 10, 1001: 12}
    arrays: dict[str, np.ndarray] = {}
    state = _unpack(json.loads(json.dumps(_pack(before.checkpoint_state(), arrays))), arrays)
    after = FedQHDExact(4, 2, gamma=0.9, ridge=1.0)
    after.restore_state(state)
    with pytest.raises(ValueError, match=r"node\(s\) \[1000, 1001\], which are not connected"):
        after._check_resumed_nodes({7, 8})
    after.restore_state(state)
    after._check_resumed_nodes({1000, 1001, 1002})  # the same nodes (and a new one): fine

"""Issue 10, simulation path: the message window, the bounded learner cache, BLAS threads
per ClientApp process, and ``fedqhd bench --suite scale`` at tiny sizes (no Ray)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fedqhd import threads
from fedqhd.client.app import app as client_app
from fedqhd.commands.main import main as cli_main
from fedqhd.config import RunConfig
from fedqhd.learners import fqi
from fedqhd.learners.cache import BoundedCache, array_bytes
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.server.simindex import index_messages, simulation_state
from fedqhd.server.window import ReplySignal, WindowedGrid, for_deployment, for_simulation


class _SlowGrid:
    """Answers a pushed message only at the second pull after its push; records how
    many messages were pushed and unanswered at most."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.pushed: list[int] = []
        self.age: dict[str, int] = {}
        self.most = 0

    def push_messages(self, messages):
        ids = []
        for m in messages:
            self.pushed.append(m.n)
            self.age[f"id{m.n}"] = 0
            ids.append(f"id{m.n}")
        self.most = max(self.most, len(self.age))
        return ids

    def pull_messages(self, ids):
        out = []
        for i in list(ids):
            if i not in self.age:
                continue
            self.age[i] += 1
            if self.answer and self.age[i] >= 2 + int(i[2:]) % 3:  # out of order
                del self.age[i]
                out.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)))
        return out


def test_window_keeps_few_messages_stored_and_returns_every_reply():
    inner = _SlowGrid()
    grid = WindowedGrid(inner, window=4, pull_interval=0.0)  # type: ignore[arg-type]
    replies = grid.send_and_receive([SimpleNamespace(n=i) for i in range(23)], timeout=30)
    # every reply, in the order of the messages (whatever the order they arrived in)
    assert [r.metadata.reply_to_message_id for r in replies] == [f"id{i}" for i in range(23)]
    assert inner.pushed == list(range(23))  # in the caller's order
    assert inner.most == grid.max_in_flight == 4


def test_window_stops_at_the_timeout_without_pushing_the_rest():
    inner = _SlowGrid(answer=False)
    grid = WindowedGrid(inner, window=3, pull_interval=0.01)  # type: ignore[arg-type]
    assert list(grid.send_and_receive([SimpleNamespace(n=i) for i in range(10)],
                                      timeout=0.2)) == []
    assert inner.pushed == [0, 1, 2]
    with pytest.raises(ValueError, match="window"):
        WindowedGrid(inner, window=0)  # type: ignore[arg-type]


def test_only_flowers_simulation_grid_is_windowed():
    state, sim, _ = simulation_state(2, indexed=False)
    store = state.store_message_res
    windowed = for_simulation(sim, 8, index=False)
    assert isinstance(windowed, WindowedGrid) and windowed.arrivals is not None
    assert state.store_message_res is not store  # the engine's stores now signal
    assert for_simulation(sim, 0, index=False) is sim  # sim-window = 0: Flower's own
    plain = InProcessGrid([client_app])
    assert for_simulation(plain, 8) is plain


def test_the_window_pulls_a_reply_when_the_engine_stores_it_not_at_its_next_poll():
    """With the link state's ReplySignal a waiting send_and_receive wakes when a reply is
    stored (here after 0.2 s), not after its poll interval (here 20 s)."""
    stored: list[str] = []

    class State:  # the engine's side: it stores a reply in the link state
        def store_message_res(self, message):
            stored.append(message)

    class Inner:  # the ServerApp's side: a reply can be pulled once it was stored
        def push_messages(self, messages):
            return [f"id{m.n}" for m in messages]

        def pull_messages(self, ids):
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                    for i in ids if i in stored]

    state = State()
    arrivals = ReplySignal().install(state)
    grid = WindowedGrid(Inner(), window=2, pull_interval=20.0,  # type: ignore[arg-type]
                        arrivals=arrivals)
    threading.Timer(0.2, state.store_message_res, args=("id0",)).start()
    t0 = time.monotonic()
    replies = grid.send_and_receive([SimpleNamespace(n=0)], timeout=60)
    assert [r.metadata.reply_to_message_id for r in replies] == ["id0"]
    assert time.monotonic() - t0 < 10 and arrivals.stored == 1


def test_a_deployed_serverapp_pulls_replies_promptly_and_backs_off_while_none_come():
    """Flower 1.42's deployed grid (HttpGrid) pulls every 3 s; for_deployment wraps it to
    pull 0.05 s after pushing, 1.5x longer after each empty pull, at most 1 s apart:
    a reply arriving after 1.2 s is picked up within about a second, in ~10 pulls, not
    20 of a fixed 0.05 s poll."""
    from flwr.superlink.grid.http_grid import HttpGrid

    class Deployed(HttpGrid):
        def __init__(self) -> None:  # no SuperLink: replies "arrive" after 1.2 s
            self.t0 = 0.0

        def push_messages(self, messages):
            self.t0 = time.monotonic()
            return [f"id{m.n}" for m in messages]

        def pull_messages(self, ids):
            late = time.monotonic() - self.t0 >= 1.2
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                    for i in ids] if late else []

    inner = Deployed()
    grid = for_deployment(inner)
    assert isinstance(grid, WindowedGrid) and for_deployment(InProcessGrid([client_app])) \
        is not grid
    t0 = time.monotonic()
    replies = grid.send_and_receive([SimpleNamespace(n=i) for i in range(3)], timeout=30)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["id0", "id1", "id2"]
    assert 1.2 <= time.monotonic() - t0 < 2.5 and grid.pulls <= 12


def _run(tmp_path: Path, name: str, grid_wrap=lambda g: g, learner_cache_mib: int = 1024,
         **changes) -> np.ndarray:
    settings = dict(hd_dim=64, num_server_rounds=3, eval_episodes=1, episodes_per_client=2,
                    output_dir=str(tmp_path / name))
    cfg = RunConfig(**{**settings, **changes})
    grid = InProcessGrid([client_app] * 3, run_config=cfg.to_run_config(),
                         node_configs=[{"learner-cache-mib": learner_cache_mib}] * 3)
    _, out_dir = run_federation(grid_wrap(grid), cfg)
    return np.load(out_dir / "final_model.npz")["readout"]


def test_window_and_an_empty_learner_cache_leave_the_results_unchanged(tmp_path):
    """Same seed -> the same readout, bit for bit, whether each node's learner is kept
    between rounds or rebuilt for every message, and whether messages go all at once
    or two at a time."""
    fqi._NODE_LEARNERS.resize(0)
    reference = _run(tmp_path, "ref")
    fqi._NODE_LEARNERS.builds = fqi._NODE_LEARNERS.hits = 0
    rebuilt = _run(tmp_path, "rebuilt", learner_cache_mib=0)
    assert fqi._NODE_LEARNERS.entries == {} and fqi._NODE_LEARNERS.hits == 0
    assert fqi._NODE_LEARNERS.builds == 3 * 3  # every message built its learner
    windowed = _run(tmp_path, "windowed", grid_wrap=lambda g: WindowedGrid(g, window=2))
    np.testing.assert_array_equal(rebuilt, reference)
    np.testing.assert_array_equal(windowed, reference)
    fqi._NODE_LEARNERS.builds = fqi._NODE_LEARNERS.hits = 0
    _run(tmp_path, "cached")
    assert (fqi._NODE_LEARNERS.builds, fqi._NODE_LEARNERS.hits) == (3, 3 * 2)


def test_bounded_cache_admits_while_it_fits_and_drops_other_generations():
    cache: BoundedCache[np.ndarray] = BoundedCache(budget=2 * 800)
    built: list[str] = []

    def build(name: str):
        return lambda: built.append(name) or np.zeros(100)  # 800 bytes

    for _ in range(3):  # round-robin over 3 keys, room for 2: the first two stay
        for key in ("a", "b", "c"):
            cache.get(key, build(key))
    assert built == ["a", "b", "c", "c", "c"] and set(cache.entries) == {"a", "b"}
    assert cache.hits == 4 and cache.used == 1600
    cache.get("a", build("a"), generation="run 2")  # another run: all dropped, "a" rebuilt
    cache.get("d", build("d"), generation="run 2")
    assert set(cache.entries) == {"a", "d"} and built[-2:] == ["a", "d"]
    cache.get("a", build("a"), generation="run 2")
    assert cache.hits == 5 and cache.used == 1600
    cache.resize(800)
    assert set(cache.entries) == {"a"} and cache.used == 800


def test_array_bytes_counts_each_buffer_once():
    a = np.zeros((10, 10))
    obj = SimpleNamespace(x=a, view=a[2:], rows=[a[:3], np.ones(5)], d={"k": (a,)})
    assert array_bytes(obj) == a.nbytes + 5 * 8


def test_blas_threads_follow_the_cpus_ray_gave_the_process(monkeypatch):
    from threadpoolctl import threadpool_limits

    monkeypatch.setattr(threads, "_LIMITER", {})
    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: True  # type: ignore[attr-defined]
    fake.get_runtime_context = lambda: SimpleNamespace(  # type: ignore[attr-defined]
        get_assigned_resources=lambda: {"CPU": 1.0})
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert threads.ray_cpus() == 1
    with threadpool_limits(limits=2, user_api="blas"):  # as a host with 2+ cores starts
        if threads.blas_threads() < 2:
            pytest.skip("this BLAS cannot run 2 threads here")
        try:
            assert threads.limit_client_threads() == 1 == threads.blas_threads()
            assert threads.limit_client_threads() == 1  # once per process
        finally:
            threads._LIMITER["limits"].restore_original_limits()


def test_outside_ray_the_client_leaves_blas_alone(monkeypatch):
    monkeypatch.setattr(threads, "_LIMITER", {})
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    before = threads.blas_threads()
    assert threads.limit_client_threads() == before and "limits" not in threads._LIMITER


def test_bench_scale_suite_without_ray(tmp_path, capsys):
    out = tmp_path / "scale"
    assert cli_main(["bench", "--suite", "scale", "--no-flwr", "--clients", "2", "--rounds",
                     "2", "--set", "hd-dim=32", "--set", "episodes-per-client=2",
                     "--transitions", "600", "--dim", "64", "--out", str(out)]) == 0
    summary = json.loads((out / "scale.json").read_text())
    assert "flwr-run" not in summary
    rounds = summary["in-process"]
    assert rounds["clients"] == 2 and len(rounds["round-s"]) == 2
    assert rounds["peak-rss-gib"] > 0.05 and rounds["replies-ok"] == [2, 2]
    assert 0.5 < rounds["cpu-s"] < 1000  # the child's CPU time (imports alone take > 1 s)
    assert summary["streaming"]["transitions"] == 600
    assert summary["exact"]["dim"] == 32 and summary["exact"]["relative-error"] < 1e-8
    assert summary["exact"]["run-status"] == "completed"  # FedQHDExact counts its replies
    assert 0 < summary["blas"]["gram-syrk-fraction"] and summary["blas"]["dim"] == 64
    printed = capsys.readouterr().out
    assert "FedQHDExact vs centralised ridge FQI" in printed and "scale.json" in printed


def test_a_rebuilt_learner_reuses_its_loaded_shard(tmp_path, monkeypatch):
    """Learners beyond the budget are rebuilt per message from the shard kept in memory
    (loaded and validated once per node and process), with the same results; the shared
    encoder is built once per process."""
    loads: list[int] = []
    real = fqi.client_shard

    def counting(*args, **kwargs):
        loads.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(fqi, "client_shard", counting)
    fqi._NODE_LEARNERS.resize(0)
    fqi._NODE_LEARNERS.builds = 0
    # D = 2000, 2 episodes: a learner is about 0.8 MB, so 1 MiB keeps one of the 3
    reference = _run(tmp_path, "ref", hd_dim=2000, learner_cache_mib=1024)
    assert sorted(loads) == [0, 1, 2] and fqi._NODE_LEARNERS.builds == 3
    loads.clear()
    fqi._NODE_LEARNERS.builds = 0
    small = _run(tmp_path, "small", hd_dim=2000, learner_cache_mib=1)
    assert len(fqi._NODE_LEARNERS.entries) == 1 and fqi._NODE_LEARNERS.builds == 1 + 2 * 3
    assert sorted(loads) == [0, 1, 2]  # every node's shard read once in 3 rounds
    np.testing.assert_array_equal(small, reference)
    cfg = RunConfig()
    assert fqi.shared_encoder(cfg) is fqi.shared_encoder(cfg.replace(num_server_rounds=9))


def test_float32_features_halve_a_learner_and_move_the_readout_little(tmp_path):
    """feature-dtype = float32: a node's cached learner takes about half the bytes, and
    the federation's final readout moves by a small relative amount (the bound stated in
    README and BENCHMARKS.md for these settings)."""
    fqi._NODE_LEARNERS.resize(0)
    reference = _run(tmp_path, "f64", hd_dim=500)
    wide = sum(size for _, size in fqi._NODE_LEARNERS.entries.values())
    narrow_readout = _run(tmp_path, "f32", hd_dim=500, feature_dtype="float32")
    narrow = sum(size for _, size in fqi._NODE_LEARNERS.entries.values())
    (learner, _), _ = next(iter(fqi._NODE_LEARNERS.entries.values()))
    assert learner.fqi._table.dtype == np.float32
    assert 0.45 < narrow / wide < 0.6
    moved = np.linalg.norm(narrow_readout - reference) / np.linalg.norm(reference)
    print("relative readout difference", moved)
    assert 0 < moved < 1e-5


def test_the_node_index_hands_the_engine_the_messages_flowers_scan_does(monkeypatch):
    """The engine's poll (get_message_ins per node, limit 1) picks the same messages in
    the same order, marks them delivered, and drops expired ones, with or without the
    per-node index; pushes after a poll and deleted messages are seen the same way."""
    import time

    from flwr.app import Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 7), ("_node_id", 1), ("_task_id", 1)):  # 1: SuperLink
        monkeypatch.setattr(TaskIdentity, name, value)  # Messages need the ServerApp's
    picked = {}
    for indexed in (False, True):
        state, grid, nodes = simulation_state(6, indexed)
        if indexed:
            assert index_messages(state)  # idempotent: installed once
        log = []

        def push(dsts, ttl=None, grid=grid, nodes=nodes):
            msgs = [Message(RecordDict({"m": MetricRecord({"k": k})}), nodes[d], "train",
                            ttl=ttl) for d, k in dsts]
            return list(grid.push_messages(msgs))

        def poll(state=state, nodes=nodes, log=log):
            for node in nodes:  # as add_messages_to_queue does, every 0.1 s
                for msg in state.get_message_ins(node_id=node, limit=1):
                    assert msg.metadata.delivered_at != ""
                    log.append((nodes.index(node), msg.content["m"]["k"]))

        ids = push([(0, 0), (3, 1), (3, 2), (5, 3)])
        push([(1, 4)], ttl=0.05)  # expires before the poll
        time.sleep(0.1)
        poll()
        poll()  # node 3's second message
        state.delete_messages(set(ids[:2]))  # replies pulled
        push([(0, 5), (2, 6)])
        poll()
        poll()  # nothing left undelivered
        assert not any(m.content["m"]["k"] == 4 for m in state.message_ins_store.values())
        picked[indexed] = log
    assert picked[False] == [(0, 0), (3, 1), (5, 3), (3, 2), (0, 5), (2, 6)]
    assert picked[True] == picked[False]


def test_a_measured_tree_above_its_memory_limit_is_killed_process_by_process():
    """The 10,000-client run's guard: a grandchild holding the memory (not the root's
    process group) is killed, as is the root; the peak and the excess are recorded."""
    import subprocess
    import time

    from fedqhd.studies.scale import PeakMemory

    hog = "import numpy as np, time; x = np.ones(40_000_000); time.sleep(60)"
    root = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
            "start_new_session=True); print(p.pid, flush=True); p.wait()")
    with PeakMemory(interval=0.05, limit=200 << 20) as mem:
        proc = subprocess.Popen([sys.executable, "-c", root, hog], stdout=subprocess.PIPE,
                                text=True)
        mem.pids = [proc.pid]
        start = time.monotonic()
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        proc.wait(timeout=30)
    try:
        assert time.monotonic() - start < 20 and proc.returncode == -9
        assert mem.exceeded > 200 << 20 and mem.peak >= mem.exceeded
        time.sleep(0.5)
        state = Path(f"/proc/{grandchild}/stat")
        assert not state.exists() or state.read_text().split(")")[1].split()[0] == "Z"
    finally:
        try:  # never leave the hog behind, whatever failed
            os.kill(grandchild, signal.SIGKILL)
        except OSError:
            pass


def test_a_client_process_parses_a_run_config_once(monkeypatch):
    from flwr.app import Context, RecordDict

    from fedqhd.client import app as client_module

    calls: list[int] = []
    real = RunConfig.from_run_config
    monkeypatch.setattr(RunConfig, "from_run_config",
                        classmethod(lambda cls, rc: calls.append(1) or real(rc)))
    client_module._parse.cache_clear()
    rc = {"seed": 5, "hd-dim": 64}
    contexts = [Context(run_id=1, node_id=i, node_config={}, state=RecordDict(),
                        run_config=dict(rc)) for i in range(3)]
    cfgs = [client_module.run_config(c) for c in contexts * 2]
    assert len(calls) == 1 and all(c is cfgs[0] for c in cfgs) and cfgs[0].seed == 5
    assert client_module.run_config(Context(run_id=1, node_id=0, node_config={},
                                            state=RecordDict(), run_config={"seed": 6})).seed == 6


def _renamed(code: str, name: str) -> list[str]:
    """A command running ``code`` in a Python whose argv[0] (what /proc shows) is ``name``,
    as Ray names its workers ``ray::ClientAppActor.run``."""
    return ["bash", "-c", f'exec -a "{name}" {sys.executable} -c "$0"', code]


BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass"


def test_cpu_seconds_and_timeline_are_kept_per_process_name():
    """``flwr_run`` reports where the CPU went by process name (a Ray worker's method
    suffix dropped) and when each process appeared."""
    import subprocess

    from fedqhd.studies.scale import PeakMemory

    with PeakMemory(interval=0.05) as mem:
        proc = subprocess.Popen(_renamed(BUSY.format(s=0.6), "ray::Busy.run"))
        mem.pids = [proc.pid]
        proc.wait(timeout=30)
    assert mem.cpu_by_name().get("ray::Busy", 0.0) >= 0.3
    assert [name for _, pid, name in mem.timeline if pid == proc.pid] == ["ray::Busy"]


def test_log_lines_are_timed_and_milestones_found():
    import subprocess
    import time

    from fedqhd.studies.scale import _milestones, timed_lines

    code = "import time; print('[ROUND 1/3]', flush=True); time.sleep(0.5); print('[ROUND 2/3]')"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    lines = timed_lines(proc, t0, timeout=30)
    marks = _milestones(lines)
    assert [line for _, line in lines] == ["[ROUND 1/3]\n", "[ROUND 2/3]\n"]
    assert marks["round 2"] - marks["round 1"] >= 0.4 and marks["end"] == marks["round 2"]
    assert "round 1 train replies" not in marks


def test_the_profile_samples_ray_workers_that_exec_from_a_setup_process(tmp_path):
    """py-spy's ``--subprocesses`` loses Ray's actors (they exec from setup_worker.py):
    each ``ray::`` process gets its own py-spy, merged under its own root frame."""
    import shutil
    import subprocess

    from fedqhd.studies.scale import BIN, _Profiler

    if not (BIN / "py-spy").exists() and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    child = json.dumps(_renamed(BUSY.format(s=2.0), "ray::Busy.run"))
    root = subprocess.Popen([sys.executable, "-c", "import json, subprocess, sys, time; "
                             "time.sleep(0.3); subprocess.run(json.loads(sys.argv[1]))", child])
    out = tmp_path / "profile.txt"
    spy = _Profiler(root.pid, out)
    root.wait(timeout=60)
    spy.stop()
    roots = {line.split(";")[0] for line in out.read_text().splitlines()} if out.exists() else set()
    if not roots:
        pytest.skip("py-spy could not attach here (ptrace not permitted)")
    assert any(r.endswith(':"ray::Busy"') for r in roots), roots
    assert not list(tmp_path.glob("profile.txt.*"))  # per-actor files merged and removed

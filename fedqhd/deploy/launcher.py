"""The docker-compose deployment as local processes on loopback.

Starts what ``docker-compose.yml`` starts, with the same flags, certificates and
keys: a SuperLink (TLS, SuperNode authentication), a SuperExec for the ServerApp,
and N SuperNodes, each with its own SuperExec (``--isolation process``) and its own
shard folder. Every process runs in its own process group and is stopped by that
group's id, also on failure and on Ctrl-C: nothing is ever killed by name, and
nothing outlives :meth:`LocalDeployment.stop`.

Every process is watched: when one that should be running exits, the deployment
raises :class:`ServiceDied` naming it, with its exit code and the end of its log
(the caller's ``with`` block then stops the rest), instead of waiting for a run that
can no longer finish. Children find Flower's executables next to the running
interpreter, so a virtual environment works without being activated.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedqhd.deploy.certs import make_credentials
from fedqhd.files import atomic_write
from fedqhd.node_config import NodeSettings, node_config_arg

#: connection name written to the private ``$FLWR_HOME/config.toml``
CONNECTION = "fedqhd-local"

#: the environment every Flower process gets: no per-run ``uv sync``, no update checks
BASE_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}


class DeploymentError(RuntimeError):
    """A service did not come up, a command failed, or a run did not finish."""


class ServiceDied(DeploymentError):
    """A process of the deployment exited while it should have been running."""

    def __init__(self, service: Service) -> None:
        code = None if service.proc is None else service.proc.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 \
            else f"exited with code {code}"
        super().__init__(f"{service.name} (pid {service.pgid}) {how}; stopping the other "
                         f"processes. The end of {service.log_path}:\n{service.log_tail()}")
        self.service = service


def child_path(path: str | None = None) -> str:
    """``PATH`` for child processes: this interpreter's ``bin/`` first, so that
    ``flower-superexec`` finds ``flwr-serverapp``/``flwr-clientapp`` (and ``flwr run``
    its helpers) in an environment that was never activated."""
    here = str(Path(sys.executable).parent)
    rest = [p for p in (path if path is not None else os.defpath).split(os.pathsep)
            if p and p != here]
    return os.pathsep.join([here, *rest])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_app_dir(start: Path | None = None) -> Path:
    """The Flower app folder (a ``pyproject.toml`` with ``[tool.flwr.app]``): this
    checkout's root, else the current folder or one above it."""
    candidates = [Path(__file__).resolve().parents[2]]
    here = (start or Path.cwd()).resolve()
    candidates += [here, *here.parents]
    for folder in candidates:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "[tool.flwr.app]" in pyproject.read_text():
            return folder
    raise DeploymentError("no Flower app found: pass the folder holding pyproject.toml")


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (works without activating it)."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise DeploymentError(f"{name} not found next to {sys.executable} or on PATH")
    return found


@dataclass
class Service:
    """One started process (and its process group, which its children inherit)."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)
    #: whether its exit is a failure of the deployment (False: one-shot commands,
    #: processes expected to be refused, ones stopped on purpose)
    watched: bool = True

    @property
    def pgid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def stop_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM a process group, then SIGKILL what is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            with contextlib.suppress(ChildProcessError):  # reap the leader if it is ours
                os.waitpid(pgid, os.WNOHANG)
            time.sleep(0.05)


class LocalDeployment:
    """SuperLink + SuperExecs + N SuperNodes on loopback, as ``docker-compose.yml``.

    Use as a context manager (or call :meth:`start` and, in a ``finally``,
    :meth:`stop`)::

        with LocalDeployment(workdir, shards_dir=shards) as dep:
            results = dep.run({"num-server-rounds": 2})

    Parameters
    ----------
    workdir : path
        Everything goes here: credentials, per-node shard folders, logs, the
        SuperLink state, a private ``FLWR_HOME`` and (by default) results.
    num_supernodes : int
        SuperNode ``i`` (1-based) gets partition ``i - 1`` of ``num_supernodes``.
    shards_dir : path or None
        A folder of ``shard-<i>.npz`` (``fedqhd data generate``); each SuperNode gets
        a copy of its own shard only, in ``workdir/node-data/supernode-<i>``. None:
        every client generates its shard (node config without ``data-dir``).
    tls, auth : bool
        TLS on the SuperLink (private CA) and SuperNode authentication with
        registered keys; both on by default, as in the compose file.
    server_env : mapping
        Extra environment for the SuperLink and the ServerApp's SuperExec (and so
        the ServerApp), e.g. ``PYTHONPATH`` for an audit hook.
    privacy : NodeSettings or None
        Every SuperNode's privacy keys (``noise``, ``rho-budget``, ``rho``,
        ``reproducible-noise``), written out in full in its ``--node-config``; None:
        the safe defaults (OpenDP noise, budget 10, at most rho 1 a release, no seeds).
    """

    def __init__(self, workdir: str | os.PathLike[str], num_supernodes: int = 3,
                 shards_dir: str | os.PathLike[str] | None = None,
                 app_dir: str | os.PathLike[str] | None = None, tls: bool = True,
                 auth: bool = True, server_env: Mapping[str, str] | None = None,
                 startup_timeout_s: float = 60.0, privacy: NodeSettings | None = None) -> None:
        if num_supernodes < 1:
            raise ValueError("num_supernodes must be >= 1")
        self.workdir = Path(workdir).resolve()
        self.num_supernodes = num_supernodes
        self.shards_dir = Path(shards_dir).resolve() if shards_dir else None
        self.app_dir = Path(app_dir).resolve() if app_dir else find_app_dir()
        self.tls, self.auth = tls, auth
        self.server_env = dict(server_env or {})
        self.startup_timeout_s = startup_timeout_s
        self.privacy = privacy or NodeSettings()
        self.creds = self.workdir / "credentials"
        self.logs = self.workdir / "logs"
        self.flwr_home = self.workdir / "flwr-home"
        self.output_dir = self.workdir / "outputs"
        self.superlink_port = 0
        self.supernode_ports: dict[int, int] = {}
        self.services: dict[str, Service] = {}
        self._run_started = 0.0

    # ---- life cycle -------------------------------------------------------

    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Credentials, shard folders, SuperLink, key registration, SuperExecs,
        SuperNodes; returns once every SuperNode is online."""
        atexit.register(self.stop)  # also when the caller forgets (not on SIGKILL)
        for folder in (self.logs, self.flwr_home, self.output_dir):
            folder.mkdir(parents=True, exist_ok=True)
        make_credentials(self.creds, self.num_supernodes)
        self._prepare_node_data()
        self.superlink_port = free_port()
        self.supernode_ports = {i: free_port() for i in self.node_ids}
        self.write_flwr_config()
        self.start_superlink()
        if self.auth:
            for i in self.node_ids:
                self.register(self.creds / "public" / f"supernode-{i}.pub")
        self.start_server_superexec()
        for i in self.node_ids:
            self.start_supernode(i)
        self.wait_nodes_online(self.num_supernodes)

    def stop(self) -> None:
        """Stop every process group this deployment started (reverse start order)."""
        atexit.unregister(self.stop)
        for service in reversed(list(self.services.values())):
            self._stop_service(service)

    @property
    def node_ids(self) -> range:
        return range(1, self.num_supernodes + 1)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.superlink_port}"

    # ---- processes --------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of every child: ours without ``FLWR_*``, Flower's settings,
        the private ``FLWR_HOME``, and this interpreter's ``bin/`` first on ``PATH``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
        env.update(BASE_ENV)
        env["FLWR_HOME"] = str(self.flwr_home)
        env.update(extra or {})
        env["PATH"] = child_path(env.get("PATH"))
        return env

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None, watch: bool = True) -> Service:
        """Start ``argv`` in a new session (own process group), logging to ``logs/``;
        ``watch``: its exit fails the deployment (see :meth:`check_alive`)."""
        if name in self.services and self.services[name].alive():
            raise DeploymentError(f"{name} is already running")
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in _stop_service
        log_file.write(f"\n$ {' '.join(argv)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=subprocess.STDOUT, env=self.env(env),
                                cwd=str(cwd or self.workdir), start_new_session=True)
        atomic_write(self.logs / f"{name}.pgid", str(proc.pid))  # for operators and tests
        service = Service(name, argv, log_path, proc, log_file, watched=watch)
        self.services[name] = service
        return service

    def check_alive(self) -> None:
        """Raise :class:`ServiceDied` for the first watched process that has exited."""
        for service in self.services.values():
            if service.watched and service.proc is not None and \
                    service.proc.poll() is not None:
                raise ServiceDied(service)

    def _stop_service(self, service: Service, sig: signal.Signals | None = None) -> None:
        service.watched = False  # stopped on purpose
        if service.proc is not None:
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(service.proc.pid, sig)
            stop_group(service.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.proc.wait(timeout=5)
        if service.log_file is not None and not service.log_file.closed:
            service.log_file.close()

    def _tls_args(self, ca: Path, flag: str = "--root-certificates") -> list[str]:
        return [flag, str(ca)] if self.tls else ["--insecure"]

    def start_superlink(self) -> Service:
        sl = self.creds / "superlink"
        argv = [_bin("flower-superlink"), "--isolation", "process",
                 "--host", "127.0.0.1", "--port", str(self.superlink_port),
                 "--database", str(self.workdir / "state.db"),
                 "--superexec-auth-secret-file", str(sl / "superexec.secret"),
                 "--disable-runtime-dependency-installation"]
        if self.tls:
            argv += ["--ssl-ca-certfile", str(sl / "ca.crt"), "--ssl-certfile",
                     str(sl / "server.pem"), "--ssl-keyfile", str(sl / "server.key")]
        else:
            argv += ["--insecure"]
        if self.auth:
            argv += ["--enable-supernode-auth"]
        service = self.spawn("superlink", argv, self.server_env)
        self.wait_healthy(service)
        return service

    def start_server_superexec(self) -> Service:
        sl = self.creds / "superexec-serverapp"
        argv = [_bin("flower-superexec"), "--runtime-api-address", self.address,
                *self._tls_args(sl / "ca.crt"),
                "--superexec-auth-secret-file", str(sl / "superexec.secret")]
        return self.spawn("superexec-serverapp", argv, self.server_env,
                          cwd=self.workdir / "serverapp")

    def supernode_argv(self, i: int, key: Path | None = None) -> list[str]:
        """SuperNode ``i``'s command line (``key``: another private key, for tests)."""
        node = self.creds / f"supernode-{i}"
        node_config = f"partition-id={i - 1} num-partitions={self.num_supernodes}"
        if self.shards_dir is not None:
            node_config += f' data-dir="{self.node_data(i)}"'
        node_config += " " + node_config_arg(self.privacy.privacy())
        argv = [_bin("flower-supernode"), "--superlink", self.address,
                *self._tls_args(node / "ca.crt"),
                "--isolation", "process", "--host", "127.0.0.1",
                "--port", str(self.supernode_ports[i]), "--node-config", node_config,
                "--superexec-auth-secret-file", str(node / "superexec.secret"),
                "--max-retries", "3"]
        if self.auth:
            argv += ["--auth-supernode-private-key", str(key or node / "supernode.key")]
        return argv

    def start_supernode(self, i: int) -> tuple[Service, Service]:
        """SuperNode ``i`` and its ClientApp SuperExec (running in its shard folder)."""
        node = self.creds / f"supernode-{i}"
        supernode = self.spawn(f"supernode-{i}", self.supernode_argv(i))
        superexec = self.spawn(
            f"superexec-clientapp-{i}",
            [_bin("flower-superexec"), "--runtime-api-address",
             f"127.0.0.1:{self.supernode_ports[i]}", "--insecure",
             "--superexec-auth-secret-file", str(node / "superexec.secret")],
            cwd=self.node_data(i) if self.shards_dir is not None else self.workdir)
        return supernode, superexec

    def kill_supernode(self, i: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Crash SuperNode ``i`` (and its SuperExec and running ClientApp): ``sig`` to
        both process groups, as a machine that dies would."""
        for name in (f"supernode-{i}", f"superexec-clientapp-{i}"):
            self._stop_service(self.services[name], sig)

    # ---- files ------------------------------------------------------------

    def node_data(self, i: int) -> Path:
        return self.workdir / "node-data" / f"supernode-{i}"

    def _prepare_node_data(self) -> None:
        (self.workdir / "serverapp").mkdir(parents=True, exist_ok=True)
        if self.shards_dir is None:
            return
        made_for = shard_partitions(self.shards_dir)
        if made_for is not None and made_for != self.num_supernodes:
            raise DeploymentError(
                f"{self.shards_dir} holds shards for {made_for} partitions, but the "
                f"deployment has {self.num_supernodes} SuperNodes: a client's data depend on "
                f"num-partitions, so use -n {made_for}, or regenerate with `fedqhd data "
                f"generate --num-partitions {self.num_supernodes} --out <another folder>`")
        for i in self.node_ids:
            name = f"shard-{i - 1}.npz"
            src = self.shards_dir / name
            if not src.is_file():
                raise DeploymentError(f"{src} missing: run `fedqhd data generate "
                                      f"--num-partitions {self.num_supernodes} --out ...`")
            self.node_data(i).mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, self.node_data(i) / name)

    def write_flwr_config(self) -> Path:
        """The private ``$FLWR_HOME/config.toml`` with one connection to this SuperLink."""
        lines = ["[superlink]", f'default = "{CONNECTION}"', "",
                 f"[superlink.{CONNECTION}]", f'address = "{self.address}"']
        if self.tls:
            lines.append(f'root-certificates = "{self.creds / "ca" / "ca.crt"}"')
        else:
            lines.append("insecure = true")
        path = self.flwr_home / "config.toml"
        atomic_write(path, "\n".join(lines) + "\n")
        return path

    # ---- readiness --------------------------------------------------------

    def wait_healthy(self, service: Service) -> None:
        """Wait until the SuperLink answers ``GET /health`` (over TLS, verified)."""
        import httpx

        scheme = "https" if self.tls else "http"
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(self.creds / "ca" / "ca.crt"))
            if self.tls else False)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if not service.alive():
                raise DeploymentError(f"{service.name} exited:\n{service.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                url = f"{scheme}://{self.address}/health"
                if httpx.get(url, verify=verify, timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise DeploymentError(f"{service.name} not healthy after {self.startup_timeout_s}s:\n"
                              f"{service.log_tail()}")

    def flwr(self, *args: str, timeout_s: float = 60.0, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        """Run a ``flwr`` CLI command against this SuperLink (private ``FLWR_HOME``),
        in its own process group so that a timeout stops all of it."""
        proc = subprocess.Popen([_bin("flwr"), *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env({"COLUMNS": "200"}), cwd=str(self.workdir),
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            stop_group(proc.pid)
            proc.communicate()
            raise
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and done.returncode != 0:
            raise DeploymentError(f"flwr {' '.join(args)} failed ({done.returncode}):\n"
                                  f"{out[-3000:]}\n{err[-3000:]}")
        return done

    def register(self, public_key: Path) -> None:
        """``flwr supernode register``: allow the SuperNode holding this key to join."""
        self.flwr("supernode", "register", str(public_key), CONNECTION)

    def list_nodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list --format json``: the SuperLink's view of the nodes."""
        out = self.flwr("supernode", "list", CONNECTION, "--format", "json").stdout
        payload = json.loads(out[out.index("{"):])
        return list(payload.get("nodes", []))

    def online_nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.list_nodes() if str(n.get("status", "")).lower() == "online"]

    def wait_nodes_online(self, count: int, timeout_s: float | None = None) -> None:
        """Wait until at least ``count`` SuperNodes are online at the SuperLink."""
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        while time.monotonic() < deadline:
            self.check_alive()
            if len(self.online_nodes()) >= count:
                return
            time.sleep(0.5)
        raise DeploymentError(f"fewer than {count} SuperNodes online after the timeout: "
                              f"{self.list_nodes()}")

    # ---- runs -------------------------------------------------------------

    def run_command(self, run_config: Mapping[str, Any] | None = None) -> list[str]:
        cfg = {"output-dir": str(self.output_dir), **(run_config or {})}
        overrides = " ".join(f"{k}={_toml_value(v)}" for k, v in cfg.items())
        return [_bin("flwr"), "run", str(self.app_dir), CONNECTION, "--stream",
                "--run-config", overrides]

    def submit(self, run_config: Mapping[str, Any] | None = None) -> Service:
        """Start ``flwr run --stream`` in the background (see :meth:`wait_run`)."""
        self._run_started = time.time()
        return self.spawn("flwr-run", self.run_command(run_config), cwd=self.app_dir,
                          watch=False)

    def wait_run(self, service: Service, timeout_s: float = 600.0,
                 on_round: Callable[[dict[str, Any]], None] | None = None,
                 poll_s: float = 1.0) -> Path:
        """Wait for ``flwr run`` to end; returns the new ``results.json``.

        Every ``poll_s`` it checks that all watched processes still run (else
        :class:`ServiceDied`) and calls ``on_round`` with each round row that
        ``results.json`` gained since the last look."""
        assert service.proc is not None
        report: Callable[[dict[str, Any]], None] = on_round or (lambda row: None)
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            try:
                service.proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            rows = self.current_rounds()
            for row in rows[seen:]:
                report(row)
            seen = max(seen, len(rows))
            try:
                self.check_alive()
            except ServiceDied:
                self._stop_service(service)
                raise
            if time.monotonic() > deadline:
                self._stop_service(service)
                raise DeploymentError(f"flwr run did not finish in {timeout_s}s:\n"
                                      f"{service.log_tail()}")
        for row in self.current_rounds()[seen:]:
            report(row)
        if service.proc.returncode != 0:
            raise DeploymentError(f"flwr run failed ({service.proc.returncode}):\n"
                                  f"{service.log_tail()}\n{self.run_status(service)}")
        results = self.latest_results()
        if results is None or "final" not in json.loads(results.read_text()):
            raise DeploymentError(f"flwr run ended without a final results.json:\n"
                                  f"{service.log_tail()}\n{self.run_status(service)}")
        return results

    def run_status(self, service: Service) -> str:
        """Why a run may have ended without results: the SuperLink's record of the run
        ``service`` (``flwr run``) started (``flwr ls --run-id``: its status and sub-status,
        e.g. ``finished:failed`` and why) and the last lines of the ServerApp's SuperExec:
        ``flwr run --stream`` may show nothing of a ServerApp that fails as it starts."""
        match = re.search(r"Successfully started run (\d+)", service.log_tail(1_000_000))
        if match is None:
            return "(flwr run started no run)"
        try:  # the error being reported must not turn into this one's
            done = self.flwr("ls", CONNECTION, "--run-id", match.group(1), "--format", "json",
                             timeout_s=30.0, check=False)
            said = (done.stdout.strip() or done.stderr.strip())[-1500:]
        except (subprocess.TimeoutExpired, OSError) as exc:
            said = f"(no answer: {exc})"
        lines = [f"$ flwr ls --run-id {match.group(1)}: {said}"]
        superexec = self.services.get("superexec-serverapp")
        if superexec is not None:
            lines.append(f"superexec-serverapp log:\n{superexec.log_tail(1500)}")
        return "\n".join(lines)

    def run(self, run_config: Mapping[str, Any] | None = None,
            timeout_s: float = 600.0) -> Path:
        """``flwr run`` against this deployment; returns its ``results.json``."""
        return self.wait_run(self.submit(run_config), timeout_s)

    def current_rounds(self) -> list[dict[str, Any]]:
        """The round rows of the current run so far (``rounds.jsonl`` while it runs,
        ``results.json`` once it has ended; none yet: [])."""
        from fedqhd.server.results import read_rounds

        run_dir = self.latest_run_dir()
        if run_dir is None:
            results = self.latest_results()
            run_dir = results.parent if results is not None else None
        if run_dir is None:
            return []
        try:
            return read_rounds(run_dir)
        except (OSError, ValueError, KeyError):  # replaced while we read it: next time
            return []

    def latest_run_dir(self) -> Path | None:
        """The newest run folder created since the last :meth:`submit` (read its rounds so
        far with :func:`fedqhd.server.results.read_rounds`)."""
        since = self._run_started - 1.0
        found = [p.parent for p in self.output_dir.glob("*/*/run_config.json")
                 if p.stat().st_mtime >= since]
        return max(found, key=lambda p: (p / "run_config.json").stat().st_mtime) if found else None

    def latest_results(self) -> Path | None:
        """The newest ``results.json`` written since the last :meth:`submit`."""
        since = self._run_started - 1.0
        found = [p for p in self.output_dir.glob("*/*/results.json")
                 if p.stat().st_mtime >= since]
        return max(found, key=lambda p: p.stat().st_mtime) if found else None


def shard_partitions(folder: Path) -> int | None:
    """How many partitions the shards in ``folder`` were made for: ``manifest.json``'s
    ``num_partitions`` (``fedqhd data generate``/``import``), else the number of
    ``shard-<i>.npz`` files; None for a folder without either."""
    manifest = folder / "manifest.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads(manifest.read_text())["settings"]["num_partitions"])
    count = len(list(folder.glob("shard-*.npz")))
    return count or None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt, so ``finally`` blocks (and so
    :meth:`LocalDeployment.stop`) run when the launcher itself is told to stop.

    SIGINT is set explicitly too: a process started in the background of a
    non-interactive shell inherits SIGINT as ignored, and Python then keeps it
    ignored, so Ctrl-C (or a test's SIGINT) would never reach us."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

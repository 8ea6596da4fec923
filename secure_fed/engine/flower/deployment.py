"""A Flower deployment on this machine over TLS: one SuperLink, N SuperNodes, ``flwr run``, faults, then shut down.

:class:`LocalDeployment` is what ``secure-fed flower local`` and the deployment tests run; it does, in processes
on 127.0.0.1, the steps the README's multi-machine section does by hand:

1. certificates (:func:`~secure_fed.engine.flower.certificates.generate_certificates`) for 127.0.0.1 and
   localhost;
2. ``flower-superlink`` (through :mod:`~secure_fed.engine.flower.superlink_launcher`, which sets a 120 s SQLite busy
   timeout) with ``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile`` (Flower 1.42 serves its Fleet,
   Control and runtime APIs over HTTPS on one port), its state in a database file (``--database``, so that a
   restarted SuperLink keeps its registered nodes), ``--enable-supernode-auth``, no runtime installation of the
   app's dependencies;
3. a key pair per SuperNode (in the node's own folder ``nodes/i/auth``), each public key registered with the
   SuperLink (:mod:`~secure_fed.engine.flower.node_auth`); an unregistered node is refused;
4. N ``flower-supernode --root-certificates ca.crt --auth-supernode-private-key KEY --isolation process
   --node-config "partition-id=i num-partitions=N state-dir=nodes/i"`` (one partition each), each with its own
   long-lived ClientApp process (:mod:`~secure_fed.engine.flower.clientapp_worker`; process isolation), waiting
   until the SuperLink has activated all of them;
5. a SuperLink connection with ``root-certificates`` in a private ``$FLWR_HOME/config.toml``, and
   ``flwr run experiments/flower-app CONNECTION --run-config ... --stream``;
6. on exit, every process it started and every process those started (the SuperLink's ``flwr-serverapp``, each
   node's ``flwr-clientapp`` processes) is stopped: they all carry a marker in their environment, so none is left
   behind even when Flower detaches its children. A second marker names the part a process belongs to (the
   SuperLink or node i), which is what :meth:`LocalDeployment.kill_node` and :meth:`LocalDeployment.kill_superlink`
   kill with ``SIGKILL``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from secure_fed.engine.flower.certificates import generate_certificates
from secure_fed.engine.flower.clientapp_worker import spawn
from secure_fed.engine.flower.link_proxy import LinkProxy, LinkShape
from secure_fed.engine.flower.node_auth import end_stale_session, register_nodes, write_node_key
from secure_fed.engine.flower.process_marks import MARKER, NODE_STATE, PART, marked_processes, processes_by
from secure_fed.errors import SecureFedError

#: how each node runs its ClientApps with process isolation (see :class:`LocalDeployment`)
CLIENTAPPS = ("zygote", "worker", "superexec")
CONNECTION = "secure-fed-local"
APP_DIR = Path(__file__).resolve().parents[3] / "experiments" / "flower-app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_string(value: str, what: str) -> str:
    if "'" in value or "\n" in value:
        raise SecureFedError(f"{what} {value!r}: a run-config value cannot hold a single quote or a line break")
    return f"'{value}'"


def round_seconds(run_dir: str | Path) -> list[float]:
    """Each round's wall time in seconds, from the run's ``private/diagnostics.jsonl`` (its ``wall_seconds``, the
    training time so far, written after each round): the differences."""
    path = Path(run_dir) / "private" / "diagnostics.jsonl"
    if not path.is_file():
        return []
    walls = [float(d["wall_seconds"]) for line in path.read_text().splitlines() if "wall_seconds" in (d := json.loads(line))]
    if not walls:
        return []
    return [b - a for a, b in zip([0.0, *walls[:-1]], walls, strict=True)]


class LocalDeployment:
    """A TLS SuperLink and ``nodes`` SuperNodes on 127.0.0.1 (a context manager; :meth:`run` starts one run).

    ``workdir`` receives the certificates, the Flower home, the SuperLink's database, each process's log, and each
    node's own folder ``nodes/i/`` (its state directory: its clients' stored state, its authentication key pair).

    ``auth``: SuperNode authentication (each node's key registered with the SuperLink before it starts; an
    unregistered node is refused). ``isolation``: ``process`` (Flower's process isolation) runs each node's
    ClientApps in a process of its own beside the SuperNode, which does not start it: with ``clientapps="zygote"``
    (the default) one long-lived process per node runs every task (:mod:`~secure_fed.engine.flower.clientapp_worker`),
    forked from one process that imported the libraries (shared pages: less memory per node); ``"worker"`` starts
    each node's worker afresh (no shared pages); with ``"superexec"`` Flower's ``flower-superexec`` starts one
    ``flwr-clientapp`` process per task; ``subprocess`` lets the SuperNode start its own. ``link``: the SuperNodes
    reach the SuperLink through a shaping proxy (:mod:`~secure_fed.engine.flower.link_proxy`: delay, jitter, loss,
    resets), else directly. ``database``: the SuperLink keeps its state in ``workdir/superlink.db`` (SQLite), which
    :meth:`restart_superlink` needs; else in memory (no SQLite lock contention with many nodes).

    Fault injection: :meth:`kill_node`, :meth:`restart_node`, :meth:`kill_superlink`, :meth:`restart_superlink`,
    :meth:`node_pids`."""

    def __init__(self, workdir: str | Path, *, nodes: int, data_root: str | None = None, start_timeout_s: float = 120.0,
                 auth: bool = True, isolation: str = "process", clientapps: str = "zygote",
                 link: LinkShape | None = None, database: bool = True):  # fmt: skip
        if nodes < 1:
            raise SecureFedError(f"--nodes {nodes}: a deployment needs at least one SuperNode")
        if isolation not in ("process", "subprocess"):
            raise SecureFedError(f"isolation {isolation!r}: process or subprocess")
        if clientapps not in CLIENTAPPS:
            raise SecureFedError(f"clientapps {clientapps!r}: one of {', '.join(CLIENTAPPS)}")
        self.workdir = Path(workdir).resolve()
        self.nodes, self.data_root, self.start_timeout_s = nodes, data_root, start_timeout_s
        self.auth, self.isolation, self.clientapps = auth, isolation, clientapps
        self.link, self.database = link, database
        #: the shaping proxy the SuperNodes dial when ``link`` is given (started with the deployment)
        self.proxy: LinkProxy | None = None
        self.marker = uuid.uuid4().hex
        self.port = 0
        #: the Flower node id of each SuperNode (known once it has joined; with ``auth`` it is its key's, for good)
        self.node_ids: dict[int, int] = {}
        #: with ``auth``: the node id the SuperLink gave each node's registered key
        self.registered_ids: dict[int, int] = {}
        self._procs: dict[str, subprocess.Popen] = {}  # the processes the deployment means to be running, by name
        self._done: list[subprocess.Popen] = []  # those killed or stopped (their logs closed in stop())
        self._certs: dict[str, Path] = {}
        self._workers: dict[int, int] = {}  # node → its ClientApp worker forked by the zygote

    # ----------------------------------------------------------------- processes
    def _env(self, part: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env[MARKER] = self.marker
        if part is not None:  # which part of the deployment the process (and every process it starts) belongs to
            env[PART] = f"{self.marker}/{part}"
        env["FLWR_HOME"] = str(self.workdir / "flwr-home")
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        if self.data_root:
            env["SECURE_FED_DATA"] = str(Path(self.data_root).resolve())
        return env

    def _start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start ``cmd`` as ``name``; its output is appended to ``name.log`` (a restarted process continues it)."""
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process in stop()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        p.log = log  # type: ignore[attr-defined]
        p.log_offset = log.tell()  # type: ignore[attr-defined] - where this start's output begins
        self._procs[name] = p
        return p

    def _wait_for(self, what: str, test, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        while not test():
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise SecureFedError(f"the {name} process exited with {p.returncode} while {what}; see {p.log.name}")
            if time.monotonic() > deadline:
                raise SecureFedError(f"timed out after {self.start_timeout_s:.0f} s {what}; see the logs in {self.workdir}")
            time.sleep(0.2)

    @staticmethod
    def _output(p: subprocess.Popen) -> bytes:
        """What ``p`` has written to its log since it started."""
        with open(p.log.name, "rb") as f:  # type: ignore[attr-defined]
            f.seek(p.log_offset)  # type: ignore[attr-defined]
            return f.read()

    def node_dir(self, i: int) -> Path:
        """SuperNode i's own folder ``workdir/nodes/i``: its state directory (its clients' stored state, kept across
        runs and restarts, so ``--resume`` and a restarted node find it; ``SECURE_FED_NODE_STATE`` in its processes'
        environment) and its authentication key pair under ``auth/``."""
        return self.workdir / "nodes" / str(i)

    @property
    def fleet_address(self) -> str:
        """The address the SuperNodes dial (the SuperLink's, or the link-shaping proxy's in front of it)."""
        return self.proxy.address if self.proxy is not None else f"127.0.0.1:{self.port}"

    def _start_superlink(self) -> None:
        certs = self._certs
        # flower-superlink itself, through a launcher that gives its SQLite writes a 120 s busy timeout, not 5 s
        cmd = [
            sys.executable, "-m", "secure_fed.engine.flower.superlink_launcher",
            "--ssl-ca-certfile", str(certs["ca.crt"]), "--ssl-certfile", str(certs["server.pem"]),
            "--ssl-keyfile", str(certs["server.key"]), "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-runtime-dependency-installation",
        ]  # fmt: skip
        if self.database:
            cmd += ["--database", str(self.workdir / "superlink.db")]
        if self.auth:
            cmd.append("--enable-supernode-auth")
        p = self._start("superlink", cmd, self._env("superlink"))
        self._wait_for("starting the SuperLink", lambda: b"Uvicorn running on https://" in self._output(p))

    def _start_node(self, i: int) -> subprocess.Popen:
        folder = self.node_dir(i)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        env = self._env(f"node-{i}")
        env[NODE_STATE] = str(folder)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"  # one torch thread per node (the ClientApp sets it too)
        port = free_port()
        cmd = [
            "flower-supernode", "--root-certificates", str(self._certs["ca.crt"]), "--superlink", self.fleet_address,
            "--port", str(port), "--isolation", self.isolation, "--node-config",
            f"partition-id={i} num-partitions={self.nodes} state-dir={_toml_string(str(folder), 'the work directory')}",
        ]  # fmt: skip
        if self.auth:
            cmd += ["--auth-supernode-private-key", str(folder / "auth" / "node.key")]
        p = self._start(f"supernode-{i}", cmd, env)
        if self.isolation == "process":  # the node's own ClientApp process, beside the SuperNode (not its child)
            runtime = ["--runtime-api-address", f"127.0.0.1:{port}", "--parent-pid", str(p.pid)]
            if self.clientapps == "zygote":  # one long-lived process, forked from the deployment's zygote
                wenv = {k: env[k] for k in (PART, NODE_STATE, "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
                self._workers[i] = spawn(str(self.workdir / "clientapps.sock"), address=f"127.0.0.1:{port}",
                                         parent_pid=p.pid, env=wenv, log=str(self.workdir / f"clientapp-{i}.log"))  # fmt: skip
            elif self.clientapps == "worker":  # one long-lived process runs every task (the run's copy built once)
                self._start(f"clientapp-{i}", [sys.executable, "-m", "secure_fed.engine.flower.clientapp_worker", *runtime], env)
            else:  # Flower's SuperExec: one flwr-clientapp process per task
                self._start(f"clientapp-{i}", ["flower-superexec", "--insecure", *runtime], env)
        return p

    def _joined(self, i: int) -> bool:
        """Whether SuperNode i's current process has joined (the SuperLink activated it); records its node id."""
        found = re.search(rb"SuperNode ID: (\d+)", self._output(self._procs[f"supernode-{i}"]))
        if found:
            self.node_ids[i] = int(found.group(1))
        return found is not None

    def start(self) -> LocalDeployment:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._certs = certs = generate_certificates(self.workdir / "certs", ["127.0.0.1", "localhost"])
        self.port = free_port()
        home = self.workdir / "flwr-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\n'
            f"root-certificates = {_toml_string(str(certs['ca.crt']), 'the certificate path')}\n"
        )
        self._start_superlink()
        if self.clientapps == "zygote" and self.isolation == "process":
            sock = self.workdir / "clientapps.sock"
            sock.unlink(missing_ok=True)
            zenv = self._env("clientapps")
            zenv["OMP_NUM_THREADS"] = zenv["MKL_NUM_THREADS"] = "1"
            self._start("clientapps", [sys.executable, "-m", "secure_fed.engine.flower.clientapp_worker", "--zygote",
                                       str(sock)], zenv)  # fmt: skip
        if self.link is not None:
            self.proxy = LinkProxy(f"127.0.0.1:{self.port}", self.link).start()
        if self.auth:  # every node's public key registered before any node starts
            keys = [write_node_key(self.node_dir(i) / "auth")[1] for i in range(self.nodes)]
            registered = register_nodes(keys, connection=CONNECTION, env=self._env())
            self.registered_ids = dict(enumerate(registered))
        for i in range(self.nodes):
            self._start_node(i)
        self._wait_for(f"connecting {self.nodes} SuperNodes", lambda: all(self._joined(i) for i in range(self.nodes)))
        return self

    # ----------------------------------------------------------------- fault injection
    def _worker(self, i: int, parts: dict[str, list[int]] | None = None) -> list[int]:
        """Node i's forked ClientApp worker, while it lives (its environment in /proc is the zygote's)."""
        pid = self._workers.get(i)
        parts = processes_by(PART) if parts is None else parts
        if pid is None or pid not in parts.get(f"{self.marker}/clientapps", []):
            return []
        return [pid]

    def _kill(self, part: str, names: list[str]) -> list[int]:
        """SIGKILL every live process of ``part`` (the named ones and every process they started)."""
        killed = []
        if part.startswith("node-") and (pids := self._worker(int(part[5:]))):
            os.kill(pids[0], signal.SIGKILL)
            killed += pids
            self._workers.pop(int(part[5:]))
        for _ in range(3):  # a process may start a child while its siblings die: sweep until none is left
            pids = marked_processes(f"{self.marker}/{part}", var=PART)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for name in names:
            if (p := self._procs.pop(name, None)) is not None:
                p.wait(timeout=10)
                self._done.append(p)
        return killed

    def node_pids(self) -> dict[int, list[int]]:
        """The live processes of each SuperNode (the SuperNode and its ClientApp process(es)), by node index."""
        parts = processes_by(PART)
        return {i: parts.get(f"{self.marker}/node-{i}", []) + self._worker(i, parts) for i in range(self.nodes)}

    def superlink_pids(self) -> list[int]:
        """The live processes of the SuperLink (with its SuperExec and its ServerApp)."""
        return marked_processes(f"{self.marker}/superlink", var=PART)

    def kill_node(self, i: int) -> list[int]:
        """``kill -9`` SuperNode i and every process of it (its ClientApp process(es)); returns their ids."""
        self._check_node(i)
        return self._kill(f"node-{i}", [f"supernode-{i}", f"clientapp-{i}"])

    def restart_node(self, i: int, *, timeout_s: float = 150.0) -> int:
        """Start SuperNode i again (same key, so the same node id; same partition; same state directory) and wait
        until the SuperLink has activated it; returns its node id.

        A node killed with ``kill -9`` stays active at the SuperLink until its heartbeat lapses (Flower 1.42: twice
        its 30 s heartbeat interval), and the SuperLink refuses to activate it again before that. So the node first
        ends that stale session itself (:func:`~secure_fed.engine.flower.node_auth.end_stale_session`, signed with
        its key; with ``auth`` only); should the SuperLink still refuse it (e.g. unreachable for that request), the
        restart is tried again every 2 s until the SuperLink takes it (or ``timeout_s``)."""
        self._check_node(i)
        if f"supernode-{i}" in self._procs:
            raise SecureFedError(f"SuperNode {i} is running; kill it first")
        deadline = time.monotonic() + timeout_s
        if self.auth and i in self.node_ids:  # the killed process's session ended by the node itself, as its own
            folder = self.node_dir(i)
            end_stale_session(folder / "auth" / "node.key", self.node_ids[i], address=self.fleet_address,
                              ca=self._certs["ca.crt"], env=self._env(f"node-{i}"))  # fmt: skip
        while True:
            p = self._start_node(i)
            while p.poll() is None and not self._joined(i) and time.monotonic() < deadline:
                time.sleep(0.2)
            if p.poll() is None and self._joined(i):
                return self.node_ids[i]
            refused = b"Failed to activate SuperNode" in self._output(p)
            self._kill(f"node-{i}", [f"supernode-{i}", f"clientapp-{i}"])
            if not refused or time.monotonic() > deadline:
                raise SecureFedError(f"SuperNode {i} did not rejoin within {timeout_s:.0f} s; see {p.log.name}")
            time.sleep(2.0)  # the SuperLink still holds the killed node's session: try again shortly

    def kill_superlink(self) -> list[int]:
        """``kill -9`` the SuperLink and every process of it (its SuperExec, the running ServerApp)."""
        return self._kill("superlink", ["superlink"])

    def restart_superlink(self) -> None:
        """Start the SuperLink again: same port, certificates and database (its registered nodes and their
        authentication survive); the running SuperNodes reconnect by themselves."""
        if "superlink" in self._procs:
            raise SecureFedError("the SuperLink is running; kill it first")
        if not self.database:
            raise SecureFedError("a SuperLink restart needs its database (LocalDeployment(database=True))")
        self._start_superlink()

    def _check_node(self, i: int) -> None:
        if not 0 <= i < self.nodes:
            raise SecureFedError(f"node {i}: this deployment has nodes 0..{self.nodes - 1}")

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop every process of the deployment (SIGTERM, then SIGKILL after ``grace_s``)."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            pids = marked_processes(self.marker)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while marked_processes(self.marker) and time.monotonic() < deadline:
                time.sleep(0.1)
        for p in [*self._procs.values(), *self._done]:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            p.log.close()
        if self.proxy is not None:
            self.proxy.stop()
        self._done = [*self._done, *self._procs.values()]
        self._procs = {}

    def __enter__(self) -> LocalDeployment:
        """Start. In the main thread a SIGTERM to this process (``kill``, ``timeout``) ends the ``with`` block as Ctrl-C
        does, and :meth:`__exit__` stops every process of the deployment, then hands the signal on to the handler
        that was there before (by default: the process ends, killed by SIGTERM). Without this a SIGTERM ended this
        process alone and left the SuperLink and the nodes running."""
        self._sigterm_installed = self._sigterm_received = self._stopping = False
        if threading.current_thread() is threading.main_thread():
            self._sigterm_before = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True
        try:
            return self.start()
        except BaseException:
            self.__exit__()
            raise

    def _on_sigterm(self, signum, frame) -> None:
        """The first SIGTERM leaves the ``with`` block (``SystemExit``, through the exits); one that comes while the
        deployment stops, or a second, is noted only (the stop is not cut short; the signal is handed on after it)."""
        first = not self._sigterm_received
        self._sigterm_received = True
        if first and not self._stopping:
            raise SystemExit(128 + signum)

    def __exit__(self, *exc) -> None:
        self._stopping = True
        try:
            self.stop()
        finally:
            if getattr(self, "_sigterm_installed", False):
                self._sigterm_installed = False
                before = self._sigterm_before
                signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
                if self._sigterm_received:  # the deployment is stopped: the signal now does what it did before
                    os.kill(os.getpid(), signal.SIGTERM)

    # ----------------------------------------------------------------- a run
    def run(self, *, out: str | Path, config: str | Path | None = None, overrides: list[str] = (),
            timeout_s: float = 1800.0, app_dir: str | Path = APP_DIR,
            resume: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
        """``flwr run`` of one experiment on this deployment; returns when the run has finished (``--stream``)."""
        if not (Path(app_dir) / "pyproject.toml").is_file():
            raise SecureFedError(f"{app_dir}: no Flower app here (pyproject.toml with [tool.flwr.app]); run from a checkout")
        rc = {"overrides": ";".join(overrides), "out": str(Path(out).resolve())}
        if config is not None:
            rc["config"] = str(Path(config).resolve())
        if self.data_root:
            rc["data-root"] = str(Path(self.data_root).resolve())
        if resume:
            rc["resume"] = "true"
        arg = " ".join(f"{k}={_toml_string(v, k)}" for k, v in rc.items())
        cmd = ["flwr", "run", str(app_dir), CONNECTION, "--run-config", arg, "--stream"]
        with open(self.workdir / "flwr-run.log", "ab") as log:  # a resumed run's output follows the first's
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(), timeout=timeout_s)
        return p


__all__ = ["LocalDeployment", "round_seconds", "MARKER", "NODE_STATE", "PART", "free_port", "marked_processes", "processes_by"]

"""A Flower deployment on this machine over TLS: one SuperLink, N SuperNodes, one ``flwr run``, then shut down.

:class:`LocalDeployment` is what ``secure-fed flower local`` and the deployment test run; it does, in processes
on 127.0.0.1, the steps the README's multi-machine section does by hand:

1. certificates (:func:`~secure_fed.engine.flower.certificates.generate_certificates`) for 127.0.0.1 and
   localhost;
2. ``flower-superlink`` with ``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile`` (Flower 1.42 serves its Fleet,
   Control and runtime APIs over HTTPS on one port), no runtime installation of the app's dependencies;
3. N ``flower-supernode --root-certificates ca.crt --node-config "partition-id=i num-partitions=N"`` (one
   partition each), waiting until the SuperLink has activated all of them;
4. a SuperLink connection with ``root-certificates`` in a private ``$FLWR_HOME/config.toml``, and
   ``flwr run experiments/flower-app CONNECTION --run-config ... --stream``;
5. on exit, every process it started and every process those started (Flower launches one ``flwr-serverapp``
   per run and one ``flwr-clientapp`` per message) is stopped: they all carry a marker in their environment,
   so none is left behind even when Flower detaches its children.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from secure_fed.engine.flower.certificates import generate_certificates
from secure_fed.errors import SecureFedError

#: the environment variable every process of one deployment carries (its value is the deployment's id)
MARKER = "SECURE_FED_DEPLOYMENT"
CONNECTION = "secure-fed-local"
APP_DIR = Path(__file__).resolve().parents[3] / "experiments" / "flower-app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def marked_processes(marker: str) -> list[int]:
    """Ids of the live processes whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _toml_string(value: str, what: str) -> str:
    if "'" in value or "\n" in value:
        raise SecureFedError(f"{what} {value!r}: a run-config value cannot hold a single quote or a line break")
    return f"'{value}'"


class LocalDeployment:
    """A TLS SuperLink and ``nodes`` SuperNodes on 127.0.0.1 (a context manager; :meth:`run` starts one run).

    ``workdir`` receives the certificates, the Flower home and each process's log."""

    def __init__(self, workdir: str | Path, *, nodes: int, data_root: str | None = None, start_timeout_s: float = 120.0):
        if nodes < 1:
            raise SecureFedError(f"--nodes {nodes}: a deployment needs at least one SuperNode")
        self.workdir = Path(workdir).resolve()
        self.nodes, self.data_root, self.start_timeout_s = nodes, data_root, start_timeout_s
        self.marker = uuid.uuid4().hex
        self.port = 0
        self._procs: list[subprocess.Popen] = []

    # ----------------------------------------------------------------- processes
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[MARKER] = self.marker
        env["FLWR_HOME"] = str(self.workdir / "flwr-home")
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        if self.data_root:
            env["SECURE_FED_DATA"] = str(Path(self.data_root).resolve())
        return env

    def _start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process in stop()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(), start_new_session=True)
        p.log = log  # type: ignore[attr-defined]
        self._procs.append(p)
        return p

    def _wait_for(self, what: str, test) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not test():
            for p in self._procs:
                if p.poll() is not None:
                    raise SecureFedError(f"{p.args[0]} exited with {p.returncode} while {what}; see {p.log.name}")
            if time.monotonic() > deadline:
                raise SecureFedError(f"timed out after {self.start_timeout_s:.0f} s {what}; see the logs in {self.workdir}")
            time.sleep(0.2)

    def _node_dir(self, i: int) -> str:
        """SuperNode i's storage of its clients' state (kept across runs, so ``--resume`` finds it), as TOML."""
        return _toml_string(str((self.workdir / f"node-{i}").resolve()), "the work directory")

    def start(self) -> LocalDeployment:
        self.workdir.mkdir(parents=True, exist_ok=True)
        certs = generate_certificates(self.workdir / "certs", ["127.0.0.1", "localhost"])
        self.port = free_port()
        home = self.workdir / "flwr-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\n'
            f"root-certificates = {_toml_string(str(certs['ca.crt']), 'the certificate path')}\n"
        )
        link_log = self.workdir / "superlink.log"
        self._start("superlink", [
            "flower-superlink", "--ssl-ca-certfile", str(certs["ca.crt"]), "--ssl-certfile", str(certs["server.pem"]),
            "--ssl-keyfile", str(certs["server.key"]), "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-runtime-dependency-installation",
        ])  # fmt: skip
        self._wait_for("starting the SuperLink", lambda: b"Uvicorn running on https://" in link_log.read_bytes())
        for i in range(self.nodes):
            self._start(f"supernode-{i}", [
                "flower-supernode", "--root-certificates", str(certs["ca.crt"]), "--superlink", f"127.0.0.1:{self.port}",
                "--port", str(free_port()), "--node-config",
                f"partition-id={i} num-partitions={self.nodes} state-dir={self._node_dir(i)}",
            ])  # fmt: skip
        self._wait_for(
            f"connecting {self.nodes} SuperNodes", lambda: link_log.read_bytes().count(b"Activated node_id") >= self.nodes
        )
        return self

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
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            p.log.close()

    def __enter__(self) -> LocalDeployment:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

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
        with open(self.workdir / "flwr-run.log", "wb") as log:
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(), timeout=timeout_s)
        return p


__all__ = ["LocalDeployment", "MARKER", "free_port", "marked_processes"]

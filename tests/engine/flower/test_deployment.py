"""A real Flower deployment on 127.0.0.1: a TLS SuperLink, 3 SuperNodes, `flwr run` of a 1-round FedAwS run with
4 clients (about 50 s on the 2-core machine: Flower starts one ClientApp process per message), the metrics against
the same run in process, and nothing left running afterwards."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time

import httpx
import pytest
import torch

from secure_fed.engine import Experiment
from secure_fed.engine.flower.deployment import LocalDeployment, marked_processes
from tests.config.test_bad_input import cli
from tests.conftest import REPO, SMALL, small_plan

SETTINGS = ["training.rounds=1", "evaluation.every=1", "algorithm.name=fedaws", "dataset.synthetic.num_labels=4"]
RUN = [*SMALL, *SETTINGS, "flower.num_supernodes=3"]  # later overrides win


def _reference(tmp_path) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ClientApps train (one thread each)
    try:
        return Experiment(small_plan(*SETTINGS), run_dir=tmp_path).run(progress=False).summary
    finally:
        torch.set_num_threads(threads)


def test_flwr_run_on_a_tls_superlink_with_three_supernodes(tmp_path):
    started = time.monotonic()
    dep = LocalDeployment(tmp_path / "deployment", nodes=3)
    with dep:
        ca = str(tmp_path / "deployment" / "certs" / "ca.crt")
        # the SuperLink speaks TLS with the deployment's own CA: trusted with it, refused without it
        assert httpx.get(f"https://127.0.0.1:{dep.port}/health", verify=ssl.create_default_context(cafile=ca)).is_success
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{dep.port}/health", verify=True)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{dep.port}/health")
        done = dep.run(out=tmp_path / "run", overrides=RUN, timeout_s=600)
        assert marked_processes(dep.marker)  # the deployment is up until the block ends
    assert done.returncode == 0, (tmp_path / "deployment" / "flwr-run.log").read_text()[-3000:]
    assert marked_processes(dep.marker) == []  # SuperLink, SuperNodes, ServerApp and ClientApp processes: all gone
    assert time.monotonic() - started < 600

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 1
    assert summary["privacy"]["epsilon"] == "inf"
    private = json.loads((tmp_path / "run" / "private" / "summary.json").read_text())
    assert private["executor"]["name"] == "flower"
    ref = _reference(tmp_path / "inprocess")
    assert set(summary["final"]) == set(ref["final"])
    for k, v in ref["final"].items():
        assert summary["final"][k] == pytest.approx(v, abs=1e-5), k
    rounds = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1]


#: a process that starts a 2-node deployment, says its marker, and waits
UNDER_SIGTERM = """
import sys, time
from secure_fed.engine.flower.deployment import LocalDeployment
with LocalDeployment(sys.argv[1], nodes=2) as dep:
    print(dep.marker, flush=True)
    time.sleep(600)
"""


def test_a_sigterm_to_the_process_that_holds_a_deployment_stops_all_of_it(tmp_path):
    """``kill``/``timeout`` on ``secure-fed flower local`` or ``deploy_faults.py``: SIGTERM ends the ``with`` block as
    Ctrl-C does, the SuperLink, the SuperNodes and their ClientApp processes are stopped, and then the signal does
    what it did before (here the default: the process ends, killed by SIGTERM)."""
    proc = subprocess.Popen([sys.executable, "-c", UNDER_SIGTERM, str(tmp_path / "dep")], stdout=subprocess.PIPE,
                            text=True, cwd=str(REPO))  # fmt: skip
    marker = ""
    try:
        marker = proc.stdout.readline().strip()
        assert len(marker) == 32, marker
        assert len(marked_processes(marker)) >= 3  # the SuperLink and two SuperNodes (and their processes)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
        assert marked_processes(marker) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in marked_processes(marker) if marker else []:  # what a failing run left
            os.kill(pid, signal.SIGKILL)


def test_the_sigterm_handler_is_the_with_blocks_only_and_only_in_the_main_thread(tmp_path, monkeypatch):
    """The handler is installed for the ``with`` block in the main thread and the one before is back after it, when
    the block ends normally and when the start fails; in another thread nothing is installed (Python allows signal
    handlers in the main thread only)."""
    import threading

    monkeypatch.setattr(LocalDeployment, "start", lambda self: self)
    monkeypatch.setattr(LocalDeployment, "stop", lambda self: None)

    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        dep = LocalDeployment(tmp_path / "a", nodes=1)
        with dep:
            assert signal.getsignal(signal.SIGTERM) == dep._on_sigterm
        assert signal.getsignal(signal.SIGTERM) is mine

        def fail(self):
            raise RuntimeError("no SuperLink")

        monkeypatch.setattr(LocalDeployment, "start", fail)
        with pytest.raises(RuntimeError, match="no SuperLink"), LocalDeployment(tmp_path / "b", nodes=1):
            pass
        assert signal.getsignal(signal.SIGTERM) is mine

        monkeypatch.setattr(LocalDeployment, "start", lambda self: self)
        seen = []

        def in_thread():
            with LocalDeployment(tmp_path / "c", nodes=1):
                seen.append(signal.getsignal(signal.SIGTERM))

        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        assert seen == [mine]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_flower_local_refuses_a_bad_config_before_starting_anything(tmp_path):
    code, out, err = cli("flower", "local", "--nodes", "2", "--out", str(tmp_path / "run"), "--set", "training.rounds=0")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "training.rounds" in err, err
    assert not (tmp_path / "run").exists() and not any(tmp_path.iterdir())


def test_flower_local_refuses_missing_data_before_starting_anything(tmp_path):
    # the ServerApp would fail on it only once the SuperLink and every SuperNode are up
    empty = tmp_path / "no-data"
    empty.mkdir()
    run = tmp_path / "run"
    code, out, err = cli("flower", "local", "--nodes", "2", "--out", str(run), "--set", "dataset.name=bibtex",
                         "--data-root", str(empty))  # fmt: skip
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert str(empty / "mulan" / "bibtex" / "bibtex-train.arff") in err and "secure-fed data download bibtex" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-data"] and not any(empty.iterdir())


def test_flower_certificates_are_a_ca_and_a_server_certificate_for_the_hosts(tmp_path):
    from cryptography import x509

    (tmp_path / "server.key").write_bytes(b"old")
    (tmp_path / "server.key").chmod(0o644)  # a world-readable file from an earlier run is overwritten private
    code, out, err = cli("flower", "certificates", "--out", str(tmp_path), "--host", "10.0.0.7", "--host", "link.example")
    assert code == 0, err
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert san.get_values_for_type(x509.DNSName) == ["link.example"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert (tmp_path / "server.key").stat().st_mode & 0o077 == 0 and (tmp_path / "ca.key").stat().st_mode & 0o077 == 0

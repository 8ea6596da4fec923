"""SuperNode authentication and process control of a real deployment (TLS SuperLink, 2 SuperNodes, no run):

* a SuperNode whose key is not registered is refused (the SuperLink logs the refusal, the node exits with Flower's
  connection-error code 305), so is one without a key; once its key is registered, the same node joins;
* ``kill_node`` / ``restart_node``: every process of the node dies with SIGKILL; the restarted node has the same
  node id (its key's), the same partition and its state directory in ``SECURE_FED_NODE_STATE``;
* ``kill_superlink`` / ``restart_superlink``: the SuperLink comes back on the same port with the same database,
  so the registered keys survive (a node restarted after it is taken) and the other nodes are still connected.

About 40 s on the 2-core machine."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from secure_fed.engine.flower.deployment import NODE_STATE, PART, LocalDeployment, free_port, marked_processes
from secure_fed.engine.flower.node_auth import REFUSED_UNREGISTERED, register_nodes, write_node_key


def _supernode(dep: LocalDeployment, tmp_path: Path, name: str, key: Path | None) -> subprocess.Popen:
    """A SuperNode outside the deployment's bookkeeping (its own command line), pointed at its SuperLink."""
    cmd = ["flower-supernode", "--root-certificates", str(dep.workdir / "certs" / "ca.crt"), "--superlink",
           dep.fleet_address, "--port", str(free_port()), "--node-config", "partition-id=0 num-partitions=2"]  # fmt: skip
    if key is not None:
        cmd += ["--auth-supernode-private-key", str(key)]
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed by the caller's wait
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dep._env(), start_new_session=True)


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def _link_log(dep: LocalDeployment) -> bytes:
    return (dep.workdir / "superlink.log").read_bytes()


def test_unregistered_supernodes_are_refused_and_a_registered_one_joins(tmp_path):
    with LocalDeployment(tmp_path / "dep", nodes=2) as dep:
        assert dep.node_ids == dep.registered_ids and len(set(dep.node_ids.values())) == 2
        private, public = write_node_key(tmp_path / "stranger")
        assert private.stat().st_mode & 0o077 == 0

        stranger = _supernode(dep, tmp_path, "stranger", private)
        keyless = _supernode(dep, tmp_path, "keyless", None)
        try:  # both end by themselves (Flower's exit code 305 in their logs): the SuperLink refuses them
            stranger.wait(timeout=120)
            keyless.wait(timeout=120)
        finally:
            for p in (stranger, keyless):
                if p.poll() is None:
                    p.kill()
                    p.wait()
        stranger_log, keyless_log = (tmp_path / "stranger.log").read_bytes(), (tmp_path / "keyless.log").read_bytes()
        assert b"Exit Code: 305" in stranger_log and b"Failed to activate SuperNode" in stranger_log
        assert b"Exit Code: 305" in keyless_log and b"authentication is enabled. All SuperNodes must be registered" in keyless_log
        assert REFUSED_UNREGISTERED in _link_log(dep)  # the SuperLink's side of the stranger's refusal

        (node_id,) = register_nodes([public], connection="secure-fed-local", env=dep._env())
        joined = _supernode(dep, tmp_path, "registered", private)
        try:
            deadline = time.monotonic() + 120
            while f"SuperNode ID: {node_id}".encode() not in (tmp_path / "registered.log").read_bytes():
                assert joined.poll() is None, (tmp_path / "registered.log").read_text()[-2000:]
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert f"Activated node_id={node_id}".encode() in _link_log(dep)
        finally:
            joined.kill()
            joined.wait()
    assert marked_processes(dep.marker) == []


def test_kill_and_restart_nodes_and_the_superlink(tmp_path):
    with LocalDeployment(tmp_path / "dep", nodes=2) as dep:
        ids = dict(dep.node_ids)
        before = dep.node_pids()
        assert all(len(p) == 2 for p in before.values())  # a SuperNode and its ClientApp worker (process isolation)
        (supernode,) = marked_processes(f"{dep.marker}/node-1", var=PART)  # (the worker's /proc environ is the zygote's)
        assert _environ(supernode)[NODE_STATE] == str(tmp_path / "dep" / "nodes" / "1")

        killed = dep.kill_node(1)
        assert sorted(killed) == sorted(before[1]) and dep.node_pids()[1] == []
        assert all(not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text() for pid in killed)
        assert dep.node_pids()[0] == before[0]  # the other node is untouched
        assert dep.restart_node(1) == ids[1]  # same key: same node id
        after = dep.node_pids()[1]
        assert len(after) == 2 and not set(after) & set(before[1])
        (supernode,) = marked_processes(f"{dep.marker}/node-1", var=PART)
        assert _environ(supernode)[NODE_STATE] == str(tmp_path / "dep" / "nodes" / "1")
        assert "partition-id=1 num-partitions=2" in " ".join(Path(f"/proc/{supernode}/cmdline").read_text().split("\0"))

        port, link = dep.port, dep.superlink_pids()
        assert dep.kill_superlink() and dep.superlink_pids() == []
        dep.restart_superlink()
        assert dep.port == port and dep.superlink_pids() and not set(dep.superlink_pids()) & set(link)
        # the database kept the registered keys: a node killed and restarted now is taken with its old id
        dep.kill_node(0)
        assert dep.restart_node(0) == ids[0]
        assert dep.node_pids()[1] == after  # node 1 rode out the SuperLink's restart
        with pytest.raises(Exception, match="kill it first"):
            dep.restart_node(1)
    assert marked_processes(dep.marker) == []


def test_a_superlink_in_memory_cannot_be_restarted(tmp_path):
    dep = LocalDeployment(tmp_path / "dep", nodes=1, database=False)
    with pytest.raises(Exception, match="needs its database"):
        dep.restart_superlink()
    assert not (tmp_path / "dep").exists()  # refused before anything was started or written

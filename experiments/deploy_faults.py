"""A seeded fault schedule run against a real deployment (:class:`~secure_fed.engine.flower.deployment.LocalDeployment`:
a TLS SuperLink and N authenticated SuperNodes), then checked from the run's own files.

    python experiments/deploy_faults.py --nodes 8 --schedule SCHEDULE.yaml --out DIR [--config CFG] [--set k=v ...]

The schedule is the shared format (``protocols/secagg/fault_schedule.py``). How the faults happen:

* **Node kills at a stage.** Each node gets its part of the schedule in its own state directory
  (``fault-plan.json``); the node kills its own SuperNode (``kill -9`` of all its processes) when it receives the
  first message of that stage in that round (:mod:`secure_fed.engine.flower.node_faults`), so the kill lands at
  exactly that stage. The driver sees the node's processes gone and restarts it (same key, same node id, same state
  directory); the server has dropped the node for the rest of the round (its stage deadline,
  ``flower.stage_timeout_s``), and the node rejoins at the next round's AdvertiseKeys with fresh round keys.
* **SuperLink kill.** For ``{round: r, stage: superlink}`` the driver kills the SuperLink (``kill -9``, with its
  ServerApp) as soon as a node reports round r's first message, restarts it (same port, database, certificates),
  and continues the run with ``resume=true`` from its last checkpoint (``output.checkpoint_every=1``).

What is checked (:func:`check`): each completed round's unmasked sum against the survivors' encoded inputs, which
each node wrote into its own folder (``flower.debug_write_inputs``, test only); the final model, the metrics and
the privacy ledger against the in-process replay (the same config, ``secure_aggregation.fault_schedule`` = the same
schedule, at one torch thread, keyed hashing's dealer pinned to the key the nodes hold); and that no node secret
(signing keys, SecAgg+ round secrets, DP secret streams, keyed-hashing keys, read from the nodes' own state files)
appears in any file of the run directory or of the SuperLink's side of the deployment (its database, logs, Flower
home). Writes ``DIR/faults-report.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from protocols.secagg.fault_schedule import STAGES, SUPERLINK, FaultSchedule, load_fault_schedule
from secure_fed.engine.flower.client_app import read_node_state_file
from secure_fed.engine.flower.deployment import APP_DIR, CONNECTION, LocalDeployment, _toml_string
from secure_fed.engine.flower.node_faults import DONE_FILE, PROGRESS_FILE, check_exact_sums, write_plan

#: what a fault run needs of the config (the driver adds them; later overrides win)
FAULT_RUN = ["output.checkpoint_every=1", "flower.debug_write_inputs=true"]


def node_plans(schedule: FaultSchedule) -> dict[int, list[tuple[int, str]]]:
    """Each node's (round, stage) kills."""
    out: dict[int, list[tuple[int, str]]] = {i: [] for i in range(schedule.nodes)}
    for e in schedule.events:
        if e.stage in STAGES:
            for v in e.kill:
                out[v].append((e.round, e.stage))
    return out


def serverapp_status(db: Path) -> tuple[str, str] | None:
    """The SuperLink's own record of its latest ServerApp task, ``(sub_status, details)`` (e.g. ``("failed", "No
    heartbeat received from the task")``), read from its database; None without one. A ServerApp that is gone
    without an exception (e.g. killed by the kernel, :func:`oom_kills`) leaves nothing in its log stream; the
    SuperLink records it as failed once its heartbeats stop."""
    if not db.is_file():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=60)) as c:
        row = c.execute(
            "SELECT sub_status, details FROM task WHERE type = 'flwr-serverapp' ORDER BY pending_at DESC LIMIT 1"
        ).fetchone()
    return None if row is None else (row[0] or "", row[1] or "")


def oom_kills(kernel_log: str, since_s: float) -> list[dict[str, Any]]:
    """The kernel OOM killer's kills in ``kernel_log`` (``dmesg``'s text) at or after ``since_s`` seconds of uptime:
    ``{"t": uptime s, "pid", "name", "anon_rss_mib"}`` each. A ServerApp the kernel killed leaves no exception in its
    log; the SuperLink then fails its task for missing heartbeats, which is all its record says."""
    pat = re.compile(
        r"\[\s*(\d+\.\d+)\]\s+(?:Memory cgroup )?[Oo]ut of memory: Killed process (\d+) \(([^)]*)\).*?anon-rss:(\d+)kB"
    )
    kills = []
    for m in pat.finditer(kernel_log):
        if float(m.group(1)) >= since_s:
            kills.append({"t": float(m.group(1)), "pid": int(m.group(2)), "name": m.group(3),
                          "anon_rss_mib": round(int(m.group(4)) / 1024, 1)})  # fmt: skip
    return kills


def kernel_oom_kills(since_s: float) -> list[dict[str, Any]] | str:
    """:func:`oom_kills` of this machine's kernel log, or why it cannot be read (``dmesg`` needs the privilege)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"kernel log not read: {e}"
    if out.returncode != 0:
        return f"kernel log not read: {out.stderr.strip()[:200]}"
    return oom_kills(out.stdout, since_s)


def uptime_s() -> float:
    """Seconds since boot, the kernel log's clock."""
    return float(Path("/proc/uptime").read_text().split()[0])


class FaultDriver:
    """Runs one experiment on ``dep`` (started) under ``schedule``; :meth:`run` returns the driver's log."""

    def __init__(self, dep: LocalDeployment, schedule: FaultSchedule, *, out: Path, config: str | None,
                 overrides: list[str], timeout_s: float = 3600.0):  # fmt: skip
        if schedule.nodes != dep.nodes:
            raise SystemExit(f"error: the schedule has {schedule.nodes} nodes, the deployment {dep.nodes}")
        self.dep, self.schedule, self.out = dep, schedule, Path(out).resolve()
        self.config, self.overrides, self.timeout_s = config, [*overrides, *FAULT_RUN], timeout_s
        self.events: list[dict[str, Any]] = []
        self.t0, self.uptime0 = time.monotonic(), uptime_s()
        self._restarting: dict[int, threading.Thread] = {}

    def log(self, what: str, **kw: Any) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 2), "event": what, **kw})

    # ----------------------------------------------------------------- the run
    def _flwr_run(self, resume: bool) -> subprocess.Popen:
        """``flwr run`` of the experiment on the deployment (as :meth:`LocalDeployment.run`, but not waited for)."""
        dep = self.dep
        rc = {"overrides": ";".join(self.overrides), "out": str(self.out)}
        if self.config is not None:
            rc["config"] = str(Path(self.config).resolve())
        if dep.data_root:
            rc["data-root"] = str(Path(dep.data_root).resolve())
        if resume:
            rc["resume"] = "true"
        arg = " ".join(f"{k}={_toml_string(v, k)}" for k, v in rc.items())
        cmd = ["flwr", "run", str(APP_DIR), CONNECTION, "--run-config", arg, "--stream"]
        log = open(dep.workdir / "flwr-run.log", "ab")  # noqa: SIM115 - closed when the run ends
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dep._env())

    def _serverapp_running(self) -> bool:
        """Whether a ServerApp process of the SuperLink is alive: ``flwr run --stream`` can return while the
        ServerApp still works (its log stream is a connection of its own), so the run's end is the ServerApp's."""
        for pid in self.dep.superlink_pids():
            with contextlib.suppress(OSError):
                if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
        return False

    def _progress(self) -> int:
        """The latest round any node has seen a message of (0: none yet)."""
        best = 0
        for i in range(self.dep.nodes):
            f = self.dep.node_dir(i) / f"{PROGRESS_FILE}-{i}"
            with contextlib.suppress(OSError, ValueError, IndexError):
                best = max(best, int(f.read_text().split()[0]))
        return best

    def _restart(self, i: int) -> None:
        started = time.monotonic()
        try:
            self.dep.kill_node(i)  # what is left of it (nothing, or a ClientApp the node's kill missed)
            self.dep.restart_node(i)
            self.log("node restarted", node=i, seconds=round(time.monotonic() - started, 2))
        except Exception as e:  # noqa: BLE001 - reported, the run decides
            self.log("node restart failed", node=i, error=str(e)[:300])

    def run(self) -> dict[str, Any]:
        for i, kills in node_plans(self.schedule).items():
            folder = self.dep.node_dir(i)
            (folder / DONE_FILE).unlink(missing_ok=True)
            write_plan(folder, kills)
        superlink_rounds = sorted(e.round for e in self.schedule.events if e.stage == SUPERLINK)
        resume = False
        runs = 0
        deadline = time.monotonic() + self.timeout_s
        while True:
            proc = self._flwr_run(resume)
            runs += 1
            self.log("flwr run", resume=resume)
            killed_link, stream_ended = False, False
            while proc.poll() is None or self._serverapp_running():
                if proc.poll() is not None and not stream_ended:  # the log stream ended, the ServerApp did not
                    stream_ended = True
                    self.log("flwr run's log stream ended while the ServerApp runs; waiting for the ServerApp")
                if time.monotonic() > deadline:  # the report still gets the memory and OOM diagnostics
                    proc.kill()
                    self.log("timeout", seconds=self.timeout_s, oom_kills=kernel_oom_kills(self.uptime0))
                    print(f"error: the run did not finish within {self.timeout_s:.0f} s", file=sys.stderr)
                    return {"returncode": 124, "flwr_runs": runs, "events": self.events,
                            "wall_s": round(time.monotonic() - self.t0, 1)}  # fmt: skip
                for i in range(self.dep.nodes):  # a node that killed itself: restart it
                    t = self._restarting.get(i)
                    p = self.dep._procs.get(f"supernode-{i}")
                    if (t is not None and t.is_alive()) or (p is not None and p.poll() is None):
                        continue
                    self.log("node died", node=i, round=self._progress())
                    t = threading.Thread(target=self._restart, args=(i,), daemon=True)
                    self._restarting[i] = t
                    t.start()
                restarting = any(t.is_alive() for t in self._restarting.values())  # a node's restart needs the link
                if superlink_rounds and self._progress() >= superlink_rounds[0] and not restarting:
                    r = superlink_rounds.pop(0)
                    self.dep.kill_superlink()
                    self.log("superlink killed", round=r)
                    killed_link = True
                    break
                time.sleep(0.1)
            if killed_link:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                started = time.monotonic()
                self.dep.restart_superlink()
                self.log("superlink restarted", seconds=round(time.monotonic() - started, 2))
                resume = True
                continue
            failed = b"ServerApp raised an exception" in (self.dep.workdir / "flwr-run.log").read_bytes()
            status = serverapp_status(self.dep.workdir / "superlink.db") if self.dep.database else None
            failed = failed or (status is not None and status[0] == "failed")
            oom = kernel_oom_kills(self.uptime0)  # e.g. the ServerApp: its task then fails for missing heartbeats
            self.log("flwr run ended", returncode=proc.returncode, serverapp_failed=failed,
                     serverapp_status=list(status) if status else None, oom_kills=oom)  # fmt: skip
            for t in self._restarting.values():
                t.join(timeout=180)
            return {"returncode": proc.returncode or int(failed), "flwr_runs": runs, "events": self.events,
                    "wall_s": round(time.monotonic() - self.t0, 1)}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------- checks
def node_secrets(dep_workdir: Path, nodes: int) -> dict[str, bytes]:
    """Every node's secrets, read from the nodes' own state files (``nodes/i/<session>/node-i.state``): signing keys,
    SecAgg+ round secrets, DP secret streams' keys, keyed hashing's run key, salt and X25519 keys."""
    found: dict[str, bytes] = {}
    for i in range(nodes):
        for f in (dep_workdir / "nodes" / str(i)).glob("*/node-*.state"):
            st = read_node_state_file(f)["protocols"]
            for cid, e in st.get("secure_aggregation", {}).items():
                if e.get("sign_sk"):
                    found[f"secagg sign_sk c{cid}"] = bytes(e["sign_sk"])
                if (r := e.get("round")) is not None:
                    for k in ("c_sk", "s_sk", "b_seed"):
                        found[f"secagg {k} c{cid} r{r['round_idx']}"] = bytes(r[k])
            for cid, stream in st.get("dp", {}).items():
                if isinstance(stream, dict) and stream.get("key"):
                    found[f"dp stream c{cid}"] = bytes(stream["key"])
            for cid, ring in st.get("keyed_hashing", {}).items():
                for k, v in ring.items():
                    if isinstance(v, bytes | bytearray) and len(v) >= 16:
                        found[f"keyed_hashing {k} c{cid}"] = bytes(v)
    return found


def superlink_side_files(dep_workdir: Path, run_dir: Path) -> list[Path]:
    """The files the SuperLink's side holds: the run directory and the deployment's folder except the nodes' own."""
    nodes = (dep_workdir / "nodes").resolve()
    files = [p for p in Path(run_dir).rglob("*") if p.is_file()]
    files += [p for p in dep_workdir.rglob("*") if p.is_file() and nodes not in p.resolve().parents]
    return files


def secrets_found(dep_workdir: Path, run_dir: Path, nodes: int) -> tuple[int, list[str]]:
    """(how many node secrets were looked for, which of them appear, raw or hex, in a SuperLink-side file)."""
    secrets = node_secrets(dep_workdir, nodes)
    hits = set()
    for f in superlink_side_files(dep_workdir, run_dir):
        blob = f.read_bytes()
        for name, s in secrets.items():
            if s in blob or s.hex().encode() in blob:
                hits.add(f"{name} in {f}")
    return len(secrets), sorted(hits)


def dealer_key(dep_workdir: Path) -> tuple[bytes, bytes] | None:
    """Keyed hashing's run key and salt as the nodes hold them (to pin the in-process replay's dealer), or None."""
    for f in sorted((dep_workdir / "nodes").glob("*/*/node-*.state")):
        ring = read_node_state_file(f)["protocols"].get("keyed_hashing", {})
        for entry in ring.values():
            if entry.get("run_key"):
                return bytes(entry["run_key"]), bytes(entry["salt"])
    return None


@contextlib.contextmanager
def pinned_dealer(key: tuple[bytes, bytes] | None):
    """The in-process dealer draws ``key`` (run key, then salt) instead of fresh ones: the replay's label order is
    the deployment's."""
    if key is None:
        yield
        return
    import protocols.keyed_hashing as kh

    draws = iter(key)

    class _OS:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def urandom(n: int) -> bytes:
            value = next(draws)
            assert len(value) == n
            return value

    kh.os = _OS()
    try:
        yield
    finally:
        kh.os = os


def replay(config: str | None, overrides: list[str], schedule_path: Path, run_dir: Path, key) -> Any:
    """The in-process replay: the same config at one torch thread, the schedule's dropouts from the layer's hook."""
    import torch

    from secure_fed.config import load_plan
    from secure_fed.engine import Experiment

    torch.set_num_threads(1)
    plan = load_plan(config, [*overrides, *FAULT_RUN, "backend=inprocess", f"secure_aggregation.fault_schedule={schedule_path}"])
    with pinned_dealer(key):
        exp = Experiment(plan, run_dir=run_dir)
        result = exp.run(progress=False)
    return exp, result


def check(dep_workdir: Path, out: Path, nodes: int, *, config: str | None, overrides: list[str], schedule_path: Path,
          replay_dir: Path, atol: float = 1e-5) -> dict[str, Any]:  # fmt: skip
    """The checks of the module's docstring; returns the figures (nothing asserted here: the caller decides)."""
    import torch

    summary = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    sums = check_exact_sums(out, [dep_workdir / "nodes" / str(i) for i in range(nodes)])
    looked, hits = secrets_found(dep_workdir, out, nodes)
    exp, res = replay(config, overrides, schedule_path, replay_dir, dealer_key(dep_workdir))
    final = torch.load(out / "private" / "checkpoints" / "final.pt", map_location="cpu", weights_only=False)
    theta = final["theta"] if "theta" in final else final["model"]["theta"]
    diff = max(float((theta[k].double() - exp.theta[k].double().cpu()).abs().max()) for k in exp.theta)
    if exp.W is not None:
        W = final["W"] if "W" in final else final["model"]["W"]
        diff = max(diff, float((W.double() - exp.W.double().cpu()).abs().max()))
    rmetrics = [json.loads(x) for x in (replay_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    metric_diff = max((abs(a[k] - b[k]) for a, b in zip(metrics, rmetrics, strict=False) for k in a
                       if k in b and isinstance(a[k], float) and isinstance(b[k], float) and k != "wall_seconds"
                       and not k.endswith("_s") and a[k] == a[k]), default=0.0)  # fmt: skip
    aborted = [m["round"] for m in metrics if m.get("aborted") or m.get("clients") == 0]
    raborted = [m["round"] for m in rmetrics if m.get("aborted") or m.get("clients") == 0]
    return {
        "status": summary["status"], "rounds_completed": summary["rounds_completed"],
        "rounds_aborted": summary["rounds_aborted"], "aborted_rounds": aborted,
        "replay_status": res.summary["status"], "replay_rounds_aborted": res.summary["rounds_aborted"],
        "replay_aborted_rounds": raborted,
        "sums": {str(r): v for r, v in sums.items()}, "sums_exact": all(v["exact"] for v in sums.values()),
        "rounds_summed": len(sums),
        "model_max_abs_diff": diff, "model_within_atol": diff <= atol, "atol": atol,
        "metrics_max_abs_diff": metric_diff,
        "privacy": summary.get("privacy"), "replay_privacy": res.summary.get("privacy"),
        "privacy_equal": summary.get("privacy") == res.summary.get("privacy"),
        "node_secrets_looked_for": looked, "node_secrets_in_superlink_files": hits,
        "rounds_metrics": len(metrics),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--out", required=True, help="the folder for the deployment (deployment/), the run (run/), the replay")
    ap.add_argument("--config", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA"))
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--no-replay", action="store_true", help="skip the checks (the run only)")
    args = ap.parse_args(argv)
    try:
        schedule = load_fault_schedule(args.schedule)
    except Exception as e:  # noqa: BLE001 - one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    if schedule.nodes != args.nodes:
        print(f"error: the schedule has {schedule.nodes} nodes, --nodes {args.nodes}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    if (out / "run").exists():
        print(f"error: {out / 'run'} exists; give another --out", file=sys.stderr)
        return 2
    overrides = [*args.overrides, f"flower.num_supernodes={args.nodes}"]
    try:  # the config as the ServerApp will load it: a bad one is one line here, before any process starts
        from secure_fed.config import load_plan
        from secure_fed.data.from_config import check_data_files

        check_data_files(load_plan(args.config, [*overrides, *FAULT_RUN, "backend=flower"]).dataset, args.data_root)
    except Exception as e:  # noqa: BLE001 - one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    from secure_fed.engine.flower.node_memory import MemorySampler

    with LocalDeployment(out / "deployment", nodes=args.nodes, data_root=args.data_root) as dep:
        driver = FaultDriver(dep, schedule, out=out / "run", config=args.config, overrides=overrides,
                             timeout_s=args.timeout)  # fmt: skip
        with MemorySampler(dep.node_pids) as memory:  # each node's processes (SuperNode, ClientApp worker)
            report: dict[str, Any] = {"driver": driver.run()}
        report["node_pss_mib"] = memory.summary()
    if not args.no_replay and (out / "run" / "summary.json").is_file():
        report["checks"] = check(out / "deployment", out / "run", args.nodes, config=args.config, overrides=overrides,
                                 schedule_path=Path(args.schedule).resolve(), replay_dir=out / "replay")  # fmt: skip
    (out / "faults-report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.get("checks", {}).items() if k != "sums"}, default=str))
    return 0 if report["driver"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""What a deployment's node does about faults, on its own side (:mod:`.client_app` calls it before and after a message).

* **Progress.** Before each message of a round node P writes ``progress-P`` (``round stage``) into its own state
  directory: the fault driver (:mod:`.fault_driver`) reads it to know that a round has started (it kills the
  SuperLink after a round's start).
* **Scripted kills.** When the driver has put the node's part of a fault schedule (the shared format,
  ``protocols/secagg/fault_schedule.py``) into its state directory as ``fault-plan.json`` (the rounds and stages at
  which this node dies), the node kills itself (``SIGKILL`` to every
  process of its SuperNode: the SuperNode, its SuperExec, its ClientApps, this one last) when it receives the
  first message of the stage the schedule names in that round, so the kill lands at exactly that stage; it
  notes the kill first in ``faults-done.json`` (a restarted node does not die again for the same event). The
  driver restarts it; it rejoins at the next round's AdvertiseKeys with fresh round keys, its long-term state
  (signing key, pinned directory, DP secret streams) read back from its state file.
* **Test-only inputs** (``flower.debug_write_inputs``): each client's encoded SecAgg+ input (the words before
  masking) into ``debug-inputs/round-R/client-C.npy`` in the node's own state directory, where the SuperLink's
  side never reads; :func:`check_exact_sums` compares their sum with the server's unmasked sum.

The stage of a message: a SecAgg+ stage query's ``secagg`` field (``advertise``, ``share``, ``receive``,
``consistency``, ``unmask``), ``input`` for a training message.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np

#: the node's own part of a fault schedule: ``{"kill": [[round, stage], ...]}`` (round 1 = the first)
PLAN_FILE = "fault-plan.json"
DONE_FILE = "faults-done.json"
PROGRESS_FILE = "progress"
INPUTS_DIR = "debug-inputs"
SUMS_DIR = "secagg-sums"  # under the run's private/ folder


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")  # writers never share a temporary
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def kill_own_node() -> None:
    """``kill -9`` every process of this node (those whose environment names this node's part of the deployment),
    this process last."""
    from secure_fed.engine.flower.process_marks import PART, marked_processes

    part = os.environ.get(PART)
    if not part:
        raise RuntimeError("a fault schedule kills nodes of a LocalDeployment only (no deployment part in this process)")
    for pid in marked_processes(part, var=PART):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def write_plan(folder: str | Path, kills: list[tuple[int, str]]) -> None:
    """The driver's side: node ``folder``'s part of a schedule, as (round, stage) pairs (round 1 = the first)."""
    _write_atomic(Path(folder) / PLAN_FILE, json.dumps({"kill": [[int(r), str(s)] for r, s in kills]}))


def before_message(folder: str | Path | None, partition: int, round_idx: int, stage: str) -> None:
    """Note node ``partition``'s progress and, when its schedule says so, die here (see the module's docstring).
    ``round_idx``: the layer's round index (the schedule's round is ``round_idx + 1``)."""
    if folder is None:
        return
    folder = Path(folder)
    if not folder.is_dir():
        return
    _write_atomic(folder / f"{PROGRESS_FILE}-{partition}", f"{round_idx + 1} {stage}\n")
    file = folder / PLAN_FILE
    if not file.is_file():
        return
    event = [round_idx + 1, stage]
    if event not in json.loads(file.read_text())["kill"]:
        return
    done_file = folder / DONE_FILE
    done = json.loads(done_file.read_text()) if done_file.is_file() else []
    if event in done:
        return
    _write_atomic(done_file, json.dumps([*done, event]))
    kill_own_node()


def write_input(folder: str | Path, round_idx: int, cid: int, words: np.ndarray) -> None:
    """Test only: client ``cid``'s encoded input of round ``round_idx`` (before masking) into the node's folder."""
    d = Path(folder) / INPUTS_DIR / f"round-{round_idx + 1}"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    np.save(d / f"client-{cid}.npy", words)


def encoded_input(layer: Any, reply: Any, weighting: str) -> np.ndarray:
    """The words the SecAgg+ mask step encodes from ``reply`` (its flat update, clipped and fixed-point encoded)."""
    x = layer.layout.flat_view(reply, weighting)
    out = np.empty(len(x), dtype=layer.codec.word_dtype)
    return layer.codec.encode_into(np.asarray(x[0 : len(x)], dtype=np.float64), out)


def sum_writer(run_dir: str | Path):
    """Test only, the server's side: a hook that writes each round's unmasked sum (words mod 2^bits) and its
    survivors into ``run_dir/private/secagg-sums/round-R.npz``."""
    d = Path(run_dir) / "private" / SUMS_DIR

    def write(round_idx: int, survivors: list[int], total: np.ndarray, bits: int) -> None:
        d.mkdir(parents=True, exist_ok=True)
        np.savez(d / f"round-{round_idx + 1}.npz", survivors=np.asarray(survivors, dtype=np.int64), total=total,
                 bits=np.asarray(bits))  # fmt: skip

    return write


def check_exact_sums(run_dir: str | Path, node_dirs: list[str | Path]) -> dict[int, dict[str, Any]]:
    """For each round whose unmasked sum the server wrote: the survivors' inputs (read from the nodes' folders)
    summed mod 2^bits against it. Returns, by round (1 = first), ``{"survivors": n, "exact": bool, "missing": [...]}``
    (``missing``: survivors whose input file no node holds)."""
    out: dict[int, dict[str, Any]] = {}
    for f in sorted((Path(run_dir) / "private" / SUMS_DIR).glob("round-*.npz"), key=lambda p: int(p.stem[6:])):
        r = int(f.stem[6:])
        with np.load(f) as z:
            survivors, total, bits = [int(c) for c in z["survivors"]], z["total"], int(z["bits"])
        acc = np.zeros(len(total), dtype=np.uint64)  # wraps mod 2^64, a multiple of 2^bits (bits ≤ 64): exact
        missing = []
        for cid in survivors:
            files = [Path(n) / INPUTS_DIR / f"round-{r}" / f"client-{cid}.npy" for n in node_dirs]
            found = [p for p in files if p.is_file()]
            if not found:
                missing.append(cid)
                continue
            acc += np.load(found[0]).astype(np.uint64)
        if bits < 64:
            acc &= np.uint64((1 << bits) - 1)
        exact = not missing and len(acc) == len(total) and bool(np.array_equal(acc, total.astype(np.uint64)))
        out[r] = {"survivors": len(survivors), "exact": bool(exact), "missing": missing}
    return out


__all__ = ["before_message", "check_exact_sums", "encoded_input", "kill_own_node", "sum_writer", "write_input", "write_plan"]

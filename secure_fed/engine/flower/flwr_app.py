"""The project as a Flower app for ``flwr run`` (``experiments/flower-app/pyproject.toml`` names these objects).

``flwr run experiments/flower-app CONNECTION --run-config "config='/abs/exp.yaml' overrides='training.rounds=2'"``
runs a secure-fed experiment on whatever the SuperLink connection points at: the simulation engine (a ``:local:``
connection with ``options.num-supernodes``) or real SuperNodes (``flower-superlink`` and ``flower-supernode``
processes, over TLS). The run config (``[tool.flwr.app.config]``):

* ``config``: the experiment YAML; empty for the embedded default. Every machine reads it from its own disk, so
  give a path that exists on each (an absolute path, or one relative to the process's working directory).
* ``overrides``: ``key=value`` overrides separated by ``;`` (as ``--set`` on the secure-fed CLI).
* ``out``: the run directory the ServerApp writes (default ``runs/flwr-<run id>``); it must not hold a run.
* ``data-root``: the ServerApp's data root (default: the config's, else ``SECURE_FED_DATA``).
* ``resume``: ``true`` continues the run in ``out`` from its last checkpoint (give the same ``config`` and
  ``overrides``; ``training.rounds`` may grow); without it ``out`` must not hold a run.
* ``node-state-dir``: where each node keeps its clients' state between Flower runs when its node config names no
  ``state-dir`` (simulation: all nodes on one machine, a file per node).

Each SuperNode serves one partition: ``--node-config "partition-id=P num-partitions=N"`` (the simulation engine
sets both), and optionally ``data-root='/path'`` for its own data and ``state-dir='/path'`` for its own storage of
its clients' state (keys, secret streams, own models), which a resumed run takes up again. The experiment's
``flower.num_supernodes`` must equal N; client c lives on the node whose partition is c mod N. The ServerApp is the
same :class:`~secure_fed.engine.runner.Experiment` as ``secure-fed run --backend flower`` builds, and the ClientApp
the same as the simulation's (:func:`~secure_fed.engine.flower.client_app.client_app_of`), so the run writes the same
files.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from secure_fed.config import load_plan
from secure_fed.engine.flower.client_app import client_app_of, client_replica
from secure_fed.engine.flower.process_marks import NODE_STATE
from secure_fed.engine.flower.server import run_with_grid

log = logging.getLogger("secure_fed.flower")


def _text(run_config: dict[str, Any], key: str) -> str:
    return str(run_config.get(key, "") or "").strip()


def plan_from_run_config(run_config: dict[str, Any]):
    """The plan of the experiment config the run config names (``backend`` set to ``flower``)."""
    path = _text(run_config, "config") or None
    overrides = [o.strip() for o in _text(run_config, "overrides").split(";") if o.strip()]
    return load_plan(path, overrides=[*overrides, "backend=flower"])


def _data_root(value: str) -> str | None:
    return value or os.environ.get("SECURE_FED_DATA") or None


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Build the experiment from the run config and run it with its clients on the connected SuperNodes."""
    from secure_fed.engine.runner import Experiment
    from secure_fed.errors import SecureFedError
    from secure_fed.run_files import holds_checkpoint

    rc = dict(context.run_config)
    plan = plan_from_run_config(rc)
    out = Path(_text(rc, "out") or f"runs/flwr-{context.run_id}")
    resume = _text(rc, "resume").lower() in ("1", "true", "yes")
    held = holds_checkpoint(out)
    if held and not resume:
        raise SecureFedError(f"out={out} already holds a run; pass resume=true to continue it, or another out")
    exp = Experiment(plan, run_dir=out, data_root=_data_root(_text(rc, "data-root")))
    if resume:
        if not exp.resume():
            raise SecureFedError(f"resume=true: no checkpoint in {out}")
        log.warning("secure-fed: resuming %s from round %d", out, exp.round)
    nodes = plan.flower.num_supernodes or len(exp.fed.clients)
    result = run_with_grid(exp, grid, num_nodes=nodes, progress=False)
    log.warning("secure-fed: run %s %s in %s; final %s", context.run_id, result.summary["status"], out,
                result.summary.get("final"))  # fmt: skip


def _node_replica(context: Context):
    plan = plan_from_run_config(dict(context.run_config))
    root = _data_root(str(context.node_config.get("data-root", "") or ""))
    from secure_fed.engine.runner import Experiment

    return client_replica(plan.config_yaml, root, threads=1, run_class=Experiment, node_copy=True)  # one node per process


def _node_storage(context: Context) -> str | None:
    """The node's own storage for its clients' state: its node config's ``state-dir``, else its environment's
    ``SECURE_FED_NODE_STATE``, else the run config's ``node-state-dir``; None: the state lasts one Flower run."""
    return (
        str(context.node_config.get("state-dir", "") or "")
        or os.environ.get(NODE_STATE, "")
        or _text(dict(context.run_config), "node-state-dir")
        or None
    )


client_app = client_app_of(_node_replica, _node_storage)

__all__ = ["client_app", "plan_from_run_config", "server_app"]

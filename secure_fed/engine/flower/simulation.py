"""``Experiment.run`` on Flower's simulation engine (``backend: flower``); the checks here read the run's
:class:`~secure_fed.engine.run_context.RunContext`.

The server's :class:`~secure_fed.engine.runner.Experiment` is the one the caller built (so resume, checkpoints
and the run directory work as in process); Flower's simulation engine starts one SuperNode per partition
(``flower.num_supernodes``, default one per client) whose ClientApps run in Ray actors of ``flower.client_cpus``
CPUs each, and the ServerApp runs the rounds through them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

from secure_fed.engine.flower.run_checks import check_flower_start, client_side_callbacks, node_held_state
from secure_fed.threads import flower_cpus, usable_cpus


def node_storage_dir(run_dir) -> Path:
    """Where the simulated nodes keep their clients' state between Flower runs (each node its own file, as each
    device would on its own disk): beside the run directory, not in it (the server's files hold no client secret)."""
    run_dir = Path(run_dir).resolve()
    return run_dir.parent / f".{run_dir.name}-nodes"


def ray_cpus(nodes: int, client_cpus: float) -> int:
    """The CPUs the simulation gives Ray: those this process may run on, and no more than ``nodes`` ClientApps of
    ``client_cpus`` each use. Flower starts one actor per ``client_cpus`` of them up front, each loading torch and
    a copy of the run, so a 4-node run on a 64-core machine starts 4 actors, not 64."""
    return flower_cpus(nodes, client_cpus, usable_cpus())


def run_on_flower(exp, *, progress: bool | None, client_app=None):
    """Run ``exp`` with its clients on Flower's simulation engine; ``client_app`` replaces the project's ClientApp
    (tests use it to play a misbehaving client)."""
    from flwr.simulation import run_simulation

    from secure_fed.engine.flower.client_app import make_client_app
    from secure_fed.engine.flower.server import make_server_app

    check_flower_start(exp.context())
    f = exp.plan.flower
    nodes = f.num_supernodes or len(exp.fed.clients)
    outcome: dict = {}
    if client_app is None:
        client_app = make_client_app(exp.plan.config_yaml, exp.data_root, type(exp), threads=max(1, int(f.client_cpus)),
                                     state_dir=node_storage_dir(exp.run_dir))  # fmt: skip
    server_app = make_server_app(exp, outcome, num_nodes=nodes, progress=progress)
    cpus = ray_cpus(nodes, f.client_cpus)
    backend_config = {
        "client_resources": {"num_cpus": f.client_cpus, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False},
    }
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    # Flower's own errors still show; its notice that run_simulation is deprecated (in favour of `flwr run`, which
    # this back end does not use yet) and Ray's note on accelerator variables do not, on every run
    flwr_logger.setLevel(logging.ERROR)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    main_thread = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        run_simulation(server_app, client_app, num_supernodes=nodes, backend_config=backend_config)
    except SystemExit:
        # Ray's driver turns the SIGTERM of its own shutdown into SystemExit when the ServerApp stopped early (an
        # error, e.g. the guard's): the ServerApp's outcome says what happened
        if not outcome:
            raise
    finally:
        flwr_logger.setLevel(level)
        if main_thread:
            signal.signal(signal.SIGTERM, sigterm)  # ray.init installed its own handler in this process
    if "error" in outcome:
        raise outcome["error"]
    if "result" not in outcome:
        raise RuntimeError("the Flower simulation ended without running the ServerApp")
    return outcome["result"]


__all__ = [
    "check_flower_start", "client_side_callbacks", "node_held_state", "node_storage_dir", "ray_cpus", "run_on_flower"
]  # fmt: skip

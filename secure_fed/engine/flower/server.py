"""The Flower ``ServerApp`` side: a run (an :class:`~secure_fed.engine.runner.Experiment`, built by the caller)
driven through a :class:`~secure_fed.engine.flower.executor.FlowerExecutor` on the run's context, which it passes
in to the run."""

from __future__ import annotations

import os
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from secure_fed.engine.flower.executor import FlowerExecutor
from secure_fed.engine.flower.node_faults import sum_writer
from secure_fed.engine.flower.run_checks import check_flower_start


def run_with_grid(exp, grid: Grid, *, num_nodes: int, progress: bool | None):
    """Run ``exp``'s rounds with its clients on the nodes behind ``grid``: a :class:`FlowerExecutor` on the run's
    context, passed in to the run."""
    check_flower_start(exp.context())
    f = exp.plan.flower
    if exp.records.flower_session is None:  # a new run: a fresh public name for it (a resumed run keeps its own)
        exp.records.flower_session = os.urandom(16).hex()
    executor = FlowerExecutor(
        grid, exp.context(), max_in_flight=f.max_in_flight, timeout_s=f.timeout_s, stage_timeout_s=f.stage_timeout_s
    )
    executor.discover(len(exp.fed.clients), num_nodes)
    if f.debug_write_inputs:  # test only: each secure sum's unmasked total into private/ (a layer with the hook)
        for layer in exp.stack.layers if exp.stack else []:
            if hasattr(layer, "on_unmasked"):
                layer.on_unmasked = sum_writer(exp.run_dir)
    return exp.run_rounds(progress=progress, executor=executor)


def make_server_app(exp, outcome: dict[str, Any], *, num_nodes: int, progress: bool | None) -> ServerApp:
    """The ServerApp that runs ``exp`` (built by the caller, in this process) with its clients on Flower."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            outcome["result"] = run_with_grid(exp, grid, num_nodes=num_nodes, progress=progress)
        except BaseException as e:  # handed to the caller, which raises it in its own thread
            outcome["error"] = e

    return app


__all__ = ["make_server_app", "run_with_grid"]

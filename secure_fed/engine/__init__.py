"""The round engine: message-based client/server separation, server optimisers, checkpoints."""

from secure_fed.engine.guard import MessageGuard
from secure_fed.engine.runner import Experiment, RunResult
from secure_fed.engine.sampling import sample_clients
from secure_fed.engine.server_optimizers import ServerOptimizer

__all__ = ["Experiment", "MessageGuard", "RunResult", "ServerOptimizer", "sample_clients"]

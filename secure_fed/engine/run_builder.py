"""Build a run's parts from its plan (:class:`~secure_fed.plan.RunPlan`): :func:`build_run`.

The parts (:class:`RunParts`): the data and the clients (the federation), the algorithm, the model state (θ, W,
the server's model module, the server optimisers), the clients' working model and local trainer, the guard and the
link to the clients (with the executor), the protocol stack (the aggregation session factory), the row order, the
records, and the callbacks (built-in, registered, checkpoint, report). The run object
(:class:`~secure_fed.engine.runner.Experiment`) takes them as they are; nothing here runs a round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.data.from_config import build_dataset
from secure_fed.engine.allocator import give_back_freed_memory, keep_freed_memory
from secure_fed.engine.builders import (
    build_algorithm,
    build_federation,
    build_model,
    resolve_device,
    use_deterministic_cuda,
)
from secure_fed.engine.callbacks import Callback, TensorBoardLog, build_callbacks
from secure_fed.engine.checkpoints import Checkpointing
from secure_fed.engine.client_link import ClientLink
from secure_fed.engine.evaluation import ClientEvaluation, Evaluation
from secure_fed.engine.executors import EXECUTORS
from secure_fed.engine.guard import MessageGuard
from secure_fed.engine.layers import ProtocolStack, StackEnv
from secure_fed.engine.model_state import ModelState
from secure_fed.engine.privacy_record import PrivacyRecord
from secure_fed.engine.row_order import RowOrder, client_rows, clients_per_row
from secure_fed.engine.run_records import RunRecords
from secure_fed.engine.run_summaries import MetricsFiles, RunReport
from secure_fed.engine.server_optimizers import ServerOptimizer
from secure_fed.errors import ConfigError
from secure_fed.hardware import warn_emulated_bf16
from secure_fed.memory import check_memory, plan_memory
from secure_fed.messages import FullTable, Params, Rules
from secure_fed.model_choices import resolve_client_choices, resolve_run_choices
from secure_fed.models.families import model_family
from secure_fed.models.sparse_rows import SparseRows, column_major
from secure_fed.plan import RunPlan
from secure_fed.plugin_specs import dense_update_layers, instance_bound, layer_specs
from secure_fed.update_forms import deferred_refusal


@dataclass
class RunParts:
    """Everything a run is made of (see the module docstring)."""

    plan: RunPlan
    run_dir: Path
    data_root: str | None
    device: torch.device
    dataset: Any
    algorithm: Any
    memory: Any  #: the memory plan the run was checked against (:mod:`secure_fed.memory`)
    fed: Any
    model: ModelState
    worker: torch.nn.Module  #: the clients' working model
    trainer: LocalTrainer
    local: LocalTraining
    messages: list[dict[str, Any]] | None
    guard: MessageGuard
    stack_env: StackEnv
    stack: ProtocolStack
    row_order: RowOrder
    link: ClientLink
    records: RunRecords
    callbacks: list[Callback]


def declared_message_rules(plan: RunPlan, algorithm, *, row_sparse: bool = False, deferred: bool = False) -> tuple[Rules, Rules]:
    """The keys the guard allows, with their rules: the algorithm's, plus those of the layers this run lists.
    Without ``row_sparse`` (a run whose updates must be dense) a θ update may not carry touched columns; without
    ``deferred``, it may not be a deferred update."""
    specs = layer_specs()
    down, up = dict(algorithm.downlink_rules), dict(algorithm.uplink_rules)
    for key, rule in up.items():
        if isinstance(rule, Params) and (rule.row_sparse and not row_sparse or rule.deferred and not deferred):
            up[key] = dataclasses.replace(rule, row_sparse=rule.row_sparse and row_sparse, deferred=rule.deferred and deferred)
    for name in plan.protocols:
        down.update(specs[name].downlink_rules)
        up.update(specs[name].uplink_rules)
    return down, up


def build_run(
    plan: RunPlan,
    run_dir: str | Path,
    data_root: str | None = None,
    dataset: Any = None,
    callbacks: Any = (),
    *,
    node_copy: bool = False,
) -> RunParts:
    """A run's parts for ``plan``, writing into ``run_dir``; ``dataset`` (a :class:`~secure_fed.data.MultiLabelDataset`)
    replaces the configured one (shadow runs); ``callbacks`` are the caller's own (the Python API's), run with the
    registered ones. ``node_copy``: the parts are a Flower node's copy of the run (client code only, one of many
    such processes on a machine): the clients' rows are made when read
    (:func:`~secure_fed.engine.builders.build_federation`'s ``rows_on_read``), and the process gives freed memory back
    (:func:`~secure_fed.engine.allocator.give_back_freed_memory`) instead of keeping up to 1 GiB of it
    (:func:`~secure_fed.engine.allocator.keep_freed_memory`). A run that cannot fit in memory stops before anything is built. The
    parts hold ``plan`` with every ``auto`` resolved (:func:`~secure_fed.model_choices.resolve_run_choices`,
    :func:`~secure_fed.model_choices.resolve_client_choices`), its ``config_yaml`` as given."""
    if not isinstance(plan, RunPlan):  # the config object stays in the config package (issue 54)
        raise TypeError(f"a run takes a RunPlan (secure_fed.config.build_plan(config)), not {type(plan).__name__}")
    # a round's large tensors reuse freed memory instead of faulting pages in anew; a node's copy gives it back
    give_back_freed_memory() if node_copy else keep_freed_memory()
    run_dir = Path(run_dir)
    device = resolve_device(plan.device)
    if device.type == "cuda":
        use_deterministic_cuda()  # runs resume exactly: no atomic-add sums whose order varies
    dataset = dataset if dataset is not None else build_dataset(plan, data_root)
    if plan.training.precision == "bf16":  # an explicit bf16 on a device that emulates it: one warning line
        warn_emulated_bf16(device.type)
    algorithm = build_algorithm(plan, device)  # it reads the algorithm's parameters and the model family alone
    # every ``auto`` the data and the device decide, decided once (the clients' loss as the algorithm took it): the
    # run and all it builds hold this plan
    plan = resolve_run_choices(plan, dataset, device.type, loss=algorithm.client_loss)
    algorithm.cfg = plan.algorithm  # the same parameters, algorithm.loss resolved
    memory = plan_memory(plan, dataset, device)
    check_memory(memory)  # a run that cannot fit stops here: nothing built, nothing written
    fed = build_federation(plan, dataset, type(algorithm), device, bound=instance_bound(plan), rows_on_read=node_copy)
    family = model_family(plan.model.family)
    C, d = dataset.num_labels, plan.model.embedding_dim
    # the simulator's copy of the server's model (θ; with FedLGT's label embeddings, computed like a client's from
    # the public names, only for scoring) and the clients' working model
    encoder = build_model(plan, dataset, cache_dir=run_dir / "cache").to(device)
    worker = build_model(plan, dataset, cache_dir=run_dir / "cache").to(device)
    if isinstance(fed.x_test, SparseRows):  # sparse rows: the first layer's weight stored as an (in, out) table
        column_major(encoder)
        column_major(worker)
    theta = {n: p.detach().clone() for n, p in encoder.named_parameters()}  # clones keep the layout
    W = family.init_rows(C, d, generator=torch.Generator().manual_seed(plan.seed * 104729 + 1))
    # one optimiser for θ, one for W rows (used when server_optimizer.apply_to_rows is set); non-trainable θ entries
    # (batch-norm running statistics) take the clients' mean under every optimiser
    opt_args = asdict(plan.training.server_optimizer)
    del opt_args["apply_to_rows"]
    frozen = frozenset(n for n, p in encoder.named_parameters() if not p.requires_grad)
    model = ModelState(theta, None if W is None else W.to(device), encoder, family,
                       ServerOptimizer(**opt_args, averaged=frozen), ServerOptimizer(**opt_args))  # fmt: skip
    messages: list[dict[str, Any]] | None = [] if plan.output.log_messages else None
    # a plaintext update of a sparse-input table as the columns the client touched, where every layer takes it;
    # a batched group's updates deferred (:mod:`secure_fed.update_forms`) where nothing refuses it
    dense = dense_update_layers(plan)
    row_sparse = isinstance(fed.x_test, SparseRows) and plan.training.sparse_updates is True and not dense
    registered = [*build_callbacks(plan), *callbacks]
    names = [type(cb).__name__ for cb in registered]
    if plan.training.deferred_updates is True and registered:
        raise ConfigError(deferred_refusal(plan, dense_layers=(), callbacks=names))
    # the ``auto`` choices the clients and the callbacks decide (threads, deferred updates), decided once
    plan = resolve_client_choices(plan, num_clients=len(fed.clients), dense_layers=dense, callbacks=names,
                                  ceiling=torch.get_num_threads())  # fmt: skip
    deferred = plan.training.deferred_updates is True
    down, up = declared_message_rules(plan, algorithm, row_sparse=row_sparse, deferred=deferred)
    guard = MessageGuard(shapes=model.tensor_shapes(), visibility=algorithm.visibility, client_rows=client_rows(fed),
                         down_rules=down, up_rules=up, log=messages)  # fmt: skip
    link: ClientLink | None = None  # the layers' exchanges go through it once it is built, below

    def call_clients(cids, payload_fn, client_fn, partial=False):
        return link.query(list(cids), payload_fn, client_fn, partial=partial)

    env = StackEnv(
        num_clients=len(fed.clients), clients_per_row=clients_per_row(fed, C), num_labels=C, embedding_dim=d,
        theta=model.theta, device=device, seed=plan.seed, max_clients_per_instance=fed.max_clients_per_instance,
        has_rows=model.W is not None, full_table_keys=tuple(k for k, rule in up.items() if isinstance(rule, FullTable)),
        call_clients=call_clients,
    )  # fmt: skip
    stack = ProtocolStack(plan, env)
    stack.wrap_algorithm(algorithm)
    trainer = LocalTrainer(worker, family)
    trainer.row_sparse_updates = row_sparse
    trainer.deferred_updates = deferred
    t = plan.training
    local = LocalTraining(epochs=t.local_epochs, batch_size=t.batch_size, lr=t.client_lr, optimizer=t.client_optimizer,
                          momentum=t.client_momentum, weight_decay=t.weight_decay,
                          precision=plan.training.precision)  # fmt: skip
    # the built-in callbacks, then the registered ones (``secure_fed.callbacks`` entry points, e.g. the attack taps of
    # threat_models), then the checkpoint (which saves what the callbacks before it keep) and the summaries
    callbacks: list[Callback] = [
        Evaluation(), ClientEvaluation(), PrivacyRecord(), MetricsFiles(),
        *([TensorBoardLog()] if plan.output.tensorboard else []), *registered, Checkpointing(), RunReport(),
    ]  # fmt: skip
    link = ClientLink(guard, fed, EXECUTORS[plan.training.executor].from_config(plan.training))
    trainer.batching = link.executor.batching  # the vectorised executor's: it trains a chunk's clients together
    return RunParts(plan, run_dir, data_root, device, dataset, algorithm, memory, fed, model, worker, trainer, local,
                    messages, guard, env, stack, RowOrder(fed, C, guard, env), link, RunRecords(), callbacks)  # fmt: skip

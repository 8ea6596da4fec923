"""The round engine: one process simulates server and clients through a guarded channel.

A run is made of parts, built from its plan (:class:`~secure_fed.plan.RunPlan`) by
:func:`~secure_fed.engine.run_builder.build_run`:

* the model state (:class:`~secure_fed.engine.model_state.ModelState`): θ (every client gets it whole), the row
  table W when the model family keeps one (each client gets only its own rows), the server optimisers;
* the clients' data (the federation), the algorithm, the clients' working model and local trainer;
* the guarded link to the clients (:class:`~secure_fed.engine.client_link.ClientLink`: the
  :class:`~secure_fed.engine.guard.MessageGuard`, which checks every message against the algorithm's and the
  layers' declarations, and the executor), the protocol stack (which opens each round's aggregation session),
  the row order, the records (:class:`~secure_fed.engine.run_records.RunRecords`);
* the callbacks, each with its own state, reading the run through a
  :class:`~secure_fed.engine.run_context.RunContext`: evaluation, the privacy record, metrics files, registered
  plugins (attack taps), the checkpoint, the summaries.

The run object, :class:`Experiment`, owns the round loop. Per round: the layers may stop the run (budget) →
sample the cohort → each client's payload (the algorithm's ``downlink``, checked) → the client function, wrapped
by callbacks, layers and the round's aggregation session, run by the executor → the session's aggregate (layers:
unmask, decrypt, noise) → server optimiser on θ, rows written back and projected by the family → the algorithm's
server step → callbacks (evaluation, privacy record, metrics files, attack taps, checkpoint, progress). At the end:
``on_run_end`` (last records, files, ``last.pt``), then ``on_release`` (the released model, ``final.pt``, the
summaries). The README's architecture table shows the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from secure_fed.algorithms import SetupContext
from secure_fed.engine.aggregation import RoundSession
from secure_fed.engine.callbacks import Callback, ProgressBar
from secure_fed.engine.checkpoint_commit import lock_run_dir
from secure_fed.engine.collector import long_lived_frozen
from secure_fed.engine.evaluation import evaluate, evaluation_scores
from secure_fed.engine.execution import ClientJob, Executor
from secure_fed.engine.layers import ProtocolSetup
from secure_fed.engine.run_builder import build_run
from secure_fed.engine.run_context import RunContext
from secure_fed.engine.run_records import RunRecords
from secure_fed.engine.sampling import client_seed, cohort_size, sample_clients
from secure_fed.errors import RoundAborted
from secure_fed.io import check_writable_dir
from secure_fed.plan import RunPlan
from secure_fed.progress import phase
from secure_fed.release import public
from secure_fed.run_files import CONFIG_FILE, METRICS_FILE, PRIVACY_RECORD, operator_config_path, released_config_path
from secure_fed.run_status import COMPLETED, COMPLETED_WITH_ABORTS
from secure_fed.threads import run_threads

#: why a round's number may be released
ROUND_WHY = "the round counter: public (the loop's, as the ledger's steps)"
#: why the released config may be released (:func:`secure_fed.release.public`)
CONFIG_WHY = "the run's config, less every setting its section marks secret (secure_fed.secret_settings)"


def tagged_config(public_doc: dict[str, Any]) -> dict[str, Any]:
    """The released config, tagged for the release gate: each section public (:data:`CONFIG_WHY`)."""
    return {section: public(value, CONFIG_WHY) for section, value in public_doc.items()}


def write_run_config(run_dir: Path, plan: RunPlan, records: RunRecords) -> None:
    """The run's two configs: the operator's, whole (``private/config.yaml``: what a resume reads), and the released
    one, less every setting its section marks secret (``config.yaml``: :mod:`secure_fed.secret_settings`, as
    ``secure-fed export`` strips them), through the release gate (``records.release``: an untagged field makes the
    run's ε ∞)."""
    import yaml

    from secure_fed.config import config_secret_paths
    from secure_fed.secret_settings import without_secrets

    text = plan.config_yaml
    operator_config_path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    operator_config_path(run_dir).write_text(text)
    public_doc = without_secrets(yaml.safe_load(text), config_secret_paths())
    released = records.release(tagged_config(public_doc), CONFIG_FILE)
    released_config_path(run_dir).write_text(yaml.safe_dump(released, sort_keys=False))


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None
    #: private/summary.json: timing, setup facts and other statistics of private data (the operator's only)
    private: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, Any]:
        """The released model's test metrics (``summary.json``'s ``final``)."""
        return self.summary.get("final", {})

    @property
    def privacy(self) -> dict[str, Any]:
        """The released privacy report: ε, δ, the unit and, per adversary, what each ε holds against."""
        return self.summary.get(PRIVACY_RECORD, {})

    @property
    def status(self) -> str:
        return self.summary.get("status", "")


class _Part:
    """An attribute of the run object kept in one of its parts (``"model.theta"``): read and set there."""

    def __init__(self, path: str):
        self.part, self.attr = path.split(".")

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(getattr(obj, self.part), self.attr)

    def __set__(self, obj, value) -> None:
        setattr(getattr(obj, self.part), self.attr, value)


class Experiment:
    """A configured run: its parts (:func:`~secure_fed.engine.run_builder.build_run`) and the round loop. ``run()``
    trains, evaluates, checkpoints and writes the run directory (through the callbacks)."""

    theta, W, encoder, family = _Part("model.theta"), _Part("model.W"), _Part("model.encoder"), _Part("model.family")
    server_opt, row_opt = _Part("model.server_opt"), _Part("model.row_opt")
    round, history, diagnostics = _Part("records.round"), _Part("records.history"), _Part("records.diagnostics")
    rounds_aborted, stop_reason = _Part("records.rounds_aborted"), _Part("records.stop_reason")
    setup_facts, flower_session = _Part("records.setup_facts"), _Part("records.flower_session")
    label_perm, executor = _Part("row_order.perm"), _Part("link.executor")

    def __init__(self, plan: RunPlan, *, run_dir: str | Path, data_root: str | None = None, dataset: Any = None,
                 callbacks: Any = (), node_copy: bool = False):  # fmt: skip
        """``plan``: the run's plan (:func:`secure_fed.config.load_plan`, :func:`~secure_fed.config.build_plan`); ``dataset``
        (a :class:`~secure_fed.data.MultiLabelDataset`) replaces the configured one (shadow runs); ``callbacks``: the
        caller's own, run with the registered ones; ``node_copy``: this object is a Flower node's copy of the run, which
        runs client code only (each client's rows made when read, freed memory given back:
        :func:`~secure_fed.engine.run_builder.build_run`)."""
        parts = build_run(plan, run_dir, data_root, dataset, callbacks, node_copy=node_copy)
        for f in fields(parts):
            setattr(self, f.name, getattr(parts, f.name))
        for cb in self.callbacks:
            cb.on_init(self.context())

    def context(self, callbacks: list[Callback] | None = None) -> RunContext:
        """What the callbacks read of the run now (:class:`~secure_fed.engine.run_context.RunContext`)."""
        return RunContext(
            plan=self.plan, run_dir=self.run_dir, device=self.device, dataset=self.dataset, fed=self.fed,
            algorithm=self.algorithm, stack=self.stack, model=self.model, records=self.records,
            row_order=self.row_order, guard=self.guard, executor=self.executor, messages=self.messages,
            callbacks=tuple(self.callbacks if callbacks is None else callbacks),
        )  # fmt: skip

    def callback(self, name: str) -> Callback | None:
        """The callback registered under ``name`` in this run, if any."""
        return self.context().callback(name)

    # ----------------------------------------------------------------- the parts' operations, on the run's state
    def evaluate(self, split: str = "test") -> dict[str, float]:
        return evaluate(self.model, self.fed, self.plan.evaluation, split)

    def model_scores(self, theta: dict[str, torch.Tensor], x, *, centred: bool = True) -> np.ndarray:
        """The (n, C) scores the run's ranking metrics read (``evaluation.center_scores`` applied), or with
        ``centred=False`` those its threshold metrics read."""
        return evaluation_scores(self.model, theta, x, self.plan.evaluation, centred=centred)

    def privacy_summary(self) -> dict[str, Any]:
        return self.context().privacy_summary()

    def state_dict(self) -> dict[str, Any]:
        return self.callback("checkpointing").server_state(self.context())

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.callback("checkpointing").load_server_state(self.context(), sd)

    def save_checkpoint(self, name: str = "last.pt", *, side_files: bool = True) -> Path:
        return self.callback("checkpointing").save(self.context(), name, side_files=side_files)

    def resume(self) -> bool:
        """Load ``private/checkpoints/last.pt`` if present (:meth:`~secure_fed.engine.checkpoints.Checkpointing.resume`)."""
        return self.callback("checkpointing").resume(self.context())

    def apply_row_order(self, perm) -> None:
        self.row_order.apply(perm)

    def _exchange(self, cid: int, payload: dict, client_fn) -> dict:
        return self.link.exchange(cid, payload, client_fn)

    # ----------------------------------------------------------------- rounds
    def setup(self) -> None:
        if self.setup_facts is not None:
            return
        facts = {}
        if self.stack:  # the layers' one-off protocols (key agreement, row order): their elapsed time past 5 s
            ctx = ProtocolSetup(query=self.link.query_all, query_one=self.link.query_one, clients=self.fed.clients,
                                label_names=list(self.dataset.label_names))  # fmt: skip
            with phase("protocol setup"):
                facts = self.stack.setup(ctx, on_row_order=self.row_order.apply)
        query = self.stack.wrap_query(self.link.query_all)
        for cb in self.callbacks:
            query = cb.wrap_setup_query(query)
        ctx = SetupContext(query=query, num_labels=self.dataset.num_labels, W=self.W, device=self.device,
                           num_clients=len(self.fed.clients), theta=self.theta)  # fmt: skip
        with phase(f"{self.algorithm.name} setup"):  # e.g. label-set collection and index builds
            self.setup_facts = {**self.algorithm.setup(ctx), **facts}

    def train_round(self) -> dict[str, Any]:
        """One round; a round a protocol aborts (:class:`RoundAborted`) changes nothing and is logged."""
        try:
            return self._train_round()
        except RoundAborted as e:
            self.round += 1
            self.rounds_aborted += 1
            return {"train_loss": float("nan"), "clients": 0, "aborted": str(e)}

    def _client_jobs(self, session: RoundSession):
        """The round's client jobs, built lazily: payload, and the client function wrapped innermost-first by the
        callbacks (canaries), the layers (clip, noise share) and the session (mask, encrypt)."""
        plan = tuple(session.client_plan()) if self.executor.remote else ()
        if plan:  # what every honest node will check: a layer whose session builds its plan another way is a bug here
            try:
                self.stack.check_client_plan(list(plan), round_idx=self.round)
            except PermissionError as e:
                raise RuntimeError(f"this run's own client plan would be refused by its nodes ({e}); a layer's session "
                                   "must build its steps with the layer's client_plan_steps") from None  # fmt: skip
        for cid in session.cohort:
            client = self.fed.clients[cid]
            payload = self.algorithm.downlink(self.theta, self.W, client.known_labels.to(self.device))
            fn = session.client_mod(self.stack.client_mod(self.client_fn(int(cid))))
            yield ClientJob(int(cid), payload, fn, plan)

    def client_fn(self, cid: int):
        """Client ``cid``'s training function in this round, client side: local training (DP-SGD when a layer gives
        a privatizer, from the client's own secret) inside the algorithm's ``client_update``, its plaintext reply
        checked against the algorithm's declarations, wrapped by the callbacks' client mods. A remote client
        (``backend: flower``) builds the same function from its own copy of the run."""
        round_idx = self.round
        gen = torch.Generator().manual_seed(client_seed(self.plan.seed, round_idx, cid))

        def train(p, d):
            priv = self.stack.local_privatizer(cid, round_idx)  # client side: DP-SGD from the client's secret
            if priv is not None:
                for cb in self.callbacks:
                    priv = cb.wrap_privatizer(cid, round_idx, priv)
            objective = self.algorithm.client_objective(p, d)  # client side: the algorithm's hooks into training
            reply = self.algorithm.client_update(p, d, lambda q: self.trainer.update(q, d, self.local, gen, priv, objective))
            self.guard.check_up(cid, reply, record=False)  # the client's own update, before any protocol
            return reply

        for cb in self.callbacks:
            train = cb.client_mod(train)
        return train

    def _train_round(self) -> dict[str, Any]:
        plan, algo, t = self.plan, self.algorithm, self.plan.training
        sizes = np.array([c.num_examples for c in self.fed.clients], dtype=float)
        secret = self.stack.cohort_uniforms(self.round, len(sizes))
        chosen = sample_clients(sizes, t.client_fraction, t.sampling, plan.seed, self.round, secret,
                                size=cohort_size(t, len(sizes)))  # fmt: skip
        base = RoundSession(cohort=[int(c) for c in chosen], theta=self.theta, W=self.W, weighting=t.aggregation)
        session = self.stack.open_round(self.round, base)
        channel = self.link.channel(self.round, self.callbacks, session.drop)
        for cid, wire in self.executor.run(self._client_jobs(session), channel):
            session.submit(cid, wire)
            del wire  # not held while the executor trains the next clients (a deferred update holds its group)
        dropped = len(session.dropped)
        agg = session.finish()
        for cb in self.callbacks:
            cb.on_aggregate(self.round, list(session.cohort), agg)
        if agg.num_clients > 0 or agg.theta_denominator is not None:
            if algo.reads_aggregate:  # server state derived from the released mean and a public count (DP: q·N)
                count = agg.num_clients if agg.theta_denominator is None else agg.theta_denominator
                algo.server_aggregate(agg.theta_mean(), count)
            self.model.apply(agg, trains_rows=algo.trains_rows, rows_by_optimizer=t.server_optimizer.apply_to_rows)
        labels = [self.fed.clients[int(c)].known_labels for c in session.cohort if int(c) not in session.dropped]
        loss = agg.loss_sum / agg.num_clients if agg.num_clients else float("nan")
        num_clients = agg.num_clients
        del agg, session, base  # the round's sums (a copy of θ) are not needed by the server step
        if labels:
            participating = torch.unique(torch.cat(labels)).to(self.device)
        else:  # an empty cohort (an empty draw, or every client dropped): no class took part
            participating = torch.zeros(0, dtype=torch.long, device=self.device)
        stats = algo.server_step(self.W, self.round, participating)
        self.stack.after_round(self.round)
        self.round += 1
        extra = {"clients_dropped": dropped} if dropped else {}
        return {"train_loss": loss, "clients": num_clients, **extra, **stats, **self.stack.round_stats()}

    def run(self, *, progress: bool | None = None) -> RunResult:
        """Train from the current round to ``training.rounds`` (or a budget stop), then write the final files: in
        this process, or with the clients on Flower nodes (``backend: flower``); torch's threads meanwhile are what
        ``training.threads`` picks (:func:`secure_fed.threads.run_threads`), as before afterwards."""
        with run_threads(self.plan, len(self.fed.clients)) as picked:
            self.records.threads = picked
            if self.plan.backend == "flower":
                from secure_fed.engine.flower.simulation import run_on_flower

                return run_on_flower(self, progress=progress)
            return self.run_rounds(progress=progress)

    def run_rounds(self, *, progress: bool | None = None, executor: Executor | None = None) -> RunResult:
        """Train from the current round to ``training.rounds`` (or a budget stop), then write the final files; the
        run directory is locked meanwhile (:func:`lock_run_dir`: a second process is refused, not interleaved).
        ``executor`` replaces the configured one for the run (the Flower back end passes its own).

        Each round: the protocol layers may stop the run (budget), :meth:`train_round` runs it, then every
        callback adds to the round's records (``on_record``: evaluation, the privacy report) and sees them
        complete (``on_round_end``: metrics files, attack taps, checkpoint, progress bar)."""
        if executor is not None:
            self.link.executor = executor
            self.trainer.batching = executor.batching
        check_writable_dir(self.run_dir)
        with lock_run_dir(self.run_dir):
            return self._run_rounds(progress)

    def _train_rounds(self, callbacks: list[Callback]) -> str:
        """Train from the current round to ``training.rounds``, each round's records through ``callbacks``; returns
        how the loop ended: ``completed`` (``completed_with_aborts`` once the caller counts aborted rounds),
        ``budget_exhausted`` (a layer stopped it) or ``diverged``."""
        ctx = self.context(callbacks)
        while self.round < self.plan.training.rounds:
            if (why := self.stack.budget_stop(self.round)) is not None:
                self.stop_reason = why
                return "budget_exhausted"
            stats = self.train_round()
            diag = {"round": self.round, **stats}
            if not self.model.finite():
                self.stop_reason = (f"training diverged in round {self.round}: θ or W became non-finite (lower the "
                                    "learning rates or the regulariser's step)")  # fmt: skip
                self.diagnostics.append(diag)  # kept in private/diagnostics.jsonl; no checkpoint of NaNs
                return "diverged"
            tagged: dict[str, Any] = {"round": public(self.round, ROUND_WHY)}
            for cb in callbacks:  # each adds tagged values (secure_fed.release)
                cb.on_record(ctx, tagged, diag)
            rec = self.records.release(tagged, METRICS_FILE)  # the release gate: the line as metrics.jsonl holds it
            diag["wall_seconds"] = self.records.elapsed()
            self.history.append(rec)
            self.diagnostics.append(diag)
            for cb in callbacks:
                cb.on_round_end(ctx, rec, diag)
        return "completed"

    def _run_rounds(self, progress: bool | None) -> RunResult:
        write_run_config(self.run_dir, self.plan, self.records)
        progress = self.plan.output.progress if progress is None else progress
        callbacks = [*self.callbacks, *([ProgressBar()] if progress else [])]
        self.records.restart_clock()
        self.setup()
        ctx = self.context(callbacks)
        for cb in callbacks:
            cb.on_run_start(ctx)
        try:
            with long_lived_frozen():  # the run's data, models and libraries: out of the collector's full scans
                status = self._train_rounds(callbacks)
        except KeyboardInterrupt:
            status = "interrupted"
        if status == "completed" and self.round > 0 and self.rounds_aborted >= self.round:
            status = "failed"
            self.stop_reason = (f"no round completed: all {self.round} rounds aborted (a protocol could not finish "
                                "them; the reasons are in private/diagnostics.jsonl)")  # fmt: skip
        elif status == COMPLETED and self.rounds_aborted:  # finished, but not every round was applied
            status = COMPLETED_WITH_ABORTS
        for cb in callbacks:  # the last records and files, then last.pt
            cb.on_run_end(ctx, status)
        for cb in callbacks:  # the released model, final.pt, the summaries
            cb.on_release(ctx, status)
        report = self.callback("run_report")
        return RunResult(self.run_dir, report.summary, self.history, self.messages, report.private)

"""Client-side code: pure functions of (payload received, the client's own data).

These functions never see the server's state or another client's data, so a
Flower ``ClientApp`` (or any transport) can host them unchanged.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from secure_fed.algorithms.base import ClientData, Payload
from secure_fed.algorithms.instance_keys import instance_keys
from secure_fed.algorithms.label_sets import TOKENIZERS
from secure_fed.algorithms.losses import LOSSES
from secure_fed.algorithms.objective import ClientObjective, ObjectiveContext
from secure_fed.algorithms.per_sample import (
    Encoded,
    GradientPrivatizer,
    clipped_sum_linear,
    forbid_batch_norm,
    linear_only,
    per_sample_gradients,
)
from secure_fed.client_functions import client_function
from secure_fed.errors import SecureFedError
from secure_fed.models.families import CosineEmbedding, ModelFamily
from secure_fed.models.sparse_rows import RowSparseDelta, SparseInputLinear, SparseRows, set_fused_sgd


@dataclass(frozen=True, kw_only=True)
class LocalTraining:
    """Local optimisation settings (sent by the server as plain numbers)."""

    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.01
    optimizer: str = "sgd"  # sgd | adam
    momentum: float = 0.0
    weight_decay: float = 0.0
    precision: str = "fp32"  # fp32 | bf16 (autocast of the encoder; weights and updates stay fp32)


class Batching(Protocol):
    """Where a trainer hands a client's training to be done with other clients' (the vectorised executor's,
    :mod:`secure_fed.engine.vectorized`); given to the trainer explicitly (:attr:`LocalTrainer.batching`)."""

    def submit(
        self,
        trainer: LocalTrainer,
        payload: Payload,
        data: ClientData,
        hp: LocalTraining,
        generator: torch.Generator,
        privatizer: GradientPrivatizer | None,
        objective: ClientObjective | None = None,
    ) -> Payload:
        """The client's update: trained with the other clients' requests, or at once (``trainer.update_one``)."""


class LocalTrainer:
    """Runs local training for one client at a time on a reusable working model.

    ``model`` is a worker-local copy of the encoder; its weights are overwritten
    from each payload, so nothing leaks from one client's update to the next.
    """

    def __init__(self, model: nn.Module, family: ModelFamily | None = None, *, batching: Batching | None = None):
        """``family`` says how the model scores (default: the positive-only papers' f = W·g_θ); ``batching``: where
        :meth:`update` hands its requests (the vectorised executor's), None to train each at once."""
        self.model = model
        self.family = family if family is not None else CosineEmbedding()
        self.names = [n for n, _ in model.named_parameters()]
        #: set by the engine from its executor (``Executor.batching``): the vectorised executor trains the requests of a
        #: chunk's clients together; None: :meth:`update` trains at once
        self.batching = batching
        #: dropout draws from torch's global generator; such a model gets it seeded from the client's own generator
        #: for each update (exact resume, and a run does not depend on what else the process did)
        self.has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())
        #: DP-SGD without per-sample gradients (ghost norms) when every trainable parameter is a linear layer's
        self.linear_fast_path = linear_only(model) and (self.family.name in ("embedding", "linear_head"))
        #: the weights of the model's sparse-input layers (their updates may travel as touched columns)
        self.sparse_tables = frozenset(
            f"{mn}.weight" if mn else "weight" for mn, m in model.named_modules() if isinstance(m, SparseInputLinear)
        )
        #: set by the engine (``training.sparse_updates``): on sparse rows under plain SGD, an update of a sparse-input
        #: table is a :class:`RowSparseDelta` over the columns the client's rows touch, not a dense tensor
        self.row_sparse_updates = False
        #: set by the engine (``training.deferred_updates``): under the vectorised executor, a batched group's
        #: Linear weight updates are :class:`~secure_fed.models.group_updates.DeferredDelta` (formed when read)
        self.deferred_updates = False
        #: sparse-input tables the working model holds exactly as the θ tensor of this key (a weak reference and its
        #: version counter): after a row-sparse update the trainer restores the touched columns, so the next client of
        #: the round loads nothing but the small parameters (an XC table is ~0.4 GB)
        self._clean: dict[str, tuple[weakref.ref, int]] = {}

    @torch.no_grad()
    def _load(self, theta: dict[str, torch.Tensor]) -> None:
        clean, self._clean = self._clean, {}
        for n, p in self.model.named_parameters():
            ref = clean.get(n)
            if ref is not None and ref[0]() is theta[n] and ref[1] == theta[n]._version:
                continue  # the working table already equals this θ tensor, unchanged since
            p.copy_(theta[n])

    def update(
        self,
        payload: Payload,
        data: ClientData,
        hp: LocalTraining,
        generator: torch.Generator,
        privatizer: GradientPrivatizer | None = None,
        objective: ClientObjective | None = None,
    ) -> Payload:
        """One client's local update; returns deltas for θ and its own rows (when it received rows).

        With a ``privatizer`` (DP-SGD in client training, from a protocol layer) each step's batch is the one it
        samples and the gradient is the one it returns from the per-sample gradients (clipped, noised).

        With a :attr:`batching` (the vectorised executor's) the request goes there, which trains it with the round's
        other clients (same result up to floating-point reassociation) or, where it cannot, calls :meth:`update_one`.

        ``objective``: the algorithm's hooks into the client's training (:mod:`secure_fed.algorithms.objective`), on
        every path."""
        if self.batching is not None:
            # the client's rows read once (shared storage gathers them on each read; the group indexes them every step)
            return self.batching.submit(self, payload, data.with_rows_read(), hp, generator, privatizer, objective)
        return self.update_one(payload, data, hp, generator, privatizer, objective)

    def update_one(
        self,
        payload: Payload,
        data: ClientData,
        hp: LocalTraining,
        generator: torch.Generator,
        privatizer: GradientPrivatizer | None = None,
        objective: ClientObjective | None = None,
    ) -> Payload:
        """One client's local update on the working model (the reference trainer)."""
        data = data.with_rows_read()
        if privatizer is not None:
            forbid_batch_norm(self.model)
        ctx = begin_objective(objective, payload, data, hp, privatizer) if objective is not None else None
        if not self.has_dropout:
            reply = self._update(payload, data, hp, generator, privatizer, objective, ctx)
        else:
            seed = int(torch.randint(2**62, (1,), generator=generator))
            devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
            with torch.random.fork_rng(devices=devices):  # torch.manual_seed reseeds every device's generator
                torch.manual_seed(seed)
                reply = self._update(payload, data, hp, generator, privatizer, objective, ctx)
        if objective is not None:
            objective.end(ctx, {n: t.detach() for n, t in reply["theta_delta"].items()})
        return reply

    def _update(
        self,
        payload: Payload,
        data: ClientData,
        hp: LocalTraining,
        generator: torch.Generator,
        privatizer: GradientPrivatizer | None = None,
        objective: ClientObjective | None = None,
        ctx: ObjectiveContext | None = None,
    ) -> Payload:
        self._load(payload["theta"])
        has_rows = "rows" in payload
        rows = payload["rows"].detach().clone() if has_rows else None
        train_rows = has_rows and bool(payload["train_rows"])
        if rows is not None:
            rows.requires_grad_(train_rows)
        # without a row table the model scores every label: targets are the client's full label vectors
        targets = data.pos if has_rows else full_label_targets(data)
        params = list(self.model.parameters()) + ([rows] if train_rows else [])
        # sparse input rows, plain SGD: the first layer's step is fused into its backward (the batch's columns only)
        # (not with an objective's weight term, which is added to the gradient after the backward)
        plain_sgd = hp.optimizer == "sgd" and not hp.momentum and not hp.weight_decay and privatizer is None
        plain_sgd = plain_sgd and not (objective is not None and objective.weight_only)
        set_fused_sgd(self.model, hp.lr if plain_sgd else None)
        # plain SGD on sparse rows changes a sparse-input table only at the columns of the client's features: its
        # update is those columns (the others' deltas are exact zeros)
        row_sparse = self.row_sparse_updates and plain_sgd and isinstance(data.x, SparseRows) and bool(self.sparse_tables)
        cols = torch.unique(data.x.indices) if row_sparse else None  # sorted, distinct
        try:
            return self._train(payload, data, hp, generator, privatizer, rows, train_rows, targets, params, cols, objective, ctx)
        finally:
            set_fused_sgd(self.model, None)

    @torch.no_grad()
    def _delta(self, theta: dict[str, torch.Tensor], cols: torch.Tensor | None) -> dict[str, torch.Tensor | RowSparseDelta]:
        """θ's update: final − start per parameter; with ``cols``, each sparse-input table's as a
        :class:`RowSparseDelta` over those columns, and the working table restored to θ there (the next client of
        the round then loads nothing of it)."""
        out: dict[str, torch.Tensor | RowSparseDelta] = {}
        for n, p in self.model.named_parameters():
            start = theta[n]
            if cols is None or n not in self.sparse_tables:
                out[n] = p.detach() - start
                continue
            out[n] = RowSparseDelta(cols, p.detach().t()[cols] - start.t()[cols], tuple(p.shape))
            p.t()[cols] = start.t()[cols]
            self._clean[n] = (weakref.ref(start), start._version)
        return out

    def _train(
        self, payload, data, hp, generator, privatizer, rows, train_rows, targets, params, cols=None, objective=None, ctx=None
    ) -> Payload:
        if hp.optimizer == "adam":
            opt = torch.optim.Adam(params, lr=hp.lr, weight_decay=hp.weight_decay)
        else:
            opt = torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        loss_fn = LOSSES[payload["loss"]]
        n = data.num_examples
        total, steps = 0.0, 0
        uncertain, random_mask = None, True
        if objective is not None and objective.masks_labels:  # e.g. CA-MLE: labels the global model is unsure of
            uncertain = objective.unknown_labels(self._global_probabilities(payload["theta"]), ctx)
            random_mask = bool(objective.random_label_mask)
        self.model.train()
        if privatizer is not None:
            no_dropout(self.model)
        for epoch in range(hp.epochs):
            if privatizer is None:
                perm = torch.randperm(n, generator=generator).to(data.x.device)
                batches = [perm[s : s + hp.batch_size] for s in range(0, n, hp.batch_size)]
            else:  # Poisson batches from the client's secret
                batches = [privatizer.batch(n, f"e{epoch} s{s}").to(data.x.device) for s in range(privatizer.steps_per_epoch())]
            for s, idx in enumerate(batches):
                if privatizer is not None:
                    loss = self._private_step(
                        data, targets, idx, rows, train_rows, loss_fn, hp, generator, uncertain, random_mask,
                        privatizer, f"e{epoch} s{s}", objective, ctx,
                    )  # fmt: skip
                    if objective is not None:
                        self._add_weight_term(objective, ctx)  # after the noise: post-processing
                        ctx.steps += 1
                    opt.step()
                    if loss is not None:
                        total += loss
                        steps += 1
                    continue
                with torch.autocast(data.x.device.type, dtype=torch.bfloat16, enabled=hp.precision == "bf16"):
                    if self.family.label_masked:
                        loss = self.family.masked_training_loss(
                            self.model,
                            data.x[idx],
                            targets[idx],
                            loss_fn,
                            generator=generator,
                            uncertain=uncertain,
                            random_mask=random_mask,
                        )
                    else:
                        out = self.family.forward(self.model, data.x[idx])
                if not self.family.label_masked:
                    loss = loss_fn(self.family.score(out, rows), targets[idx])
                if objective is not None and objective.per_example:
                    loss = loss + objective.per_example_term(self._represent, data.x[idx], targets[idx], ctx).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if objective is not None:
                    self._add_weight_term(objective, ctx)
                    ctx.steps += 1
                opt.step()
                total += float(loss.detach())
                steps += 1
        with torch.no_grad():
            theta_delta = self._delta(payload["theta"], cols)
            reply: Payload = {"theta_delta": theta_delta, "num_examples": n, "loss": total / max(steps, 1)}
            if train_rows:
                reply["rows_delta"] = rows.detach() - payload["rows"]
                reply["row_ids"] = payload["row_ids"]
        return reply

    def _represent(self, x: torch.Tensor, theta: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The working model's representation of ``x`` (the family's encoder output): with its own weights, or with
        the fixed weights ``theta`` (no gradient; eval-free: the model's mode is unchanged)."""
        if theta is None:
            return self.family.forward(self.model, x)
        from torch.func import functional_call

        with torch.no_grad():
            return functional_call(Encoded(self.family, self.model), {f"model.{n}": t for n, t in theta.items()}, (x,))

    @torch.no_grad()
    def _add_weight_term(self, objective: ClientObjective, ctx: ObjectiveContext) -> None:
        """The objective's weight term added to each parameter's ``.grad`` (after the backward, or after DP-SGD's
        noise)."""
        if not objective.weight_only:
            return
        params = dict(self.model.named_parameters())
        for n, t in objective.weight_term({n: p.detach() for n, p in params.items()}, ctx).items():
            p = params[n]
            p.grad = t.to(p.dtype).clone() if p.grad is None else p.grad + t.to(p.dtype)

    def _private_step(
        self, data, targets, idx, rows, train_rows, loss_fn, hp, generator, uncertain, random_mask, privatizer, step,
        objective=None, ctx=None,
    ) -> float | None:  # fmt: skip
        """One DP-SGD step: per-sample gradients of the batch, clipped and summed chunk by chunk, then the
        privatizer's noise; the result becomes each parameter's ``.grad``. Returns the batch's mean loss (None for
        an empty Poisson batch, whose step is noise only)."""
        rng = torch.get_rng_state()  # a per-sample draw from torch's generator would follow the batch position
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        trained = {**params, **({"rows": rows} if train_rows else {})}
        # float64: the privatizer's chunk sums are exact grid multiples (or float64 sums with a bounded error), and a
        # float32 running sum would round them again
        sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in trained.items()}
        losses: list[torch.Tensor] = []
        if len(idx) > 0:
            x, y = data.x[idx], targets[idx]
            states = None
            if self.family.label_masked:  # the label mask drawn per instance (keyed by content), never by position
                keys = instance_keys(x, y)
                states = self.family.label_states(
                    self.model, x, y, generator=None, uncertain=uncertain, random_mask=random_mask,
                    uniforms=privatizer.instance_uniforms(keys, y.shape[1] + 1, step),
                )  # fmt: skip

            # each sample's clip scale (privacy.local.copy_clip: split), from how many clients its instance sits on
            scales = privatizer.clip_scales(None if data.copies is None else data.copies[idx.cpu()])
            done = [0]  # samples already summed: the chunks come in batch order

            def add(grads: dict[str, torch.Tensor], batch_losses: torch.Tensor) -> None:
                b = len(batch_losses)
                if scales is None:
                    clipped = privatizer.clip_sum(grads)
                else:
                    clipped = privatizer.clip_sum(grads, scales[done[0] : done[0] + b])
                done[0] += b
                for n, g in clipped.items():
                    sums[n] += g.to(sums[n].dtype)
                losses.append(batch_losses.float())

            extra = None
            if objective is not None and objective.per_example:  # inside each example's loss: inside the clip
                extra = lambda represent, xb, yb: objective.per_example_term(represent, xb, yb, ctx)  # noqa: E731
            if self.linear_fast_path and states is None and extra is None:
                clipped, batch_losses = clipped_sum_linear(
                    family=self.family, model=self.model, rows=rows, x=x, targets=y, loss_fn=loss_fn,
                    factors=privatizer.factors if scales is None else (lambda norms: privatizer.factors(norms, scales)),
                    precision=hp.precision,
                )  # fmt: skip
                for n, g in clipped.items():
                    sums[n] += g.to(sums[n].dtype)
                losses.append(batch_losses.float())
            else:
                per_sample_gradients(
                    family=self.family, model=self.model, params=params, rows=rows,
                    x=x, targets=y, loss_fn=loss_fn, states=states, precision=hp.precision, on_chunk=add, extra=extra,
                )  # fmt: skip
                if done[0] != len(idx):  # every sample's scale was used once, in batch order
                    raise RuntimeError(f"DP-SGD summed {done[0]} per-sample gradients of a batch of {len(idx)}")
        if not torch.equal(rng, torch.get_rng_state()):
            raise RuntimeError(
                "a DP-SGD step drew from torch's global generator (dropout or another random op in the model): such draws "
                "follow the batch position, so one instance would change other samples' gradients; remove the random op"
            )
        step_grads = privatizer.finish(sums, step)
        for n, p in trained.items():
            p.grad = step_grads[n].to(p.dtype).reshape(p.shape)
        return float(torch.cat(losses).mean()) if losses else None

    def _global_probabilities(self, theta: dict[str, torch.Tensor]):
        """``probabilities(x)``: the (b, C) probabilities of the global model the client received (θ, through the
        working model with those weights, in eval mode, every label unknown) for a batch ``x``; what an objective's
        :meth:`~secure_fed.algorithms.objective.ClientObjective.unknown_labels` reads (FedLGT's CA-MLE)."""
        from torch.func import functional_call

        @torch.no_grad()
        def probabilities(x: torch.Tensor) -> torch.Tensor:
            was_training = self.model.training
            # eval mode: dropout off, and batch norm reads its running statistics, which are parameters in θ here
            # (FederatedBatchNorm2d): in training mode it would write the batch's statistics into the payload
            self.model.eval()
            try:
                with torch.autocast(x.device.type, enabled=False):  # fp32: the band τ ± ε is narrower than bf16's error
                    p = torch.sigmoid(functional_call(self.model, theta, (x.float(),)).float())
            finally:
                self.model.train(was_training)
            return p

        return probabilities


def begin_objective(
    objective: ClientObjective, payload: Payload, data: ClientData, hp: LocalTraining, privatizer: GradientPrivatizer | None
) -> ObjectiveContext:
    """The objective's context for one client's update (the θ it received, its own state, the step settings), after
    :meth:`~secure_fed.algorithms.objective.ClientObjective.begin`; every trainer path starts an objective here. A weight
    term under a privatizer that takes no local step (``privacy.local.noise: shares``) is refused."""
    theta = {n: t.detach() for n, t in payload["theta"].items()}
    per_epoch = privatizer.steps_per_epoch() if privatizer is not None else -(-data.num_examples // hp.batch_size)
    if objective.weight_only and privatizer is not None and not privatizer.applies_weight_terms:
        raise SecureFedError(
            f"client objective {type(objective).__name__}: its weight term needs a local step, but "
            f"{type(privatizer).__name__} sends the clipped sums instead (privacy.local.noise: shares), so the "
            "term would be dropped; use privacy.local.noise: local"
        )
    count = None if privatizer is not None else data.num_examples  # a private count under DP-SGD
    ctx = ObjectiveContext(theta, data.state, float(hp.lr), count, hp.epochs * per_epoch, private=privatizer is not None)
    objective.begin(ctx)
    return ctx


def no_dropout(model: nn.Module) -> None:
    """DP-SGD's steps run without dropout: its masks come from torch's generator in batch order (one per position
    under ``vmap``), so removing one instance would hand every later sample another's mask and change its clipped
    gradient. Every dropout of ``model`` (each dropout module's ``p``, ``nn.MultiheadAttention``'s ``dropout``) is set to 0;
    the model is the trainer's working model (θ is loaded into it each update), and under ``privacy.local`` every
    update it runs is private (``model.ctran.dropout`` above 0 is refused there)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):  # Dropout, Dropout1d/2d/3d, AlphaDropout, …
            m.p = 0.0
        elif isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0


def full_label_targets(data: ClientData) -> torch.Tensor:
    """(n, C) bool: the client's label vectors over all C labels (the labels it does not know are absent from
    all of its instances, so they are negatives)."""
    C = data.num_labels
    out = torch.zeros(data.num_examples, C, dtype=torch.bool, device=data.pos.device)
    out[:, data.known_labels.to(data.pos.device)] = data.pos
    return out


@client_function
def token_client(payload: Payload, data: ClientData) -> Payload:
    """Label-set collection, client side: tokens of every instance plus the client's label."""
    tokenizer = TOKENIZERS[payload["tokenizer"]]()
    if len(data.known_labels) != 1:
        raise ValueError("label-set collection needs the positive-only setting (one label per client)")
    return {"tokens": tokenizer.tokens(data.raw), "label": int(data.known_labels[0])}

"""Many clients' local SGD at once, exactly: the vectorised executor's training (``training.executor: vectorized``).

Every client of a round starts from the same θ, and plain SGD changes a linear layer's weight by a sum of
rank-b terms: after steps t < s, client i's weight is

    A_i(s) = A₀ − η Σ_{t<s} δ_{i,t}ᵀ x_{i,t}

where x_{i,t} (b × in) is the layer's input on the client's batch t and δ_{i,t} (b × out) the loss gradient at
the layer's output. So the layer's output on the client's next batch is

    x A_i(s)ᵀ = x A₀ᵀ − η Σ_{t<s} (x x_{i,t}ᵀ) δ_{i,t}

The first term is **one** matrix product for all clients together (their batches stacked: a large GEMM that runs
near the machine's matmul rate, where one client's b = 32 rows run at a fraction of it); the history terms are
two batched products over the client's past steps concatenated, (x [x_{i,0}; …]ᵀ)[δ_{i,0}; …] (joined once the
history is small; one product per past step made thousands of small calls on long schedules). The backward pass
is the same algebra written out: the gradient at the layer's input is
``δ A₀ − η Σ_{t<s} (δ δ_{i,t}ᵀ) x_{i,t}`` (autograd runs only through the family's score and the loss). No
client's weight is formed until the end, when its update Δ_i = −η Σ_t δ_{i,t}ᵀ x_{i,t} is one product over its
own rows; with deferred updates (:mod:`secure_fed.models.group_updates`) it is formed only when read, and the
round's sum Σ_i w_i Δ_i is a few products over every lock step's rows (:meth:`_TrainedGroup.add_weighted_sum`).

Each client runs **exactly its own SGD steps**: its own batches, drawn from its own generator in the same calls as
:class:`~secure_fed.algorithms.client.LocalTrainer` makes (one ``randperm`` per epoch), its own row(s), its own
loss. The clients of a group run in lock step (step s of every client that has one); a client's short last batch
is padded with rows that carry no label (masked out of the loss, so their gradient is exactly zero). The result
equals the sequential trainer's up to floating-point reassociation (``tests/algorithms/test_batched_sgd.py``).

Clients that start from different θ of the same shapes (a cohort of federations: membership inference's shadow
runs, :mod:`threat_models.shadow_cohort`) train as one group too (``group_key(req, own_theta=True)``): the shared
product x A₀ᵀ is then one product per θ over the rows of the clients that start from it (each θ held once), and each
client's bias starts from its own θ.

What it covers: models whose forward pass is a chain of ``nn.Linear`` and ``nn.ReLU`` modules (``model.chain()``:
the text network and the MLPs, with either head), plain SGD (no momentum, no weight decay), no DP-SGD, no dropout,
no label mask training, losses in :data:`MASKED_LOSSES`. :func:`unbatchable` names what rules a request out; the
executor then runs that client with the reference trainer and counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from secure_fed.algorithms.base import ClientData, Payload
from secure_fed.algorithms.losses import asymmetric_loss, bce_loss, positive_hinge_loss
from secure_fed.algorithms.objective import AffineTerm
from secure_fed.models.group_updates import DeferredDelta, UpdateGroup
from secure_fed.models.sparse_rows import SparseRows

#: a group's history is joined into one segment per layer once it takes at most this many bytes (see train_group)
JOIN_HISTORY_BYTES = 64 << 20


def _positive(scores: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    # a padded row carries no positive label, so it adds nothing to the sum nor to the count
    p = pos & valid[..., None]
    terms = positive_hinge_loss(scores, p, reduction="none")
    return terms.sum(dim=(-2, -1)) / p.to(terms.dtype).sum(dim=(-2, -1)).clamp(min=1.0)


def _elementwise(fn) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss(scores: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        elem = fn(scores, pos, reduction="none")
        w = valid.to(elem.dtype)[..., None]
        return (elem * w).sum(dim=(-2, -1)) / (w.sum(dim=(-2, -1)) * elem.shape[-1]).clamp(min=1.0)

    return loss


#: client losses with a padding mask: ``loss(scores (b, k), pos (b, k), valid (b,))`` equals the loss of
#: :data:`~secure_fed.algorithms.losses.LOSSES` on the valid rows only; with leading batch dimensions
#: ((G, b, k), (G, b, k), (G, b)) it gives each client's loss (G,)
MASKED_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "positive": _positive,
    "bce": _elementwise(bce_loss),
    "asl": _elementwise(asymmetric_loss),
}


def linear_chain(model: nn.Module) -> list[tuple[nn.Module, str | None]] | None:
    """``model``'s forward pass as ``[(module, parameter prefix)]``, every module an ``nn.Linear`` or ``nn.ReLU``
    (prefix None for a ReLU), when the model declares such a chain (``chain()``) and the chain's Linears hold every
    parameter; else None."""
    chain_fn = getattr(model, "chain", None)
    chain = chain_fn() if callable(chain_fn) else None
    if not chain:
        return None
    names = {id(m): n for n, m in model.named_modules()}
    out: list[tuple[nn.Module, str | None]] = []
    covered: set[str] = set()
    for m in chain:
        if isinstance(m, nn.ReLU):
            out.append((m, None))
        elif isinstance(m, nn.Linear) and id(m) in names:  # SparseInputLinear too: on dense rows it is nn.Linear
            prefix = names[id(m)]
            out.append((m, prefix))
            covered |= {f"{prefix}.{p}" for p, _ in m.named_parameters()}
        else:
            return None
    if covered != {n for n, _ in model.named_parameters()}:
        return None
    return out


@dataclass
class TrainRequest:
    """One client's call of ``LocalTrainer.update``: what it received, its data, its settings, its generator."""

    payload: Payload
    data: ClientData
    hp: object  # LocalTraining
    generator: torch.Generator
    #: the client objective's affine weight term for this update (:class:`~secure_fed.algorithms.objective.AffineTerm`),
    #: added to every step's gradient in the closed form; None: none
    affine: AffineTerm | None = None


@dataclass(frozen=True)
class ModelFacts:
    """What :func:`unbatchable` needs to know of a model (the same for every request of a run: compute it once)."""

    has_dropout: bool
    is_chain: bool

    @classmethod
    def of(cls, model: nn.Module) -> ModelFacts:
        return cls(any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()), linear_chain(model) is not None)


def unbatchable(model: nn.Module, family, req: TrainRequest, privatizer=None, *, facts: ModelFacts | None = None) -> str | None:
    """Why ``req`` cannot run in a batched group (a short reason), or None when it can. ``facts``: the model's
    :class:`ModelFacts`, when the caller keeps them (computed here otherwise)."""
    hp = req.hp
    if privatizer is not None:
        return "DP-SGD in client training"
    if hp.optimizer != "sgd" or hp.momentum or hp.weight_decay:
        return "client optimiser other than plain SGD"
    if family.label_masked:
        return "label mask training"
    facts = facts or ModelFacts.of(model)
    if facts.has_dropout:
        return "dropout"
    if isinstance(req.data.x, SparseRows):
        return "sparse input rows"
    if req.payload["loss"] not in MASKED_LOSSES:
        return f"loss {req.payload['loss']!r}"
    if not facts.is_chain:
        return "model is not a chain of Linear and ReLU layers"
    if not all(p.requires_grad for p in model.parameters()):
        return "fixed parameters (model.fixed_encoder)"
    return None


def group_key(req: TrainRequest, *, own_theta: bool = False) -> tuple:
    """Requests with equal keys run in one lock-step group (same θ storage, row count, loss and settings). With
    ``own_theta`` (a cohort of federations, each client with its own θ), θ's names and shapes instead of its storage."""
    p = req.payload
    if own_theta:
        theta_ptrs = tuple((n, tuple(t.shape), t.dtype) for n, t in sorted(p["theta"].items()))
    else:
        theta_ptrs = tuple((n, t.data_ptr()) for n, t in sorted(p["theta"].items()))
    rows = p.get("rows")
    return (
        theta_ptrs,
        None if rows is None else tuple(rows.shape),
        bool(p.get("train_rows", False)) and rows is not None,
        p["loss"],
        req.hp,
        str(req.data.x.device),
    )


def shares_theta(reqs: list[TrainRequest]) -> bool:
    """Whether every request starts from the same θ storage (a round's clients); else each trains its own."""
    ptrs = {tuple((n, t.data_ptr()) for n, t in sorted(r.payload["theta"].items())) for r in reqs}
    return len(ptrs) <= 1


class _ThetaPositions:
    """A group whose clients start from several θ (a cohort of federations): the distinct θ, and for each the
    positions (in lock-step order, ascending) of the clients that start from it. Each θ's weights are held once."""

    def __init__(self, thetas: list[dict[str, torch.Tensor]]):
        keys: dict[tuple, int] = {}
        self.distinct: list[dict[str, torch.Tensor]] = []
        which = []
        for t in thetas:
            key = tuple((n, v.data_ptr()) for n, v in sorted(t.items()))
            if key not in keys:
                keys[key] = len(self.distinct)
                self.distinct.append(t)
            which.append(keys[key])
        dev = next(iter(thetas[0].values())).device
        w = torch.tensor(which, dtype=torch.long)
        self.positions = [torch.nonzero(w == u).squeeze(1).to(dev) for u in range(len(self.distinct))]
        self._counts = [np.searchsorted(p.cpu().numpy(), np.arange(len(thetas) + 1)) for p in self.positions]

    def product(self, h: torch.Tensor, A: torch.Tensor, Gs: int, *, transpose: bool) -> torch.Tensor:
        """Per client position j < Gs, h[j] @ A[θ(j)]ᵀ (``transpose``) or h[j] @ A[θ(j)]: one product per θ over its
        clients' rows stacked, as a round's shared product (``A``: the distinct θs' weights stacked)."""
        out = None
        for u, pos in enumerate(self.positions):
            sel = pos[: int(self._counts[u][Gs])]
            if sel.numel() == 0:
                continue
            hs = h.index_select(0, sel)
            Au = A[u].T if transpose else A[u]
            y = (hs.reshape(-1, hs.shape[-1]) @ Au).view(sel.numel(), h.shape[1], -1)
            if out is None:
                out = y.new_empty(Gs, h.shape[1], y.shape[-1])
            out.index_copy_(0, sel, y)
        assert out is not None
        return out


class _Client:
    """One client's schedule in a group: its batches (index tensors) and targets."""

    def __init__(self, req: TrainRequest, has_rows: bool):
        from secure_fed.algorithms.client import full_label_targets

        d, hp = req.data, req.hp
        n = d.num_examples
        self.req = req
        self.n = n
        # one permutation per epoch, the same generator calls as LocalTrainer._update; an epoch's batches are its
        # consecutive slices of b rows (the last one short)
        self.perms = [torch.randperm(n, generator=req.generator).to(d.x.device) for _ in range(hp.epochs)]
        self.num_steps = hp.epochs * -(-n // hp.batch_size)
        self.targets = d.pos if has_rows else full_label_targets(d)
        self.losses: list[float] = []


class _Schedule:
    """A group's lock-step batches as one index table: the clients' inputs (cast once to the product dtype) and
    targets stacked in lock-step order with a zero row at the end, and ``idx`` (G, steps, b) naming, for each client
    position, step and slot, its row there (the zero row for padding: no input, no label). A step's inputs and
    targets are then one gather each."""

    def __init__(self, clients: list[_Client], order: list[int], b: int, dtype):
        ordered = [clients[i] for i in order]
        x0, t0 = ordered[0].req.data.x, ordered[0].targets
        dev, dtype = x0.device, dtype or x0.dtype
        self.x = torch.cat([c.req.data.x.to(dtype) for c in ordered] + [x0.new_zeros(1, x0.shape[1], dtype=dtype)])
        self.t = torch.cat([c.targets for c in ordered] + [t0.new_zeros(1, t0.shape[1])])
        self.pad = self.x.shape[0] - 1
        G, S, E = len(ordered), ordered[0].num_steps, len(ordered[0].perms)
        # epoch e of client position j fills the slots from (j·S + e·⌈n_j/b⌉)·b on, in its permutation's order (a
        # batch is b consecutive slots, so a short last batch leaves its step's last slots to padding)
        n = np.array([c.n for c in ordered], dtype=np.int64)
        seg_n = np.repeat(n, E)
        seg_base = ((np.arange(G) * S * b)[:, None] + np.arange(E)[None, :] * (-(-n // b) * b)[:, None]).ravel()
        seg_row0 = np.repeat(np.cumsum(n) - n, E)  # the client's first row in ``self.x``
        within = np.arange(int(seg_n.sum())) - np.repeat(np.cumsum(seg_n) - seg_n, seg_n)
        dest = torch.from_numpy(np.repeat(seg_base, seg_n) + within).to(dev)
        rows = torch.cat([p for c in ordered for p in c.perms]) + torch.from_numpy(np.repeat(seg_row0, seg_n)).to(dev)
        self.idx = torch.full((G * S * b,), self.pad, dtype=torch.long, device=dev)
        self.idx[dest] = rows
        self.idx = self.idx.view(G, S, b)

    def step(self, s: int, Gs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Lock step s's inputs (G_s, b, in), targets (G_s, b, k) and padding mask (G_s, b)."""
        idx = self.idx[:Gs, s]
        flat = idx.reshape(-1)
        xs = self.x.index_select(0, flat).view(*idx.shape, -1)
        ts = self.t.index_select(0, flat).view(*idx.shape, -1)
        return xs, ts, idx != self.pad


class _Affine:
    """A group's affine weight terms (:class:`~secure_fed.algorithms.objective.AffineTerm`), per client position.

    Client j's term g = a_j(w − anchor_j) + b_j is, with E = w − θ_j (its deviation from the θ it started from),
    g = a_j·E + c_j with the constant c_j = a_j(θ_j − anchor_j) + b_j (0 for a proximal term, whose anchor is θ_j). A step
    E ← E − η(δᵀx + a_j E + c_j) = ρ_j E − η δᵀx − η c_j with ρ_j = 1 − η a_j unrolls to

        E_j(s) = Σ_{t<s} ρ_j^{s−1−t} (−η δ_tᵀ x_t) − η γ_j(s) c_j,   γ_j(0) = 0, γ_j(s+1) = ρ_j γ_j(s) + 1

    so each history term is weighted by ρ_j^{s−1−t} (:meth:`decay`; only where some a_j ≠ 0) and each layer gains
    the term −η γ_j(s) (x c_jᵀ) (and δ c_j in the backward; only where some c_j ≠ 0). The biases, formed
    explicitly, take g directly."""

    def __init__(self, reqs: list[TrainRequest], thetas: list[dict[str, torch.Tensor]], names: list[str], lr: float):
        terms = [r.affine for r in reqs]
        self.lr = lr
        dev = next(iter(thetas[0].values())).device
        rates = [float(t.rate) if t is not None else 0.0 for t in terms]
        #: ρ_j = 1 − η a_j (float64: powers of it over a long schedule), or None when every a_j = 0
        self.rho = torch.tensor([1.0 - lr * a for a in rates], dtype=torch.float64) if any(rates) else None
        self.rate = torch.tensor(rates, dtype=torch.float64)
        #: γ_j(s) of each client position (float64), advanced for the active positions after each step
        self.gamma = torch.zeros(len(terms), dtype=torch.float64)
        #: c_j stacked per parameter name (G, *shape), in θ's dtype; a name with every c_j = 0 is absent
        self.const: dict[str, torch.Tensor] = {}
        for n in names:
            cs = []
            for term, theta in zip(terms, thetas, strict=True):
                c = None
                if term is not None and term.rate != 0.0 and term.anchor is not None:
                    c = term.rate * (theta[n].detach() - term.anchor[n].to(theta[n].dtype))
                if term is not None and term.offset is not None and n in term.offset:
                    b = term.offset[n].detach().to(theta[n].dtype)
                    c = b if c is None else c + b
                cs.append(c)
            if any(c is not None for c in cs):
                ref = thetas[0][n]
                self.const[n] = torch.stack([c if c is not None else torch.zeros_like(ref) for c in cs]).to(dev)
        self._rate_dev = self.rate.to(dev)

    def decay(self, positions: slice, s: int, t0: int, k: int) -> torch.Tensor | None:
        """(G', k) float64: ρ_j^{s−1−t} for the client positions ``positions`` and the steps t0 … t0 + k − 1 (the
        weight of step t's history at step s, in E(s)); None when every a_j = 0."""
        if self.rho is None:
            return None
        expo = (s - 1 - t0 - torch.arange(k, dtype=torch.float64))[None, :]
        return self.rho[positions, None] ** expo

    def bias_term(self, name: str, bias: torch.Tensor, start: torch.Tensor, Gs: int) -> torch.Tensor | None:
        """(G_s, out) g of the active positions' biases ``bias`` (started from ``start``): a_j(bias − start) + c_j."""
        out = None
        if self.rho is not None:
            out = self._rate_dev[:Gs, None].to(bias.dtype) * (bias[:Gs] - start[:Gs])
        c = self.const.get(name)
        if c is not None:
            out = c[:Gs] if out is None else out + c[:Gs]
        return out

    def advance(self, Gs: int) -> None:
        """After a step of the positions 0 … G_s − 1: γ ← ρ γ + 1."""
        rho = self.rho[:Gs] if self.rho is not None else 1.0
        self.gamma[:Gs] = rho * self.gamma[:Gs] + 1.0


def _decayed(P: torch.Tensor, W: torch.Tensor | None, b: int) -> torch.Tensor:
    """``P`` (G', rows', k·b), its last dimension a history segment's k steps of b rows each, with step m's columns
    multiplied by W[:, m] in place (no-op for W None)."""
    if W is None:
        return P
    Gp, r = P.shape[0], P.shape[1]
    P.view(Gp, r, W.shape[1], b).mul_(W.to(P.dtype)[:, None, :, None])
    return P


def train_group(model: nn.Module, family, reqs: list[TrainRequest], *, deferred: bool = False) -> list[Callable[[], Payload]]:
    """Run the requests of one group (equal :func:`group_key`) together; returns, per request in order, a
    function that builds its reply (the same keys and values as ``LocalTrainer.update``'s). Building a reply
    forms that client's dense update, so the executor builds one at a time; with ``deferred``, each Linear
    weight's update is a :class:`~secure_fed.models.group_updates.DeferredDelta` instead (formed when read; the
    round's plain sum adds the group's weighted sum in a few products per layer, see
    :mod:`secure_fed.models.group_updates`), and the group keeps every lock step's rows for that sum.

    The forward pass and the backward pass through the chain are written out (the backward of
    ``y = x A₀ᵀ + Σ_t (x X_tᵀ) D_t`` is ``∂x = δ A₀ + Σ_t (δ D_tᵀ) X_t``, and a ReLU passes δ where its output is
    positive); autograd runs only through the family's score and the loss, from the last layer's output (and the
    client's rows). Products run in the product dtype (bf16 under ``precision: bf16``, as autocast runs the
    reference trainer's); a layer's output, its shared product plus bias and history terms, is summed in the
    weights' dtype, and an input gradient in the product dtype (as autograd sums it under autocast).

    A request's affine weight term (``req.affine``, a client objective's :class:`~secure_fed.algorithms.objective.
    AffineTerm`: a proximal term, a constant correction) is added in the same closed form (:class:`_Affine`):
    the history terms decay by ρ = 1 − η·a per step and a constant term −η γ (x cᵀ) joins each layer's output."""
    chain = linear_chain(model)
    assert chain is not None
    first = reqs[0]
    p0, hp = first.payload, first.hp
    theta = p0["theta"]
    has_rows = "rows" in p0
    train_rows = has_rows and bool(p0["train_rows"])
    loss_fn = MASKED_LOSSES[p0["loss"]]
    lr, b = float(hp.lr), int(hp.batch_size)
    product_dtype = torch.bfloat16 if hp.precision == "bf16" else None  # None: each weight's own dtype

    clients = [_Client(r, has_rows) for r in reqs]
    # lock step: sort by number of steps (longest first), so the clients active at step s are a prefix
    order = sorted(range(len(clients)), key=lambda i: -clients[i].num_steps)
    steps = [clients[i].num_steps for i in order]
    G = len(order)
    layers = [(m, prefix) for m, prefix in chain if prefix is not None]
    # one θ for the group (a round's clients), or several (θs of equal shapes: a cohort of federations,
    # :func:`shares_theta`); with several, the product x A₀ᵀ is one product per θ over the positions of its clients
    own = not shares_theta(reqs)
    thetas = [clients[i].req.payload["theta"] for i in order]
    sharing = _ThetaPositions(thetas) if own else None
    A0 = [theta[f"{prefix}.weight"].detach() for _, prefix in layers]
    if sharing is not None:
        A0 = [torch.stack([t[f"{prefix}.weight"].detach() for t in sharing.distinct]) for _, prefix in layers]
    acc = [a.dtype for a in A0]  # each layer's sum (shared product + history terms) in its weight's dtype
    # the weights as the products read them, cast once per group
    A0c = [a.to(product_dtype) if product_dtype is not None else a for a in A0]
    bias = [
        (
            torch.stack([t[f"{prefix}.bias"].detach() for t in thetas])
            if own
            else theta[f"{prefix}.bias"].detach().expand(G, -1).clone()
        )
        if m.bias is not None
        else None
        for m, prefix in layers
    ]
    rows = torch.stack([clients[i].req.payload["rows"] for i in order]).detach().clone() if has_rows else None
    rows0 = rows.clone() if rows is not None else None
    names = [f"{prefix}.{p}" for m, prefix in layers for p in (("weight", "bias") if m.bias is not None else ("weight",))]
    ordered_reqs = [clients[i].req for i in order]
    aff = _Affine(ordered_reqs, thetas, names, lr) if any(r.affine is not None for r in ordered_reqs) else None
    if aff is not None and not aff.const and aff.rho is None:
        aff = None  # every term is zero (e.g. a proximal term of rate 0)
    # the biases as they started (an affine term with a ≠ 0 reads a bias's deviation from its start)
    bias0 = [bb.clone() if bb is not None and aff is not None and aff.rho is not None else None for bb in bias]
    #: per layer: the active clients' history so far as segments of consecutive steps, (inputs (G_s, rows, in),
    #: −η·δ (G_s, rows, out)), each segment's history term two batched products. While the clients are many, each
    #: step is a segment of its own (joining them would copy the whole history every step); once the history is
    #: small (:data:`JOIN_HISTORY_BYTES`) the segments are joined, so a long schedule's late steps, which few clients
    #: run, cost two products a layer instead of two per past step
    hist: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in layers]
    #: per layer, each history segment's first step (its steps are consecutive; read for an affine term's decay)
    hist_t0: list[list[int]] = [[] for _ in layers]
    #: per layer, per client position: its whole history (inputs, −η·δ) of its real rows, kept when it stops
    done: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in layers]
    #: per layer, every lock step's (inputs, −η·δ) of its G_s client positions (kept for a deferred group sum)
    trail: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in layers]
    # many clients' scores at once: the family's own batched score, or vmap; the masked losses take batches
    score = family.score if family.batched_score else torch.func.vmap(family.score, in_dims=(0, 0 if has_rows else None))
    # a client's real rows in its history are a prefix when only its last batch is short
    prefix_rows = hp.epochs == 1

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(product_dtype) if product_dtype is not None and t.dtype != product_dtype else t

    # each layer's c_j stacked (G, out, in) as the products read them (None: every c_j = 0)
    const_w = [cast(aff.const[f"{p}.weight"]) if aff is not None and f"{p}.weight" in aff.const else None for _, p in layers]

    sched = _Schedule(clients, order, b, product_dtype) if G else None
    for s in range(steps[0] if G else 0):
        Gs = sum(1 for k in steps if k > s)
        cur, ys_t, valid = sched.step(s, Gs)
        # the forward pass; saved: each Linear's input (product dtype), each ReLU's output (its mask)
        saved: list[torch.Tensor] = []
        li = 0
        fresh = False  # cur is a tensor this step made (not the data, nor a saved input)
        with torch.no_grad():
            for _m, prefix in chain:
                if prefix is None:
                    # ReLU after the cast (rounding keeps signs and zero, so this is the cast of ReLU's output), in
                    # place when the cast made a new tensor or the input is this step's own sum
                    c = cast(cur)
                    cur = torch.relu_(c) if (c is not cur or fresh) else torch.relu(c)
                    saved.append(cur)
                    fresh = False
                    continue
                hc = cast(cur)
                saved.append(hc)
                # x A₀ᵀ + b + Σ_t (x X_tᵀ) D_t: each product in the product dtype, the sum in the weights' dtype (in
                # bf16 the history terms are small beside x A₀ᵀ, and a bf16 sum would round most of them away); each
                # term cast before it is added (an elementwise op on mixed dtypes runs several times slower)
                if sharing is not None:
                    y = sharing.product(hc, A0c[li], Gs, transpose=True).to(acc[li])
                else:
                    y = (hc.reshape(Gs * b, -1) @ A0c[li].T).view(Gs, b, -1).to(acc[li])
                if bias[li] is not None:
                    y.add_(bias[li][:Gs, None, :])
                for (X_h, D_h), t0 in zip(hist[li], hist_t0[li], strict=True):
                    # a segment's steps: the sum over them inside one product (an affine term's decay ρ^{s−1−t} on
                    # each step's columns)
                    P = torch.bmm(hc, X_h[:Gs].transpose(1, 2))
                    W = aff.decay(slice(0, Gs), s, t0, X_h.shape[1] // b) if aff is not None else None
                    y.add_(torch.bmm(_decayed(P, W, b), D_h[:Gs]).to(acc[li]))
                if const_w[li] is not None:  # the affine terms' constant part of E(s): −η γ(s) x cᵀ
                    k = (-lr * aff.gamma[:Gs]).to(y.device, acc[li])
                    y.add_(torch.bmm(hc, const_w[li][:Gs].transpose(1, 2)).to(acc[li]).mul_(k[:, None, None]))
                cur, fresh = y, True
                li += 1
        out = cur.to(acc[-1]).detach().requires_grad_()
        r = rows[:Gs].detach().clone().requires_grad_(train_rows) if rows is not None else None
        per_client = loss_fn(score(out, r), ys_t, valid)
        wrt = [out] + ([r] if train_rows else [])
        grads = torch.autograd.grad(per_client.sum(), wrt)
        with torch.no_grad():
            g = grads[0]
            new_d: list[torch.Tensor | None] = [None] * len(layers)
            li = len(layers)
            for k_op in range(len(chain) - 1, -1, -1):
                if chain[k_op][1] is None:  # ReLU: δ passes where its output is positive (as autograd's ReLU)
                    g = torch.ops.aten.threshold_backward(g, saved[k_op].to(g.dtype), 0)
                    continue
                li -= 1
                x_in = saved[k_op]
                D = torch.mul(g, -lr, out=torch.empty_like(g, dtype=x_in.dtype))  # −η·δ as the history reads it
                new_d[li] = D
                if bias[li] is not None:
                    gb = g.sum(dim=1, dtype=bias[li].dtype)
                    if aff is not None:  # the bias's affine term, at its weights before this step
                        term = aff.bias_term(f"{layers[li][1]}.bias", bias[li], bias0[li], Gs)
                        gb = gb if term is None else gb + term
                    bias[li][:Gs] -= lr * gb
                if li == 0:
                    break  # the first Linear's input is data: no gradient needed below it
                # δ A₀ + Σ_t (δ D_tᵀ) X_t, summed in the product dtype (as autograd sums the input's gradients
                # under autocast in the reference trainer)
                gp = cast(g)
                if sharing is not None:
                    g = sharing.product(gp, A0c[li], Gs, transpose=False)
                else:
                    g = (gp.reshape(Gs * b, -1) @ A0c[li]).view(Gs, b, -1)
                for (X_h, D_h), t0 in zip(hist[li], hist_t0[li], strict=True):
                    P = torch.bmm(gp, D_h[:Gs].transpose(1, 2))
                    W = aff.decay(slice(0, Gs), s, t0, X_h.shape[1] // b) if aff is not None else None
                    g.add_(torch.bmm(_decayed(P, W, b), X_h[:Gs]))
                if const_w[li] is not None:  # −η γ(s) δ c
                    k = (-lr * aff.gamma[:Gs]).to(g.device, g.dtype)
                    g.add_(torch.bmm(gp, const_w[li][:Gs]).mul_(k[:, None, None]))
            Gn = sum(1 for k in steps if k > s + 1)  # clients with a next step (a prefix of these Gs)
            inputs = [saved[k] for k, (_m, prefix) in enumerate(chain) if prefix is not None]
            for li_, (x_in, D) in enumerate(zip(inputs, new_d, strict=True)):
                if deferred:
                    trail[li_].append((x_in, D))
                segs = [(X[:Gs], Dh[:Gs]) for X, Dh in hist[li_]] + [(x_in, D)]
                seg_t0 = [*hist_t0[li_], s]
                if Gs > Gn and not deferred:  # clients at their last step keep their rows: views of one segment,
                    # or joined (one copy for all of them); a deferred group reads them from its trail when asked
                    Xf = segs[0][0][Gn:] if len(segs) == 1 else torch.cat([X[Gn:] for X, _ in segs], dim=1)
                    Df = segs[0][1][Gn:] if len(segs) == 1 else torch.cat([Dh[Gn:] for _, Dh in segs], dim=1)
                    Wf = aff.decay(slice(Gn, Gs), s + 1, 0, s + 1) if aff is not None else None
                    if Wf is not None:  # E(S) weighs step t's rows by ρ^{S−1−t} (a copy: the segments stay unweighted)
                        Dw = Df.reshape(Gs - Gn, s + 1, b, -1) * Wf.to(Df.dtype)[:, :, None, None]
                        Df = Dw.view(Gs - Gn, -1, Df.shape[-1])
                    for j in range(Gn, Gs):
                        X, Dh = Xf[j - Gn], Df[j - Gn]
                        if prefix_rows:  # the padding of its short last batch (δ = 0 there) is left out
                            n = clients[order[j]].n
                            X, Dh = X[:n], Dh[:n]
                        done[li_][j] = (X, Dh)
                segs = [(X[:Gn], Dh[:Gn]) for X, Dh in segs] if Gn else []
                seg_t0 = seg_t0 if Gn else []
                size = sum(X.numel() + Dh.numel() for X, Dh in segs) * x_in.element_size()
                if len(segs) > 1 and size <= JOIN_HISTORY_BYTES:
                    segs = [(torch.cat([X for X, _ in segs], dim=1), torch.cat([Dh for _, Dh in segs], dim=1))]
                    seg_t0 = seg_t0[:1]
                hist[li_], hist_t0[li_] = segs, seg_t0
            if train_rows:
                rows[:Gs] = rows[:Gs].detach() - lr * grads[-1]
            if aff is not None:
                aff.advance(Gs)
        for j, v in enumerate(per_client.detach().tolist()):
            clients[order[j]].losses.append(v)

    group = _TrainedGroup(
        theta=theta, layers=[prefix for _, prefix in layers], order=order, done=done, trail=trail if deferred else None,
        real_rows=[clients[i].n if prefix_rows else None for i in order],
        affine=aff, steps=steps, b=b,
    )  # fmt: skip

    def reply(i: int) -> Callable[[], Payload]:
        def build() -> Payload:
            j = group.pos_of[i]
            c = clients[i]
            delta: dict[str, torch.Tensor | DeferredDelta] = {}
            with torch.no_grad():
                for li_, (_m, prefix) in enumerate(layers):
                    name = f"{prefix}.weight"
                    A = theta[name]
                    delta[name] = DeferredDelta(group, i, name, A.shape, A.dtype) if deferred else group.dense(i, name)
                    if bias[li_] is not None:
                        delta[f"{prefix}.bias"] = bias[li_][j] - c.req.payload["theta"][f"{prefix}.bias"]
            out: Payload = {
                "theta_delta": {n: delta[n] for n in theta},
                "num_examples": c.n,
                "loss": sum(c.losses) / max(len(c.losses), 1),
            }
            if train_rows:
                out["rows_delta"] = rows[j].detach() - rows0[j]
                out["row_ids"] = c.req.payload["row_ids"]
            return out

        return build

    return [reply(i) for i in range(len(reqs))]


#: :meth:`_TrainedGroup.add_weighted_sum` joins consecutive lock steps into one product until it has this many rows
SUM_PRODUCT_ROWS = 4096


class _TrainedGroup(UpdateGroup):
    """A trained group's weight updates: one client's from its own history, or a weighted sum over clients from
    every lock step's rows. Without deferral each client's history is kept when it stops (``done``: per layer and
    client position, its rows' inputs and −η·δ); a deferred group keeps only ``trail`` (per layer, each step's inputs
    (G_s, b, in) and −η·δ (G_s, b, out) of the client positions 0 … G_s − 1) and reads a client's rows from it when
    asked. A padded row has δ = 0 and adds nothing; ``real_rows`` (per position, or None) cuts a client's history to
    its real rows where they are a prefix."""

    def __init__(
        self, *, theta, layers: list[str], order: list[int], done, trail, real_rows: list[int | None],
        affine: _Affine | None = None, steps: list[int] | None = None, b: int = 1,
    ) -> None:  # fmt: skip
        self.theta = theta
        self.layer_of = {f"{prefix}.weight": li for li, prefix in enumerate(layers)}
        self.pos_of = {i: j for j, i in enumerate(order)}
        self.size = len(order)
        self.done, self.trail, self.real_rows = done, trail, real_rows
        #: the clients' affine weight terms (``done`` already holds their decayed rows; a trail's are decayed when
        #: read), their numbers of steps S_j and the batch size
        self.affine, self.steps, self.b = affine, steps, b

    def _trail_decay(self, j: int, t: int) -> float:
        """ρ_j^{S_j−1−t}: the weight of client position j's step t in its final update (1 without a decay)."""
        if self.affine is None or self.affine.rho is None:
            return 1.0
        return float(self.affine.rho[j] ** (self.steps[j] - 1 - t))

    def _constant(self, j: int, name: str) -> tuple[torch.Tensor, float] | None:
        """(c_j, −η γ_j(S_j)): the constant part of client position j's update of ``name`` is their product (None: 0)."""
        c = self.affine.const.get(name) if self.affine is not None else None
        if c is None:
            return None
        return c[j], -self.affine.lr * float(self.affine.gamma[j])

    def _history(self, li: int, j: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Client position j's rows (inputs, −η·δ) at layer li, its steps in order; None when it took no step."""
        if self.trail is None:
            return self.done[li].get(j)
        steps = [(X[j], D[j] * self._trail_decay(j, t)) for t, (X, D) in enumerate(self.trail[li]) if X.shape[0] > j]
        if not steps:
            return None
        X, D = torch.cat([x for x, _ in steps]), torch.cat([d for _, d in steps])
        n = self.real_rows[j]
        return (X, D) if n is None else (X[:n], D[:n])

    def dense(self, index: int, name: str) -> torch.Tensor:
        li, j, A = self.layer_of[name], self.pos_of[index], self.theta[name]
        with torch.no_grad():
            hist = self._history(li, j)
            if hist is None:  # a client without examples took no step (no history kept)
                return torch.zeros_like(A)
            # −η Σ_t δ_tᵀ x_t; a padded row has δ = 0, so it adds nothing. In bf16 the product runs in bf16 (fp32
            # accumulation, one rounding of the sum), as autocast forms each step's weight gradient in the
            # reference trainer; in fp32, in fp32
            X, D = hist
            out = (D.T @ X).to(A.dtype)
            const = self._constant(j, name)
            return out if const is None else out.add_(const[0].to(A.dtype), alpha=const[1])

    def add_weighted_sum(self, target: torch.Tensor, name: str, weights: dict[int, float]) -> None:
        """Σ_i w_i Δ_i = Σ_steps (w ⊙ D_s)ᵀ X_s over the steps' rows, consecutive steps joined into products of at
        least :data:`SUM_PRODUCT_ROWS` rows; each product in the product dtype, added to ``target`` in its dtype."""
        if self.trail is None:
            raise RuntimeError("this group kept no lock-step history to sum (its updates were not deferred)")
        li = self.layer_of[name]
        w = torch.zeros(self.size, dtype=torch.float64)
        for i, wi in weights.items():
            w[self.pos_of[i]] = wi
        dev = self.trail[li][0][1].device if self.trail[li] else w.device
        w_dev = w.to(dev, torch.float32 if self.theta[name].dtype != torch.float64 else torch.float64)
        xs: list[torch.Tensor] = []
        ds: list[torch.Tensor] = []

        def flush() -> None:
            X = xs[0] if len(xs) == 1 else torch.cat(xs)
            D = ds[0] if len(ds) == 1 else torch.cat(ds)
            target.add_((D.T @ X).to(target.device, target.dtype))
            xs.clear()
            ds.clear()

        decays = self.affine is not None and self.affine.rho is not None
        if decays:  # step t of position j weighs ρ_j^{S_j−1−t}
            rho, S = self.affine.rho, torch.tensor(self.steps, dtype=torch.float64)
        with torch.no_grad():
            for t, (X, D) in enumerate(self.trail[li]):
                ws = w[: X.shape[0]]
                if not bool(ws.any()):
                    continue
                wd = w_dev[: X.shape[0]]
                if decays:
                    Gs = X.shape[0]
                    wd = wd * (rho[:Gs] ** (S[:Gs] - 1 - t)).to(wd.device, wd.dtype)
                if not bool(ws.all()):  # the clients not in the sum left out (not multiplied by 0: an inf would stay)
                    keep = ws.nonzero().squeeze(1).to(X.device)
                    X, D, wd = X.index_select(0, keep), D.index_select(0, keep), wd.index_select(0, keep)
                # w_i·(−η δ) computed in the weights' precision and rounded once to the history's dtype
                Dw = torch.mul(D, wd[:, None, None], out=torch.empty_like(D))
                xs.append(X.reshape(-1, X.shape[-1]))
                ds.append(Dw.reshape(-1, Dw.shape[-1]))
                if sum(len(x) for x in xs) >= SUM_PRODUCT_ROWS:
                    flush()
            if xs:
                flush()
            c = self.affine.const.get(name) if self.affine is not None else None
            if c is not None:  # Σ_i w_i (−η γ_i c_i)
                coef = (w * (-self.affine.lr) * self.affine.gamma).to(c.device, c.dtype)
                target.add_(torch.tensordot(coef, c, dims=1).to(target.device, target.dtype))


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over all tensors of two equal-keyed dicts (for tests and the benchmark)."""
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    return (num / max(den, 1e-300)) ** 0.5


__all__ = [
    "MASKED_LOSSES",
    "ModelFacts",
    "TrainRequest",
    "group_key",
    "linear_chain",
    "shares_theta",
    "train_group",
    "unbatchable",
    "relative_error",
]

"""Per-sample gradients for DP-SGD inside client training, and the interface a DP layer implements.

The core computes what DP-SGD needs from the model, for any model family: the gradient of each sample's own
loss with respect to θ (and to the client's class rows when it trains them), with ``torch.func``
(``vmap`` over ``grad`` of a ``functional_call``). What is done with them — Poisson sampling of the batch,
per-sample clipping, the noise, the accounting — belongs to the layer that supplies a
:class:`GradientPrivatizer` (``protocols/dp``); the core never imports it.

A sample's own loss is the family's loss on a batch of that one sample: the hinge on its positive labels
(embedding family), BCE/ASL over its label vector (linear head), or the loss on its unknown labels under
the label states drawn for it (C-Tran: drawn outside ``vmap``, per instance from the client's secret keyed by the
instance's content, :meth:`GradientPrivatizer.instance_uniforms`). DP-SGD's steps run without dropout.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from secure_fed.models.sparse_rows import SparseRows

#: how many samples' gradients are materialised at once (bounds memory: chunk × |θ| floats)
DEFAULT_CHUNK = 64


class GradientPrivatizer(ABC):
    """Client side: DP-SGD for one client's local training in one round (supplied by a protocol layer).

    Its randomness (batch sampling, noise) must come from a secret of the client; a step is addressed by
    ``step`` (epoch and step index), so a resumed run redraws exactly the same.
    """

    #: whether its steps move the local model (False: it sends the clipped sums instead of stepping, so a client
    #: objective's weight term, added to the step's gradient, would be lost: the trainer refuses such an objective)
    applies_weight_terms: bool = True

    @abstractmethod
    def steps_per_epoch(self) -> int:
        """How many DP-SGD steps make one local epoch."""

    @abstractmethod
    def batch(self, n: int, step: str) -> torch.Tensor:
        """Indices (into the client's ``n`` examples) of this step's batch."""

    def instance_uniforms(self, keys, m: int, step: str) -> torch.Tensor:
        """``(len(keys), m)`` float64 uniforms on (0, 1) for the per-sample randomness of this step (C-Tran's label
        mask), row i a function of the client's secret, ``step`` and ``keys[i]`` alone (the instance's content key,
        :func:`secure_fed.algorithms.instance_keys.instance_keys`), never of the batch order."""
        raise NotImplementedError(f"{type(self).__name__} draws no per-instance randomness (needed by label-masked models)")

    def clip_scales(self, copies: torch.Tensor | None) -> torch.Tensor | None:
        """(B,) float64 factors s_i of each sample's clip norm (clipped to s_i·C), from the ``(B,)`` number of clients
        each sample's instance sits on (:attr:`~secure_fed.algorithms.base.ClientData.copies`; None where the client
        has none); None (the default): every sample clipped to C. When not None, the trainer passes them to
        :meth:`factors` and :meth:`clip_sum`."""
        return None

    @abstractmethod
    def factors(self, norms: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) clipping factors from the (B,) norms of the per-sample gradients (min(1, s_i·C/‖g_i‖), s_i the
        :meth:`clip_scales`, 1 when ``scales`` is None)."""

    @abstractmethod
    def clip_sum(self, grads: dict[str, torch.Tensor], scales: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Σ over the samples of the per-sample gradients (``(B, *shape)`` for each trained tensor, by name: θ's
        parameter names, and ``rows`` for the client's class rows; together one vector per sample), each
        sample's vector clipped first (to s_i·C with ``scales``); returns one ``shape`` tensor per name."""

    @abstractmethod
    def finish(self, sums: dict[str, torch.Tensor], step: str) -> dict[str, torch.Tensor]:
        """The step's gradient from the clipped sums (noise added, scaled by a public constant)."""


def forbid_batch_norm(model: nn.Module) -> None:
    """Per-sample gradients need samples that do not interact: batch norm in training mode mixes a batch's
    samples (one sample's statistics enter every other sample's output), so no per-sample clip bounds it."""
    bn = [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if bn:
        raise ValueError(
            f"DP-SGD in client training (privacy.local) cannot run on a model with batch norm ({bn[0]}, …): a batch's "
            "statistics mix its samples, so no per-sample clip bounds one instance; use a model without batch norm"
        )


class _Scored(nn.Module):
    """The model and the family's scoring as one module, so ``functional_call`` can swap θ in."""

    def __init__(self, family, model: nn.Module):
        super().__init__()
        self.family = family
        self.model = model

    def forward(self, x: torch.Tensor, rows: torch.Tensor | None, states: torch.Tensor | None) -> torch.Tensor:
        if states is not None:
            return self.model(x, states).float()
        return self.family.score(self.family.forward(self.model, x), rows)


class Encoded(nn.Module):
    """The family's encoder output (its representation of a batch) as one module, so ``functional_call`` can swap
    θ in (``model.<name>``)."""

    def __init__(self, family, model: nn.Module):
        super().__init__()
        self.family = family
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.family.forward(self.model, x)


def per_sample_gradients(
    *,
    family,
    model: nn.Module,
    params: dict[str, torch.Tensor],
    rows: torch.Tensor | None,
    x: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable,
    states: torch.Tensor | None = None,
    precision: str = "fp32",
    on_chunk: Callable[[dict[str, torch.Tensor], torch.Tensor], None],
    chunk: int = DEFAULT_CHUNK,
    extra: Callable | None = None,
) -> None:
    """Per-sample gradients of each sample's own loss w.r.t. ``params`` (and ``rows`` when given), chunk by chunk.

    For each chunk of at most ``chunk`` samples, calls ``on_chunk(grads, losses)``: ``grads`` maps each name of
    ``params`` (and ``rows``) to its ``(b, *shape)`` gradients; ``losses`` is ``(b,)``. The trainer turns dropout
    off under DP-SGD (its draws would follow the batch position), and a private step that draws from torch's global
    generator raises (``randomness="different"`` only matters for a model that draws anyway).

    ``extra(represent, x, y)``: a client objective's per-example term (:mod:`secure_fed.algorithms.objective`),
    added to each sample's loss, so its gradient is clipped with the loss's; ``represent(x, theta=None)`` is the
    model's representation with the weights being differentiated (or with fixed weights ``theta``).
    """
    from secure_fed.models.ctran import UNKNOWN, masked_loss

    if isinstance(x, SparseRows):
        raise ValueError(
            "DP-SGD in client training on sparse input rows needs the linear fast path (a model whose trainable layers "
            "are all linear: the sparse_text encoder with the embedding or linear_head family); this model is not, so "
            "set model.sparse_input: false"
        )
    scored = _Scored(family, model)
    encoded = Encoded(family, model)
    masked = states is not None

    def loss_one(p: dict[str, torch.Tensor], r, xi, yi, si):
        xb, yb = xi.unsqueeze(0), yi.unsqueeze(0)
        sb = si.unsqueeze(0) if masked else None
        with torch.autocast(xb.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = functional_call(scored, p, (xb, r, sb))
        loss = masked_loss(loss_fn, out.float(), yb, sb == UNKNOWN) if masked else loss_fn(out, yb)
        if extra is not None:

            def represent(xr: torch.Tensor, theta: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
                weights = p if theta is None else {f"model.{n}": t.detach() for n, t in theta.items()}
                return functional_call(encoded, weights, (xr,))

            loss = loss + extra(represent, xb, yb).sum()
        return loss, loss.detach()

    with_rows = rows is not None and rows.requires_grad
    argnums = (0, 1) if with_rows else 0
    g = grad(loss_one, argnums=argnums, has_aux=True)
    per = vmap(g, in_dims=(None, None, 0, 0, 0 if masked else None), randomness="different")
    p_named = {f"model.{n}": t.detach() for n, t in params.items()}
    r = rows.detach() if rows is not None else None
    for s in range(0, x.shape[0], chunk):
        sl = slice(s, s + chunk)
        with warnings.catch_warnings():  # torch's note that attention has no batching rule under vmap (it loops)
            warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented")
            grads, losses = per(p_named, r, x[sl], targets[sl], states[sl] if masked else None)
        gp, gr = grads if with_rows else (grads, None)
        out = {n: gp[f"model.{n}"] for n in params}
        if gr is not None:
            out["rows"] = gr
        on_chunk(out, losses)


# ------------------------------------------------------------------------------ the fast path for linear models
def linear_only(model: nn.Module) -> bool:
    """Every trainable parameter belongs to an ``nn.Linear`` (the MLP and sparse-text encoders, the linear head); true
    of a model with none (a fixed encoder: only the client's rows train)."""
    owners = [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    return all(isinstance(m, nn.Linear) for m in owners)


#: per-sample row gradients formed at once by :class:`_CosineRowGradients` (samples × k × d float64 numbers)
ROW_GRADIENT_CHUNK_ELEMENTS = 2**22


class _CosineRowGradients:
    """Each sample's gradient with respect to the (k, d) rows under cosine scores s_bj = ĥ_b·r̂_j, from the scores'
    gradient δ_bj = ∂ℓ_b/∂s_bj: sample b's gradient of row j is δ_bj·(ĥ_b − (ĥ_b·r̂_j) r̂_j) / ‖r_j‖. Formed
    explicitly in float64, a chunk of samples at a time (:data:`ROW_GRADIENT_CHUNK_ELEMENTS`), once for the norms and
    once for the weighted sum, so each norm is that of the very vector the sum adds (the clip's float guarantee,
    :mod:`protocols.dp.exact_sums`), while memory stays at a chunk where per-sample copies of the rows would hold
    B·k·d numbers (the central DP reference on Bibtex at d = 1024: 4880 × 159 × 1024)."""

    def __init__(self, delta: torch.Tensor, h_hat: torch.Tensor, rows: torch.Tensor):
        self.delta = delta.double()
        self.h = h_hat.double()
        r = rows.double()
        self.r_norm = r.norm(dim=-1).clamp_min(1e-12)  # nn.functional.normalize's floor
        self.r_hat = r / self.r_norm[:, None]
        k, d = rows.shape
        self.chunk = max(1, ROW_GRADIENT_CHUNK_ELEMENTS // max(1, k * d))

    def _chunks(self):
        for a in range(0, self.delta.shape[0], self.chunk):
            h, dl = self.h[a : a + self.chunk], self.delta[a : a + self.chunk]
            s = h @ self.r_hat.T  # (c, k)
            g = h[:, None, :] - s[:, :, None] * self.r_hat[None, :, :]  # (c, k, d)
            yield a, g * (dl / self.r_norm[None, :])[:, :, None]

    def sq_norms(self) -> torch.Tensor:
        out = torch.empty(self.delta.shape[0], dtype=torch.float64, device=self.delta.device)
        for a, g in self._chunks():
            out[a : a + g.shape[0]] = g.pow(2).sum((1, 2))
        return out

    def weighted_sum(self, f: torch.Tensor) -> torch.Tensor:
        total = torch.zeros_like(self.r_hat)
        for a, g in self._chunks():
            total += torch.einsum("c,ckd->kd", f[a : a + g.shape[0]].double(), g)
        return total


def _cosine_row_gradients(delta, h_hat, rows) -> _CosineRowGradients:
    if delta is None:
        raise RuntimeError("the cosine scores kept no gradient: the loss does not depend on them")
    return _CosineRowGradients(delta, h_hat, rows)


def clipped_sum_linear(
    *,
    family,
    model: nn.Module,
    rows: torch.Tensor | None,
    x: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable,
    factors: Callable[[torch.Tensor], torch.Tensor],
    precision: str = "fp32",
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The clipped sum Σ_i f_i·∇ℓ_i of a batch without materialising any per-sample gradient, for models whose
    trainable parameters are all ``nn.Linear`` on 2-D inputs (the ghost-norm trick of Goodfellow 2015 and Li et al.
    2022): one forward and one backward of Σ_i ℓ_i record each layer's inputs a_i and output gradients g_i; the
    per-sample gradient of a weight is g_i a_iᵀ, so its squared norm is ‖g_i‖²‖a_i‖² (bias: ‖g_i‖²), and the
    clipped sum is (f∘G)ᵀA, one matrix product. The client's rows (embedding family) the same way, from the scores'
    gradient (:class:`_CosineRowGradients`). Returns the sums by name (θ's names, ``rows``) and the (B,) per-sample
    losses.
    """
    if any(getattr(m, "fused_sgd_lr", None) is not None for m in model.modules()):
        raise RuntimeError("DP-SGD's backward would apply the sparse layer's fused (non-private) SGD step: unset it")
    acts: dict[str, torch.Tensor] = {}
    outs: dict[str, torch.Tensor] = {}
    handles = []
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}

    def keep(name):
        def hook(_m, inputs, output):
            acts[name] = inputs[0].detach()
            if output.requires_grad:  # not below a fixed encoder's last trained layer (nothing to record there)
                output.register_hook(lambda g: outs.__setitem__(name, g.detach()))

        return hook

    for n, m in linears.items():
        handles.append(m.register_forward_hook(keep(n)))
    B = x.shape[0]
    train_rows = rows is not None and rows.requires_grad
    try:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = family.forward(model, x)
        if train_rows:  # the embedding family's cosine scores; their gradient δ gives each sample's rows gradient
            h_hat = nn.functional.normalize(out.float(), dim=-1)
            scores = h_hat @ nn.functional.normalize(rows.detach(), dim=-1).T
            scores.retain_grad() if scores.requires_grad else scores.requires_grad_(True)  # a fixed encoder: a leaf
        else:
            scores = family.score(out, rows.detach() if rows is not None else None)
        losses = vmap(lambda s, y: loss_fn(s.unsqueeze(0), y.unsqueeze(0)))(scores, targets)
        losses.sum().backward()
    finally:
        for h in handles:
            h.remove()
    row_grad = _cosine_row_gradients(scores.grad, h_hat.detach(), rows.detach()) if train_rows else None
    # float64 throughout (norms, factors, products, sums): the squares of float32 values are exact in float64, and the
    # clipped sum is within a proven bound of the exact one, which the privatizer's noise covers (protocols/dp's
    # exact_sums: 2·γ_{N+1}·N·C); a float32 sum's worst-case error would not be covered
    sq = torch.zeros(B, device=x.device, dtype=torch.float64)
    for n, m in linears.items():
        if not any(p.requires_grad for p in m.parameters()):
            continue
        a, g = acts[n], outs[n].double()
        if isinstance(a, SparseRows):  # the sparse first layer: ‖a_i‖² over the row's non-zeros
            a_sq = a.row_sq_norms(torch.float64)
        else:
            a = a.double()
            if a.dim() != 2:
                raise ValueError(f"the linear fast path needs 2-D inputs; {n} got {tuple(a.shape)}")
            a_sq = a.pow(2).sum(1)
        gn = g.pow(2).sum(1)
        sq += gn * a_sq if m.weight.requires_grad else 0.0
        if m.bias is not None and m.bias.requires_grad:
            sq += gn
    if row_grad is not None:
        sq += row_grad.sq_norms()
    f = factors(sq.sqrt()).to(torch.float64)
    sums: dict[str, torch.Tensor] = {}
    for n, m in linears.items():
        if not any(p.requires_grad for p in m.parameters()):
            continue
        g = outs[n].double() * f[:, None]
        prefix = f"{n}." if n else ""
        if m.weight.requires_grad:
            a = acts[n]
            sums[prefix + "weight"] = a.t_matmul(g) if isinstance(a, SparseRows) else g.T @ a.double()
        if m.bias is not None and m.bias.requires_grad:
            sums[prefix + "bias"] = g.sum(0)
    if row_grad is not None:
        sums["rows"] = row_grad.weighted_sum(f)
    for p in model.parameters():
        p.grad = None  # the backward above left Σ ∇ℓ_i on the parameters: not the step's gradient
    return sums, losses.detach()

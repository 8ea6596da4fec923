"""Per-sample gradients (the core half of DP-SGD in client training), checked against independent computations:
one backward pass per sample, and Opacus's own per-sample gradients (``GradSampleModule``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from secure_fed.algorithms.losses import bce_loss, positive_hinge_loss
from secure_fed.algorithms.per_sample import forbid_batch_norm, per_sample_gradients
from secure_fed.config import build_plan, load_config
from secure_fed.engine import Experiment
from secure_fed.models.families import CosineEmbedding, CTranFamily, LinearHead, LinearHeadModel
from tests.conftest import SMALL


def _collect(**kw):
    """Run per_sample_gradients and concatenate its chunks: one ``(B, *shape)`` tensor per name, in θ's order then
    ``rows``."""
    out: list[dict[str, torch.Tensor]] = []
    losses: list[torch.Tensor] = []

    def on_chunk(grads, ls):
        out.append({n: g.clone() for n, g in grads.items()})
        losses.append(ls.clone())

    per_sample_gradients(on_chunk=on_chunk, **kw)
    return [torch.cat([o[n] for o in out]) for n in out[0]], torch.cat(losses)


def _loop(model, params, rows, x, loss_of):
    """One forward/backward per sample: the gradient of that sample's own loss, by autograd."""
    grads, losses = [], []
    for i in range(x.shape[0]):
        for p in params:
            p.grad = None
        if rows is not None:
            rows.grad = None
        loss = loss_of(i)
        loss.backward()
        grads.append([p.grad.clone() for p in params] + ([rows.grad.clone()] if rows is not None else []))
        losses.append(loss.detach())
    return [torch.stack(g) for g in zip(*grads, strict=True)], torch.stack(losses)


def test_embedding_family_with_rows_matches_one_backward_per_sample():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5))
    fam = CosineEmbedding()
    rows = torch.randn(3, 5, requires_grad=True)
    x, pos = torch.randn(10, 6), torch.rand(10, 3) < 0.5
    pos[:, 0] = True
    params = dict(model.named_parameters())
    got, got_loss = _collect(family=fam, model=model, params=params, rows=rows, x=x, targets=pos,
                             loss_fn=positive_hinge_loss, chunk=4)  # fmt: skip
    want, want_loss = _loop(model, list(params.values()), rows, x,
                            lambda i: positive_hinge_loss(fam.score(model(x[i : i + 1]), rows), pos[i : i + 1]))  # fmt: skip
    assert len(got) == len(params) + 1  # θ's tensors, then the rows
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_loss, want_loss)


def test_linear_head_matches_opacus_grad_sample():
    """Opacus computes per-sample gradients its own way (hooks on each layer): the two must agree."""
    from opacus import GradSampleModule

    torch.manual_seed(1)
    model = LinearHeadModel(nn.Linear(6, 8), 8, 4)
    x, y = torch.randn(12, 6), torch.rand(12, 4) < 0.3
    params = dict(model.named_parameters())
    got, _ = _collect(family=LinearHead(), model=model, params=params, rows=None, x=x, targets=y, loss_fn=bce_loss, chunk=5)
    gsm = GradSampleModule(model, loss_reduction="sum")
    # one forward of the batch; the loss is the sum of each sample's own mean over its labels (bce_loss on one sample)
    bce_loss(gsm(x), y, reduction="none").mean(dim=1).sum().backward()
    for g, (name, p) in zip(got, params.items(), strict=True):
        torch.testing.assert_close(g, p.grad_sample, atol=1e-6, rtol=1e-5, msg=name)
    gsm._close()


def test_ctran_with_label_states_matches_one_backward_per_sample(tmp_path):
    cfg = load_config(overrides=[*SMALL, "algorithm.name=fedctran", "model.family=ctran", "model.embedding_dim=16",
                                 "model.ctran={layers: 1, heads: 2, token_size: 4, dropout: 0.0}",
                                 "partition.name=iid", "partition.num_clients=2"])  # fmt: skip
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    model, fam = exp.worker, CTranFamily()
    model.train()
    client = exp.fed.clients[0]
    x = client.x[:6]
    from secure_fed.algorithms.client import full_label_targets

    y = full_label_targets(client)[:6]
    states = fam.label_states(model, x, y, generator=torch.Generator().manual_seed(3))
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    got, _ = _collect(family=fam, model=model, params=params, rows=None, x=x, targets=y, loss_fn=bce_loss,
                      states=states, chunk=4)  # fmt: skip
    from secure_fed.models.ctran import UNKNOWN, masked_loss

    want, _ = _loop(model, list(params.values()), None, x,
                    lambda i: masked_loss(bce_loss, model(x[i : i + 1], states[i : i + 1]).float(), y[i : i + 1],
                                          states[i : i + 1] == UNKNOWN))  # fmt: skip
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_batch_norm_is_refused():
    with pytest.raises(ValueError, match="batch norm"):
        forbid_batch_norm(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    forbid_batch_norm(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)))


@pytest.mark.parametrize("family", ["embedding", "embedding-softmax", "linear_head"])
def test_linear_fast_path_equals_clipping_the_per_sample_gradients(family):
    """Ghost norms: the clipped sum from layer inputs and output gradients equals clipping each materialised per-sample
    gradient (the vmap path) and summing, with clipping active on most samples. The softmax case (the central DP
    reference's loss) gives every row, negatives included, a gradient; one of its rows is zero (scores 0)."""
    from secure_fed.algorithms.losses import softmax_multilabel_loss
    from secure_fed.algorithms.per_sample import clipped_sum_linear, linear_only

    torch.manual_seed(4)
    enc = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5))
    x = torch.randn(11, 6)
    if family.startswith("embedding"):
        model, fam = enc, CosineEmbedding()
        if family == "embedding":
            loss_fn, rows = positive_hinge_loss, torch.randn(2, 5)
            y = torch.rand(11, 2) < 0.6
        else:
            loss_fn, rows = softmax_multilabel_loss, torch.randn(4, 5)
            rows[3] = 0.0
            y = torch.rand(11, 4) < 0.3
        rows.requires_grad_(True)
        y[:, 0] = True
    else:
        model, fam, loss_fn = LinearHeadModel(enc, 5, 3), LinearHead(), bce_loss
        rows, y = None, torch.rand(11, 3) < 0.4
    assert linear_only(model)
    params = dict(model.named_parameters())
    C = 0.05

    def factors(norms):
        return (C / (norms + 1e-12)).clamp(max=1.0)

    got, losses = clipped_sum_linear(family=fam, model=model, rows=rows, x=x, targets=y, loss_fn=loss_fn, factors=factors)
    per, want_losses = _collect(family=fam, model=model, params=params, rows=rows, x=x, targets=y, loss_fn=loss_fn)
    names = list(params) + (["rows"] if rows is not None else [])
    norms = torch.sqrt(sum(g.reshape(11, -1).pow(2).sum(1) for g in per))
    assert (norms > C).sum() >= 8  # clipping is active
    f = factors(norms)
    for n, g in zip(names, per, strict=True):
        assert got[n].dtype == torch.float64  # the clipped sum is formed in float64 (exact sums before the snap)
        torch.testing.assert_close(got[n], torch.einsum("b,b...->...", f, g).double(), atol=1e-6, rtol=1e-5, msg=n)
    torch.testing.assert_close(losses, want_losses)
    assert all(p.grad is None for p in model.parameters())


def test_the_fast_path_is_only_taken_for_linear_models():
    from secure_fed.algorithms.per_sample import linear_only

    assert not linear_only(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)))
    assert not linear_only(nn.Sequential(nn.Conv1d(1, 1, 3)))


def test_linear_fast_path_under_bf16_autocast_sums_what_bf16_autograd_gives():
    """bf16 training (autocast of the encoder): with no clipping (factors 1) the ghost-norm sum is the gradient of
    Σ_i ℓ_i that ordinary bf16 autograd computes (the same bf16 forward and backward; its error against fp32 is bf16
    training's own, about 8% on the first layer here). Clipping stays exact in bf16: the norms and the sum are formed
    from the same recorded inputs and output gradients."""
    from secure_fed.algorithms.per_sample import clipped_sum_linear

    torch.manual_seed(5)
    model = LinearHeadModel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)), 16, 4)
    x, y = torch.randn(20, 16), torch.rand(20, 4) < 0.3
    got, _ = clipped_sum_linear(family=LinearHead(), model=model, rows=None, x=x, targets=y, loss_fn=bce_loss,
                                factors=torch.ones_like, precision="bf16")  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    bce_loss(out.float(), y, reduction="none").mean(dim=1).sum().backward()
    for n, p in model.named_parameters():
        assert got[n].dtype == torch.float64  # the clipped sum is formed in float64 (exact sums before the snap)
        torch.testing.assert_close(got[n], p.grad.double(), atol=1e-3, rtol=2e-2, msg=n)

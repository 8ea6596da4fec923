"""C-Tran: feature tokens, label mask training (loss only on unknown labels), CA-MLE's mask per sample."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from secure_fed.algorithms.client import LocalTrainer
from secure_fed.algorithms.fedlgt import CaMle
from secure_fed.algorithms.losses import LOSSES
from secure_fed.models.ctran import (
    NEGATIVE,
    POSITIVE,
    UNKNOWN,
    ChunkTokens,
    CTran,
    label_mask_states,
    masked_loss,
)
from secure_fed.models.families import CTranFamily

L = 7


def _model(seed: int = 0, **kw) -> CTran:
    torch.manual_seed(seed)
    return CTran(ChunkTokens(12, token_size=4, width=16), num_labels=L, width=16, layers=1, heads=2, **kw)


def test_feature_major_tokens_follow_scenes_moment_major_layout():
    """Token t of a feature-major row is (x[t], x[T + t], x[2T + t], …): scene's 6 moments of block t."""
    tok = ChunkTokens(294, token_size=6, width=8, feature_major=True)
    with torch.no_grad():
        tok.proj.weight.copy_(torch.eye(8, 6))
        tok.proj.bias.zero_()
        tok.position.zero_()
    x = torch.arange(294, dtype=torch.float32).unsqueeze(0)
    out = tok(x)
    assert out.shape == (1, 49, 8)
    assert out[0, 5, :6].tolist() == [5.0 + 49 * j for j in range(6)]
    chunks = ChunkTokens(10, token_size=4, width=4)  # consecutive chunks, zero-padded
    with torch.no_grad():
        chunks.proj.weight.copy_(torch.eye(4))
        chunks.proj.bias.zero_()
        chunks.position.zero_()
    assert chunks(torch.arange(10.0).unsqueeze(0))[0, 2].tolist() == [8.0, 9.0, 0.0, 0.0]


def test_label_mask_states_draw_between_a_quarter_and_all_labels_unknown():
    g = torch.Generator().manual_seed(0)
    y = torch.rand(4000, L, generator=torch.Generator().manual_seed(1)) < 0.4
    s = label_mask_states(y, 0.25, g)
    n_unknown = (s == UNKNOWN).sum(dim=1)
    low = math.ceil(0.25 * L)
    assert int(n_unknown.min()) == low and int(n_unknown.max()) == L  # both ends are drawn
    counts = np.bincount(n_unknown.numpy(), minlength=L + 1)[low:]
    assert counts.min() > 0.7 * counts.mean()  # uniform over [⌈L/4⌉, L]
    known = s != UNKNOWN
    assert torch.equal(s[known] == POSITIVE, y[known]) and torch.equal(s[known] == NEGATIVE, ~y[known])
    per_label = (s == UNKNOWN).float().mean(dim=0)  # which labels are unknown is uniform too
    assert float(per_label.max() - per_label.min()) < 0.05


@pytest.mark.parametrize("loss", ["bce", "asl"])
def test_only_unknown_labels_contribute_to_the_loss(loss):
    """The gradient of the training loss w.r.t. the logits is zero on every label given to the model (known), and
    the loss equals the elementwise loss averaged over the unknown labels, computed here independently."""
    model = _model()
    x = torch.randn(32, 12)
    y = torch.rand(32, L) < 0.5
    seen = {}

    def keep(module, args, out):
        out.retain_grad()
        seen["logits"], seen["states"] = out, args[1]

    model.register_forward_hook(keep)
    value = CTranFamily().masked_training_loss(model, x, y, LOSSES[loss], generator=torch.Generator().manual_seed(3))
    value.backward()
    value = value.detach()
    grad, states = seen["logits"].grad, seen["states"]
    unknown = states == UNKNOWN
    assert 0 < int(unknown.sum()) < unknown.numel()
    assert torch.all(grad[~unknown] == 0)
    assert torch.all(grad[unknown] != 0)
    z = seen["logits"].detach().double()
    if loss == "bce":
        elem = -(y * torch.nn.functional.logsigmoid(z) + (~y) * torch.nn.functional.logsigmoid(-z))
        assert float(value) == pytest.approx(float(elem[unknown].mean()), rel=1e-5)
    assert float(masked_loss(LOSSES[loss], seen["logits"].detach(), y, unknown)) == pytest.approx(float(value), rel=1e-6)


def test_the_known_states_reach_the_model():
    """Giving the true state of a label changes the logits (the state embeddings are used); unknown = no state."""
    model = _model().eval()
    x = torch.randn(4, 12)
    all_unknown = torch.zeros(4, L, dtype=torch.long)
    assert torch.equal(model(x), model(x, all_unknown))
    given = all_unknown.clone()
    given[:, 0] = POSITIVE
    assert not torch.allclose(model(x), model(x, given))


def test_ca_mle_marks_every_sample_whose_global_probability_is_within_epsilon_of_tau():
    """The client's CA-MLE mask, against a direct computation: a separate copy of the received global model, in
    eval mode with every label unknown, p = σ(logits), unknown where τ − ε ≤ p ≤ τ + ε; for every sample of the
    batch (the authors' code only did the first)."""
    received = _model(seed=1)
    theta = {n: p.detach().clone() for n, p in received.named_parameters()}
    worker = _model(seed=2)  # the client's working model holds other (trained) weights
    trainer = LocalTrainer(worker, CTranFamily())
    x = torch.randn(64, 12)
    with torch.no_grad():
        p = torch.sigmoid(received.eval()(x))
    tau, eps = float(p.median()), 0.05
    expected = (p >= tau - eps) & (p <= tau + eps)
    worker.train()
    got = CaMle(tau, eps).unknown_labels(trainer._global_probabilities(theta), None)(x)
    assert torch.equal(got, expected)
    assert 0 < int(expected.sum()) < expected.numel()
    assert int(expected[1:].any(dim=1).sum()) > 10  # samples after the first are masked too
    assert worker.training  # the worker goes back to training mode
    assert not torch.equal(worker.head_weight, theta["head_weight"])  # its own weights are left as they were


def test_ca_mle_unknown_labels_join_the_label_mask_and_are_trained_on():
    model = _model()
    x, y = torch.randn(16, 12), torch.rand(16, L) < 0.5
    band = torch.zeros(16, L, dtype=torch.bool)
    band[:, 2] = True  # label 2 uncertain for every sample
    seen = {}
    model.register_forward_hook(lambda m, a, out: seen.update(states=a[1]))
    gen = torch.Generator().manual_seed(0)
    CTranFamily().masked_training_loss(model, x, y, LOSSES["bce"], generator=gen, uncertain=lambda _x: band)
    assert torch.all(seen["states"][:, 2] == UNKNOWN)
    plain = label_mask_states(y, 0.25, torch.Generator().manual_seed(0))
    keep = torch.ones(L, dtype=torch.bool)
    keep[2] = False
    assert torch.equal(seen["states"][:, keep], plain[:, keep])  # the others keep their label-mask state


def test_text_embeddings_are_buffers_outside_theta():
    model = CTran(ChunkTokens(12, token_size=4, width=16), num_labels=L, width=16, layers=1, heads=2,
                  label_source="text", text_dim=5)  # fmt: skip
    names = {n for n, _ in model.named_parameters()}
    assert "text_proj.weight" in names and not any(n.startswith("text_labels") or n.startswith("text_states") for n in names)
    with pytest.raises(RuntimeError, match="set_text_embeddings"):
        model(torch.randn(2, 12))
    model.set_text_embeddings(np.ones((L, 5), np.float32), np.ones((2, 5), np.float32))
    assert model(torch.randn(2, 12)).shape == (2, L)
    assert "text_labels" not in model.state_dict()  # not persistent: each client computes them


def test_ca_mle_leaves_the_payload_unchanged_with_batch_norm_statistics_in_theta():
    """ResNet tokens: batch-norm running statistics are parameters in θ; scoring with the received θ must not
    write a batch's statistics into the payload (it runs in eval mode)."""
    from secure_fed.models.backbones import ResNetEncoder
    from secure_fed.models.ctran import ResNetTokens

    torch.manual_seed(0)
    tokens = ResNetTokens(ResNetEncoder("resnet18", (3, 32, 32), out_dim=8, weights="random"), width=16)
    model = CTran(tokens, num_labels=L, width=16, layers=1, heads=2)
    assert tokens.num_tokens == 1
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    before = {n: t.clone() for n, t in theta.items()}
    model.train()
    probabilities = LocalTrainer(model, CTranFamily())._global_probabilities(theta)
    mask = CaMle(0.5, 0.1).unknown_labels(probabilities, None)(torch.randn(8, 3 * 32 * 32) * 3)
    assert mask.shape == (8, L)
    assert all(torch.equal(theta[n], before[n]) for n in theta)

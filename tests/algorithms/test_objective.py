"""The client objective's hooks (:mod:`secure_fed.algorithms.objective`) on the trainer's paths: sequential SGD and
DP-SGD (per-sample). Checked against independent computations: plain autograd on loss + term, and a deterministic
privatizer (full batch, zero noise) whose clip is either inactive or makes the data's gradient vanish."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from secure_fed.algorithms.base import ClientData
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.algorithms.losses import bce_loss
from secure_fed.algorithms.objective import ClientObjective
from secure_fed.algorithms.per_sample import GradientPrivatizer
from secure_fed.models.families import LinearHead, LinearHeadModel

LR = 0.1


class FullBatch(GradientPrivatizer):
    """DP-SGD's interface with no randomness: every example in every step, clip norm ``clip``, no noise, the sum
    divided by n (so with an inactive clip a step is plain full-batch SGD on the mean loss)."""

    def __init__(self, n: int, clip: float):
        self.n, self.clip = n, clip

    def steps_per_epoch(self) -> int:
        return 1

    def batch(self, n: int, step: str) -> torch.Tensor:
        return torch.arange(n)

    def factors(self, norms: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.clip / norms.clamp(min=1e-30), max=1.0)

    def clip_sum(self, grads):
        flat = torch.cat([g.reshape(g.shape[0], -1).double() for g in grads.values()], dim=1)
        f = self.factors(flat.norm(dim=1))
        return {n: (g.double() * f.view(-1, *[1] * (g.dim() - 1))).sum(0) for n, g in grads.items()}

    def finish(self, sums, step):
        return {n: s / self.n for n, s in sums.items()}


class ConstantPull(ClientObjective):
    """A weight term that is a constant vector per parameter (as SCAFFOLD's c − c_i)."""

    name = "constant"
    weight_only = True

    def __init__(self, value: float):
        self.value = value

    def weight_term(self, params, ctx):
        return {n: torch.full_like(p, self.value) for n, p in params.items()}


class Magnet(ClientObjective):
    """A per-example term: λ·Σ_j tanh(represent(x))_j per example, and ``begin``/``end`` counting in the state."""

    name = "magnet"
    per_example = True

    def __init__(self, lam: float):
        self.lam = lam

    def begin(self, ctx):
        ctx.state["begun"] = ctx.state.get("begun", 0) + 1

    def per_example_term(self, represent, x, y, ctx):
        return self.lam * torch.tanh(represent(x)).sum(dim=1)

    def end(self, ctx, theta_delta):
        ctx.state["steps"] = ctx.steps


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = LinearHeadModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 8, 4)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = torch.randn(12, 6), torch.rand(12, 4) < 0.3
    data = ClientData(0, x, y, torch.arange(4), None, num_labels=4)
    return model, theta, data


def _train(model, theta, data, objective=None, privatizer=None, epochs=3, fast=True):
    trainer = LocalTrainer(model, LinearHead())
    trainer.linear_fast_path &= fast  # False: DP-SGD through per-sample gradients (vmap), as a non-linear model's
    hp = LocalTraining(epochs=epochs, batch_size=len(data.x), lr=LR)
    payload = {"theta": theta, "train_rows": False, "loss": "bce"}
    return trainer.update_one(payload, data, hp, torch.Generator().manual_seed(0), privatizer, objective)


def _reference(theta, data, term, epochs=3):
    """Full-batch gradient descent on the mean of (loss + per-example term), written out with autograd."""
    model = LinearHeadModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 8, 4)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(theta[n])
    for _ in range(epochs):
        out = model(data.x)  # the family's representation (the linear head's: its logits)
        loss = bce_loss(out, data.pos) + term(out).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads, strict=True):
                p -= LR * g
    return {n: p.detach() - theta[n] for n, p in model.named_parameters()}


def test_per_example_term_on_the_sequential_path_equals_autograd_on_loss_plus_term():
    model, theta, data = _setup()
    got = _train(model, theta, data, Magnet(0.5))["theta_delta"]
    want = _reference(theta, data, lambda h: 0.5 * torch.tanh(h).sum(dim=1))
    for n in want:
        torch.testing.assert_close(got[n], want[n], atol=1e-6, rtol=1e-5)
    assert (got["encoder.0.weight"] - _train(model, theta, data)["theta_delta"]["encoder.0.weight"]).abs().max() > 1e-3


def test_per_example_term_under_dp_sgd_is_in_each_examples_loss():
    """An inactive clip and no noise: DP-SGD's step is full-batch SGD on loss + term (per-sample gradients summed)."""
    model, theta, data = _setup(1)
    got = _train(model, theta, data, Magnet(0.5), FullBatch(len(data.x), clip=1e9))["theta_delta"]
    want = _reference(theta, data, lambda h: 0.5 * torch.tanh(h).sum(dim=1))
    for n in want:
        torch.testing.assert_close(got[n], want[n], atol=1e-6, rtol=1e-5)


def test_per_example_term_under_dp_sgd_is_inside_the_clip():
    """A per-example term with a huge gradient is clipped with the loss: each step moves θ by at most η·C."""
    model, theta, data = _setup(2)
    clip = 1e-3
    delta = _train(model, theta, data, Magnet(1e4), FullBatch(len(data.x), clip=clip), epochs=2)["theta_delta"]
    norm = float(torch.cat([d.reshape(-1) for d in delta.values()]).norm())
    assert 0 < norm <= 2 * LR * clip * (1 + 1e-6)


@pytest.mark.parametrize("fast", [True, False], ids=["ghost-norms", "per-sample"])
def test_weight_term_under_dp_sgd_is_added_after_the_noise_unclipped(fast):
    """A clip that makes the data's gradient vanish (C = 1e-12) and a constant weight term: the update is the term's
    K·η steps exactly, not clipped (inside the clip it would be ~1e-12)."""
    model, theta, data = _setup(3)
    priv = FullBatch(len(data.x), clip=1e-12)
    delta = _train(model, theta, data, ConstantPull(0.25), priv, epochs=3, fast=fast)["theta_delta"]
    for d in delta.values():
        torch.testing.assert_close(d, torch.full_like(d, -3 * LR * 0.25), atol=1e-6, rtol=0)  # fp32 steps


def test_weight_term_on_the_sequential_path_adds_to_the_gradient():
    model, theta, data = _setup(4)
    plain = _train(model, theta, data)["theta_delta"]
    pulled = _train(model, theta, data, ConstantPull(0.25), epochs=1)["theta_delta"]
    one = _train(model, theta, data, epochs=1)["theta_delta"]
    for n in plain:  # one full-batch step: the term moves every entry by −η·0.25 more
        torch.testing.assert_close(pulled[n] - one[n], torch.full_like(one[n], -LR * 0.25), atol=1e-6, rtol=0)


def test_begin_and_end_see_the_clients_own_state_and_the_step_count():
    model, theta, data = _setup(5)
    _train(model, theta, data, Magnet(0.0), epochs=3)
    _train(model, theta, data, Magnet(0.0), FullBatch(len(data.x), clip=1.0), epochs=2)
    assert data.state == {"begun": 2, "steps": 2}


def test_a_weight_term_under_noise_shares_is_refused_and_dp_hides_the_count():
    """Under ``privacy.local.noise: shares`` the client sends its clipped sums and takes no local step, so a weight
    term would be dropped: refused, one line. Under DP-SGD the hooks do not see the client's example count."""
    from protocols.dp.local_dpsgd import LocalDPSGD
    from protocols.dp.local_shares import LocalShareSums
    from protocols.randomness import SecretStream
    from secure_fed.errors import SecureFedError

    assert LocalDPSGD.applies_weight_terms and not LocalShareSums.applies_weight_terms
    stream = SecretStream.from_noise_seed(1, "c")
    shares = LocalShareSums(sink=lambda sums: None, clip_norm=1.0, noise_multiplier=1.0, sample_rate=1.0, divisor=4,
                            stream=stream, label="r0")  # fmt: skip
    seen = {}

    class Weighted(ClientObjective):
        weight_only = True

        def begin(self, ctx):
            seen["count"] = ctx.num_examples

        def weight_term(self, params, ctx):
            return {n: torch.zeros_like(p) for n, p in params.items()}

    model, theta, data = _setup()
    with pytest.raises(SecureFedError, match="noise: shares"):
        _train(model, theta, data, Weighted(), shares, epochs=1)
    local = LocalDPSGD(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.5, divisor=4, stream=stream, label="r0")
    _train(model, theta, data, Weighted(), local, epochs=1)
    assert seen["count"] is None
    _train(model, theta, data, Weighted(), None, epochs=1)
    assert seen["count"] == data.num_examples

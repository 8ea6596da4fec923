"""FedProx's and SCAFFOLD's weight terms under DP-SGD in client training (``privacy.local``): added to each step's
gradient **after** the noise, exactly, never inside the per-sample clip.

The client trains with the real DP-SGD privatizer (``protocols.dp.local_dpsgd.LocalDPSGD``: Poisson batches,
per-sample clip, Gaussian noise from a fixed seed), wrapped to record each step's private gradient (what
``finish`` returns: the clipped sum plus noise, scaled). The update is then recomputed independently from those
records alone: w ← w − η(private gradient + the term written out at w). A term moved inside the clip (it would then
be part of the recorded gradient, clipped, and the replay would add it again), dropped, or with its sign flipped
fails the comparison; the term's own share of the update is checked to be far above the tolerance."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from secure_fed.algorithms.base import ClientData
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.algorithms.per_sample import GradientPrivatizer
from secure_fed.models.families import LinearHead, LinearHeadModel

LR, EPOCHS = 0.1, 3


class Recording(GradientPrivatizer):
    """A privatizer as is, each step's private gradient (``finish``'s output) kept."""

    def __init__(self, inner: GradientPrivatizer):
        self.inner, self.steps = inner, []
        self.applies_weight_terms = inner.applies_weight_terms

    def steps_per_epoch(self) -> int:
        return self.inner.steps_per_epoch()

    def batch(self, n: int, step: str) -> torch.Tensor:
        return self.inner.batch(n, step)

    def factors(self, norms: torch.Tensor) -> torch.Tensor:
        return self.inner.factors(norms)

    def clip_sum(self, grads):
        return self.inner.clip_sum(grads)

    def finish(self, sums, step):
        out = self.inner.finish(sums, step)
        self.steps.append({n: t.detach().clone() for n, t in out.items()})
        return out


def _privatizer(clip: float = 1.0) -> Recording:
    from protocols.dp.local_dpsgd import LocalDPSGD
    from protocols.randomness import SecretStream

    stream = SecretStream.from_noise_seed(7, "client 0")
    return Recording(LocalDPSGD(clip_norm=clip, noise_multiplier=1.0, sample_rate=0.5, divisor=6, stream=stream, label="r0"))


def _train(objective, privatizer, fast: bool, state: dict | None = None):
    torch.manual_seed(0)
    model = LinearHeadModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 8, 4)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = torch.randn(12, 6), torch.rand(12, 4) < 0.3
    data = ClientData(0, x, y, torch.arange(4), None, num_labels=4, state=state if state is not None else {})
    trainer = LocalTrainer(model, LinearHead())
    trainer.linear_fast_path &= fast  # False: per-sample gradients through vmap (a non-linear model's path)
    hp = LocalTraining(epochs=EPOCHS, batch_size=6, lr=LR)
    payload = {"theta": theta, "train_rows": False, "loss": "bce"}
    reply = trainer.update_one(payload, data, hp, torch.Generator().manual_seed(0), privatizer, objective)
    return theta, reply["theta_delta"]


def _replay(theta, steps, term) -> dict[str, torch.Tensor]:
    """The update from the recorded private gradients alone, the term added after them: w ← w − η(g_t + term(w))."""
    w = {n: t.clone() for n, t in theta.items()}
    for g in steps:
        w = {n: w[n] - LR * (g[n].to(w[n].dtype).reshape(w[n].shape) + term(n, w[n])) for n in w}
    return {n: w[n] - theta[n] for n in theta}


def _check(theta, delta, steps, term):
    assert len(steps) == EPOCHS * 2  # 1/q steps per epoch
    want = _replay(theta, steps, term)
    without = _replay(theta, steps, lambda n, w: torch.zeros_like(w))
    share = max(float((want[n] - without[n]).abs().max()) for n in theta)
    assert share > 1e-3  # the term's part of the update, ≫ the tolerance below
    for n in theta:
        torch.testing.assert_close(delta[n], want[n], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("fast", [True, False], ids=["ghost-norms", "per-sample"])
def test_fedprox_term_is_added_after_the_noise_exactly(plugin_path, fast):
    from fedprox.algorithm import ProximalTerm

    mu = 2.0
    priv = _privatizer()
    theta, delta = _train(ProximalTerm(mu), priv, fast)
    _check(theta, delta, priv.steps, lambda n, w: mu * (w - theta[n]))


@pytest.mark.parametrize("fast", [True, False], ids=["ghost-norms", "per-sample"])
def test_scaffold_correction_is_added_after_the_noise_exactly(plugin_path, fast):
    """SCAFFOLD with a server ĉ and the client's own c_i: each step adds c − c_i, c = ĉ/(Kη) with K = epochs × the
    privatizer's steps per epoch (DP-SGD's fixed K)."""
    from scaffold.algorithm import STATE_KEY, ControlVariates

    torch.manual_seed(5)
    model = LinearHeadModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 8, 4)
    control = {n: 0.05 * torch.randn_like(p) for n, p in model.named_parameters()}
    c_i = {n: 0.3 * torch.randn_like(p) for n, p in model.named_parameters()}
    priv = _privatizer()
    theta, delta = _train(ControlVariates(control), priv, fast, state={STATE_KEY: c_i})
    k_eta = EPOCHS * 2 * LR
    _check(theta, delta, priv.steps, lambda n, w: control[n] / k_eta - c_i[n])

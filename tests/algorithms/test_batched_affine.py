"""An objective's affine weight term (:class:`~secure_fed.algorithms.objective.AffineTerm`) in the batched trainer's
closed form, against the reference trainer (``LocalTrainer.update_one`` with the objective, which adds the term's
gradient at each step's weights): a proximal rate (FedProx's shape), a constant offset per client (SCAFFOLD's shape)
and both with an anchor of its own, over ragged schedules, joined and per-step histories, with and without deferred
updates. In float64 the two agree to rounding."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from secure_fed.algorithms import batched_sgd
from secure_fed.algorithms.batched_sgd import TrainRequest, relative_error, train_group
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.algorithms.objective import AffineTerm, ClientObjective
from secure_fed.models.encoders import SparseTextEncoder
from secure_fed.models.families import CosineEmbedding
from tests.algorithms.test_batched_sgd import JOINS, _clients


class Declared(ClientObjective):
    """The reference's objective: the given affine term, evaluated at each step's weights (the default weight_term)."""

    name = "declared"
    weight_only = True
    affine = True

    def __init__(self, term: AffineTerm):
        self.term = term

    def affine_term(self, ctx):
        return self.term


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    dt = torch.float64
    model = SparseTextEncoder(20, embed_dim=16, hidden_dims=(32, 24), out_dim=8).to(dt)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    clients = _clients(dt, num_labels=4, positive_only=True)
    rows = F.normalize(torch.randn(4, 8, dtype=dt), dim=-1)

    def payload(d):
        k = d.known_labels
        return {"theta": theta, "rows": rows[k], "row_ids": k, "train_rows": True, "loss": "positive"}

    return model, theta, clients, payload


def _terms(kind: str, theta, n_clients: int) -> list[AffineTerm]:
    g = torch.Generator().manual_seed(3)

    def rand_like(t):
        return 0.3 * torch.randn(t.shape, generator=g, dtype=t.dtype)

    out = []
    for i in range(n_clients):
        if kind == "proximal":  # FedProx: a = μ (one per client here), anchor = the θ received, b = 0
            out.append(AffineTerm(rate=0.4 + 0.2 * i))
        elif kind == "constant":  # SCAFFOLD: a = 0, b = c − c_i
            out.append(AffineTerm(offset={n: rand_like(t) for n, t in theta.items()}))
        else:  # an anchor of its own and an offset on some parameters only
            out.append(AffineTerm(rate=0.7, anchor={n: t + rand_like(t) for n, t in theta.items()},
                                  offset={n: rand_like(t) for n, t in theta.items() if n.endswith("bias")}))  # fmt: skip
    return out


KINDS = ["proximal", "constant", "general"]


@pytest.mark.parametrize("join", sorted(JOINS))
@pytest.mark.parametrize("epochs", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_the_affine_term_in_the_closed_form_equals_the_reference_trainers_steps(kind, epochs, join, monkeypatch):
    monkeypatch.setattr(batched_sgd, "JOIN_HISTORY_BYTES", JOINS[join])
    model, theta, clients, payload = _setup()
    terms = _terms(kind, theta, len(clients))
    hp = LocalTraining(batch_size=4, lr=0.3, epochs=epochs)
    trainer = LocalTrainer(model, CosineEmbedding())
    ref = [trainer.update_one(payload(d), d, hp, torch.Generator().manual_seed(10 + i), None, Declared(terms[i]))
           for i, d in enumerate(clients)]  # fmt: skip
    plain = [trainer.update_one(payload(d), d, hp, torch.Generator().manual_seed(10 + i)) for i, d in enumerate(clients)]
    reqs = [
        TrainRequest(payload(d), d, hp, torch.Generator().manual_seed(10 + i), affine=t)
        for i, (d, t) in enumerate(zip(clients, terms, strict=True))
    ]
    got = [b() for b in train_group(model, CosineEmbedding(), reqs)]
    for r, p, o, d in zip(ref, got, plain, clients, strict=True):
        assert relative_error(p["theta_delta"], r["theta_delta"]) < 1e-9
        assert relative_error({"r": p["rows_delta"]}, {"r": r["rows_delta"]}) < 1e-9
        assert p["loss"] == pytest.approx(r["loss"], rel=1e-9, abs=1e-12)
        # the term moved the update (a proximal term is 0 at the first step: from the second step on)
        if d.num_examples > (hp.batch_size if kind == "proximal" and epochs == 1 else 0):
            assert relative_error(r["theta_delta"], o["theta_delta"]) > 1e-3


@pytest.mark.parametrize("join", sorted(JOINS))
@pytest.mark.parametrize("epochs", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_a_deferred_group_with_affine_terms_reads_and_sums_as_the_reference(kind, epochs, join, monkeypatch):
    """Deferred updates: each weight's update read alone equals the reference's, and the group's weighted sum (over
    a subset of its clients) equals Σ w_i Δ_i of the reference updates."""
    monkeypatch.setattr(batched_sgd, "JOIN_HISTORY_BYTES", JOINS[join])
    model, theta, clients, payload = _setup(1)
    terms = _terms(kind, theta, len(clients))
    hp = LocalTraining(batch_size=4, lr=0.3, epochs=epochs)
    trainer = LocalTrainer(model, CosineEmbedding())
    ref = [trainer.update_one(payload(d), d, hp, torch.Generator().manual_seed(10 + i), None, Declared(terms[i]))
           for i, d in enumerate(clients)]  # fmt: skip
    reqs = [
        TrainRequest(payload(d), d, hp, torch.Generator().manual_seed(10 + i), affine=t)
        for i, (d, t) in enumerate(zip(clients, terms, strict=True))
    ]
    got = [b() for b in train_group(model, CosineEmbedding(), reqs, deferred=True)]
    names = [n for n in theta if n.endswith("weight")]
    for r, p in zip(ref, got, strict=True):
        dense = {n: t.to_dense() if n in names else t for n, t in p["theta_delta"].items()}
        assert relative_error(dense, r["theta_delta"]) < 1e-9
    weights = {i: 1.0 + 0.5 * i for i in range(len(clients)) if i != 2}
    group = got[0]["theta_delta"][names[0]].group
    for n in names:
        target = torch.full_like(theta[n], 0.25)
        group.add_weighted_sum(target, n, weights)
        expect = sum(w * ref[i]["theta_delta"][n] for i, w in weights.items())
        assert relative_error({n: target - 0.25}, {n: expect}) < 1e-9


def test_without_the_affine_term_the_closed_form_is_the_plain_update():
    """The term travels with the request: a request without it trains as plain SGD (so the comparison above is not
    met by a group that ignores the term)."""
    model, theta, clients, payload = _setup(2)
    hp = LocalTraining(batch_size=4, lr=0.3, epochs=1)
    terms = _terms("constant", theta, len(clients))
    reqs = [TrainRequest(payload(d), d, hp, torch.Generator().manual_seed(10 + i)) for i, d in enumerate(clients)]
    with_term = [TrainRequest(payload(d), d, hp, torch.Generator().manual_seed(10 + i), affine=terms[i])
                 for i, d in enumerate(clients)]  # fmt: skip
    a = [b() for b in train_group(model, CosineEmbedding(), reqs)]
    b_ = [b() for b in train_group(model, CosineEmbedding(), with_term)]
    trainer = LocalTrainer(model, CosineEmbedding())
    plain = [trainer.update_one(payload(d), d, hp, torch.Generator().manual_seed(10 + i)) for i, d in enumerate(clients)]
    for x, y, p, d in zip(a, b_, plain, clients, strict=True):
        assert relative_error(x["theta_delta"], p["theta_delta"]) < 1e-9
        if d.num_examples:
            assert relative_error(y["theta_delta"], p["theta_delta"]) > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_clients_with_their_own_theta_and_affine_terms_train_as_the_reference(kind):
    """A cohort of federations (each client its own θ, one group): the term's anchor defaults to each client's own θ,
    and an explicit anchor's constant a(θ_j − anchor_j) is formed from each client's θ."""
    model, base, clients, _ = _setup(3)
    thetas = {d.client_id: {n: t + 0.5 * torch.randn_like(t) for n, t in base.items()} for d in clients}
    rows = F.normalize(torch.randn(4, 8, dtype=torch.float64), dim=-1)

    def payload(d):
        k = d.known_labels
        return {"theta": thetas[d.client_id], "rows": rows[k], "row_ids": k, "train_rows": True, "loss": "positive"}

    terms = _terms(kind, base, len(clients))
    hp = LocalTraining(batch_size=4, lr=0.3, epochs=2)
    trainer = LocalTrainer(model, CosineEmbedding())
    ref = [trainer.update_one(payload(d), d, hp, torch.Generator().manual_seed(10 + i), None, Declared(terms[i]))
           for i, d in enumerate(clients)]  # fmt: skip
    reqs = [TrainRequest(payload(d), d, hp, torch.Generator().manual_seed(10 + i), affine=t)
            for i, (d, t) in enumerate(zip(clients, terms, strict=True))]  # fmt: skip
    assert not batched_sgd.shares_theta(reqs)
    got = [b() for b in train_group(model, CosineEmbedding(), reqs)]
    for r, p in zip(ref, got, strict=True):
        assert relative_error(p["theta_delta"], r["theta_delta"]) < 1e-9

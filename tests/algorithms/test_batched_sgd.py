"""Batched lock-step SGD (the vectorised executor's trainer) against the reference trainer, client by client.

The reference is ``LocalTrainer.update_one``: autograd through the working model, one client at a time, with
torch's SGD. The batched trainer never forms a client's weights during training (shared products plus low-rank
history terms), so the two are independent computations of the same SGD; in float64 they agree to rounding.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from secure_fed.algorithms import batched_sgd
from secure_fed.algorithms.base import ClientData
from secure_fed.algorithms.batched_sgd import TrainRequest, linear_chain, relative_error, train_group, unbatchable
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.models.encoders import MLPEncoder, SparseTextEncoder
from secure_fed.models.families import CosineEmbedding, CTranFamily, LinearHead
from secure_fed.models.group_updates import DeferredDelta

#: client sizes: ragged last batches, one client smaller than a batch, one with many steps (lock step + padding),
#: one with no examples (no step: a zero update, as the reference gives)
SIZES = [3, 9, 4, 13, 1, 8, 0]


def _clients(dt, *, num_labels, positive_only, in_dim=20, seed=0, sizes=SIZES):
    g = torch.Generator().manual_seed(seed)
    out = []
    for c, n in enumerate(sizes):
        x = (torch.rand(n, in_dim, generator=g, dtype=torch.float64) * (torch.rand(n, in_dim, generator=g) < 0.4)).to(dt)
        if positive_only:
            known = torch.tensor([c % num_labels])
            pos = torch.ones(n, 1, dtype=torch.bool)
        else:  # the general setting: the client knows a subset of the labels, full label vectors as targets
            known = torch.tensor(sorted({c % num_labels, (c + 2) % num_labels}))
            pos = torch.rand(n, len(known), generator=g) < 0.5
        out.append(ClientData(client_id=c, x=x, pos=pos, known_labels=known, raw=None, num_labels=num_labels))
    return out


def _compare(model, family, clients, payload_of, hp, tol):
    trainer = LocalTrainer(model, family)
    reference = [trainer.update_one(payload_of(d), d, hp, torch.Generator().manual_seed(10 + i)) for i, d in enumerate(clients)]
    reqs = [TrainRequest(payload_of(d), d, hp, torch.Generator().manual_seed(10 + i)) for i, d in enumerate(clients)]
    batched = [build() for build in train_group(model, family, reqs)]
    for ref, got in zip(reference, batched, strict=True):
        assert set(got) == set(ref)
        assert relative_error(got["theta_delta"], ref["theta_delta"]) < tol
        assert got["num_examples"] == ref["num_examples"]
        assert got["loss"] == pytest.approx(ref["loss"], rel=tol, abs=tol)
        if "rows_delta" in ref:
            assert relative_error({"r": got["rows_delta"]}, {"r": ref["rows_delta"]}) < tol
            assert torch.equal(got["row_ids"], ref["row_ids"])
        if ref["num_examples"]:
            assert max(float(t.abs().max()) for t in ref["theta_delta"].values()) > 0  # a real update was compared


#: JOIN_HISTORY_BYTES: never join (a segment per step), join midway through the schedule, join from the start
JOINS = {"per-step": -1, "midway": 8_000, "joined": 1 << 30}


@pytest.mark.parametrize("join", sorted(JOINS))
@pytest.mark.parametrize("train_rows", [True, False])
@pytest.mark.parametrize("epochs", [1, 2])
def test_embedding_family_matches_the_reference_trainer_in_float64(train_rows, epochs, join, monkeypatch):
    monkeypatch.setattr(batched_sgd, "JOIN_HISTORY_BYTES", JOINS[join])
    torch.manual_seed(0)
    dt = torch.float64
    model = SparseTextEncoder(20, embed_dim=16, hidden_dims=(32, 24), out_dim=8).to(dt)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    clients = _clients(dt, num_labels=4, positive_only=True)
    rows = F.normalize(torch.randn(4, 8, dtype=dt), dim=-1)

    def payload(d):
        k = d.known_labels
        return {"theta": theta, "rows": rows[k], "row_ids": k, "train_rows": train_rows, "loss": "positive"}

    hp = LocalTraining(batch_size=4, lr=0.3, epochs=epochs)
    _compare(model, CosineEmbedding(), clients, payload, hp, 1e-9)


@pytest.mark.parametrize("batched_score", [True, False])
def test_a_family_scores_many_clients_at_once_or_through_vmap(batched_score, monkeypatch):
    """The embedding family scores a whole lock step at once (``batched_score``); a family that does not is called
    through vmap. Both give the reference trainer's updates."""
    calls = []
    score = CosineEmbedding.score

    def counted(self, out, rows):
        calls.append(out.dim())
        return score(self, out, rows)

    monkeypatch.setattr(CosineEmbedding, "score", counted)
    monkeypatch.setattr(CosineEmbedding, "batched_score", batched_score)
    dt = torch.float64
    torch.manual_seed(1)
    model = SparseTextEncoder(20, embed_dim=16, hidden_dims=(32,), out_dim=8).to(dt)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = F.normalize(torch.randn(4, 8, dtype=dt), dim=-1)

    def payload(d):
        k = d.known_labels
        return {"theta": theta, "rows": rows[k], "row_ids": k, "train_rows": True, "loss": "positive"}

    _compare(model, CosineEmbedding(), _clients(dt, num_labels=4, positive_only=True), payload,
             LocalTraining(batch_size=4, lr=0.3), 1e-9)  # fmt: skip
    batched = [d for d in calls if d == 3]  # the lock steps' calls (the reference trainer's are 2-d)
    assert bool(batched) == batched_score


@pytest.mark.parametrize("loss", ["bce", "asl"])
def test_linear_head_family_in_the_general_setting_matches_in_float64(loss):
    torch.manual_seed(1)
    dt = torch.float64
    from secure_fed.models.families import LinearHeadModel

    model = LinearHeadModel(MLPEncoder(20, hidden_dims=(16,), out_dim=12), 12, 5).to(dt)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    clients = _clients(dt, num_labels=5, positive_only=False)
    hp = LocalTraining(batch_size=4, lr=0.5, epochs=2)
    _compare(model, LinearHead(), clients, lambda d: {"theta": theta, "train_rows": False, "loss": loss}, hp, 1e-9)


def _against_float64(*, seed, dims, sizes, hp):
    """Per client with examples: (float64 reference update, batched update, reference update), the last two from an
    fp32 copy of a float64 text network (``dims``: embed, hidden, out) trained with ``hp`` (its precision applies to
    both fp32 trainers; the float64 one runs at full precision)."""
    torch.manual_seed(seed)
    embed, hidden, out = dims
    model64 = SparseTextEncoder(20, embed_dim=embed, hidden_dims=hidden, out_dim=out).double()
    theta64 = {n: p.detach().clone() for n, p in model64.named_parameters()}
    rows64 = F.normalize(torch.randn(4, out, dtype=torch.float64), dim=-1)

    def payload(theta, rows, d):
        return {"theta": theta, "rows": rows[d.known_labels], "row_ids": d.known_labels, "train_rows": True, "loss": "positive"}

    hp64 = LocalTraining(batch_size=hp.batch_size, lr=hp.lr, epochs=hp.epochs)
    exact = [LocalTrainer(model64, CosineEmbedding()).update_one(payload(theta64, rows64, d), d, hp64,
                                                                 torch.Generator().manual_seed(i))
             for i, d in enumerate(_clients(torch.float64, num_labels=4, positive_only=True, sizes=sizes))]  # fmt: skip
    model32 = model64.float()
    theta32 = {n: t.float() for n, t in theta64.items()}
    reqs = [TrainRequest(payload(theta32, rows64.float(), d), d, hp, torch.Generator().manual_seed(i))
            for i, d in enumerate(_clients(torch.float32, num_labels=4, positive_only=True, sizes=sizes))]  # fmt: skip
    batched = [b() for b in train_group(model32, CosineEmbedding(), reqs)]
    ref = [LocalTrainer(model32, CosineEmbedding()).update_one(r.payload, r.data, hp, torch.Generator().manual_seed(i))
           for i, r in enumerate(reqs)]  # fmt: skip
    return [(e, b, r) for e, b, r in zip(exact, batched, ref, strict=True) if e["num_examples"]]


def test_float32_is_as_close_to_the_exact_update_as_the_reference_is():
    """In fp32 neither trainer is exact; the batched one must not be further from the float64 result than the
    reference trainer (which loses bits forming θ_final − θ)."""
    for e, b, r in _against_float64(seed=2, dims=(16, (32,), 8), sizes=SIZES, hp=LocalTraining(batch_size=4, lr=0.3)):
        err_b = relative_error(b["theta_delta"], e["theta_delta"])
        err_r = relative_error(r["theta_delta"], e["theta_delta"])
        assert err_b < 1e-5 and err_b <= 2 * err_r + 1e-7


#: (client sizes, batch size, lr, epochs): the fixture's short ragged schedules, and Bibtex's (batch 32, lr 0.01,
#: clients of 3 to 22 steps, where the history terms of the late steps are many)
BF16_SCHEDULES = {"short": (SIZES, 4, 0.3, 2), "bibtex-like": ([96, 100, 104, 128, 300, 700], 32, 0.01, 1)}


@pytest.mark.parametrize("schedule", sorted(BF16_SCHEDULES))
def test_bfloat16_is_as_close_to_the_exact_update_as_the_reference_is(schedule):
    """Under bf16 autocast neither trainer is exact: the reference rounds each step's products (and its weights) to
    bf16; the batched trainer rounds its products too, sums x A₀ᵀ and the history terms in fp32, and forms each
    update as one bf16 product over all steps. Over the clients, its updates must be no further from the float64
    ones than the reference's (a single client's ratio scatters between about 0.7 and 3 with the seed, so the test
    compares the sums): 1.01 and 1.19 here; with the history terms summed in bf16 the bibtex-like one was 1.64."""
    sizes, batch, lr, epochs = BF16_SCHEDULES[schedule]
    hp = LocalTraining(batch_size=batch, lr=lr, epochs=epochs, precision="bf16")
    err_b = err_r = 0.0
    for e, b, r in _against_float64(seed=3, dims=(32, (64, 64), 16), sizes=sizes, hp=hp):
        assert all(t.dtype == torch.float32 for t in b["theta_delta"].values())  # updates stay fp32, as θ
        err_b += relative_error(b["theta_delta"], e["theta_delta"])
        err_r += relative_error(r["theta_delta"], e["theta_delta"])
    assert err_r > 1e-4 and err_b > 1e-4  # bf16 really ran in both (fp32 alone stays near 1e-7)
    assert err_b <= 1.5 * err_r, (err_b, err_r)


def test_what_the_batched_trainer_does_not_cover_is_named():
    model = SparseTextEncoder(6, embed_dim=4, hidden_dims=(4,), out_dim=4)
    d = _clients(torch.float32, num_labels=2, positive_only=True, in_dim=6)[0]
    theta = dict(model.named_parameters())

    def req(hp=None, loss="positive", **extra):
        return TrainRequest({"theta": theta, "loss": loss, **extra}, d, hp or LocalTraining(), torch.Generator())

    fam = CosineEmbedding()
    assert unbatchable(model, fam, req()) is None
    assert "DP-SGD" in unbatchable(model, fam, req(), privatizer=object())
    assert "SGD" in unbatchable(model, fam, req(LocalTraining(momentum=0.9)))
    assert "SGD" in unbatchable(model, fam, req(LocalTraining(weight_decay=0.1)))
    assert "SGD" in unbatchable(model, fam, req(LocalTraining(optimizer="adam")))
    assert "softmax" in unbatchable(model, fam, req(loss="softmax"))
    assert "mask" in unbatchable(model, CTranFamily(), req())
    dropout = nn.Sequential(nn.Linear(6, 4), nn.Dropout(0.5))
    assert unbatchable(dropout, fam, req()) is not None


def test_a_chain_must_hold_every_parameter():
    enc = SparseTextEncoder(6, embed_dim=4, hidden_dims=(4,), out_dim=4)
    assert [isinstance(m, nn.Linear) for m, _ in linear_chain(enc)] == [True, True, False, True]
    enc.extra = nn.Linear(2, 2)  # a parameter outside the chain: the chain no longer describes the model
    assert linear_chain(enc) is None
    assert linear_chain(nn.Sequential(nn.Linear(2, 2))) is None  # no chain() declared


def test_the_declared_chain_computes_the_models_forward_pass():
    torch.manual_seed(3)
    from secure_fed.models.families import LinearHeadModel

    for model in (SparseTextEncoder(7, embed_dim=5, hidden_dims=(6, 4), out_dim=3),
                  LinearHeadModel(MLPEncoder(7, hidden_dims=(5,), out_dim=4), 4, 3)):  # fmt: skip
        x = torch.randn(5, 7)
        h = x
        for m, _ in linear_chain(model):
            h = m(h)
        assert torch.allclose(h, model(x), atol=1e-6)


# --------------------------------------------------------------------------------------------- deferred updates
def _deferred_setup(dt, *, epochs, batch=4, lr=0.3, sizes=SIZES, precision="fp32"):
    """A text network, its clients (ragged batches, one without examples) and fresh requests for it."""
    torch.manual_seed(5)
    model = SparseTextEncoder(20, embed_dim=16, hidden_dims=(32, 24), out_dim=8).to(dt)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    clients = _clients(dt, num_labels=4, positive_only=True, sizes=sizes)
    rows = F.normalize(torch.randn(4, 8, dtype=dt), dim=-1)
    hp = LocalTraining(batch_size=batch, lr=lr, epochs=epochs, precision=precision)

    def payload(d):
        k = d.known_labels
        return {"theta": theta, "rows": rows[k], "row_ids": k, "train_rows": True, "loss": "positive"}

    def reqs():
        return [TrainRequest(payload(d), d, hp, torch.Generator().manual_seed(20 + i)) for i, d in enumerate(clients)]

    return model, theta, clients, payload, hp, reqs


@pytest.mark.parametrize("product_rows", [1, 1 << 20])  # every lock step its own product; all steps in one
@pytest.mark.parametrize("join", sorted(JOINS))
@pytest.mark.parametrize("epochs", [1, 2])
def test_a_deferred_group_reads_as_its_dense_updates_and_sums_them_as_the_reference_does(epochs, join, product_rows, monkeypatch):
    """``deferred=True``: each weight update reads (``to_dense``) exactly as the group's dense update without
    deferral, every other entry is the same tensor, and the group's weighted sum over a subset of its clients is
    Σ w_i Δ_i of the reference trainer's updates (float64), added to what the target held."""
    monkeypatch.setattr(batched_sgd, "JOIN_HISTORY_BYTES", JOINS[join])
    monkeypatch.setattr(batched_sgd, "SUM_PRODUCT_ROWS", product_rows)
    model, theta, clients, payload, hp, reqs = _deferred_setup(torch.float64, epochs=epochs)
    fam = CosineEmbedding()
    plain = [b() for b in train_group(model, fam, reqs(), deferred=False)]
    deferred = [b() for b in train_group(model, fam, reqs(), deferred=True)]
    weights_names = [n for n in theta if n.endswith("weight")]
    for p, d in zip(plain, deferred, strict=True):
        assert set(d["theta_delta"]) == set(theta)
        for n, t in d["theta_delta"].items():
            if n in weights_names:
                assert isinstance(t, DeferredDelta) and t.shape == tuple(theta[n].shape) and t.dtype == theta[n].dtype
                assert torch.equal(t.to_dense(), p["theta_delta"][n])
            else:
                assert torch.equal(t, p["theta_delta"][n])
        assert torch.equal(d["rows_delta"], p["rows_delta"]) and d["loss"] == p["loss"]
    trainer = LocalTrainer(model, fam)
    reference = [trainer.update_one(r.payload, r.data, hp, r.generator) for r in reqs()]
    weights = {i: 1.0 + 0.5 * i for i in range(len(clients)) if i != 2}  # client 2 left out of the sum
    group = deferred[0]["theta_delta"][weights_names[0]].group
    for n in weights_names:
        target = torch.full_like(theta[n], 0.25)
        group.add_weighted_sum(target, n, weights)
        expect = sum(w * reference[i]["theta_delta"][n] for i, w in weights.items())
        assert float(expect.abs().max()) > 0
        assert relative_error({n: target - 0.25}, {n: expect}) < 1e-9


def test_a_group_trained_without_deferral_refuses_to_sum():
    model, theta, _, _, _, reqs = _deferred_setup(torch.float64, epochs=1)
    plain = [b() for b in train_group(model, CosineEmbedding(), reqs())]
    assert all(isinstance(t, torch.Tensor) for r in plain for t in r["theta_delta"].values())
    group = batched_sgd._TrainedGroup(theta=theta, layers=[], order=[0], done=[], trail=None, real_rows=[None])
    with pytest.raises(RuntimeError, match="no lock-step history"):
        group.add_weighted_sum(torch.zeros(1), "embed.weight", {0: 1.0})


def test_a_deferred_bfloat16_sum_is_as_close_to_the_exact_sum_as_the_dense_updates_sum_is():
    """Under bf16 the group's sum runs its products in bf16 over many clients' rows (and rounds w_i·(−η δ) to
    bf16), where the dense path rounds each client's update: against the float64 sum of the same products, 1.3e-3 to
    1.6e-3 (dense) and 1.7e-3 to 1.8e-3 (pooled) here; the pooled sum must not be more than 2× further."""
    model, theta, clients, payload, hp, reqs = _deferred_setup(
        torch.float32, epochs=1, batch=32, lr=0.05, sizes=[96, 100, 104, 128, 300, 700, 50, 33], precision="bf16"
    )
    fam = CosineEmbedding()
    deferred = [b() for b in train_group(model, fam, reqs(), deferred=True)]
    weights = {i: float(d.num_examples) for i, d in enumerate(clients)}
    group = deferred[0]["theta_delta"]["embed.weight"].group
    for n in [n for n in theta if n.endswith("weight")]:
        li = group.layer_of[n]
        exact = sum(  # float64 products of the same bf16 histories, each client's own rows
            weights[i] * (h[1].double().T @ h[0].double())
            for i in weights
            if (h := group._history(li, group.pos_of[i])) is not None
        )
        dense = sum(weights[i] * deferred[i]["theta_delta"][n].to_dense().double() for i in weights)
        pooled = torch.zeros_like(theta[n])
        group.add_weighted_sum(pooled, n, weights)
        err_dense = float((dense - exact).norm() / exact.norm())
        err_pooled = float((pooled.double() - exact).norm() / exact.norm())
        assert 1e-4 < err_dense < 1e-2 and 1e-4 < err_pooled < 1e-2  # bf16 ran in both
        assert err_pooled <= 2 * err_dense, (n, err_pooled, err_dense)


@pytest.mark.parametrize("deferred", [False, True])
def test_a_group_keeps_its_lock_step_history_only_when_its_updates_are_deferred(deferred, monkeypatch):
    kept = []
    init = batched_sgd._TrainedGroup.__init__

    def spy(self, **kw):
        kept.append(kw["trail"])
        init(self, **kw)

    monkeypatch.setattr(batched_sgd._TrainedGroup, "__init__", spy)
    model, _, _, _, _, reqs = _deferred_setup(torch.float64, epochs=1)
    train_group(model, CosineEmbedding(), reqs(), deferred=deferred)
    assert (kept[0] is not None and all(kept[0])) if deferred else kept == [None]


@pytest.mark.parametrize("epochs", [1, 2])
def test_clients_with_their_own_theta_train_as_one_group_as_the_reference_does(epochs):
    """A cohort of federations (membership inference's shadow runs): each client starts from its own θ (same shapes),
    one group for all of them (``group_key(own_theta=True)``), each equal to its reference update."""
    torch.manual_seed(0)
    dt = torch.float64
    model = SparseTextEncoder(20, embed_dim=16, hidden_dims=(32, 24), out_dim=8).to(dt)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    clients = _clients(dt, num_labels=4, positive_only=True)
    # each client its own θ: far enough apart that a product with another client's θ would show
    thetas = {d.client_id: {n: t + 0.5 * torch.randn_like(t) for n, t in base.items()} for d in clients}
    rows = F.normalize(torch.randn(4, 8, dtype=dt), dim=-1)

    def payload(d):
        k = d.known_labels
        return {"theta": thetas[d.client_id], "rows": rows[k], "row_ids": k, "train_rows": True, "loss": "positive"}

    hp = LocalTraining(batch_size=4, lr=0.3, epochs=epochs)
    reqs = [TrainRequest(payload(d), d, hp, torch.Generator()) for d in clients]
    assert not batched_sgd.shares_theta(reqs)
    assert len({batched_sgd.group_key(r, own_theta=True) for r in reqs if r.data.num_examples}) == 1
    _compare(model, CosineEmbedding(), clients, payload, hp, 1e-9)

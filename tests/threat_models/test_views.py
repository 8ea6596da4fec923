"""Roles and views: what the simulator hands each attacker, and that attacks get nothing else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from secure_fed.algorithms.label_sets import Sha256Tokenizer
from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL
from tests.protocols.test_keyed_hashing_and_ckks import _blob, _file_holds, _holds
from threat_models import ATTACKS, Role
from threat_models.attacks_section import attacks_of
from threat_models.audit import audit
from threat_models.context import AuditContext
from threat_models.views import ClientView, ObserverView, ServerView


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


TAP = ["attacks.run=[update_inversion]", "training.rounds=2"]


def _run(tmp_path, *ov):
    e = build_experiment(small_plan(*TAP, *ov), run_dir=tmp_path)
    e.run(progress=False)
    return e


def test_plaintext_uplinks_are_in_the_server_view_and_sum_to_its_aggregate(tmp_path):
    e = _run(tmp_path, "algorithm.name=fedaws")
    cap = AuditContext(e).server_view().capture
    assert cap.uplink_kind == "plaintext" and cap.round == 1
    assert set(cap.individual) == set(cap.cohort) and len(cap.cohort) == len(e.fed.clients)
    total = sum(cap.individual.values())
    assert torch.allclose(total, cap.aggregate, atol=1e-5)
    assert all(t.abs().sum() > 0 for t in cap.individual.values())


@pytest.mark.parametrize("layer", ["secure_aggregation", "ckks"])
def test_secure_sum_layers_leave_the_server_only_the_sum(tmp_path, layer):
    plain = AuditContext(_run(tmp_path / "p", "algorithm.name=fedaws")).server_view().capture
    sec = AuditContext(_run(tmp_path / "s", "algorithm.name=fedaws", f"protocols=[{layer}]")).server_view().capture
    assert sec.individual is None
    assert sec.uplink_kind == ("masked" if layer == "secure_aggregation" else "encrypted")
    assert torch.allclose(sec.aggregate, plain.aggregate, atol=1e-4)  # the sum itself is what the server learns


def test_keyed_hashing_view_holds_tokens_and_row_numbers_only(tmp_path):
    e = _run(tmp_path, "protocols=[keyed_hashing]")
    view = AuditContext(e).server_view()
    assert view.row_names is None and view.tokenizer == "hmac-sha256"
    plain = set(Sha256Tokenizer().tokens(e.dataset.train.features))
    received = {t for _, toks, _ in view.token_messages for t in toks}
    assert received and not (received & plain)
    kh = e.stack.layers[0]
    secrets = {r.run_key for r in kh._clients.values()} | {r.salt for r in kh._clients.values()}
    secrets |= {r.pair.private_bytes() for r in kh._clients.values()}
    blob = _blob(dataclasses.asdict(view))
    for s in secrets:
        assert not _holds(blob, s)
        assert not _file_holds(tmp_path / "private" / "checkpoints" / "server_view.pt", s)
    # … and the same search finds the run key where the clients keep it
    assert any(_file_holds(tmp_path / "private" / "checkpoints" / "clients.pt", s) for s in secrets)


def test_clear_labels_give_the_server_names_and_plain_tokens(tmp_path):
    e = _run(tmp_path)
    view = AuditContext(e).server_view()
    assert view.row_names == tuple(e.dataset.label_names) and view.tokenizer == "sha256"
    plain = set(Sha256Tokenizer().tokens(e.dataset.train.features))
    assert {t for _, toks, _ in view.token_messages for t in toks} <= plain


def test_observer_and_client_views_hold_only_the_released_model_or_own_rows(tmp_path):
    e = _run(tmp_path, "protocols=[keyed_hashing]")
    ctx = AuditContext(e)
    obs = ctx.observer_view()
    assert {f.name for f in dataclasses.fields(ObserverView)} == {"config", "theta0", "theta", "W", "label_names", "privacy"}
    assert torch.equal(obs.W, e.W[torch.as_tensor(e.label_perm)])  # released in label-name order
    cv = ctx.client_view(3)
    assert cv.rows.shape[0] == 1 and torch.equal(cv.rows[0], e.W[e.fed.clients[3].known_labels[0]])
    assert cv.raw.shape[0] == e.fed.clients[3].num_examples
    with pytest.raises(dataclasses.FrozenInstanceError):
        obs.theta = {}


def test_views_have_no_private_fields():
    private = {"raw", "x", "pos", "run_key", "salt", "included", "label_perm", "members", "secret"}
    for cls in (ServerView, ObserverView):
        assert not ({f.name for f in dataclasses.fields(cls)} & private), cls


def test_each_attack_gets_its_roles_view_and_no_ground_truth(tmp_path, monkeypatch):
    plan = small_plan("attacks.run=[all]", "training.rounds=3", "attacks.membership_inference.shadows=0",
                       "attacks.one_run_audit.canaries=50")  # fmt: skip
    e = build_experiment(plan, run_dir=tmp_path)
    e.run(progress=False)
    ctx = AuditContext(e)
    seen: dict[str, tuple[type, object]] = {}
    for name, cls in ATTACKS.items():
        orig = cls.run

        def spy(self, view, aux, _orig=orig, _name=name):
            seen[_name] = (type(view), aux)
            return _orig(self, view, aux)

        monkeypatch.setattr(cls, "run", spy)
    audit(ctx, progress=False)
    expected = {Role.SERVER: ServerView, Role.OBSERVER: ObserverView, Role.AUDITOR: ObserverView, Role.CLIENT: ClientView}
    ran = {n for n in ATTACKS if n not in ("update_inversion", "gradient_inversion")}  # no images: both skip
    assert ran <= set(seen)
    for name in ran:
        assert seen[name][0] is expected[ATTACKS[name].role], name
    # the auxiliary knowledge carries no ground truth
    assert seen["one_run_audit"][1]["canaries"].included is None
    assert "member" not in seen["membership_inference"][1]
    assert set(seen["token_linkage"][1]) == {"candidates"}
    assert set(seen["label_deanonymization"][1]) == {"Y_public", "names"}
    # an attack run on a view gives the same guess whatever the simulator's truth is afterwards
    atk = ATTACKS["one_run_audit"](attacks_of(plan).one_run_audit)
    aux, truth = atk.prepare(ctx)
    g1 = atk.run(ctx.observer_view(), aux)
    canaries = ctx.inserted("one_run_audit")
    canaries.included = ~canaries.included
    g2 = atk.run(ctx.observer_view(), aux)
    assert np.array_equal(g1["scores"], g2["scores"])

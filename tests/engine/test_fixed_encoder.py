"""``model.fixed_encoder``: the encoder stays at its seeded initialisation (its released value does not depend on the
data, which the privacy report states); only W's rows or the linear head learn, with and without DP-SGD."""

from __future__ import annotations

import pytest
import torch

from secure_fed.algorithms.losses import positive_hinge_loss
from secure_fed.algorithms.per_sample import clipped_sum_linear
from secure_fed.engine import Experiment
from secure_fed.engine.builders import fix_encoder
from secure_fed.errors import ConfigError
from secure_fed.models.encoders import SparseTextEncoder
from secure_fed.models.families import CosineEmbedding
from tests.conftest import small_config, small_plan

DP = ['protocols=["dp"]', "algorithm.name=fedaws", "training.client_lr=1.0",
      'privacy.local={"clip_norm": 1.0, "noise_multiplier": 1.0, "batch_sample_rate": 1.0, '
      '"max_labels_per_instance": 3}']  # fmt: skip


@pytest.mark.parametrize("extra", [[], DP, ["model.family=linear_head", "partition.name=iid", "algorithm.name=fedavg"]],
                         ids=["plain", "dp-sgd", "linear-head"])  # fmt: skip
def test_the_encoder_is_released_as_initialised_and_the_rest_learns(tmp_path, extra):
    exp = Experiment(small_plan("model.fixed_encoder=true", "training.rounds=2", *extra), run_dir=tmp_path)
    start = {k: v.clone() for k, v in exp.theta.items()}
    W0 = None if exp.W is None else exp.W.clone()
    exp.run(progress=False)
    fixed = [k for k in start if not k.startswith("head.")]
    assert fixed and all(torch.equal(start[k], exp.theta[k]) for k in fixed)
    learned = [exp.theta[k] - start[k] for k in start if k.startswith("head.")] + ([] if W0 is None else [exp.W - W0])
    assert learned and all(d.abs().max() > 0 for d in learned)


def test_the_privacy_report_names_the_fixed_encoder_and_what_dp_sgd_covers(tmp_path):
    res = Experiment(small_plan("model.fixed_encoder=true", "training.rounds=1", *DP), run_dir=tmp_path).run(progress=False)
    unit = res.privacy["units"]["instance"]
    assert "fixed at its initialisation" in unit["fixed"][0]
    assert "(the client's class rows)" in unit["scope"]
    res = Experiment(small_plan("training.rounds=1", *DP), run_dir=tmp_path / "b").run(progress=False)
    unit = res.privacy["units"]["instance"]
    assert "fixed" not in unit and "θ and the client's class rows" in unit["scope"]


def test_rows_only_dp_sgd_clips_the_rows_gradient_of_each_instance():
    """The ghost-norm path with nothing trained in the encoder: each instance's row gradient, clipped to C, summed,
    against one autograd call per instance."""
    torch.manual_seed(0)
    enc = SparseTextEncoder(20, embed_dim=8, hidden_dims=(), out_dim=6)
    fix_encoder(enc)
    rows = torch.randn(1, 6).requires_grad_(True)
    x, y = torch.rand(9, 20), torch.ones(9, 1, dtype=torch.bool)
    C = 0.05

    def factors(norms):
        return (C / (norms + 1e-12)).clamp(max=1.0)

    sums, _ = clipped_sum_linear(family=CosineEmbedding(), model=enc, rows=rows, x=x, targets=y,
                                 loss_fn=positive_hinge_loss, factors=factors)  # fmt: skip
    assert set(sums) == {"rows"}
    want = torch.zeros_like(rows)
    for i in range(9):
        r = rows.detach().clone().requires_grad_(True)
        s = torch.nn.functional.normalize(enc(x[i : i + 1]), dim=-1) @ torch.nn.functional.normalize(r, dim=-1).T
        (g,) = torch.autograd.grad(positive_hinge_loss(s, y[i : i + 1]), r)
        want += g * min(1.0, C / float(g.norm()))
    torch.testing.assert_close(sums["rows"], want, rtol=1e-5, atol=1e-7, check_dtype=False)  # the fast path sums in float64


CLIENT_DP = ['protocols=["dp"]', "algorithm.name=fedaws", 'privacy.client={"noise_multiplier": 1.0}']
SHARES = ['protocols=["dp", "secure_aggregation"]', "algorithm.name=fedaws", "training.local_epochs=1",
          'privacy.local={"noise_multiplier": 1.0, "batch_sample_rate": 1.0, "max_labels_per_instance": 1, '
          '"noise": "shares"}']  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [["model.family=ctran"], ["model.name=resnet18", "model.weights=random"], CLIENT_DP, SHARES],
    ids=["ctran", "resnet", "client-dp-noise-on-theta", "shares-noise-on-theta"],
)
def test_a_fixed_encoder_that_would_still_learn_is_refused(bad):
    with pytest.raises(ConfigError, match="fixed_encoder"):
        small_config("model.fixed_encoder=true", *bad)


def test_validate_says_the_encoder_is_fixed_and_what_learns(tmp_path):
    from tests.config.test_bad_input import cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 0\n")

    dp = ['protocols=["dp"]', "algorithm.name=fedaws",
          'privacy.local={"noise_multiplier": 1.0, "batch_sample_rate": 1.0, "max_labels_per_instance": 3}']  # fmt: skip
    code, out, err = cli("validate", str(cfg), *[x for s in [*dp, "model.fixed_encoder=true"] for x in ("--set", s)])
    assert code == 0, err
    assert "encoder g_θ is fixed at its initialisation" in out and "only W's rows learn" in out
    code, out, _ = cli("validate", str(cfg), *[x for s in dp for x in ("--set", s)])
    assert code == 0 and "is fixed" not in out


def test_encoder_init_orthogonal_builds_the_same_projection_on_every_call_and_kaiming_is_unchanged():
    """model.encoder_init: the server's and the worker's builds agree (same seed), orthogonal differs from the
    default, and the default is the Kaiming encoder the golden runs pin."""
    from secure_fed.data.from_config import build_dataset
    from secure_fed.engine.builders import build_encoder_for

    linear = ["model.hidden_dims=[]", "model.fixed_encoder=true", "model.embedding_dim=8"]
    plan, base = small_plan(*linear, "model.encoder_init=orthogonal"), small_plan(*linear)
    data = build_dataset(plan, None)
    a, b, k = build_encoder_for(plan, data), build_encoder_for(plan, data), build_encoder_for(base, data)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))

    def composed(enc):  # the linear encoder's map x ↦ A x, from its layers
        A = None
        for m in enc.chain():
            A = m.weight if A is None else m.weight @ A
        return A

    A = composed(a)
    s = torch.linalg.svdvals(A)
    gain = 2.0 ** (len(a.chain()) / 2)  # √2 per layer
    assert A.shape[0] < A.shape[1] and torch.allclose(s, torch.full_like(s, gain), atol=1e-4)
    assert not torch.allclose(composed(k), A)


@pytest.mark.parametrize("bad", ["model.name=resnet18 model.weights=random", "model.family=ctran"])
def test_encoder_init_orthogonal_is_refused_where_it_has_no_linear_layers_to_set(bad):
    with pytest.raises(ConfigError, match="encoder_init=orthogonal"):
        small_plan("model.encoder_init=orthogonal", *bad.split())

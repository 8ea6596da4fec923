"""DP: the ledger matches Opacus, calibration hits the target, the budget is never exceeded,
the label-set mechanism reduces to the non-private step, and resume does not double count."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import PRVAccountant, RDPAccountant

from protocols.dp.accountant import RDP_ORDERS, PrivacyUnit, calibrate_sigma, epsilon_of
from protocols.dp.client_dp import clip_update, update_norm
from protocols.dp.discrete_gaussian import noisy_sum
from protocols.dp.label_set_dpsgd import dp_label_set_step
from protocols.randomness import SecretStream
from secure_fed.algorithms.fedaws import regularizer_step
from secure_fed.algorithms.regularizers import (
    correlation_sigma,
    correlation_top_k,
    label_set_correlation_grads,
    nearest_classes,
    neighbour_hinge_grads,
)
from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_config, small_plan

OPACUS = {"rdp": RDPAccountant, "prv": PRVAccountant}


def _released(total: torch.Tensor, sigma: float, sensitivity: float) -> torch.Tensor:
    """The W step's mechanism as the dp layer runs it (σ = 0 here: the sum as it is)."""
    return noisy_sum(total, sigma=sigma, sensitivity=sensitivity, stream=SecretStream.fresh(), label="w")


def unit(sigma=1.0, q=0.1, target=None, acc="rdp"):
    return PrivacyUnit(name="instance", scope="test", sigma=sigma, sample_rate=q, delta=1e-5, accountant=acc,
                       target_epsilon=target, clip_norm=1.0, calibrated=False, planned_steps=10)  # fmt: skip


@pytest.mark.parametrize("acc", ["rdp", "prv"])
def test_ledger_epsilon_equals_opacus(acc):
    u = unit(sigma=1.1, q=0.05, acc=acc)
    ref = OPACUS[acc]()
    for _ in range(30):
        u.step()
        ref.step(noise_multiplier=1.1, sample_rate=0.05)
    # RDP: Opacus's curve at the integer orders of the ledger's grid, where it is proven for the discrete Gaussian
    # (protocols/dp/discrete_gaussian_accounting.py; its fractional orders are interpolated, and do not win here)
    alphas = {"rdp": [a for a in RDP_ORDERS if float(a).is_integer()], "prv": None}[acc]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert u.epsilon() == pytest.approx(ref.get_epsilon(1e-5, **({"alphas": alphas} if alphas else {})), rel=1e-9)


@pytest.mark.parametrize("acc", ["rdp", "prv"])
@pytest.mark.parametrize("target", [1.0, 4.0])
def test_calibrated_sigma_reaches_target_within_one_percent(acc, target):
    """σ is calibrated so that neither accountant exceeds the target; the binding one (RDP, the looser bound
    everywhere we measured) lands within 1% of it, whichever accountant the run reports."""
    sigma = calibrate_sigma(target_epsilon=target, delta=1e-5, sample_rate=0.1, steps=50, accountant=acc)
    eps = {a: epsilon_of([(sigma, 0.1, 50)], 1e-5, a) for a in ("rdp", "prv")}
    assert max(eps.values()) <= target and max(eps.values()) >= 0.99 * target


@settings(max_examples=30, deadline=None)
@given(
    sigma=st.floats(0.3, 3.0),
    q=st.floats(0.01, 1.0),
    target=st.floats(0.2, 10.0),
    steps=st.integers(1, 80),
)
def test_budget_is_never_exceeded(sigma, q, target, steps):
    u = unit(sigma=sigma, q=q, target=target)
    done = 0
    while done < steps and u.stop_reason() is None:
        u.step()
        done += 1
        assert u.epsilon() <= target
    if done < steps:  # it stopped early: because the next step would have crossed the target
        assert u.epsilon_after(1) > target


def test_label_set_step_without_noise_equals_nonprivate_sigma_step():
    torch.manual_seed(0)
    C, d, n = 10, 8, 40
    W = torch.nn.functional.normalize(torch.randn(C, d, dtype=torch.float64), dim=-1)
    Y = (torch.rand(n, C) < 0.3).double()
    W_ref = W.clone()
    regularizer_step(W_ref, lambda V: correlation_top_k(V, 9.0 * correlation_sigma(Y), 3, 1.0), 0.05)
    W_dp = W.clone()

    def grads(V):  # W-only parts computed once per step, reused over chunks
        nn_idx = nearest_classes(V, 3)
        pair = neighbour_hinge_grads(V, nn_idx, 1.0)
        return lambda Yb: label_set_correlation_grads(V, Yb, k=3, margin=1.0, scale=9.0, nn_idx=nn_idx, pair_grads=pair)

    stats = dp_label_set_step(W_dp, Y, grads, clip_norm=1e9, noise_multiplier=0.0, divisor=float(n), step_size=0.05,
                              pick=torch.ones(n, dtype=torch.bool), noise=_released, chunk=7)  # fmt: skip
    assert stats["dp_batch"] == n and stats["dp_clipped_frac"] == 0.0
    assert torch.allclose(W_dp, W_ref, atol=1e-12)


def test_label_set_step_clips_every_contribution():
    torch.manual_seed(1)
    W = torch.nn.functional.normalize(torch.randn(8, 4, dtype=torch.float64), dim=-1)
    Y = torch.zeros(1, 8, dtype=torch.float64)
    Y[0, :3] = 1
    grads = lambda V: lambda Yb: label_set_correlation_grads(V, Yb, k=7, margin=2.0, scale=100.0)  # noqa: E731
    W2 = W.clone()
    dp_label_set_step(W2, Y, grads, clip_norm=1e-3, noise_multiplier=0.0, divisor=1.0, step_size=1.0,
                      pick=torch.ones(1, dtype=torch.bool), noise=_released)  # fmt: skip
    # one set, clipped to 1e-3, step 1, divided by the public B̄ = 1 → W moves by at most 1e-3 before renormalising
    assert (W2 - W).norm() <= 1e-3 * 1.01


def test_client_clip_bounds_the_whole_update():
    reply = {"theta_delta": {"a": torch.full((3,), 2.0)}, "rows_delta": torch.full((1, 4), 2.0), "row_ids": [0]}
    assert update_norm(clip_update(reply, 0.5)) == pytest.approx(0.5)
    small = {"theta_delta": {"a": torch.full((3,), 0.01)}}
    assert torch.equal(clip_update(small, 0.5)["theta_delta"]["a"], small["theta_delta"]["a"])


DP_INSTANCE = [
    'protocols=["dp"]',
    "algorithm.normalize_gamma=false",
    'privacy.instance={"target_epsilon": 2.0, "sample_rate": 0.2}',
]


def test_budget_stops_training_before_the_step_that_would_exceed(tmp_path):
    cfg = small_config(*DP_INSTANCE, 'privacy.instance={"noise_multiplier": 2.0, "target_epsilon": 2.0, "sample_rate": 0.2}',
                       "training.rounds=40")  # fmt: skip
    res = Experiment(build_plan(cfg), run_dir=tmp_path).run(progress=False)
    s = res.summary
    assert s["status"] == "budget_exhausted" and 0 < s["rounds_completed"] < 40
    inst = s["privacy"]["units"]["instance"]
    assert inst["epsilon"] <= 2.0 and "would reach" in s["stop_reason"]
    assert epsilon_of([(2.0, 0.2, inst["steps"] + 1)], 1e-5, "rdp") > 2.0  # the next step really would exceed
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    eps = [x["privacy"]["instance"]["epsilon"] for x in lines]
    assert eps == sorted(eps) and len(lines) == s["rounds_completed"] and "P@1" in lines[-1]


@pytest.mark.parametrize(
    "stack",
    [
        [*DP_INSTANCE, "privacy.instance.noise_multiplier=1.5", "privacy.instance.target_epsilon=null"],
        ['protocols=["dp"]', 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}'],
        [
            'protocols=["dp"]',
            "algorithm.name=fedaws",
            'privacy.local={"noise_multiplier": 1.0, "batch_sample_rate": 0.5, "max_labels_per_instance": 8}',
        ],
    ],
    ids=["instance", "client", "local"],
)
def test_resume_restores_the_ledger_without_double_counting(tmp_path, stack):
    ov = [*stack, "training.rounds=6", "output.checkpoint_every=3", "privacy.noise_seed=5"]  # two runs, one noise
    full = Experiment(small_plan(*ov), run_dir=tmp_path / "full").run(progress=False).summary
    Experiment(small_plan(*ov, "training.rounds=3"), run_dir=tmp_path / "part").run(progress=False)
    e = Experiment(small_plan(*ov), run_dir=tmp_path / "part")
    assert e.resume()
    resumed = e.run(progress=False).summary
    unit_name = full["privacy"]["unit"]
    a, b = full["privacy"]["units"][unit_name], resumed["privacy"]["units"][unit_name]
    # 6 rounds: one step a round, or (local) the same whole number of steps each round
    assert a["steps"] == b["steps"] and a["steps"] % 6 == 0 and a["epsilon"] == pytest.approx(b["epsilon"], rel=1e-12)
    assert full["final"]["P@1"] == resumed["final"]["P@1"]


def test_run_without_dp_says_epsilon_infinite(tmp_path):
    s = Experiment(small_plan("training.rounds=2"), run_dir=tmp_path).run(progress=False).summary
    assert s["privacy"]["epsilon"] == "inf"


CLIENT_NOISE = 'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "clients"}'


def test_client_side_noise_needs_a_secure_sum():
    with pytest.raises(ConfigError, match="needs secure_aggregation after dp"):
        small_config('protocols=["dp"]', CLIENT_NOISE)


def test_client_side_noise_shares_add_up_to_sigma_and_the_server_adds_none(tmp_path):
    """Each client adds N(0, (σS)²/t); t shares sum to variance ≥ (σS)²; the server adds no noise itself."""
    from protocols.dp.layer import DifferentialPrivacy
    from secure_fed.engine.aggregation import RoundSession

    cfg = small_config("algorithm.name=fedaws", 'protocols=["dp", "secure_aggregation"]', CLIENT_NOISE)
    e = Experiment(build_plan(cfg), run_dir=tmp_path)
    dp = next(layer for layer in e.stack.layers if isinstance(layer, DifferentialPrivacy))
    base = RoundSession(cohort=[0, 1, 2, 3], theta=e.theta, W=e.W, weighting="uniform")
    session = dp.open_round(0, base)
    session._set_min_summands(4)  # what a secure-sum layer outside dp sets: t = 4
    zero = {"theta_delta": {n: torch.zeros_like(t) for n, t in e.theta.items()}, "num_examples": 1, "loss": 0.0}
    fn = session.client_mod(lambda p, d: zero)
    noisy = fn({}, e.fed.clients[0])
    flat = torch.cat([t.flatten() for t in noisy["theta_delta"].values()])
    rows = noisy["row_noise"].flatten()
    for x in (flat, rows):  # σ·S/√t with t = 4, to 6 standard errors of a sample std (the draws are secret)
        assert x.std().item() == pytest.approx(2.0 * 0.5 / 2.0, rel=6 / (2 * x.numel()) ** 0.5)
    session.submit(0, noisy)  # one share in: the sums are that share, unless the server adds noise of its own
    agg = session.finish()
    assert torch.equal(torch.cat([t.flatten() for t in agg.theta_sum.values()]), flat)
    assert float(agg.row_sum.abs().max()) == 0.0  # row shares travel in the secure sum's packing; the server adds none
    assert dp.units["client"].steps == 1


def test_client_side_noise_runs_under_secure_aggregation_and_is_refused_under_ckks(tmp_path):
    """Noise shares need an exact sum: secure aggregation's integer sums carry the grid values exactly; CKKS decrypts
    approximately (data-dependent error and float decryption noise on the release), so validate refuses it. Under
    general partitions with per-label rows, the secure sum would carry each row's client count exactly: refused too."""
    cfg = small_config("algorithm.name=fedavg", 'protocols=["dp", "secure_aggregation"]', CLIENT_NOISE, "training.rounds=2")
    s = Experiment(build_plan(cfg), run_dir=tmp_path / "secagg").run(progress=False).summary
    assert s["status"] == "completed" and s["privacy"]["units"]["client"]["steps"] == 2
    with pytest.raises(ConfigError, match="CKKS decrypts approximately"):
        small_config("algorithm.name=fedavg", 'protocols=["dp", "ckks"]', CLIENT_NOISE)
    with pytest.raises(ConfigError, match="each row's count of clients"):
        small_config(
            "algorithm.name=fedavg",
            "partition.name=iid",
            "model.family=embedding",
            'protocols=["dp", "secure_aggregation"]',
            CLIENT_NOISE,
        )


def test_a_noise_share_step_sends_no_training_loss(tmp_path):
    """The loss would reach the server inside the secure sum, exactly and outside the noise: the share step sends 0."""
    exp = Experiment(small_plan("algorithm.name=fedavg", 'protocols=["dp", "secure_aggregation"]', CLIENT_NOISE),
                     run_dir=tmp_path)  # fmt: skip
    dp = exp.stack.by_name()["dp"]
    reply = {"theta_delta": {n: torch.zeros_like(t) for n, t in exp.theta.items()}, "loss": 1.23, "num_examples": 5}
    out = dp.noise_share_step(reply, exp.fed.clients[0], std=0.1, rows=None, label="noise share r0")
    assert out["loss"] == 0.0 and reply["loss"] == 1.23


def test_a_secure_sum_range_that_would_clip_noise_shares_is_refused(tmp_path):
    """Noise shares travel inside secure aggregation's encoding, which clips to ±clip_range: a range below
    S·(1 + 10σ) (here 0.5 · 21 = 10.5) is refused before anything runs — when the config is read for a given σ,
    when the dp layer calibrates σ otherwise. Once the model is built, the dp layer adds the discrete Gaussian's grid
    term (std σ·(S + γ√d)): 10.5 is refused then too, and just above the corrected bound the run goes on, in 64- and
    in 32-bit words."""
    base = ["algorithm.name=fedavg", 'protocols=["dp", "secure_aggregation"]', "training.rounds=1"]
    with pytest.raises(ConfigError, match=r"secure_aggregation.clip_range 10.4 would clip .* = 10.5 "):
        small_config(*base, CLIENT_NOISE, "secure_aggregation.clip_range=10.4")
    calibrated = 'privacy.client={"target_epsilon": 5.0, "clip_norm": 0.5, "noise": "clients"}'
    cfg = small_config(*base, calibrated, "secure_aggregation.clip_range=1.5")  # σ unknown until calibrated
    with pytest.raises(ConfigError, match=r"secure_aggregation.clip_range 1.5 would clip the clients' noise shares"):
        Experiment(build_plan(cfg), run_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"clip_range 10.5 would clip .* the grid's γ√d"):
        Experiment(small_plan(*base, CLIENT_NOISE, "secure_aggregation.clip_range=10.5"), run_dir=tmp_path / "g")
    for name, words in (("64", []), ("32", ["secure_aggregation.modulus_bits=32", "secure_aggregation.frac_bits=16"])):
        cfg = small_config(*base, CLIENT_NOISE, "secure_aggregation.clip_range=10.52", *words)
        e = Experiment(build_plan(cfg), run_dir=tmp_path / name)
        assert e.run(progress=False).summary["status"] == "completed"
        assert e.stack.by_name()["secure_aggregation"].codec.word_dtype.itemsize * 8 == int(name)
    # the server draws the noise itself (noise: server): the encoded values are clipped updates, no range needed
    ok = small_config(*base, CLIENT_NOISE.replace("clients", "server"), "secure_aggregation.clip_range=5")
    assert Experiment(build_plan(ok), run_dir=tmp_path / "d").run(progress=False).summary["status"] == "completed"


def test_secure_aggregation_refuses_a_range_that_would_clip_its_bookkeeping(tmp_path):
    """Row counts and the client count (1 each) need clip_range ≥ 1 (refused when the config is read); a weight
    or loss beyond ±R would silently skew the mean: the client refuses to encode it, naming the key."""
    with pytest.raises(ConfigError, match=r"secure_aggregation.clip_range 0.5 is below 1"):
        small_config('protocols=["secure_aggregation"]', "secure_aggregation.clip_range=0.5")
    cfg = small_config("algorithm.name=fedavg", 'protocols=["secure_aggregation"]', "secure_aggregation.clip_range=1",
                       "training.aggregation=num_examples", "training.rounds=1")  # fmt: skip
    with pytest.raises(ConfigError, match=r"secure_aggregation.clip_range 1 would clip client 0's weight \(they"):
        Experiment(build_plan(cfg), run_dir=tmp_path / "w").run(progress=False)  # client 0 holds 58 examples
    uniform = ["algorithm.name=fedavg", 'protocols=["secure_aggregation"]', "training.rounds=1"]
    with pytest.raises(ConfigError, match=r"clip_range 1 would clip client \d+'s training loss \(they"):
        Experiment(small_plan(*uniform, "secure_aggregation.clip_range=1"), run_dir=tmp_path / "l").run(progress=False)
    ok = Experiment(small_plan(*uniform, "secure_aggregation.clip_range=5"), run_dir=tmp_path / "ok")
    assert ok.run(progress=False).summary["status"] == "completed"


def test_merged_duplicates_change_a_set_so_the_sensitivity_is_two_clip_norms():
    """Identical instances A (labels {0, 1}) and B (labels {0, 2}) share a token, so collection merges them into
    {0, 1, 2}; removing A turns that set into {0, 2}: a change, not a removal, of up to 2C after clipping."""
    from secure_fed.algorithms.label_sets import merge_label_sets

    t, other = b"A=B" * 8, b"xyz" * 8
    before = merge_label_sets([([t, t, other], 0), ([t], 1), ([t], 2), ([other], 3)], 5)
    after = merge_label_sets([([t, other], 0), ([t], 2), ([other], 3)], 5)  # A removed; B and the other stay
    assert before.shape[0] == after.shape[0] == 2  # the same number of sets: one of them changed
    torch.manual_seed(3)
    W = torch.nn.functional.normalize(torch.randn(5, 4, dtype=torch.float64), dim=-1)
    C = 1e-3  # every set's gradient is clipped

    def clipped_sum(Y):
        G = label_set_correlation_grads(W, torch.from_numpy(Y.toarray()).double(), k=4, margin=2.0, scale=10.0)
        norms = G.flatten(1).norm(dim=1, keepdim=True).unsqueeze(2)
        return (G * (C / norms).clamp(max=1.0)).sum(0)

    change = float((clipped_sum(before) - clipped_sum(after)).norm())
    assert C < change <= 2 * C * (1 + 1e-9)  # more than the add/remove bound C, within the accounted 2C


def test_label_set_noise_std_is_sigma_times_two_clip_norms():
    W = torch.nn.functional.normalize(torch.randn(6, 3, dtype=torch.float64), dim=-1)
    Y = torch.zeros(10, 6, dtype=torch.float64)
    e = torch.zeros_like(W)
    e[2, 1] = 1.0  # one unit of noise on one coordinate, nothing sampled
    sigma, C, bbar, step = 1.5, 0.7, 2.5, 0.01
    W2 = W.clone()
    seen = []

    def noise(total, s, sens):  # the mechanism gets the noise multiplier and the sensitivity 2C
        seen.append((s, sens))
        return total + s * sens * e

    dp_label_set_step(W2, Y, lambda V: lambda Yb: torch.zeros(len(Yb), 6, 3, dtype=torch.float64), clip_norm=C,
                      noise_multiplier=sigma, divisor=bbar, step_size=step, pick=torch.zeros(10, dtype=torch.bool),
                      noise=noise)  # fmt: skip
    assert seen == [(sigma, 2 * C)]
    expected = torch.nn.functional.normalize(W - step * (sigma * 2 * C) * e / bbar, dim=-1)
    assert torch.allclose(W2, expected, atol=1e-15)


def test_client_level_clip_of_a_row_sparse_update_is_the_dense_clip():
    """Client-level DP clips the whole update: a table's update that arrives as touched columns is clipped as its
    dense matrix (norm written out: ‖(3, 4)‖ = 5 over both parameters, scaled to the clip norm 1)."""
    from protocols.dp.client_dp import clip_step
    from secure_fed.models.sparse_rows import RowSparseDelta

    reply = {"theta_delta": {"w": RowSparseDelta(torch.tensor([2]), torch.tensor([[3.0]]), (1, 4)),
                             "b": torch.tensor([4.0])}, "loss": 0.0, "num_examples": 1}  # fmt: skip
    out = clip_step(reply, clip_norm=1.0)
    assert torch.allclose(out["theta_delta"]["w"], torch.tensor([[0.0, 0.0, 0.6, 0.0]]))
    assert torch.allclose(out["theta_delta"]["b"], torch.tensor([0.8]))

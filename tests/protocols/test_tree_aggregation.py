"""DP-FTRL's tree aggregation (privacy.client.mechanism: tree): the prefix sums' noise, the accounting against a
published case and an independent zCDP computation, a run end to end with exact resume, and the bad inputs."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from protocols.dp.accountant import epsilon_of
from protocols.dp.discrete_gaussian import grid_noise, release_grid, snap
from protocols.dp.tree_aggregation import (
    TreeNoise,
    full_participation_sq,
    gaussian_equivalents,
    prefix_nodes,
    sensitivity_sq,
    single_participation_equivalents,
    tree_depth,
    tree_release,
    zcdp_epsilon,
    zcdp_rho,
)
from protocols.dp.tree_ledger import TreeUnit
from protocols.randomness import SecretStream
from secure_fed.engine import Experiment
from tests.config.test_bad_input import _default, assert_one_error_line, cli
from tests.conftest import small_config, small_plan

GRID = 2.0**-20


# ---------------------------------------------------------------- (1) the prefix sums' noise
def _independent_nodes(t: int) -> list[tuple[int, int]]:
    """The dyadic blocks of [0, t), re-derived greedily from the left: the largest aligned power of two that fits."""
    out, start = [], 0
    while start < t:
        h = 0
        while start % (2 ** (h + 1)) == 0 and start + 2 ** (h + 1) <= t:
            h += 1
        out.append((h, start >> h))
        start += 2**h
    return out


def test_prefix_nodes_cover_the_prefix_once_with_popcount_nodes():
    for t in range(0, 300):
        nodes = prefix_nodes(t)
        assert sorted(nodes) == sorted(_independent_nodes(t))
        assert len(nodes) == bin(t).count("1") <= tree_depth(t)
        covered = sorted(x for h, j in nodes for x in range(j << h, (j + 1) << h))
        assert covered == list(range(t))


def test_prefix_noise_is_the_sum_of_its_nodes_draws_and_increments_telescope():
    stream, std, n = SecretStream(b"k" * 32), 3.0 * GRID * 1000, 50
    tn = TreeNoise(stream, "lbl")
    total = torch.zeros(n, dtype=torch.float64)
    for r in range(13):
        total += tn.increment(r, 13, "w", n, std, GRID)
        t = r + 1
        # independently: each node drawn by its label, summed over the blocks of [0, t)
        want = sum(grid_noise(n, std, GRID, stream, f"lbl tree 0 node h{h} j{j} w") for h, j in _independent_nodes(t))
        assert torch.equal(total, want)


def test_prefix_noise_variance_is_popcount_and_prefixes_are_correlated():
    """Measured over many independent trees: Var(noise of prefix t) = popcount(t)·std², and two prefixes share
    exactly their common nodes (prefix 6 = [0,4)+[4,6), prefix 7 = [0,4)+[4,6)+[6,7): covariance 2·std²)."""
    std, n = 1000 * GRID, 4000
    stream = SecretStream(b"v" * 32)
    noise = {t: [] for t in range(1, 9)}
    for tree in range(8):  # 8 trees × 4000 coordinates = 32,000 draws per prefix
        tn = TreeNoise(stream, "var")
        for t in range(1, 9):
            noise[t].append(tn.prefix(tree, t, "w", n, std, GRID))
    for t, xs in noise.items():
        x = torch.cat(xs) / std
        assert float(x.var()) == pytest.approx(bin(t).count("1"), rel=0.05), t
    a, b = torch.cat(noise[6]) / std, torch.cat(noise[7]) / std
    assert float((a * b).mean()) == pytest.approx(2.0, rel=0.07)
    c = torch.cat(noise[4]) / std
    assert float((c * torch.cat(noise[3]) / std).mean()) == pytest.approx(0.0, abs=0.05)  # no common node


# ---------------------------------------------------------------- (2) the accounting
def test_sensitivity_counts_every_used_node_a_client_is_in():
    for t in range(1, 70):
        assert full_participation_sq(t) == sensitivity_sq(range(t), t)
        assert max(sensitivity_sq([x], t) for x in range(t)) == tree_depth(t) == math.ceil(math.log2(t + 1))
    assert gaussian_equivalents(12, 1) == 12  # a tree a round: the plain Gaussian, no sampling
    assert gaussian_equivalents(5, 5) == 3 * 1 + 1 * 4 + 1 * 16  # nodes [0,1) [2,3) [4,5); [0,2); [0,4)
    assert gaussian_equivalents(10, 4) == 2 * full_participation_sq(4) + full_participation_sq(2)


def test_the_published_case_dp_ftrl_cifar10_and_dp_accounting():
    """google-research/DP-FTRL README: CIFAR-10, batch 500 (100 batches an epoch), noise 10, 100 epochs, the tree
    restarted every epoch; its privacy.compute_epsilon_tree(restart=True, 100, 100, 10, 1e-5) gives ε = 15.1754
    (the paper's Appendix D accounting, ρ = E·⌈log2(n+1)⌉/(2σ²), RDP converted at α on a 0.1 grid). The same ε by
    dp_accounting's SingleEpochTreeAggregationDpEvent, one a tree; a power-of-two epoch (128 leaves: depth 8, not 7)
    against dp_accounting too."""
    k = single_participation_equivalents(100, trees=100)
    assert k == 700
    assert zcdp_epsilon(zcdp_rho(10.0, k), 1e-5) == pytest.approx(15.1754, abs=0.005)
    for sigma, leaves, trees in ((10.0, 100, 100), (2.0, 128, 1), (3.0, 255, 4), (3.0, 256, 4)):
        acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=privacy_accountant.NeighboringRelation.REPLACE_SPECIAL)
        for _ in range(trees):
            acc.compose(dp_event.SingleEpochTreeAggregationDpEvent(sigma, leaves))
        ref = acc.get_epsilon(1e-5)
        k = single_participation_equivalents(leaves, trees)
        assert zcdp_epsilon(zcdp_rho(sigma, k), 1e-5) == pytest.approx(ref, rel=2e-3), (sigma, leaves)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert epsilon_of([(sigma, 1.0, k)], 1e-5, "rdp") == pytest.approx(ref, rel=2e-2), (sigma, leaves)


def test_the_ledger_is_the_gaussian_at_sigma_over_root_k_and_zcdp_bounds_it():
    sigma, rounds, r = 40.0, 20, 8
    u = TreeUnit(tree_rounds=r, name="client", scope="s", sigma=sigma, sample_rate=1.0, delta=1e-5, accountant="rdp",
                 target_epsilon=None, clip_norm=1.0, calibrated=False, planned_steps=rounds)  # fmt: skip
    for _ in range(rounds):
        u.step()
    k = 2 * full_participation_sq(8) + full_participation_sq(4)
    assert u.steps == rounds and u.accountant.history == [(sigma, 1.0, k)]
    # independent: a Gaussian of sensitivity √K·C at noise σC is ρ = K/(2σ²)-zCDP; RDP at α is αρ
    rep = u.report()
    assert rep["tree"]["zcdp_rho"] == pytest.approx(k / (2 * sigma**2))
    assert rep["tree"]["sampling_amplification"] is False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps = u.epsilon()
    assert eps == pytest.approx(zcdp_epsilon(k / (2 * sigma**2), 1e-5), rel=2e-2) and eps >= zcdp_epsilon(
        k / (2 * sigma**2), 1e-5
    ) * (1 - 1e-9)
    # full participation in one tree costs more than a tree a round (the plain Gaussian) would
    assert k > rounds


# ---------------------------------------------------------------- (3) end to end, resume
TREE = [
    'protocols=["dp"]',
    'privacy.client={"noise_multiplier": 3.0, "clip_norm": 0.5, "mechanism": "tree", "tree_restart_every": 4}',
    "training.server_optimizer.name=fedavg",
    "training.server_optimizer.lr=1.0",
    "privacy.noise_seed=7",
]


def test_a_tree_run_completes_with_finite_epsilon_and_resumes_exactly(tmp_path):
    ov = [*TREE, "training.rounds=6", "output.checkpoint_every=3"]
    full = Experiment(small_plan(*ov), run_dir=tmp_path / "full").run(progress=False).summary
    c = full["privacy"]["units"]["client"]
    k = full_participation_sq(4) + full_participation_sq(2)
    assert c["steps"] == 6 and c["sample_rate"] == 1.0 and c["tree"]["gaussian_equivalents"] == k
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert c["epsilon"] == pytest.approx(epsilon_of([(3.0, 1.0, k)], 1e-5, "rdp"), rel=1e-12)
    assert math.isfinite(c["epsilon"])
    Experiment(small_plan(*ov, "training.rounds=3"), run_dir=tmp_path / "part").run(progress=False)
    e = Experiment(small_plan(*ov), run_dir=tmp_path / "part")
    assert e.resume()
    resumed = e.run(progress=False).summary
    assert resumed["privacy"]["units"]["client"]["epsilon"] == c["epsilon"]
    assert resumed["final"] == full["final"]
    a = torch.load(tmp_path / "full" / "private" / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "part" / "private" / "checkpoints" / "last.pt", weights_only=False)
    ta, tb = a["theta"], b["theta"]
    assert ta.keys() == tb.keys() and all(torch.equal(ta[n], tb[n]) for n in ta)


def test_the_releases_add_up_to_the_noisy_prefix_sum():
    """FTRL form: what the model adds up (η/N times each round's release, fedavg's x ← x + η·Δ) is the snapped
    clipped sums so far plus the noise of their prefix, the sum of popcount(t) nodes drawn independently here."""
    stream, clip = SecretStream(b"f" * 32), 0.5
    tn = TreeNoise(stream, "ftrl")
    gen = torch.Generator().manual_seed(0)
    acc = {"a": torch.zeros(3, 4, dtype=torch.float64), "rows": torch.zeros(5, 2, dtype=torch.float64)}
    leaves = {"a": torch.zeros(3, 4, dtype=torch.float64), "rows": torch.zeros(5, 2, dtype=torch.float64)}
    grid, corrected = release_grid(clip, 22)
    for r in range(7):
        agg = SimpleNamespace(theta_sum={"a": torch.randn(3, 4, generator=gen, dtype=torch.float64)},
                              row_sum=torch.randn(5, 2, generator=gen, dtype=torch.float64))  # fmt: skip
        leaves["a"] += snap(agg.theta_sum["a"], grid)
        leaves["rows"] += snap(agg.row_sum, grid)
        tree_release(agg, clip_norm=clip, noise_multiplier=2.0, noise=tn, round_idx=r, tree_rounds=5, noise_rows=True)
        acc["a"] += agg.theta_sum["a"]
        acc["rows"] += agg.row_sum
        tree, pos = divmod(r, 5)
        for n, shape in (("a", (3, 4)), ("rows", (5, 2))):
            numel = math.prod(shape)
            # every finished tree's total, then the current tree's prefix: each a sum of its nodes' own draws
            noise = sum(
                (grid_noise(numel, 2.0 * corrected, grid, stream, f"ftrl tree {k} node h{h} j{j} {n}")
                 for k, t in [*((k, 5) for k in range(tree)), (tree, pos + 1)] for h, j in _independent_nodes(t)),
                torch.zeros(numel, dtype=torch.float64),
            )  # fmt: skip
            assert torch.allclose(acc[n], leaves[n] + noise.reshape(shape), rtol=0, atol=1e-9)


# ---------------------------------------------------------------- (4) bad inputs
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["training.client_fraction=0.5", "training.sampling=poisson"], "uses no sampling amplification"),
        (["training.clients_per_round=3"], "uses no sampling amplification"),
        (["training.server_optimizer.name=fedadam"], "server_optimizer.name fedadam"),
        (['privacy.client={"noise_multiplier": 1.0, "mechanism": "tree", "noise": "clients"}'], "with noise: clients"),
        (['privacy.client={"noise_multiplier": 1.0, "tree_restart_every": 3}'], "mechanism: tree only"),
    ],
    ids=["poisson", "fixed-cohort", "fedadam", "client-noise", "restart-without-tree"],
)
def test_bad_tree_configs_are_one_error_line(tmp_path, extra, needle):
    ov = [x for o in (*TREE, "training.rounds=1", *extra) for x in ("--set", o)]
    assert_one_error_line(*cli("validate", *_default(tmp_path), *ov)[::2], needle)
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], needle)
    assert not out.exists()


def test_default_mechanism_is_gaussian():
    cfg = small_config('protocols=["dp"]', 'privacy.client={"noise_multiplier": 1.0}')
    assert cfg.privacy.client.mechanism == "gaussian" and cfg.privacy.client.tree_restart_every is None


def test_a_resumed_run_draws_node_noise_from_the_checkpointed_secret(tmp_path):
    """Without privacy.noise_seed the server's key is fresh: on resume the node noise must come from the key in
    server_secrets.pt (the nodes the interrupted tree still uses are redrawn from it), not from a new key."""
    ov = [x for x in TREE if not x.startswith("privacy.noise_seed")]
    Experiment(small_plan(*ov, "training.rounds=3", "output.checkpoint_every=3"), run_dir=tmp_path).run(progress=False)
    e = Experiment(small_plan(*ov, "training.rounds=6", "output.checkpoint_every=3"), run_dir=tmp_path)
    assert e.resume()
    (dp,) = [la for la in e.stack.layers if la.name == "dp"]
    assert dp.tree_noise.stream is dp.server_stream

"""Per-instance randomness under DP-SGD: draws keyed by an instance's content, never by its batch position.

C-Tran's label mask is drawn per sample inside DP-SGD. Drawn in batch order, removing one instance handed every later
sample another's mask (the worst-case check measured one step's noiseless clipped sum moving by 1.83 C, against an
accounted C). These tests pin the pieces: the keyed draws, the content keys, the masks built from them, and the
refusal of dropout under DP-SGD; the end-to-end check is tests/protocols/test_worst_case_combinations.py
(``fedlgt_general-…-local-…``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.randomness import SecretStream
from secure_fed.algorithms.instance_keys import instance_keys
from secure_fed.config import build_plan, load_config
from secure_fed.errors import SecureFedError
from secure_fed.models.ctran import UNKNOWN, label_mask_states_keyed


def test_a_keyed_row_depends_on_its_key_alone():
    s = SecretStream.from_noise_seed(3, "client 0")
    keys = np.array([11, 22, 33, 44], dtype=np.uint64)
    full = s.keyed_uniform(keys, 7, "step")
    assert full.shape == (4, 7) and ((full > 0) & (full < 1)).all()
    # another subset, another order: each key's row is the same
    np.testing.assert_array_equal(s.keyed_uniform(keys[[3, 1]], 7, "step"), full[[3, 1]])
    # another label, another key stream or another secret: different draws
    assert not np.array_equal(s.keyed_uniform(keys, 7, "other"), full)
    assert not np.array_equal(SecretStream.from_noise_seed(4, "client 0").keyed_uniform(keys, 7, "step"), full)
    assert len({tuple(r) for r in full}) == 4  # distinct keys, distinct rows


def test_keyed_draws_are_uniform():
    """20,000 keys × 3 columns: mean 0.5 and variance 1/12 within 5 standard errors; columns uncorrelated."""
    u = SecretStream.from_noise_seed(5, "c").keyed_uniform(np.arange(20_000, dtype=np.uint64), 3, "l")
    n = u.shape[0]
    assert abs(u.mean(axis=0) - 0.5).max() < 5 * np.sqrt(1 / 12 / n)
    assert abs(u.var(axis=0) - 1 / 12).max() < 5 * np.sqrt(1 / 180 / n)
    assert abs(np.corrcoef(u.T)[np.triu_indices(3, 1)]).max() < 5 / np.sqrt(n)


def test_content_keys_survive_removal_and_separate_copies():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 4, generator=g), torch.rand(6, 3, generator=g) < 0.5
    x[4], y[4] = x[1], y[1]  # a copy of instance 1
    k = instance_keys(x, y)
    assert len(set(k.tolist())) == 6  # the copy gets a key of its own
    keep = [0, 2, 3, 4, 5]  # instance 1 removed: its copy takes the first copy's key, the others keep theirs
    k2 = instance_keys(x[keep], y[keep])
    assert k2.tolist() == [k[0], k[2], k[3], k[1], k[5]]
    y2 = y.clone()
    y2[0, 0] = ~y2[0, 0]
    assert instance_keys(x, y2)[0] != k[0]  # the labels are part of the content


def test_a_masked_sample_keeps_its_mask_when_another_is_removed():
    p = LocalDPSGD(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.5, divisor=8, label="r0",
                   stream=SecretStream.from_noise_seed(9, "client 2"))  # fmt: skip
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 5, generator=g), torch.rand(8, 6, generator=g) < 0.4
    states = label_mask_states_keyed(y, 0.25, p.instance_uniforms(instance_keys(x, y), 7, "e0 s0"))
    keep = [i for i in range(8) if i != 2]
    again = label_mask_states_keyed(y[keep], 0.25, p.instance_uniforms(instance_keys(x[keep], y[keep]), 7, "e0 s0"))
    torch.testing.assert_close(again, states[keep], rtol=0, atol=0)
    unknown = (states == UNKNOWN).sum(dim=1)
    assert (unknown >= 2).all() and (unknown <= 6).all()  # ⌈0.25·6⌉ = 2 … L unknown labels


def test_keyed_masks_draw_every_count_and_every_label():
    """The number of unknown labels is uniform on [⌈m·L⌉, L] and each label equally likely unknown (4,000 rows)."""
    L, n = 5, 4000
    u = torch.from_numpy(SecretStream.from_noise_seed(2, "c").keyed_uniform(np.arange(n, dtype=np.uint64), L + 1, "l"))
    states = label_mask_states_keyed(torch.zeros(n, L, dtype=torch.bool), 0.4, u)
    counts = torch.bincount((states == UNKNOWN).sum(dim=1), minlength=L + 1).double() / n
    assert counts[:2].sum() == 0  # ⌈0.4·5⌉ = 2 at least
    assert (counts[2:] - 0.25).abs().max() < 5 * (0.25 * 0.75 / n) ** 0.5
    per_label = (states == UNKNOWN).double().mean(dim=0)
    assert (per_label - per_label.mean()).abs().max() < 5 * (0.25 / n) ** 0.5


CTRAN_LOCAL = [
    "algorithm.name=fedlgt", "model.family=ctran", "model.embedding_dim=8", "partition.name=iid", "partition.num_clients=4",
    'protocols=["dp"]', 'privacy.local={"noise_multiplier": 1.0, "clip_norm": 1.0, "batch_sample_rate": 0.5}',
]  # fmt: skip


def test_dropout_under_dp_sgd_is_refused_and_auto_accepted():
    assert load_config(overrides=CTRAN_LOCAL).model.ctran.dropout == "auto"
    assert load_config(overrides=[*CTRAN_LOCAL, "model.ctran.dropout=0"]).model.ctran.dropout_rate == 0.0
    with pytest.raises(SecureFedError, match="dropout"):
        load_config(overrides=[*CTRAN_LOCAL, "model.ctran.dropout=0.1"])
    assert load_config(overrides=CTRAN_LOCAL[:5] + ["model.ctran.dropout=0.2"]).model.ctran.dropout_rate == 0.2
    assert load_config(overrides=CTRAN_LOCAL[:5]).model.ctran.dropout_rate == 0.1


def test_dp_sgd_turns_every_dropout_off():
    from secure_fed.algorithms.client import no_dropout
    from secure_fed.models.ctran import ChunkTokens, CTran

    m = CTran(ChunkTokens(8, token_size=4, width=8), num_labels=3, width=8, layers=1, heads=2, dropout=0.3)
    no_dropout(m)
    rates = [mod.p for mod in m.modules() if isinstance(mod, torch.nn.Dropout)]
    rates += [mod.dropout for mod in m.modules() if isinstance(mod, torch.nn.MultiheadAttention)]
    assert rates and all(r == 0.0 for r in rates)


def test_a_private_step_that_draws_from_torchs_generator_raises(monkeypatch, tmp_path):
    """The guard behind no_dropout: a C-Tran forward that draws (dropout re-enabled inside the step) makes the DP-SGD
    step raise instead of releasing batch-order randomness."""
    from secure_fed.algorithms import client as client_mod

    monkeypatch.setattr(client_mod, "no_dropout", lambda model: None)  # the mutant: dropout left on
    from tests.protocols.worst_case_combinations import Combination

    c = Combination("fedlgt_general", "off", "local", "off", "trained", "none")
    from secure_fed.engine import Experiment

    cfg = load_config(overrides=[*c.overrides(), "model.ctran.dropout=auto"])
    with pytest.raises(RuntimeError, match="drew from torch's global generator"):
        Experiment(build_plan(cfg), run_dir=tmp_path / "run").run(progress=False)


def test_each_step_draws_afresh_and_the_canary_wrapper_passes_the_draws_through():
    from threat_models.canaries import _CanaryPrivatizer

    p = LocalDPSGD(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.5, divisor=8, label="r3",
                   stream=SecretStream.from_noise_seed(1, "client 0"))  # fmt: skip
    keys = np.array([5, 6, 7], dtype=np.uint64)
    a, b = p.instance_uniforms(keys, 4, "e0 s0"), p.instance_uniforms(keys, 4, "e0 s1")
    assert not torch.equal(a, b)  # another step, other masks
    other_round = LocalDPSGD(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.5, divisor=8, label="r4",
                             stream=SecretStream.from_noise_seed(1, "client 0"))  # fmt: skip
    assert not torch.equal(a, other_round.instance_uniforms(keys, 4, "e0 s0"))  # another round, other masks
    wrapped = _CanaryPrivatizer.__new__(_CanaryPrivatizer)
    wrapped.inner = p
    assert torch.equal(wrapped.instance_uniforms(keys, 4, "e0 s0"), a)

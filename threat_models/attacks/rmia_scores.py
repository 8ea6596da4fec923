"""RMIA's scores (Zarifzadeh, Liu, Backes & Shokri, "Low-Cost High-Power Membership Inference Attacks", ICML 2024).

Pure functions of the target model's and the reference models' likelihoods; the membership-inference attack
(:mod:`threat_models.attacks.membership_inference`) feeds them LiRA's own shadow runs as the reference models, so
the two attacks are compared on the same models.

With Pr(x|θ) the likelihood of x's labels under the released model θ and Pr(x) its average over reference models,
the score of a target x is the fraction of population samples z whose pairwise likelihood ratio

    LR(x, z) = (Pr(x|θ) / Pr(x)) / (Pr(z|θ) / Pr(z))

is at least γ. Pr(x) is

* **online**: the mean of Pr(x|θ_k) over every reference model (about half trained on x);
* **offline**: from the OUT reference models only, with the paper's linear approximation of the missing IN half,
  Pr_IN(x) ≈ a·Pr_OUT(x) + (1 − a), so that Pr(x) = ½(Pr_OUT(x) + Pr_IN(x)) = ½((1 + a)·Pr_OUT(x) + (1 − a)).
  ``a`` is tuned by the paper on one reference model; 0.3 is ML Privacy Meter's default.

Pr(z) is computed the same way as Pr(x) (online: all references; offline: z's OUT references and the same ``a``).

For one target model and a fixed population Z, the score is the empirical CDF over Z of z's ratio evaluated at
x's ratio over γ, a non-decreasing function of Pr(x|θ)/Pr(x): the ranking (hence the ROC) is that of the
reference-normalised likelihood, up to the ties that a finite Z makes. Z sets the scale the score is read on.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

#: ML Privacy Meter's default for the offline approximation's slope (the paper tunes it on a reference model)
OFFLINE_A = 0.3
#: the pairwise threshold: x dominates z when LR(x, z) ≥ γ (ML Privacy Meter's value)
GAMMA = 1.0


def probability(phi) -> np.ndarray:
    """Pr(x|θ) from LiRA's logit-scaled statistic φ = log p − log(1 − p): p = σ(φ)."""
    return expit(np.asarray(phi, dtype=np.float64))


def _shapes(ref_probs, inside) -> tuple[np.ndarray, np.ndarray]:
    ref_probs = np.asarray(ref_probs, dtype=np.float64)
    inside = np.asarray(inside, dtype=bool)
    if ref_probs.ndim != 2 or ref_probs.shape != inside.shape:
        raise ValueError(f"reference likelihoods {ref_probs.shape} and IN masks {inside.shape} must both be (K, n)")
    return ref_probs, inside


def pr_online(ref_probs, inside) -> np.ndarray:
    """Online Pr(x): the mean of Pr(x|θ_k) over all K reference models, ``ref_probs`` (K, n)."""
    ref_probs, _ = _shapes(ref_probs, inside)
    return ref_probs.mean(axis=0)


def pr_offline(ref_probs, inside, *, a: float = OFFLINE_A) -> tuple[np.ndarray, int]:
    """Offline Pr(x) = ½((1 + a)·Pr_OUT(x) + (1 − a)), Pr_OUT the mean over the references not trained on x.

    A target with no OUT reference (chance 2^−K) gets the mean over every OUT (reference, target) pair; returns
    Pr(x) and the count of such targets.
    """
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"the offline slope a must be in [0, 1], got {a}")
    ref_probs, inside = _shapes(ref_probs, inside)
    out = ~inside
    cnt = out.sum(axis=0)
    tot = np.where(out, ref_probs, 0.0).sum(axis=0)
    fallback = tot.sum() / cnt.sum() if cnt.sum() > 0 else 0.5
    p_out = np.where(cnt > 0, tot / np.maximum(cnt, 1), fallback)
    return 0.5 * ((1.0 + a) * p_out + (1.0 - a)), int((cnt == 0).sum())


def rmia_score(p_x, pr_x, p_z, pr_z, *, gamma: float = GAMMA) -> np.ndarray:
    """The fraction of population samples z with (p_x/pr_x) / (p_z/pr_z) ≥ γ, per target x.

    ``p_x``, ``pr_x`` (n,): Pr(x|θ) and Pr(x); ``p_z``, ``pr_z`` (m,): the same for the population. Computed by
    sorting z's ratios (n log m), equal to the pairwise count.
    """
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    ratio_x = np.asarray(p_x, dtype=np.float64) / np.asarray(pr_x, dtype=np.float64)
    ratio_z = np.sort(np.asarray(p_z, dtype=np.float64) / np.asarray(pr_z, dtype=np.float64))
    if ratio_z.size == 0:
        raise ValueError("RMIA needs at least one population sample z")
    # LR(x, z) ≥ γ  ⟺  ratio_z ≤ ratio_x / γ (all ratios are positive)
    return np.searchsorted(ratio_z, ratio_x / gamma, side="right") / ratio_z.size


def rmia_online(phi, shadow_scores, inside, population, *, gamma: float = GAMMA) -> tuple[np.ndarray, dict[str, int]]:
    """Online RMIA from LiRA's statistics: ``phi`` (n,) on the released model, ``shadow_scores`` (K, n) on the
    reference models, ``inside`` (K, n) their IN masks; ``population``: the indices of the targets used as Z."""
    p, refs = probability(phi), probability(shadow_scores)
    pr = pr_online(refs, inside)
    z = np.asarray(population)
    return rmia_score(p, pr, p[z], pr[z], gamma=gamma), {}


def rmia_offline(phi, shadow_scores, inside, population, *, a: float = OFFLINE_A,
                 gamma: float = GAMMA) -> tuple[np.ndarray, dict[str, int]]:  # fmt: skip
    """Offline RMIA: as :func:`rmia_online` with Pr from the OUT references and the slope ``a``; also returns the
    count of targets with no OUT reference."""
    p, refs = probability(phi), probability(shadow_scores)
    pr, missing = pr_offline(refs, inside, a=a)
    z = np.asarray(population)
    return rmia_score(p, pr, p[z], pr[z], gamma=gamma), {"no_out_shadow": missing}

"""Attack (d): membership inference on the released model — LOSS threshold and LiRA, online and offline.

Targets are the training instances (members) and the test instances
(non-members), shuffled together; the attacker does not know which is which.
The per-example statistic is LiRA's logit-scaled confidence, extended to
multi-label: with p = Σ_{y∈Y} softmax(16·s)_y over the cosine scores s,
φ = log p − log(1 − p).

* **LOSS**: the score is φ itself (higher = more likely a member).
* **LiRA** (Carlini et al. 2022): the attacker trains K shadow runs with the
  target's public recipe (same configuration, DP included), each on an
  independent random half of the target pool, so each target is IN about K/2
  shadows and OUT of the other K/2. Both variants come from the same shadows:

  - **online** (§IV): per target, a Gaussian fitted to φ of the IN shadows
    and one to φ of the OUT shadows; the score is the log-likelihood ratio
    log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²).
  - **offline** (§VI-C): the OUT shadows only, one-sided: (φ − μ_out)/σ_out.

  μ is always per target. σ is per side and *global* (pooled within-target
  spread over all targets) when K < 64: the paper's fixed-variance variant,
  which it recommends for few shadows, where a per-target σ from ~K/2 points
  is too noisy. With K ≥ 64, σ is per target as in the paper's full attack.
  A target no shadow trained on (no IN) or every shadow trained on (no OUT)
  has no per-target mean on that side: it gets the global mean of that side
  (the mean over all targets' shadow scores on it), and it is counted
  (``details["fallback"]``). The chance of either is 2^−K per target.

* **RMIA** (Zarifzadeh et al. 2024; :mod:`threat_models.attacks.rmia_scores`), online and offline, from the
  same shadows as LiRA (its reference models) and Pr(x|θ) = σ(φ): the fraction of population samples z (the
  target pool itself) with (Pr(x|θ)/Pr(x)) / (Pr(z|θ)/Pr(z)) ≥ γ; Pr(x) the mean over all shadows (online) or
  ½((1 + a)·Pr_OUT(x) + (1 − a)) from the OUT shadows (offline).

Reported: for ``loss``, ``lira_online``, ``lira_offline``, ``rmia_online`` and ``rmia_offline``, AUC with a
bootstrap 95% interval, TPR at 1% and 0.1% FPR, and the ROC on log axes
(``roc.png``). Chance: AUC 0.5, TPR@x = x.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.metrics import roc_auc_score, roc_curve
from torch.nn import functional as F

from secure_fed.plugin_api.attacks import Features, phase, plan_variant, stack_rows, track
from threat_models.attacks.membership_inference_spec import SPEC
from threat_models.attacks.rmia_scores import rmia_offline, rmia_online
from threat_models.base import Attack, AttackResult

SCALE = 16.0
#: the paper's advice: below this many shadows, one global σ per side (fixed-variance LiRA)
FIXED_VARIANCE_BELOW = 64
SIGMA_FLOOR = 1e-6
#: the scores reported, in plotting order
SCORES = ("loss", "lira_online", "lira_offline", "rmia_online", "rmia_offline")


@torch.no_grad()
def logit_confidence(model, theta, W, x: torch.Tensor, Y: np.ndarray) -> np.ndarray:
    """φ = log p − log(1−p) of each target's true labels under the model θ (LiRA's logit-scaled confidence).

    With class-embedding rows W (in label order), p is the softmax(16·cos) mass on the true labels. Without rows
    (``W`` None: ``model`` outputs one logit per label, as ``linear_head``), p is the likelihood of the whole label
    vector, Π_l σ(z_l)^{y_l} σ(−z_l)^{1−y_l}.
    """
    for n, p in model.named_parameters():
        p.copy_(theta[n])
    model.eval()
    Wn = None if W is None else F.normalize(W.float(), dim=-1)
    out = []
    for start in range(0, x.shape[0], 2048):
        xb, yb = x[start : start + 2048], Y[start : start + 2048]
        mask = torch.as_tensor(yb, dtype=torch.bool)
        if Wn is None:
            z = model(xb).double()
            lp = -torch.where(mask, F.softplus(-z), F.softplus(z)).sum(dim=1)  # log σ(z) = −softplus(−z)
        else:
            logp = F.log_softmax(SCALE * (F.normalize(model(xb).float(), dim=-1) @ Wn.T), dim=1).double()
            lp = torch.logsumexp(logp.masked_fill(~mask, -torch.inf), dim=1)
        lp = lp.clamp(min=-60.0, max=-1e-12)
        out.append((lp - torch.log(-torch.expm1(lp))).numpy())
    return np.concatenate(out)


def tpr_at(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    ok = fpr <= target
    return float(tpr[ok].max()) if ok.any() else 0.0


def roc_summary(member: np.ndarray, score: np.ndarray, *, bootstrap: int, seed: int) -> tuple[dict, dict]:
    """AUC and TPR at 1% and 0.1% FPR, each with a 95% percentile-bootstrap interval (``bootstrap`` resamples of the
    targets with replacement; resamples holding one class only are skipped), and the ROC on a log-spaced FPR grid."""
    auc = float(roc_auc_score(member, score))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        i = rng.integers(len(score), size=len(score))
        if member[i].min() != member[i].max():
            bf, bt, _ = roc_curve(member[i], score[i])
            boots.append((roc_auc_score(member[i], score[i]), tpr_at(bf, bt, 0.01), tpr_at(bf, bt, 0.001)))
    lo, hi = np.percentile(np.asarray(boots), [2.5, 97.5], axis=0)
    fpr, tpr, _ = roc_curve(member, score)
    grid = np.unique(np.r_[np.logspace(-4, 0, 120), 0.001, 0.01])
    curve = {"fpr": grid.tolist(), "tpr": [tpr_at(fpr, tpr, g) for g in grid]}
    m = {"auc": auc, "auc_ci95": [float(lo[0]), float(hi[0])],
         "tpr_at_1pct_fpr": tpr_at(fpr, tpr, 0.01), "tpr_at_1pct_fpr_ci95": [float(lo[1]), float(hi[1])],
         "tpr_at_0.1pct_fpr": tpr_at(fpr, tpr, 0.001), "tpr_at_0.1pct_fpr_ci95": [float(lo[2]), float(hi[2])]}  # fmt: skip
    return m, curve


# ------------------------------------------------------------------ LiRA scores: pure functions of the shadows
def _side(scores: np.ndarray, mask: np.ndarray, fixed_variance: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-target mean and σ of ``scores`` (K, n) over the shadows where ``mask`` (K, n) holds; and how many
    targets had no such shadow (they get the global mean of the side).

    The global σ is the pooled within-target standard deviation, √(Σ_t Σ_k (φ_tk − μ_t)² / Σ_t (n_t − 1));
    the per-target σ (``fixed_variance=False``) is the target's own (ddof 1), or the global σ where it has < 2.
    """
    cnt = mask.sum(axis=0)
    tot = np.where(mask, scores, 0.0).sum(axis=0)
    global_mu = tot.sum() / cnt.sum() if cnt.sum() > 0 else 0.0
    mu = np.where(cnt > 0, tot / np.maximum(cnt, 1), global_mu)
    sq = np.where(mask, (scores - mu[None, :]) ** 2, 0.0).sum(axis=0)
    dof = np.maximum(cnt - 1, 0)
    if dof.sum() > 0:
        pooled = np.sqrt(sq.sum() / dof.sum())
    elif cnt.sum() > 1:  # every target has at most one shadow on this side: the spread across targets
        pooled = float(np.std(scores[mask], ddof=1))
    else:
        pooled = 1.0
    pooled = max(float(pooled), SIGMA_FLOOR)
    if fixed_variance:
        sd = np.full(mu.shape, pooled)
    else:
        sd = np.where(dof > 0, np.maximum(np.sqrt(sq / np.maximum(dof, 1)), SIGMA_FLOOR), pooled)
    return mu, sd, int((cnt == 0).sum())


def _log_normal(x: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """log N(x; μ, σ²) up to the constant −½ log 2π."""
    return -0.5 * ((x - mu) / sd) ** 2 - np.log(sd)


def _check(phi, shadow_scores, inside, fixed_variance) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    phi = np.asarray(phi, dtype=np.float64)
    shadow_scores = np.asarray(shadow_scores, dtype=np.float64)
    inside = np.asarray(inside, dtype=bool)
    if shadow_scores.ndim != 2 or shadow_scores.shape != inside.shape or shadow_scores.shape[1] != phi.shape[0]:
        raise ValueError(f"shadow scores {shadow_scores.shape} and IN masks {inside.shape} must be (K, n) for n = {phi.shape[0]}")
    if fixed_variance is None:
        fixed_variance = shadow_scores.shape[0] < FIXED_VARIANCE_BELOW
    return phi, shadow_scores, inside, bool(fixed_variance)


def lira_online(phi, shadow_scores, inside, *, fixed_variance: bool | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Online LiRA: log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²) per target.

    ``phi`` (n,): the targets' statistic on the released model; ``shadow_scores`` (K, n): on each shadow;
    ``inside`` (K, n): whether shadow k trained on target t. ``fixed_variance`` (default: K < 64): one global
    σ per side. Returns the scores and the counts of targets with no IN / no OUT shadow (global-mean fallback).
    """
    phi, s, inside, fixed = _check(phi, shadow_scores, inside, fixed_variance)
    mu_in, sd_in, no_in = _side(s, inside, fixed)
    mu_out, sd_out, no_out = _side(s, ~inside, fixed)
    score = _log_normal(phi, mu_in, sd_in) - _log_normal(phi, mu_out, sd_out)
    return score, {"no_in_shadow": no_in, "no_out_shadow": no_out}


def lira_offline(phi, shadow_scores, inside, *, fixed_variance: bool | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Offline LiRA: the one-sided test against the OUT shadows only, (φ − μ_out)/σ_out per target.

    Arguments as :func:`lira_online`; returns the scores and the count of targets with no OUT shadow.
    """
    phi, s, inside, fixed = _check(phi, shadow_scores, inside, fixed_variance)
    mu_out, sd_out, no_out = _side(s, ~inside, fixed)
    return (phi - mu_out) / sd_out, {"no_out_shadow": no_out}


class MembershipInference(Attack):
    spec = SPEC

    def prepare(self, ctx):
        ds, fed = ctx.dataset, ctx.fed
        feats = stack_rows(ds.train.features, ds.test.features)
        labels = sp.vstack([ds.train.labels, ds.test.labels]).tocsr()
        # members: the training rows the model trained on (a centralised baseline holds out a validation split)
        trained = np.zeros(ds.train.num_instances, bool)
        trained[np.concatenate([s.indices for s in fed.shards])] = True
        member = np.r_[trained, np.zeros(ds.test.num_instances, bool)]
        order = np.random.default_rng([ctx.plan.seed, 0x3E3]).permutation(len(member))
        feats, labels, member = feats[order], labels[order], member[order]
        x = fed.encode(feats).cpu()  # as the clients' rows were made (dense, or sparse rows at XC scale)
        aux = {
            "x": x, "Y": labels.toarray().astype(bool), "encoder": ctx.new_encoder(),
            "shadow": _ShadowTrainer(ctx, feats, labels, self.options) if self.options.shadows > 0 else None,
        }  # fmt: skip
        return aux, {"member": member, "seed": ctx.plan.seed}

    def run(self, view, aux):
        phi = logit_confidence(aux["encoder"], view.theta, view.W, aux["x"], aux["Y"])
        out = {"loss": phi}
        sh = aux["shadow"]
        if sh is not None:
            scores, inside = sh.run(aux["encoder"], aux["x"], aux["Y"])  # (K, n), (K, n)
            fixed = scores.shape[0] < FIXED_VARIANCE_BELOW
            out["lira_online"], fb_online = lira_online(phi, scores, inside, fixed_variance=fixed)
            out["lira_offline"], fb_offline = lira_offline(phi, scores, inside, fixed_variance=fixed)
            o = self.options
            pool = np.arange(phi.shape[0])  # Z: the target pool (the attacker's data), scored on θ and every shadow
            out["rmia_online"], fb_rmia_on = rmia_online(phi, scores, inside, pool, gamma=o.rmia_gamma)
            out["rmia_offline"], fb_rmia_off = rmia_offline(phi, scores, inside, pool, a=o.rmia_offline_a, gamma=o.rmia_gamma)
            out["shadows"] = int(scores.shape[0])
            out["fixed_variance"] = fixed
            out["fallback"] = {"lira_online": fb_online, "lira_offline": fb_offline, "rmia_offline": fb_rmia_off}
            out["rmia"] = {"offline_a": o.rmia_offline_a, "gamma": o.rmia_gamma, "population": int(pool.size)}
            out["in_shadows_per_target"] = float(inside.sum(axis=0).mean())
        return out

    def score(self, guess, truth):
        member = truth["member"].astype(int)
        metrics, curves = {}, {}
        for k in SCORES:
            if k in guess:
                metrics[k], curves[k] = roc_summary(member, guess[k], bootstrap=self.options.bootstrap, seed=truth["seed"])
        chance = {k: {"auc": 0.5, "tpr_at_1pct_fpr": 0.01, "tpr_at_0.1pct_fpr": 0.001} for k in metrics}
        details = {"members": int(member.sum()), "non_members": int((1 - member).sum()), "shadows": guess.get("shadows", 0)}
        if "fallback" in guess:
            details.update({k: guess[k] for k in ("fixed_variance", "fallback", "in_shadows_per_target", "rmia")})
        return AttackResult(
            attack=self.name, role=self.role.value, metrics=metrics, chance=chance, curves=curves, details=details
        )


class _ShadowTrainer:
    """The attacker's shadow runs: the target's recipe on random halves of the target pool (cached on disk)."""

    def __init__(self, ctx, feats: Features, labels: sp.csr_matrix, options):
        plan = ctx.plan
        # the recipe: the target's settings, without the layers that do not change the model (dp stays), without
        # attacks (their settings too: an audit's attacks.* settings leave the cached shadows valid), evaluated once
        self.plan = plan_variant(plan, [
            f"protocols=[{'dp' if 'dp' in plan.protocols else ''}]", "attacks={run: []}", "output.progress=false",
            f"output.checkpoint_every={10**6}", f"evaluation.every={plan.training.rounds}", "evaluation.max_test=16",
        ])  # fmt: skip
        self.feats, self.labels, self.options = feats, labels, options
        self.names, self.kind, self.name = list(ctx.dataset.label_names), ctx.dataset.feature_kind, ctx.dataset.name
        self.meta = {"image_shape": ctx.dataset.image_shape} if ctx.dataset.image_shape is not None else {}
        digest = hashlib.sha256(self.plan.config_yaml.encode() + str(feats.shape).encode()).hexdigest()[:16]
        root = Path(options.shadow_dir) if options.shadow_dir else ctx.exp.run_dir / "shadows"
        self.dir = root / digest

    def _experiment(self, k: int, inside: np.ndarray):
        """Shadow k's run, built (not trained): the recipe on its IN rows, its seed; and those rows' indices."""
        from secure_fed.plugin_api.attacks import MultiLabelDataset, MultiLabelSplit, build_experiment

        idx = np.flatnonzero(inside)
        hold = np.flatnonzero(~inside)[:16]
        ds = MultiLabelDataset(
            name=f"{self.name}-shadow{k}",
            train=MultiLabelSplit(self.feats[idx], self.labels[idx]),
            test=MultiLabelSplit(self.feats[hold], self.labels[hold]),
            label_names=self.names, feature_kind=self.kind, meta=dict(self.meta),
        )  # fmt: skip
        # shadow runs train on the attacker's own data (``dataset=ds``), in this process whatever the target's backend
        plan = plan_variant(self.plan, [f"seed={self.plan.seed + 1000 + k}", "backend=inprocess"])
        return build_experiment(plan, run_dir=self.dir / f"run{k}", dataset=ds), idx

    @staticmethod
    def _outcome(exp, idx: np.ndarray, inside: np.ndarray):
        """A trained shadow's θ, its class rows in label order (or None), and the rows it really trained on."""
        perm = exp.label_perm
        W = None if exp.W is None else exp.W.detach().cpu()
        trained = np.zeros(len(inside), bool)  # the shadow's IN rows it really trained on (not its validation split)
        trained[idx[np.concatenate([s.indices for s in exp.fed.shards])]] = True
        return exp.theta, (W if perm is None or W is None else W[torch.as_tensor(perm)]), trained

    def _train(self, k: int, inside: np.ndarray):
        """Shadow k trained alone, with the recipe's own executor."""
        exp, idx = self._experiment(k, inside)
        exp.run(progress=False)
        return self._outcome(exp, idx, inside)

    def inside(self, k: int, n: int) -> np.ndarray:
        """Shadow k's random half of the n targets (depends on k, not on K: a cache of fewer shadows is reused)."""
        return np.random.default_rng([self.plan.seed, 0x5AD, k]).random(n) < 0.5

    def run(self, encoder, x, Y) -> tuple[np.ndarray, np.ndarray]:
        """Every shadow's scores on the targets and the rows it trained on, (K, n) each: cached ones read back, the
        others trained (:attr:`options.shadow_cohort` at a time as one cohort, or one after another) and cached as
        each finishes."""
        self.dir.mkdir(parents=True, exist_ok=True)
        n, K = x.shape[0], self.options.shadows
        insides = [self.inside(k, n) for k in range(K)]
        done: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k in range(K):
            cached = _load_cached(self._file(k), insides[k])
            if cached is not None:
                done[k] = cached
        todo = [k for k in range(K) if k not in done]

        def finish(k: int, theta, W, trained) -> None:
            s = logit_confidence(encoder, theta, W, x, Y)
            _save(self._file(k), s, insides[k], trained)
            done[k] = (s, trained)

        size = self.options.shadow_cohort
        if size > 1 and len(todo) > 1:
            from threat_models.shadow_cohort import train_shadows_together

            rounds = self.plan.training.rounds
            with phase("membership inference: shadow rounds (cohort)", total=len(todo) * rounds) as bar:
                for start in range(0, len(todo), size):
                    part = todo[start : start + size]
                    built = {k: self._experiment(k, insides[k]) for k in part}
                    train_shadows_together(
                        {k: e for k, (e, _) in built.items()},
                        on_done=lambda k, e, built=built: finish(k, *self._outcome(e, built[k][1], insides[k])),
                        progress=bar,
                    )
                    del built
        else:
            for k in track(range(K), "membership inference: shadow models"):  # a cached shadow advances it too
                if k not in done:
                    finish(k, *self._train(k, insides[k]))
        return np.stack([done[k][0] for k in range(K)]), np.stack([done[k][1] for k in range(K)])

    def _file(self, k: int) -> Path:
        return self.dir / f"shadow{k}.npz"


def _save(f: Path, score: np.ndarray, inside: np.ndarray, trained: np.ndarray) -> None:
    """Cache one shadow's scores, its random half and the rows it trained on (atomically: a killed audit never
    leaves a truncated entry)."""
    tmp = f.with_name(f.name + ".part")
    with open(tmp, "wb") as fh:
        np.savez(fh, score=score, inside=inside, trained=trained)
    tmp.replace(f)


def _load_cached(f: Path, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A cached shadow's (scores, rows it trained on), or None when absent, unreadable, or for another split."""
    if not f.is_file():
        return None
    try:
        with np.load(f) as z:
            score, cached, trained = z["score"], z["inside"], z["trained"]
    except (OSError, ValueError, KeyError):
        return None
    if cached.shape != inside.shape or score.shape != inside.shape or not np.array_equal(cached, inside):
        return None
    return score, trained

"""Attack (d): membership inference on the released model — LOSS threshold and offline LiRA.

Targets are the training instances (members) and the test instances
(non-members), shuffled together; the attacker does not know which is which.
The per-example statistic is LiRA's logit-scaled confidence, extended to
multi-label: with p = Σ_{y∈Y} softmax(16·s)_y over the cosine scores s,
φ = log p − log(1 − p).

* **LOSS**: the score is φ itself (higher = more likely a member).
* **Offline LiRA** (Carlini et al. 2022, §VI-C "offline"): the attacker trains
  K shadow runs with the target's public recipe (same configuration, DP
  included) on random halves of the target pool; for each target it keeps the
  shadows that did *not* train on it, and scores (φ − μ_out)/σ_out with a
  global σ_out (the fixed-variance variant, sound for small K).

Reported: AUC with a bootstrap 95% interval, TPR at 1% and 0.1% FPR, and the
ROC on log axes (``roc.png``). Chance: AUC 0.5, TPR@x = x.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.metrics import roc_auc_score, roc_curve
from torch.nn import functional as F

from threat_models.base import Attack, AttackResult, Role

SCALE = 16.0


@torch.no_grad()
def logit_confidence(encoder, theta, W, x: torch.Tensor, Y: np.ndarray) -> np.ndarray:
    """φ = log p − log(1−p), p = softmax(16·cos)(true labels) mass; W rows in label order."""
    for n, p in encoder.named_parameters():
        p.copy_(theta[n])
    encoder.eval()
    Wn = F.normalize(W.float(), dim=-1)
    out = []
    for start in range(0, x.shape[0], 2048):
        xb, yb = x[start : start + 2048], Y[start : start + 2048]
        logp = F.log_softmax(SCALE * (F.normalize(encoder(xb).float(), dim=-1) @ Wn.T), dim=1).double()
        mask = torch.as_tensor(yb, dtype=torch.bool)
        lp = torch.logsumexp(logp.masked_fill(~mask, -torch.inf), dim=1).clamp(min=-60.0, max=-1e-12)
        out.append((lp - torch.log(-torch.expm1(lp))).numpy())
    return np.concatenate(out)


def tpr_at(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    ok = fpr <= target
    return float(tpr[ok].max()) if ok.any() else 0.0


def roc_summary(member: np.ndarray, score: np.ndarray, *, bootstrap: int, seed: int) -> tuple[dict, dict]:
    auc = float(roc_auc_score(member, score))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        i = rng.integers(len(score), size=len(score))
        if member[i].min() != member[i].max():
            boots.append(roc_auc_score(member[i], score[i]))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    fpr, tpr, _ = roc_curve(member, score)
    grid = np.unique(np.r_[np.logspace(-4, 0, 120), 0.001, 0.01])
    curve = {"fpr": grid.tolist(), "tpr": [tpr_at(fpr, tpr, g) for g in grid]}
    m = {"auc": auc, "auc_ci95": [float(lo), float(hi)], "tpr_at_1pct_fpr": tpr_at(fpr, tpr, 0.01),
         "tpr_at_0.1pct_fpr": tpr_at(fpr, tpr, 0.001)}  # fmt: skip
    return m, curve


class MembershipInference(Attack):
    name = "membership_inference"
    role = Role.OBSERVER
    needs = "the released θ and W; the target instances with their labels; for LiRA, the training recipe (public config)"
    defended_by = "dp (privacy.client; the instance unit covers only W's label-set step)"
    description = "LOSS threshold and offline LiRA with shadow runs; AUC, TPR at low FPR, log-scale ROC"

    def prepare(self, ctx):
        ds, fed = ctx.dataset, ctx.fed
        feats = sp.vstack([ds.train.features, ds.test.features]).tocsr()
        labels = sp.vstack([ds.train.labels, ds.test.labels]).tocsr()
        member = np.r_[np.ones(ds.train.num_instances, bool), np.zeros(ds.test.num_instances, bool)]
        order = np.random.default_rng([ctx.cfg.seed, 0x3E3]).permutation(len(member))
        feats, labels, member = feats[order], labels[order], member[order]
        x = torch.from_numpy(fed.preprocessor.transform(feats))
        aux = {
            "x": x, "Y": labels.toarray().astype(bool), "encoder": ctx.new_encoder(),
            "shadow": _ShadowTrainer(ctx, feats, labels, self.options) if self.options.shadows > 0 else None,
        }  # fmt: skip
        return aux, {"member": member, "seed": ctx.cfg.seed}

    def run(self, view, aux):
        phi = logit_confidence(aux["encoder"], view.theta, view.W, aux["x"], aux["Y"])
        out = {"loss": phi}
        sh = aux["shadow"]
        if sh is not None:
            scores, inside = sh.run(aux["encoder"], aux["x"], aux["Y"])  # (K, n), (K, n)
            out_scores = np.where(~inside, scores, np.nan)
            n_out = (~inside).sum(axis=0)
            # per-target OUT mean; a target no shadow left out gets the global OUT mean
            mu = np.where(n_out > 0, np.nansum(out_scores, axis=0) / np.maximum(n_out, 1), np.nanmean(out_scores))
            sd = np.nanstd(out_scores - mu[None, :]) + 1e-6
            out["lira"] = (phi - mu) / sd
            out["shadows"] = int(scores.shape[0])
        return out

    def score(self, guess, truth):
        member = truth["member"].astype(int)
        metrics, curves = {}, {}
        for k in ("loss", "lira"):
            if k in guess:
                metrics[k], curves[k] = roc_summary(member, guess[k], bootstrap=self.options.bootstrap, seed=truth["seed"])
        chance = {k: {"auc": 0.5, "tpr_at_1pct_fpr": 0.01, "tpr_at_0.1pct_fpr": 0.001} for k in metrics}
        return AttackResult(
            attack=self.name, role=self.role.value, metrics=metrics, chance=chance, curves=curves,
            details={"members": int(member.sum()), "non_members": int((1 - member).sum()), "shadows": guess.get("shadows", 0)},
        )  # fmt: skip


class _ShadowTrainer:
    """The attacker's shadow runs: the target's recipe on random halves of the target pool (cached on disk)."""

    def __init__(self, ctx, feats: sp.csr_matrix, labels: sp.csr_matrix, options):
        from secure_fed.config.schema import ExperimentConfig

        cfg = ctx.cfg.model_dump(mode="json")
        cfg["protocols"] = ["dp"] if "dp" in cfg["protocols"] else []  # other layers do not change the model
        cfg["attacks"] = {"run": []}
        cfg["output"] = {**cfg["output"], "progress": False, "checkpoint_every": 10**6}
        cfg["evaluation"] = {**cfg["evaluation"], "every": cfg["training"]["rounds"], "max_test": 16}
        self.cfg = ExperimentConfig.model_validate(cfg)
        self.feats, self.labels, self.options = feats, labels, options
        self.names, self.kind, self.name = list(ctx.dataset.label_names), ctx.dataset.feature_kind, ctx.dataset.name
        digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode() + str(feats.shape).encode()).hexdigest()[:16]
        root = Path(options.shadow_dir) if options.shadow_dir else ctx.exp.run_dir / "shadows"
        self.dir = root / digest

    def _train(self, k: int, inside: np.ndarray):
        from secure_fed.data.dataset import MultiLabelDataset, MultiLabelSplit
        from secure_fed.engine import Experiment

        idx = np.flatnonzero(inside)
        hold = np.flatnonzero(~inside)[:16]
        ds = MultiLabelDataset(
            name=f"{self.name}-shadow{k}",
            train=MultiLabelSplit(self.feats[idx], self.labels[idx]),
            test=MultiLabelSplit(self.feats[hold], self.labels[hold]),
            label_names=self.names, feature_kind=self.kind,
        )  # fmt: skip
        cfg = self.cfg.model_copy(update={"seed": self.cfg.seed + 1000 + k})
        exp = Experiment(cfg, run_dir=self.dir / f"run{k}", dataset=ds)
        exp.run(progress=False)
        perm = exp.label_perm
        W = exp.W.detach().cpu()
        return exp.theta, W if perm is None else W[torch.as_tensor(perm)]

    def run(self, encoder, x, Y) -> tuple[np.ndarray, np.ndarray]:
        self.dir.mkdir(parents=True, exist_ok=True)
        n = x.shape[0]
        scores, insides = [], []
        for k in range(self.options.shadows):
            f = self.dir / f"shadow{k}.npz"
            if f.is_file():
                z = np.load(f)
                scores.append(z["score"])
                insides.append(z["inside"])
                continue
            inside = np.random.default_rng([self.cfg.seed, 0x5AD, k]).random(n) < 0.5
            theta, W = self._train(k, inside)
            s = logit_confidence(encoder, theta, W, x, Y)
            np.savez(f, score=s, inside=inside)
            scores.append(s)
            insides.append(inside)
        return np.stack(scores), np.stack(insides)

"""Attack (f): update inversion — which words does a client's data contain?

The first encoder layer is linear in the input, ``h = A·x`` (no bias in the
sparse-text encoder). Its gradient for a batch is ``Σ_i δ_i x_iᵀ``, so column
f of A changes only if feature f is non-zero in some instance the client
trained on (plain local SGD without weight decay: exactly zero otherwise). From
one client's Δθ the server therefore reads the *vocabulary* of that client's
data — the union of its instances' supports — with precision 1 (recall
falls short only for words whose every instance had a zero loss gradient, e.g.
a hinge already satisfied) (Zhu et al. 2019 DLG /
the analytic first-layer inversions: for a single instance, a row of ΔA is
proportional to x itself).

From a secure aggregate the server only has ΔA summed over the cohort: the
support of the sum is the union of all cohort clients' vocabularies and cannot
be split between them. For each target client the attack then guesses that
union. Reported: precision, recall and F1 of the recovered vocabulary per
target client (mean over targets), from individual updates when the wire
carries them and from the aggregate. The chance level is the best guesser that
uses no update at all: the k most frequent features of public data, with k
tuned in hindsight for the highest mean F1 (so it is, if anything, generous).
"""

from __future__ import annotations

import numpy as np

from threat_models.attacks.update_inversion_spec import SPEC
from threat_models.base import Attack, AttackResult


def support(delta, tol: float = 0.0) -> np.ndarray:
    """Input features whose column of a first-layer update is non-zero."""
    d = delta.detach().float().abs().amax(dim=0)
    return np.flatnonzero(d.cpu().numpy() > tol)


def prf(guess: np.ndarray, true: np.ndarray) -> tuple[float, float, float]:
    g, t = set(guess.tolist()), set(true.tolist())
    hit = len(g & t)
    p = hit / len(g) if g else 0.0
    r = hit / len(t) if t else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


class UpdateInversion(Attack):
    spec = SPEC

    def applies(self, ctx) -> str | None:
        tap = ctx.tap
        if tap is None or tap.capture is None:
            return "the run recorded no round of uplinks (set attacks.run before training)"
        if ctx.dataset.feature_kind != "sparse":
            return "needs sparse inputs: with dense features every first-layer column moves"
        return None

    def prepare(self, ctx):
        test = ctx.dataset.test.features
        doc_freq = np.asarray((test != 0).sum(axis=0)).ravel()
        cohort = ctx.tap.capture["cohort"]
        vocab = {}
        for cid in cohort:
            raw = ctx.fed.clients[cid].raw
            vocab[cid] = np.unique(raw.nonzero()[1])
        return {"public_doc_freq": doc_freq, "targets": self.options.targets}, {"vocabulary": vocab}

    def run(self, view, aux):
        cap = view.capture
        targets = sorted(cap.cohort)[: aux["targets"]]
        union = support(cap.aggregate)
        public_order = np.argsort(-aux["public_doc_freq"], kind="stable")
        out = {"targets": targets, "aggregate": union, "public_order": public_order, "cohort": len(cap.cohort),
               "kind": cap.uplink_kind}  # fmt: skip
        out["individual"] = None if cap.individual is None else {c: support(cap.individual[c]) for c in targets}
        return out

    def score(self, guess, truth):
        vocab = truth["vocabulary"]
        tg = guess["targets"]

        def mean_prf(pred_of):
            rows = np.array([prf(pred_of(c), vocab[c]) for c in tg])
            return {"precision": float(rows[:, 0].mean()), "recall": float(rows[:, 1].mean()), "f1": float(rows[:, 2].mean())}

        metrics = {"aggregate": mean_prf(lambda c: guess["aggregate"])}
        if guess["individual"] is not None:
            metrics["individual"] = mean_prf(lambda c: guess["individual"][c])
            metrics["exact_recovery"] = float(np.mean([set(guess["individual"][c]) == set(vocab[c]) for c in tg]))
        headline = metrics.get("individual", metrics["aggregate"])
        metrics["f1"] = headline["f1"]
        order = guess["public_order"]
        ks = np.unique(np.geomspace(1, len(order), 40).astype(int))
        prior = max((mean_prf(lambda c, k=k: order[:k]) | {"k": int(k)} for k in ks), key=lambda d: d["f1"])
        return AttackResult(
            attack=self.name, role=self.role.value, metrics=metrics, chance={"f1": prior["f1"], "prior": prior},
            details={"uplinks": guess["kind"], "cohort": guess["cohort"], "targets": len(tg),
                     "mean_vocabulary": float(np.mean([len(vocab[c]) for c in tg])),
                     "aggregate_support": int(len(guess["aggregate"]))},
        )  # fmt: skip

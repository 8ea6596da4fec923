"""Attack (b): label de-anonymisation of pseudonymised label sets by co-occurrence graph matching.

The server holds the merged label sets with W rows as columns. Under keyed
hashing the rows carry pseudonyms, not names. It knows the label vocabulary
(the dataset's public label list) and public co-occurrence statistics — here
from the test split, disjoint from training. It matches rows to names:

1. *frequency seed*: Hungarian assignment on |log f_row − log f_name|;
2. *co-occurrence refinement*: repeatedly score row r against name n by the
   cosine between r's conditional co-occurrence profile P(r'|r), carried into
   name space through the current assignment, and n's public profile P(n'|n),
   minus the frequency distance; re-assign with the Hungarian method. This is
   a seeded graph-matching (quadratic-assignment) heuristic.

Reported: the fraction of rows re-identified (top-1, and top-5 by the final
scores), against chance (1/C and 5/C). Without pseudonyms the server received
names in the clear: rate 1.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from threat_models.attacks.label_deanonymization_spec import SPEC
from threat_models.base import Attack, AttackResult, label_of_row


def _stats(Y: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    Y = Y.astype(np.float64)
    n = max(Y.shape[0], 1)
    f = Y.sum(0) / n
    co = Y.T @ Y / n
    np.fill_diagonal(co, 0.0)
    cond = co / (f[:, None] + eps)  # P(r' | r)
    return np.log(f + eps), cond


def match_by_cooccurrence(Y_server: np.ndarray, Y_public: np.ndarray, *, iterations: int, eps: float = 1e-4):
    """Rows of ``Y_server`` ↔ columns of ``Y_public``: (assignment, final score matrix, frequency-only assignment)."""
    lf_s, cond_s = _stats(Y_server, eps)
    lf_p, cond_p = _stats(Y_public, eps)
    freq_cost = np.abs(lf_s[:, None] - lf_p[None, :])
    _, assign = linear_sum_assignment(freq_cost)
    freq_assign = assign.copy()
    prof_p = cond_p / (np.linalg.norm(cond_p, axis=1, keepdims=True) + 1e-12)
    score = -freq_cost
    for _ in range(iterations):
        carried = np.zeros_like(cond_s)
        carried[:, assign] = cond_s  # row r's profile over names, through the current assignment
        carried /= np.linalg.norm(carried, axis=1, keepdims=True) + 1e-12
        score = carried @ prof_p.T - 0.5 * freq_cost
        _, new = linear_sum_assignment(-score)
        if np.array_equal(new, assign):
            break
        assign = new
    return assign, score, freq_assign


class LabelDeanonymization(Attack):
    spec = SPEC

    def applies(self, ctx) -> str | None:
        if getattr(ctx.exp.algorithm, "label_sets", None) is None:
            return f"{ctx.plan.algorithm.name} collects no label sets"
        return None

    def prepare(self, ctx):
        names = list(ctx.dataset.label_names)
        aux = {"Y_public": ctx.dataset.test.labels.toarray().astype(np.int8), "names": names}
        return aux, {"row_of_label": ctx.row_of_label}

    def run(self, view, aux):
        names = aux["names"]
        C = len(names)
        if view.row_names is not None:  # labels arrived in the clear
            name_of_row = np.array([names.index(n) for n in view.row_names])
            return {"top1": name_of_row, "top5": name_of_row[:, None], "frequency_only": name_of_row, "clear": True}
        Y = view.label_sets.toarray()  # the matching is C × C (label co-occurrence profiles) whatever the storage
        assign, score, freq_assign = match_by_cooccurrence(Y, aux["Y_public"], iterations=self.options.iterations)
        top5 = np.argsort(-score, axis=1)[:, : min(5, C)]
        return {"top1": assign, "top5": top5, "frequency_only": freq_assign, "clear": False}

    def score(self, guess, truth):
        truth_rows = label_of_row(truth["row_of_label"])
        C = len(truth_rows)
        top1 = float(np.mean(guess["top1"] == truth_rows))
        top5 = float(np.mean([truth_rows[r] in guess["top5"][r] for r in range(C)]))
        freq = float(np.mean(guess["frequency_only"] == truth_rows))
        return AttackResult(
            attack=self.name,
            role=self.role.value,
            metrics={"reidentified": top1, "reidentified_top5": top5},
            chance={"reidentified": 1.0 / C, "reidentified_top5": min(5, C) / C},
            details={"labels": C, "names_sent_in_clear": guess["clear"], "frequency_seed_only": freq},
        )

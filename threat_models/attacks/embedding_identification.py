"""Attack (c): class-embedding identification — which label is this W row?

The server holds θ and the rows of W (in positive-only training each row is
one client's class, and the server receives that client's row updates). With
auxiliary labelled data — here the public test split — it embeds each public
instance with the released encoder, forms a centroid per label name, and ranks
names for each row by cosine similarity. Under keyed pseudonyms this
de-anonymises rows (and so clients); with client-level DP the noisy θ and rows
make it harder.

Reported: top-1 and top-5 accuracy of the ranking, and top-1 after a
one-to-one (Hungarian) assignment, against chance 1/C and 5/C.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch.nn import functional as F

from secure_fed.plugin_api.attacks import split_rows
from threat_models.attacks.embedding_identification_spec import SPEC
from threat_models.base import Attack, AttackResult, label_of_row


class EmbeddingIdentification(Attack):
    spec = SPEC

    def applies(self, ctx) -> str | None:
        if ctx.exp.W is None:
            return f"model.family={ctx.plan.model.family} has no class-embedding rows to identify"
        return None

    def prepare(self, ctx):
        aux = {
            "x_public": ctx.fed.x_test.detach().cpu(),
            "Y_public": ctx.dataset.test.labels[: ctx.fed.x_test.shape[0]].toarray().astype(bool),
            "encoder": ctx.new_encoder(),
        }
        return aux, {"row_of_label": ctx.row_of_label}

    @torch.no_grad()
    def run(self, view, aux):
        enc = aux["encoder"]
        for n, p in enc.named_parameters():
            p.copy_(view.theta[n])
        enc.eval()
        z = torch.cat([F.normalize(enc(xb).float(), dim=-1) for xb in split_rows(aux["x_public"], 2048)])
        Y = torch.as_tensor(aux["Y_public"], dtype=torch.float32)
        centroids = F.normalize(Y.T @ z, dim=-1)  # (C, d); labels absent from the public data give zeros
        sim = (F.normalize(view.W.float(), dim=-1) @ centroids.T).numpy()  # rows × names
        _, matched = linear_sum_assignment(-sim)
        return {"ranking": np.argsort(-sim, axis=1)[:, :5], "matched": matched}

    def score(self, guess, truth):
        truth_rows = label_of_row(truth["row_of_label"])
        C = len(truth_rows)
        rank = guess["ranking"]
        top1 = float(np.mean(rank[:, 0] == truth_rows))
        top5 = float(np.mean([truth_rows[r] in rank[r] for r in range(C)]))
        matched = float(np.mean(guess["matched"] == truth_rows))
        return AttackResult(
            attack=self.name,
            role=self.role.value,
            metrics={"top1": top1, "top5": top5, "top1_matched": matched},
            chance={"top1": 1.0 / C, "top5": min(5, C) / C, "top1_matched": 1.0 / C},
            details={"labels": C},
        )

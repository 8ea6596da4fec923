"""Attack (a): token linkage — a dictionary attack on FedALC's label-set collection.

The server knows the public tokenizer and canonical encoding
(:func:`~secure_fed.algorithms.label_sets.canonical_instance_bytes`). Given a
pool of candidate instances — part of the training data plus distractors — it
recomputes each candidate's token and looks it up among the tokens it
received. A hit links the candidate to the clients that sent that token, i.e.
to its label set. Under keyed hashing the tokens are HMACs under a key the
server never holds; the best it can compute is the unkeyed token, which matches
nothing.

Reported: ``linked`` (fraction of the pool's training instances linked to the
right set of clients) and ``precision`` (correct links / links made), with the
chance level of a guesser that links each candidate to a random received label set.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from secure_fed.plugin_api.attacks import Sha256Tokenizer, stack_rows
from threat_models.attacks.token_linkage_spec import SPEC
from threat_models.base import Attack, AttackResult


class TokenLinkage(Attack):
    spec = SPEC

    def applies(self, ctx) -> str | None:
        if getattr(ctx.exp.algorithm, "label_sets", None) is None:
            return f"{ctx.plan.algorithm.name} collects no label sets"
        if ctx.tap is None:
            return "the run recorded no server view (set attacks.run before training)"
        return None

    def prepare(self, ctx):
        o = self.options
        rng = np.random.default_rng([ctx.plan.seed, 0x70C])
        train, test = ctx.dataset.train.features, ctx.dataset.test.features
        n_in = max(1, int(round(o.pool_fraction * train.shape[0])))
        members = rng.choice(train.shape[0], size=n_in, replace=False)
        distract = rng.choice(test.shape[0], size=min(o.distractors, test.shape[0]), replace=False)
        pool = stack_rows(train[members], test[distract])
        order = rng.permutation(pool.shape[0])
        source = np.r_[members, -1 - distract][order]  # ≥ 0: training index; < 0: distractor
        # who holds each training instance (the simulator's knowledge)
        holders: dict[int, set[int]] = {}
        for shard in ctx.fed.shards:
            for i in shard.indices:
                holders.setdefault(int(i), set()).add(int(shard.client_id))
        truth = {"source": source, "holders": holders}
        return {"candidates": pool[order]}, truth

    def run(self, view, aux):
        by_token: dict[bytes, set[int]] = {}
        for cid, tokens, _row in view.token_messages:
            for t in tokens:
                by_token.setdefault(t, set()).add(cid)
        # the attacker can only compute the public (unkeyed) token; under keyed hashing nothing matches
        guesses = [by_token.get(t) for t in Sha256Tokenizer().tokens(aux["candidates"])]
        sets = Counter(frozenset(s) for s in by_token.values())
        return {"links": [None if g is None else frozenset(g) for g in guesses], "set_counts": sets, "tokenizer": view.tokenizer}

    def score(self, guess, truth):
        source, holders = truth["source"], truth["holders"]
        is_train = source >= 0
        correct = made = 0
        for link, src in zip(guess["links"], source, strict=True):
            if link is None:
                continue
            made += 1
            correct += int(src >= 0 and link == frozenset(holders.get(int(src), ())))
        n_train = int(is_train.sum())
        counts, total = guess["set_counts"], sum(guess["set_counts"].values())
        # a guesser linking each candidate to a uniformly random received label set
        chance = np.mean([counts.get(frozenset(holders.get(int(s), ())), 0) / max(total, 1) for s in source[is_train]])
        return AttackResult(
            attack=self.name,
            role=self.role.value,
            metrics={"linked": correct / max(n_train, 1), "precision": correct / made if made else 0.0},
            chance={"linked": float(chance), "precision": float(chance)},
            details={
                "tokenizer": guess["tokenizer"], "pool": len(source), "pool_training_instances": n_train,
                "distractors": int((~is_train).sum()), "links_made": made, "correct_links": correct,
                "distinct_tokens_received": total,
            },
        )  # fmt: skip

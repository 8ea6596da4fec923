"""``label_prior``: the "label prior only" baseline. The model scores every instance by the federated label
frequencies alone, so it predicts the most frequent labels whatever the input.

At setup the server asks the clients for the statistic ``label_counts`` (each client's count of its instances per
label, an instance counting once per label it holds) and sums the replies. Without ``dp`` the clients answer with their
exact counts, so the prior is the training split's label frequencies. Under ``dp`` with the DP mechanism plugin
``privacy.label_prior`` set, the dp layer answers the query itself with its one released noisy sum of the clients'
bounded counts (:mod:`protocols.dp.label_prior`), charged to the run's ledger; under ``dp`` without it the channel is
un-noised and the run's ε is ∞ (the capability ``setup_statistics`` declares it).

The prior p (the counts over their largest magnitude, in [-1, 1]) becomes the model at setup: θ is zeroed except the
last bias of the network, so g_θ(x) is that bias for every x. ``linear_head``: the head's bias is p, the scores are p.
``embedding``: the encoder's last bias is e₀ and row c of W is (p_c, √(1 − p_c²), 0, …), so the cosine score is p_c.
The clients never train (``client_training: False``): their round reply is a zero update with constant count and
loss, read from no data, so a run's rounds change nothing and release nothing.

One module (params, spec, implementation): the implementation is built when first asked (``__getattr__``), so reading
the spec imports no torch.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar, Literal

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec
from secure_fed.client_functions import client_function

#: the statistic its setup asks for (the DP mechanism plugin that releases it: protocols.dp.label_prior)
STATISTIC = "label_counts"


class LabelPriorParams(AlgorithmParams):
    """``algorithm.name: label_prior``: the label prior only (no parameters of its own)."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(
        trains_rows=False, dp_units=frozenset(), client_training=False, setup_statistics=(STATISTIC,)
    )
    name: Literal["label_prior"] = "label_prior"


SPEC = AlgorithmSpec(
    LabelPriorParams,
    "secure_fed.algorithms.label_prior:LabelPrior",
    "the label prior only: every instance scored by the federated label frequencies (DP with privacy.label_prior)",
)


@client_function
def exact_label_counts(payload: dict[str, Any], data) -> dict[str, Any]:
    """Client side: this client's count of its instances per label (length C), each instance once per label."""
    import torch

    counts = torch.zeros(int(data.num_labels), dtype=torch.float64)
    counts[data.known_labels.long().cpu()] = data.pos.to(torch.float64).sum(0).cpu()
    return {STATISTIC: counts}


def prior_model(counts, theta: dict, W) -> None:
    """θ (and W, where the family has rows) set in place so that every instance's scores are ``counts`` over their
    largest magnitude (see the module docstring)."""
    import torch

    p = counts.to(torch.float64)
    p = p / p.abs().max().clamp_min(1e-12)
    biases = [n for n in theta if n.endswith("bias")]
    if not biases:
        raise ValueError("label_prior: the model's θ has no bias to hold the prior")
    for t in theta.values():
        t.zero_()
    last = theta[biases[-1]]
    if W is None:  # the scores are the last bias (a linear head)
        if last.numel() != p.numel():
            raise ValueError(f"label_prior: the last bias has {last.numel()} entries, not one per label ({p.numel()})")
        last.copy_(p.to(last.dtype))
        return
    last[0] = 1.0  # g_θ(x) = e₀ for every x; the cosine with row c is p_c
    W.zero_()
    W[:, 0] = p.to(W.dtype)
    W[:, 1] = (1.0 - p * p).clamp_min(0.0).sqrt().to(W.dtype)


@cache
def _implementation() -> type:
    import torch

    from secure_fed.algorithms.base import Algorithm
    from secure_fed.messages import Number, Params, Setting, Vector

    class LabelPrior(Algorithm):
        """The label prior only (:mod:`secure_fed.algorithms.label_prior`)."""

        params = LabelPriorParams
        downlink_rules = {**Algorithm.downlink_rules, "statistic": Setting()}
        uplink_rules = {
            "theta_delta": Params("theta", row_sparse=True, deferred=True), "num_examples": Number(), "loss": Number(),
            STATISTIC: Vector(),
        }  # fmt: skip

        def setup(self, ctx) -> dict[str, Any]:
            replies = ctx.query(lambda cid: {"statistic": STATISTIC}, exact_label_counts)
            counts = torch.zeros(ctx.num_labels, dtype=torch.float64)
            for _, reply in replies:
                counts += reply[STATISTIC].to(torch.float64).cpu()
            self.counts = counts  # server side: the prior as the server holds it (private: not released as such)
            prior_model(counts, ctx.theta, ctx.W)
            return {}

        def client_update(self, payload, data, train) -> dict[str, Any]:
            """Client side: no training; a zero update, count and loss read from no data."""
            return {"theta_delta": {n: torch.zeros_like(t) for n, t in payload["theta"].items()}, "num_examples": 1,
                    "loss": 0.0}  # fmt: skip

    LabelPrior.__module__ = __name__
    return LabelPrior


def __getattr__(name: str) -> Any:
    if name == "LabelPrior":  # the spec's implementation: built (torch imported) when a run asks for it
        return _implementation()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

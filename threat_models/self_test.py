"""The audit's self-test: planted mechanism bugs that the one-run audit must catch (``secure-fed audit --self-test``).

An audit that has never failed shows nothing: a lower bound below the claimed ε is what a correct mechanism gives,
and also what a blind audit gives. So the self-test trains a small private recipe (synthetic data, a fixed encoder,
one full-batch DP-SGD step per client at the claimed ε, canaries in the clients' class rows) once with the correct
mechanism (the control) and once with each of a set of *planted bugs*, and runs the one-run audit (Steinke, Nasr &
Jagielski 2023, :mod:`threat_models.attacks.one_run_audit`, with the ``noise_free_replay`` reference) on every run.
Each bug must be caught (the audit's ε lower bound, at its confidence, above the accountant's ε at the audit's δ,
the ε it is compared with) and the control must not be flagged.

The bugs are planted in this process only, by swapping the DP layer's privatizer
(:meth:`protocols.dp.layer.DifferentialPrivacy.local_privatizer`) for a subclass of
:class:`protocols.dp.local_dpsgd.LocalDPSGD` whose behaviour is broken: the mechanism's own code
(:meth:`~protocols.dp.local_dpsgd.LocalDPSGD.finish`, its clipping factors, its noise stream) still runs, with one
thing changed. The config and the ledger are untouched, so the claimed ε is the config's. What each bug stands for:

* ``noise_off``: the noise is never added (a flag wired the wrong way, a σ of 0 passed where the calibrated σ was
  meant). The released step is the clipped sum itself.
* ``noise_scaled_down_10x``: the noise std is σ·C/10 instead of σ·C (a unit slip: the std divided by a constant, the
  noise added after the division by the batch, a variance taken for a std ...).
* ``clipping_off``: per-sample gradients are not clipped (the clip norm never reaches the clipping, ∞ there) while the
  noise is still scaled to the configured C. The auditor's canaries are instances whose gradient is 10·C: the
  correct mechanism clips them to C, the bug lets them through whole.
* ``public_seed_noise``: the noise is drawn from a public seed (``privacy.noise_seed``'s derivation, with a seed the
  auditor knows) instead of the client's secret. The noise is then no protection: the auditor redraws it and
  subtracts it. Here the auditor's reference (the replay of the run without the canaries) is given the same public
  noise, so it cancels in every canary's score.
* ``data_dependent_sigma``: σ is computed from private data: the noise std is σ·C/√n_c, with n_c the client's own
  example count (as if the noise protected the client's mean over its own examples). The released σ is then a
  function of the data (the last audit of this code found one computed from the data's largest label count, and a
  private divisor); here it makes every client's realised noise √n_c times smaller than the ledger assumes (n_c is
  57–183 in the synthetic recipe at seed 0: 7.5–13.5× less noise), most of all for the clients holding the most
  data (every client owns canaries here).

The control is the same recipe with no bug; over 10 control runs the bound stayed below the ε it is compared with in
every run (docs/concepts/threat-models.md has the measured table).
"""

from __future__ import annotations

import math
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from protocols.dp.layer import DifferentialPrivacy
from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.randomness import SecretStream

#: the claimed (config's, ledger's) ε of the self-test's recipe
CLAIMED_EPSILON = 1.0
#: the public seed of the ``public_seed_noise`` bug (the auditor knows it)
PUBLIC_SEED = 46
#: the auditor's canary size, in units of the clip norm C (clipped to C by a correct mechanism)
CANARY_NORM = 10.0

#: the audit's canaries per run
RECIPE_CANARIES = 1000

#: the small private recipe on synthetic data: a fixed encoder (only each client's class row trains), one full-batch
#: DP-SGD step per client (Poisson rate 1), an instance on at most 3 clients; 1000 instance canaries in the class rows
RECIPE = [
    "training.rounds=1", "evaluation.every=1", "output.progress=false", "output.checkpoint_every=1",
    "dataset.synthetic.num_train=400", "dataset.synthetic.num_test=200", "dataset.synthetic.num_labels=8",
    "dataset.synthetic.num_groups=2", "dataset.synthetic.num_features=16", "dataset.synthetic.feature_noise=0.6",
    "model.embedding_dim=256", "model.hidden_dims=[]", "model.fixed_encoder=true", "device=cpu",
    "algorithm.name=fedaws", "training.batch_size=512", "training.client_lr=100", "training.server_optimizer.name=fedavg",
    "training.server_optimizer.lr=1.0", "protocols=[dp]", "attacks.run=[one_run_audit]",
    f"attacks.one_run_audit.canaries={RECIPE_CANARIES}", "attacks.one_run_audit.reference=noise_free_replay",
    f"attacks.one_run_audit.canary_norm={CANARY_NORM}",
]  # fmt: skip


def recipe_overrides(*, seed: int, epsilon: float = CLAIMED_EPSILON) -> list[str]:
    """The recipe's config overrides at run seed ``seed`` and claimed ε ``epsilon`` (δ: the default's)."""
    local = f'{{"clip_norm": 1.0, "batch_sample_rate": 1.0, "max_labels_per_instance": 3, "target_epsilon": {epsilon}}}'
    return [*RECIPE, f"seed={seed}", f"privacy.local={local}"]


class PlantedPrivatizer(LocalDPSGD):
    """A client's DP-SGD with one planted bug: ``LocalDPSGD``'s own code, with the noise multiplier, the noise stream
    or the clip norm swapped for the duration of :meth:`finish` (or, for clipping, outside it)."""

    def __init__(self, base: LocalDPSGD, *, bug: str, cid: int, state: dict[str, Any]):
        super().__init__(clip_norm=base.clip_norm, noise_multiplier=base.noise_multiplier, sample_rate=base.sample_rate,
                         divisor=base.divisor, stream=base.stream, label=base.label, copy_clip=base.copy_clip,
                         copies_bound=base.copies_bound)  # fmt: skip
        self.bug, self.cid, self.state = bug, int(cid), state
        self.true_clip_norm = base.clip_norm
        self.examples = 0  # the client's example count, seen by batch()
        if bug == "clipping_off":
            self.clip_norm = math.inf  # what the clipping (and the canaries, the auditor's instances) see

    def batch(self, n: int, step: str):
        self.examples = int(n)
        return super().batch(n, step)

    def finish(self, sums, step: str):
        saved = (self.noise_multiplier, self.stream, self.clip_norm)
        sigma = self.noise_multiplier
        if self.bug == "noise_off":
            self.noise_multiplier = 0.0
        elif self.bug == "noise_scaled_down_10x":
            self.noise_multiplier = sigma / 10.0
        elif self.bug == "data_dependent_sigma":
            self.noise_multiplier = sigma / math.sqrt(max(self.examples, 1))
        elif self.bug == "public_seed_noise":
            # the run's σ for the run and for the auditor's replay alike: the auditor redraws the run's public noise
            self.noise_multiplier = self.state.setdefault("sigma", sigma)
            self.stream = SecretStream.from_noise_seed(PUBLIC_SEED, f"client {self.cid}")
        self.clip_norm = self.true_clip_norm  # the noise is scaled to the configured C in every case
        try:
            return super().finish(sums, step)
        finally:
            self.noise_multiplier, self.stream, self.clip_norm = saved


#: the planted bugs, in the table's order (the control, ``None``, comes first)
BUGS = ("noise_off", "noise_scaled_down_10x", "clipping_off", "public_seed_noise", "data_dependent_sigma")


@contextmanager
def planted(bug: str | None) -> Iterator[None]:
    """Within the block, every client's DP-SGD privatizer carries ``bug`` (``None``: the correct mechanism)."""
    if bug is None:
        yield
        return
    if bug not in BUGS:
        raise ValueError(f"unknown planted bug {bug!r}: one of {', '.join(BUGS)}")
    original = DifferentialPrivacy.local_privatizer
    state: dict[str, Any] = {}

    def local_privatizer(self, cid: int, round_idx: int):
        priv = original(self, cid, round_idx)
        if priv is None:
            return None
        if type(priv) is not LocalDPSGD:
            raise RuntimeError(f"the self-test plants bugs in LocalDPSGD only, not {type(priv).__name__}")
        return PlantedPrivatizer(priv, bug=bug, cid=cid, state=state)

    with mock.patch.object(DifferentialPrivacy, "local_privatizer", local_privatizer):
        yield


@dataclass(frozen=True)
class CaseResult:
    """One audited run: the bug (``None``: the control), the claimed ε (the ledger's, at its δ), the ε the bound is
    compared with (the accountant's at the audit's δ), the bound and whether it exceeds that ε."""

    bug: str | None
    seed: int
    claimed_epsilon: float
    claimed_delta: float
    compared_epsilon: float
    audit_delta: float
    lower_bound: float
    correct: int
    guesses: int
    confidence: float

    @property
    def flagged(self) -> bool:
        return self.lower_bound > self.compared_epsilon

    @property
    def ok(self) -> bool:
        """A bug caught, or the control not flagged."""
        return self.flagged if self.bug is not None else not self.flagged


def run_case(bug: str | None, *, seed: int = 0, epsilon: float = CLAIMED_EPSILON, work_dir: Path | None = None) -> CaseResult:
    """Train the recipe with ``bug`` planted (``None``: the control) and run the one-run audit on it."""
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import build_experiment
    from threat_models.audit import audit
    from threat_models.context import AuditContext

    plan = load_plan(overrides=recipe_overrides(seed=seed, epsilon=epsilon))
    with (
        tempfile.TemporaryDirectory(prefix="secure-fed-self-test-", dir=work_dir) as tmp,
        planted(bug),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message="Optimal order is")  # Opacus on the calibration's trial σ values
        exp = build_experiment(plan, run_dir=Path(tmp) / "run")
        exp.run(progress=False)
        res = audit(AuditContext(exp), ["one_run_audit"], out_dir=Path(tmp) / "audit", progress=False)["attacks"]
    r = res["one_run_audit"]
    m, d = r["metrics"], r["details"]
    return CaseResult(
        bug=bug, seed=seed, claimed_epsilon=float(m["accountant_epsilon"]), claimed_delta=float(d["audit_delta"]["ledger_delta"]),
        compared_epsilon=float(m["replacement_epsilon"]), audit_delta=float(d["delta"]),
        lower_bound=float(m["epsilon_lower_bound"]), correct=int(d["correct"]), guesses=int(d["guesses"]),
        confidence=float(d["confidence"]),
    )  # fmt: skip


def self_test(
    bugs: tuple[str, ...] = BUGS, *, control_runs: int = 1, seed: int = 0, epsilon: float = CLAIMED_EPSILON,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:  # fmt: skip
    """The control (``control_runs`` runs at seeds ``seed``, ``seed + 1``, ...), then each bug at ``seed``."""
    out = []
    for case, s in [*((None, seed + i) for i in range(control_runs)), *((b, seed) for b in bugs)]:
        out.append(run_case(case, seed=s, epsilon=epsilon))
        if on_result is not None:
            on_result(out[-1])
    return out


HEADER = f"{'bug':<24} {'seed':>4} {'claimed ε':>9} {'ε at audit δ':>12} {'lower bound':>11} {'right':>9}  caught"


def table_row(r: CaseResult) -> str:
    """One line of the table: the bug, the claimed ε, the ε compared, the bound, right guesses, caught yes/no (the
    control: "no" is the pass, marked "(control)")."""
    name = r.bug or "none (control)"
    caught = "yes" if r.flagged else "no"
    verdict = "" if r.ok else ("  <- FAIL: the control is flagged" if r.bug is None else "  <- FAIL: not caught")
    return (f"{name:<24} {r.seed:>4} {r.claimed_epsilon:>9.3g} {r.compared_epsilon:>12.3g} {r.lower_bound:>11.3f} "
            f"{f'{r.correct}/{r.guesses}':>9}  {caught}{verdict}")  # fmt: skip


__all__ = ["BUGS", "CLAIMED_EPSILON", "CaseResult", "PlantedPrivatizer", "planted", "run_case", "self_test", "table_row"]

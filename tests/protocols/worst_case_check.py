"""The worst-case check of one combination of DP mechanisms (tests/protocols/test_worst_case_combinations.py).

For a combination (:mod:`tests.protocols.worst_case_combinations`) on small synthetic data:

1. **The pair.** D: the synthetic training set with one instance r whose label set no other instance has, each of
   its labels kept by exactly one other instance (the set thinned), its features scaled up (:data:`FEATURE_SCALE`)
   so that its per-sample gradients reach the clip norm; D⁻ = D without r. The client-level clip norm is below the
   round's update norms, so every client's update is clipped.
2. **Four runs of round 1.** D and D⁻ with noise, and D and D⁻ with the noise off (the discrete Gaussian sampler
   patched to 0) and every Poisson draw taken (the cohort, the label sets, the DP-SGD batches), recording what each
   mechanism is about to noise: the W step's clipped sum, each client's DP-SGD sums, each client's clipped update,
   and the std of each release. Both pairs share ``privacy.noise_seed``: the same secret streams.
3. **(a) released files.** Every file outside the run's ``private/`` is byte-identical between D and D⁻ except the
   allowlist (:data:`ALLOWLIST`): the metric fields, which the test recomputes from the released θ and W on the public
   test split and finds equal to the reported ones; θ and W themselves are the DP outputs.
4. **(b) lower bound.** For each adversary, the reported ε of the instance unit (the client unit's instance-level ε
   where client-level DP is the only unit; the observer only) is at least the ε (δ of the report) of the
   privacy-loss distribution (``dp_accounting``, ``from_two_probability_mass_functions``, both directions) of the
   realised mechanisms on a pair with the noiseless differences observed: each release projected on the direction of
   its difference (a post-processing), its Poisson sampling (of the pair's k clients, or of the one instance) a
   mixture, binned (a post-processing), composed over its steps; on a channel with mechanisms in series (DP-SGD,
   then client-level noise), the smaller one; for a client mechanism, over the k clients that moved most.
5. **(c) upper bound.** The reported ε is at most an independent composition of the mechanisms the pair reaches,
   each counted once: ``dp_accounting``'s RDP of the subsampled Gaussians and the group bound for client mechanisms
   written out here (log E_j exp(2α(α−1)j²/σ²)/(α−1), j ~ Binomial(k, q)), at Opacus's orders, converted by
   ``dp_accounting``'s RDP → (ε, δ), plus :data:`UPPER_TOL`; steps, σ and q are the public ones the combination
   configures (k copies of round(1/q) DP-SGD steps, or with ``copy_clip: split`` one full-batch step at the L2 shift
   of the k copies, one W step, one client-level release a round).
6. **(d) the same composition from below.** The reported ε is not below that composition (:data:`MATCH_REL`), and
   is ∞ exactly where it is ∞. This, not (b), is what a mechanism dropped from the graph or a group one too small
   fails: the realised pair moves a client's clipped update by ≪ 2C (measured: 0.07 to 0.94 C), so its PLD sits far
   below the group bound's ε, which assumes 2C per client.
7. **(e) sensitivity.** No mechanism's noiseless release moves by more than its accounted sensitivity
   (:data:`SENSITIVITY`). A general partition (iid, cmda) deals instances by the data set's size, so both neighbours
   run on D's partition (``partition: natural``, :func:`_same_clients`): D⁻ is D less one instance on the same clients.

``check(combination, tmp)`` returns a :class:`Verdict` whose ``failures`` list names every violated assertion.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from opacus.accountants.analysis import rdp as opacus_rdp
from scipy.stats import norm

from protocols.dp.mechanisms import ORDERS
from secure_fed.config import load_plan
from secure_fed.data import MultiLabelSplit
from secure_fed.data.from_config import build_dataset
from secure_fed.engine import Experiment
from secure_fed.plan import RunPlan
from tests.protocols.worst_case_combinations import CLIENT_CLIP, GENERAL, INSTANCE_CLIP, LOCAL_CLIP, Combination

#: the scale of r's features: its per-sample gradients and its clients' updates far above the clip norm
FEATURE_SCALE = 1000.0
#: the reported ε may exceed the independent composition by this much (ε units): dp_accounting's RDP of the
#: subsampled Gaussian is computed by another series than Opacus's, so the two curves differ in the last digits
#: (measured: ≤ 1e-9 relative at these σ and q), and the +1e-3 of the issue
UPPER_TOL = 1e-3
#: (d): the reported ε may fall below the independent composition by this fraction (and UPPER_TOL): dp_accounting's
#: RDP → (ε, δ) conversion and Opacus's differ slightly (measured: the independent one ≤ 3e-5 relative higher)
MATCH_REL = 1e-3
#: a noiseless difference below this (in the release's units) is no difference: rounding on the noise grid
ZERO = 1e-9
#: bins of the 1-D projections, per noise std (a finer binning only raises the lower bound towards the exact one)
BINS_PER_STD = 40
#: the fields of the released files that may differ between the neighbours, each recomputed from θ, W and the public
#: test split: the evaluation metrics (metrics.jsonl, summary.json's ``final``) and W's mean cosine
ALLOWLIST = ("final", "W_mean_cos", "<metrics>")


@dataclass
class Record:
    """What the wrapped mechanisms saw in one run."""

    w_step: list[tuple[np.ndarray, float]] = field(default_factory=list)  #: (clipped sum, std of its noise)
    dp_sgd: dict[int, list[tuple[np.ndarray, float]]] = field(default_factory=dict)  #: client → its steps' sums
    updates: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  #: client → its clipped update
    client_std: list[tuple[float, bool]] = field(default_factory=list)  #: (std of the release, rows noised)
    w_sets: list[set[tuple]] = field(default_factory=list)  #: each W step's label sets
    w_without: list[np.ndarray] = field(default_factory=list)  #: the W step's clipped sum without the other's sets


def _set_keys(label_sets) -> list[tuple]:
    if sp.issparse(label_sets):
        m = sp.csr_matrix(label_sets)
        return [tuple(int(j) for j in m.indices[m.indptr[i] : m.indptr[i + 1]]) for i in range(m.shape[0])]
    dense = torch.as_tensor(label_sets).cpu()
    return [tuple(int(j) for j in torch.nonzero(row).reshape(-1)) for row in dense]


@dataclass
class Verdict:
    combination: Combination
    failures: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- the pair
def worst_case_pair(plan: RunPlan, bound: int | None):
    """(D, D⁻, r): r's label set is unique, it has ``bound`` labels (or 2, or the nearest count there is), and each
    of its labels keeps exactly one other instance in D (the synthetic set thinned: the other instances with r's labels
    are left out of both neighbours, unless a label would lose its last instance), so that r weighs on its clients'
    updates; r's features are scaled by :data:`FEATURE_SCALE` (its per-sample gradients at the clip norm); D⁻ = D − r."""
    ds = build_dataset(plan)
    y = sp.csr_matrix(ds.train.labels)
    per_label = np.asarray(y.sum(axis=0)).ravel()
    keys = [tuple(int(j) for j in y.indices[y.indptr[i] : y.indptr[i + 1]]) for i in range(y.shape[0])]
    count: dict[tuple, int] = {}
    for k in keys:
        count[k] = count.get(k, 0) + 1
    want = bound or 2
    ok = [i for i, k in enumerate(keys) if k and count[k] == 1 and all(per_label[j] >= 2 for j in k)]
    assert ok, "no instance with a unique label set whose labels all have another instance"
    r = min(ok, key=lambda i: (abs(len(keys[i]) - want), i))
    mine = set(keys[r])
    keep, partner = [], {}
    for i, k in enumerate(keys):
        shared = mine & set(k)
        if i == r or not shared:
            keep.append(i)
        elif any(j not in partner for j in shared) and k != keys[r]:
            keep.append(i)
            partner.update({j: i for j in shared if j not in partner})
    keep = sorted(keep)
    kept_per_label = np.asarray(y[keep].sum(axis=0)).ravel()
    for j in np.flatnonzero((per_label > 0) & (kept_per_label == 0)):  # a label the thinning would empty keeps one
        keep = sorted({*keep, next(i for i, k in enumerate(keys) if j in k)})
    y = y[keep]
    r = keep.index(r)
    f = ds.train.features[keep]
    scale = np.ones(y.shape[0], dtype=np.float32)
    scale[r] = FEATURE_SCALE
    x = sp.csr_matrix(sp.diags(scale) @ f, dtype=f.dtype) if sp.issparse(f) else (np.asarray(f) * scale[:, None]).astype(f.dtype)
    d = dataclasses.replace(ds, train=MultiLabelSplit(x, y))
    rest = np.flatnonzero(np.arange(y.shape[0]) != r)
    minus = dataclasses.replace(ds, train=MultiLabelSplit(x[rest], y[rest]))
    return d, minus, r, tuple(sorted(mine))


# ---------------------------------------------------------------------------------------------------- the runs
@contextlib.contextmanager
def _frozen_heap():
    """The heap frozen for the cyclic collector around a run, so the engine's long-lived block (collector.py) finds
    it frozen and skips its full collection (0.7 s a run here, most of a one-round run's time)."""
    owner = gc.get_freeze_count() == 0
    if owner:
        gc.freeze()
    try:
        yield
    finally:
        if owner:
            gc.unfreeze()


_RDP_CACHE: dict[tuple[float, float, float], float] = {}
_opacus_compute_rdp = opacus_rdp._compute_rdp


def _cached_rdp(q: float, sigma: float, alpha: float) -> float:
    """Opacus's per-order RDP of the subsampled Gaussian, memoised (a pure function of its arguments; the runs here
    share a few (q, σ), and its fractional orders cost most of a one-round run)."""
    key = (float(q), float(sigma), float(alpha))
    if key not in _RDP_CACHE:
        _RDP_CACHE[key] = _opacus_compute_rdp(q, sigma, alpha)
    return _RDP_CACHE[key]


def _flat(sums: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([sums[n].detach().double().cpu().reshape(-1).numpy() for n in sorted(sums)])


def run_round(
    plan: RunPlan, ds, run_dir: Path, *, noise_off: bool, mutate=None, other_sets: set | None = None
) -> tuple[Experiment, Record]:
    """Round 1 of ``plan`` on ``ds``, with the mechanisms' inputs recorded (and the noise off, every draw taken).
    ``other_sets``: the neighbour's label sets; the W step's clipped sum is then also taken, at the same W, without
    the sets the neighbour lacks (the removed instance's contribution, free of what client training changed)."""
    from protocols.dp import adaptive_clipping, client_release, discrete_gaussian, layer, w_step_release
    from protocols.dp.client_dp import released_sums
    from protocols.dp.discrete_gaussian import release_grid
    from protocols.dp.local_dpsgd import LocalDPSGD
    from protocols.dp.local_shares import LocalShareSums
    from protocols.randomness import SecretStream

    rec = Record()
    with pytest.MonkeyPatch.context() as mp, _frozen_heap():
        mp.setattr(opacus_rdp, "_compute_rdp", _cached_rdp)
        mp.setattr(os, "fsync", lambda fd: None)  # durability of the run's files: not what this checks (0.4 s a run)
        if mutate is not None:
            mutate(mp)
        if noise_off:
            mp.setattr(discrete_gaussian, "sample_discrete_gaussian", lambda stream, n, sigma, label: np.zeros(n, np.int64))
            uniform = SecretStream.uniform

            def every_draw_taken(self, n, label):
                if label.endswith(" sample") or label.startswith("cohort "):
                    return np.full(n, 2.0**-54)
                return uniform(self, n, label)

            mp.setattr(SecretStream, "uniform", every_draw_taken)
        noisy_sum = w_step_release.noisy_sum

        def w_noisy_sum(total, *, sigma, sensitivity, stream, label):
            rec.w_step.append((total.detach().double().cpu().reshape(-1).numpy().copy(),
                               sigma * release_grid(sensitivity, total.numel())[1]))  # fmt: skip
            return noisy_sum(total, sigma=sigma, sensitivity=sensitivity, stream=stream, label=label)

        mp.setattr(w_step_release, "noisy_sum", w_noisy_sum)
        w_step = w_step_release.dp_label_set_step

        def w_recorded(W, label_sets, per_set_grads, **kw):
            keys = _set_keys(label_sets)
            rec.w_sets.append(set(keys))
            if other_sets is not None:
                mask = torch.tensor([k not in other_sets for k in keys], dtype=torch.bool)
                got = []

                def capture(total, sigma, sens):
                    got.append(total.detach().double().cpu().reshape(-1).numpy().copy())
                    return total

                w_step(W.clone(), label_sets, per_set_grads, **{**kw, "pick": kw["pick"] & ~mask.to(kw["pick"].device),
                                                                "noise": capture})  # fmt: skip
                rec.w_without.append(got[0])
            return w_step(W, label_sets, per_set_grads, **kw)

        mp.setattr(w_step_release, "dp_label_set_step", w_recorded)
        mp.setattr(adaptive_clipping, "noisy_sum", adaptive_clipping.noisy_sum)  # the count: not recorded
        privatizer = layer.DifferentialPrivacy.local_privatizer

        def tagged(self, cid, round_idx):
            p = privatizer(self, cid, round_idx)
            if p is not None:
                p._combo_cid = int(cid)
            return p

        mp.setattr(layer.DifferentialPrivacy, "local_privatizer", tagged)
        for cls in (LocalDPSGD, LocalShareSums):
            finish = cls.__dict__["finish"]

            def recorded(self, sums, step, _finish=finish):
                flat = _flat(sums)
                # the std the release draws: split's covers √m copies' roundings (LocalDPSGD.noise_sensitivity)
                per_sigma = (
                    self.noise_sensitivity(flat.size)[1]
                    if self.copy_clip == "split"
                    else release_grid(self.clip_norm, flat.size)[1]
                )
                std = self.noise_multiplier * per_sigma
                rec.dp_sgd.setdefault(getattr(self, "_combo_cid", -1), []).append((flat, std))
                return _finish(self, sums, step)

            mp.setattr(cls, "finish", recorded)
        apply_plan = client_release.apply_client_plan

        def recorded_plan(reply, steps, *, data, layers):
            out = apply_plan(reply, steps, data=data, layers=layers)
            upd = {f"theta.{n}": t.detach().double().cpu().clone() for n, t in out.get("theta_delta", {}).items()}
            if "rows_delta" in out:
                upd["rows"] = (
                    torch.as_tensor(out["row_ids"]).reshape(-1).cpu(),
                    out["rows_delta"].detach().double().cpu().clone(),
                )
            rec.updates[int(data.client_id)] = upd
            return out

        mp.setattr(client_release, "apply_client_plan", recorded_plan)
        aggregate = client_release.noise_aggregate

        def noised(agg, **kw):
            std = released_sums(
                agg, noise_rows=kw["noise_rows"], clip_norm=kw["clip_norm"], noise_multiplier=kw["noise_multiplier"]
            )[2]
            rec.client_std.append((std, bool(kw["noise_rows"])))
            return aggregate(agg, **kw)

        mp.setattr(client_release, "noise_aggregate", noised)
        exp = Experiment(plan, run_dir=run_dir, dataset=ds)
        exp.run(progress=False)
    return exp, rec


def _update_vector(upd: dict, num_rows: int, rows: bool) -> np.ndarray:
    parts = [upd[n].reshape(-1).numpy() for n in sorted(k for k in upd if k.startswith("theta."))]
    if rows and "rows" in upd:
        ids, delta = upd["rows"]
        full = np.zeros((num_rows, delta.shape[1]))
        np.add.at(full, ids.numpy(), delta.numpy())
        parts.append(full.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0)


# ---------------------------------------------------------------------------------------------------- (a)
def _released(run_dir: Path) -> dict[str, bytes]:
    out = {}
    for f in sorted(run_dir.rglob("*")):
        rel = f.relative_to(run_dir)
        if f.is_file() and rel.parts[0] != "private" and rel.name != ".lock":
            out[str(rel)] = f.read_bytes()
    return out


def _recomputed_metrics(exp: Experiment, run_dir: Path) -> tuple[dict, float | None]:
    """The evaluation metrics of the released θ and W (the final checkpoint's, which ``secure-fed export`` releases) on
    the public test split."""
    final = torch.load(run_dir / "private" / "checkpoints" / "final.pt", map_location="cpu", weights_only=False)
    for n, t in final["theta"].items():
        exp.model.theta[n].data.copy_(t)
    cos = None
    if final.get("W") is not None and exp.model.W is not None:
        exp.model.W.data.copy_(final["W"])
        w = torch.nn.functional.normalize(final["W"].double(), dim=1)
        c = w @ w.T
        n = c.shape[0]
        cos = float((c.sum() - c.diagonal().sum()) / (n * (n - 1))) if n > 1 else None
    return exp.evaluate(), cos


def released_diff(exps: dict[str, tuple[Experiment, Path]]) -> list[str]:
    """(a): the released files of D and D⁻ differ only in the allowlist, and each allowed field equals its value
    recomputed from the released θ, W and the public test split."""
    failures = []
    files = {k: _released(p) for k, (_, p) in exps.items()}
    if set(files["D"]) != set(files["D-"]):
        failures.append(f"(a) released files differ in name: {sorted(set(files['D']) ^ set(files['D-']))}")
    for name in sorted(set(files["D"]) & set(files["D-"])):
        a, b = files["D"][name], files["D-"][name]
        if a == b:
            continue
        if name not in ("summary.json", "metrics.jsonl"):
            failures.append(f"(a) released file {name} differs between the neighbours (not on the allowlist)")
    for side, (exp, run_dir) in exps.items():
        want, cos = _recomputed_metrics(exp, run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        for key, val in (summary.get("final") or {}).items():
            if key in want and not math.isclose(val, want[key], rel_tol=1e-6, abs_tol=1e-9):
                failures.append(f"(a) {side}: summary final.{key} = {val}, recomputed {want[key]}")
        if cos is not None and "W_mean_cos" in summary and not math.isclose(summary["W_mean_cos"], cos, abs_tol=1e-5):
            failures.append(f"(a) {side}: W_mean_cos {summary['W_mean_cos']}, recomputed {cos}")
        last = lines[-1]
        for key, val in last.items():
            if key in want and isinstance(val, float) and not math.isclose(val, want[key], rel_tol=1e-6, abs_tol=1e-9):
                failures.append(f"(a) {side}: metrics.jsonl {key} = {val}, recomputed {want[key]}")
    # every field that differs is an allowed one (a metric recomputed above, or W's mean cosine)
    sd = [json.loads((p / "summary.json").read_text()) for _, p in exps.values()]
    for key in sorted(set(sd[0]) | set(sd[1])):
        if sd[0].get(key) != sd[1].get(key) and key not in ("final", "W_mean_cos"):
            failures.append(
                f"(a) summary.json field {key!r} differs between the neighbours: {sd[0].get(key)!r} vs {sd[1].get(key)!r}"
            )
    ml = [[json.loads(x) for x in (p / "metrics.jsonl").read_text().splitlines()] for _, p in exps.values()]
    if len(ml[0]) != len(ml[1]):
        failures.append("(a) metrics.jsonl: another number of lines")
    metric_keys = set(exps["D"][0].evaluate())
    for la, lb in zip(*ml, strict=False):
        for key in sorted(set(la) | set(lb)):
            if la.get(key) != lb.get(key) and key not in metric_keys and key != "W_mean_cos":
                failures.append(f"(a) metrics.jsonl field {key!r} differs: {la.get(key)!r} vs {lb.get(key)!r} (not recomputable "
                                "from θ, W and the test split)")  # fmt: skip
    return failures


# ---------------------------------------------------------------------------------------------------- (b)
def _binned(means_p, means_q, weights, std: float) -> tuple[dict, dict]:
    """log-PMFs of the two 1-D Gaussian mixtures Σ w N(means, std²), binned on one grid (a post-processing)."""
    lo = min(min(means_p), min(means_q)) - 14 * std
    hi = max(max(means_p), max(means_q)) + 14 * std
    edges = np.arange(lo, hi + std / BINS_PER_STD, std / BINS_PER_STD)
    edges[0], edges[-1] = -np.inf, np.inf

    def pmf(means):
        p = np.zeros(len(edges) - 1)
        for m, w in zip(means, weights, strict=True):
            p += w * np.diff(norm.cdf((edges - m) / std))
        return p

    p, q = pmf(means_p), pmf(means_q)
    keep = (p > 0) & (q > 0)
    return ({i: math.log(v) for i, v in enumerate(p) if keep[i]}, {i: math.log(v) for i, v in enumerate(q) if keep[i]})


def _mixture_pld(shifts_p, shifts_q, q: float, std: float, *, forward: bool):
    """The PLD of one release whose group members (each sampled with probability q) move it by ``shifts_p[i]`` on D
    and ``shifts_q[i]`` on D⁻ (1-D, after projection)."""
    k = len(shifts_p)
    mp, mq, w = [], [], []
    for picks in product((0, 1), repeat=k):
        wt = math.prod(q if s else 1 - q for s in picks)
        if wt == 0.0:
            continue
        mp.append(sum(s * x for s, x in zip(picks, shifts_p, strict=True)))
        mq.append(sum(s * x for s, x in zip(picks, shifts_q, strict=True)))
        w.append(wt)
    lp, lq = _binned(mp, mq, w, std)
    upper, lower = (lp, lq) if forward else (lq, lp)
    return pld_lib.from_two_probability_mass_functions(lower, upper, pessimistic_estimate=False)


# ---------------------------------------------------------------------------------------------------- (c)
def _sampled_gaussian_rdp(sigma: float, q: float, steps: int) -> np.ndarray:
    """dp_accounting's RDP curve at ORDERS; with q < 1, its values at the integer orders only, and at a fractional
    order α between k and k + 1 the log-linear interpolation (α−1)ε(α) = (k+1−α)(k−1)ε(k) + (α−k)·k·ε(k+1): the
    ledger's curve, proven for the discrete Gaussian (protocols/dp/discrete_gaussian_accounting.py)."""
    if q >= 1.0:
        acc = rdp_lib.RdpAccountant(orders=list(ORDERS))
        acc.compose(GaussianDpEvent(sigma), steps)
        return np.asarray(acc._rdp, dtype=float)  # the accountant's RDP curve at ORDERS
    fractional = [a for a in ORDERS if not float(a).is_integer()]
    around = {k for a in fractional for k in (math.floor(a), math.floor(a) + 1)} - {1}
    needed = sorted({int(a) for a in ORDERS if float(a).is_integer()} | around)
    acc = rdp_lib.RdpAccountant(orders=needed)
    acc.compose(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps)
    at = {1: 0.0, **dict(zip(needed, np.asarray(acc._rdp, dtype=float), strict=True))}
    out = []
    for a in ORDERS:
        k, lam = math.floor(a), math.floor(a) + 1 - a
        out.append(at[k] if lam == 1 else (lam * (k - 1) * at[k] + (1 - lam) * k * at[k + 1]) / (a - 1))
    return np.asarray(out)


def _group_rdp(sigma: float, q: float, k: int, steps: int) -> np.ndarray:
    """log E_j exp(2α(α−1)j²/σ²)/(α−1), j ~ Binomial(k, q), per round (each sampled member moves the sum by ≤ 2C)."""
    out = []
    for a in ORDERS:
        if q >= 1.0:  # every member sampled: j = k
            logs = [2 * a * (a - 1) * k * k / sigma**2]
        else:
            logs = [math.log(math.comb(k, j)) + j * math.log(q) + (k - j) * math.log1p(-q) + 2 * a * (a - 1) * j * j / sigma**2
                    for j in range(k + 1)]  # fmt: skip
        top = max(logs)
        out.append(steps * (top + math.log(sum(math.exp(x - top) for x in logs))) / (a - 1))
    return np.asarray(out)


# ---------------------------------------------------------------------------------------------------- the check
#: the sampling rates and step counts the combinations configure (tests/protocols/worst_case_combinations.py), in
#: one round: the W step once, DP-SGD round(1/q) steps on each of the k clients an instance enters
W_RATE, LOCAL_RATE, CLIENT_RATE, W_STEPS_PER_ROUND = 0.5, 0.5, 0.75, 1
#: the largest shift of each mechanism's release by one instance, in clip norms: the accounted sensitivities (the W
#: step 2C, a DP-SGD step C, a substituted client 2C); (e) fails a noiseless difference above it (relative slack for
#: float32 sums)
SENSITIVITY = {"w_step": 2.0, "dp_sgd": 1.0, "client": 2.0}
SENSITIVITY_SLACK = 1e-5

#: the mechanisms' declared noise and sampling, written out here (not read from protocols.dp.mechanisms): who adds the
#: noise, and whether the server knows the sample
NOISE_BY_CLIENTS = {"dp_sgd", "dp_sgd_shares", "client_noise_shares"}
SAMPLE_KNOWN_TO_SERVER = {"w_step", "client_server_noise", "client_noise_shares", "adaptive_clipping", "client_tree",
                          "client_banded"}  # fmt: skip
CLIENT_KINDS = {"client_server_noise", "client_noise_shares", "adaptive_clipping", "client_tree", "client_banded"}


def _same_clients(c: Combination, plan: RunPlan, d, r: int, tmp: Path):
    """side → the run's plan. A general partition (iid, cmda) deals the instances to clients from the data set's
    size, so D⁻ would be dealt anew: both neighbours run instead on D's partition, read from a client-id file
    (``partition: natural``, the same path in both configs, so config.yaml stays identical), D⁻'s without r's line."""
    if c.family not in GENERAL:
        return lambda side: plan
    from secure_fed.data import partitioner_from_config

    shards = partitioner_from_config(plan.partition, seed=plan.seed).partition(d.train, np.random.default_rng([plan.seed, 11]))
    ids = np.empty(d.train.num_instances, dtype=np.int64)
    for s in shards:
        ids[s.indices] = s.client_id
    path = tmp / "client_ids.txt"
    side_plan = load_plan(overrides=[*c.overrides(), "partition.name=natural", f"partition.client_ids_file={path}"])

    def plan_for(side: str):
        rows = ids if side == "D" else np.delete(ids, r)
        tmp.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{i}\n" for i in rows))
        return side_plan

    return plan_for


def check(c: Combination, tmp: Path, *, mutate=None, delta: float = 1e-5) -> Verdict:
    """Run the worst-case check of ``c`` under ``tmp``; ``mutate(monkeypatch)`` applies a mutant to every run."""
    v = Verdict(c)
    plan = load_plan(overrides=c.overrides())
    d, minus, r, labels = worst_case_pair(plan, c.bound)
    v.figures["removed"] = {"index": r, "labels": [int(x) for x in labels]}
    plan_for = _same_clients(c, plan, d, r, tmp)
    runs = {}
    for noise_off, (side, ds) in product((False, True), (("D-", minus), ("D", d))):  # D⁻ first
        tag = ("off-" if noise_off else "") + side.replace("-", "minus")
        others = runs[(True, "D-")][1].w_sets[0] if noise_off and side == "D" and runs[(True, "D-")][1].w_sets else None
        exp_rec = run_round(plan_for(side), ds, tmp / tag, noise_off=noise_off, mutate=mutate, other_sets=others)
        runs[(noise_off, side)] = (*exp_rec, tmp / tag)
    # (a)
    v.failures += released_diff({side: (runs[(False, side)][0], runs[(False, side)][2]) for side in ("D", "D-")})
    summary = json.loads((runs[(False, "D")][2] / "summary.json").read_text())
    units = summary["privacy"]["units"]
    if "instance" in units:
        reported = {adv: units["instance"]["adversaries"][adv]["epsilon"] for adv in ("observer", "server")}
        if summary["privacy"]["epsilon"] != reported["observer"]:
            v.failures.append(
                f"the released model's ε {summary['privacy']['epsilon']} is not the observer's {reported['observer']}"
            )
    else:  # client-level DP alone: the instance's ε is the client unit's instance-level one, for the observer
        reported = {"observer": units["client"]["instance_level"]["epsilon"]}
    v.figures["reported"] = reported
    # the realised mechanisms: noiseless differences, their noise std, their steps (the public count the accounting
    # must charge); (e) a difference above the accounted sensitivity
    off = {s: runs[(True, s)][1] for s in ("D", "D-")}
    k = c.bound or 1
    mechs = []  # (kind, channel, 1-D shifts on D, on D⁻, q, std, steps)
    over = []  # (kind, observed difference, accounted sensitivity)
    kinds = c.kinds
    if "w_step" in kinds and off["D"].w_step:
        (a, std), b = off["D"].w_step[0], off["D"].w_without[0]
        dist = float(np.linalg.norm(a - b))
        mechs.append(("w_step", "label_sets", [dist], [0.0], W_RATE, std, W_STEPS_PER_ROUND))
        over.append(("w_step", dist, SENSITIVITY["w_step"] * INSTANCE_CLIP))
    local = kinds & {"dp_sgd", "dp_sgd_shares"}
    if local:
        kind = local.pop()
        dists, std = [], None
        for cid, seq in off["D"].dp_sgd.items():
            other = off["D-"].dp_sgd.get(cid)
            if other is not None and (dd := float(np.linalg.norm(seq[0][0] - other[0][0]))) > ZERO:
                dists.append(dd)
                std = seq[0][1]
        if dists and c.local == "split":  # k releases of their own noise, one step each: one Gaussian at the L2 shift
            shift = math.sqrt(sum(dd * dd for dd in dists))
            mechs.append((kind, "client_training", [shift], [0.0], 1.0, std, 1))
            over.append((kind, shift, SENSITIVITY["dp_sgd"] * LOCAL_CLIP))
        elif dists:
            q, per_client = (1.0, 1) if kind == "dp_sgd_shares" else (LOCAL_RATE, round(1 / LOCAL_RATE))
            mechs.append((kind, "client_training", [max(dists)], [0.0], q, std, k * per_client))
            over.append((kind, max(dists), SENSITIVITY["dp_sgd"] * LOCAL_CLIP))
    client = kinds & CLIENT_KINDS
    if client and off["D"].client_std:
        kind = client.pop()
        std, rows = off["D"].client_std[0]
        num_rows = int(plan.dataset.synthetic.num_labels)
        group = [cid for cid in off["D"].updates if cid in off["D-"].updates]
        vecs = {s: {cid: _update_vector(off[s].updates[cid], num_rows, rows) for cid in group} for s in ("D", "D-")}
        moved = sorted((float(np.linalg.norm(vecs["D"][cid] - vecs["D-"][cid])), cid) for cid in group)
        moved = [cid for dd, cid in moved if dd > ZERO][-k:]  # the k that moved most: the group the bound is for
        if moved:
            total = sum(vecs["D"][cid] - vecs["D-"][cid] for cid in moved)
            u = total / np.linalg.norm(total)
            x = [float(vecs["D"][cid] @ u) for cid in moved]
            y = [float(vecs["D-"][cid] @ u) for cid in moved]
            over += [(kind, float(np.linalg.norm(vecs["D"][cid] - vecs["D-"][cid])), SENSITIVITY["client"] * CLIENT_CLIP)
                     for cid in moved]  # fmt: skip
            q = 1.0 if kind in ("client_tree", "client_banded") else CLIENT_RATE
            mechs.append((kind, "client_training", x, y, q, std, 1))
    v.figures["mechanisms"] = [
        {"kind": m[0], "shift": [round(x - y, 6) for x, y in zip(m[2], m[3], strict=True)],
         "q": m[4], "std": m[5], "steps": m[6]}
        for m in mechs
    ]  # fmt: skip
    for kind, seen, bound in over:
        if seen > bound * (1 + SENSITIVITY_SLACK):
            v.failures.append(f"(e) {kind}: one instance moves its noiseless release by {seen:.6g}, above the accounted "
                              f"sensitivity {bound:g}")  # fmt: skip
    differing = {m[0] for m in mechs}
    for adv in reported:
        lower = lower_bound(mechs, adv, delta)
        upper = independent_upper(c, mechs, adv, delta, label_sets="instance" in units)
        v.figures[adv] = {"reported": reported[adv], "pld_lower": lower, "independent_upper": upper}
        rep = math.inf if reported[adv] == "inf" else float(reported[adv])
        of = f"of {sorted(differing)}"
        if rep < lower:
            v.failures.append(f"(b) {adv}: reported ε {rep:.6g} below the PLD lower bound {lower:.6g} {of}")
        if math.isfinite(rep) and rep > upper + UPPER_TOL:
            v.failures.append(f"(c) {adv}: reported ε {rep:.6g} above the independent composition {upper:.6g} {of}")
        if math.isfinite(rep) != math.isfinite(upper) or (math.isfinite(rep) and rep < upper * (1 - MATCH_REL) - UPPER_TOL):
            v.failures.append(f"(d) {adv}: reported ε {rep:.6g} below the independent composition {upper:.6g} {of}")
    return v


def _reaches(kind: str, adversary: str) -> bool:
    return adversary == "observer" or kind in NOISE_BY_CLIENTS


def _rate(kind: str, q: float, adversary: str) -> float:
    return 1.0 if adversary == "server" and kind in SAMPLE_KNOWN_TO_SERVER else q


def lower_bound(mechs, adversary: str, delta: float) -> float:
    """(b): the ε of the composed PLDs of the realised mechanisms that protect against ``adversary`` (noise it does not
    add itself); on a channel with two in series, the smaller one. Against the server a mechanism it noises itself
    bounds nothing: its channel's loss is unbounded, which no finite lower bound expresses; it is left out (0)."""
    best = 0.0
    for forward in (True, False):
        per_channel = {}
        for kind, channel, sp_, sq, q, std, steps in mechs:
            if not _reaches(kind, adversary) or steps == 0:
                continue
            one = _mixture_pld(sp_, sq, _rate(kind, q, adversary), std, forward=forward)
            pl = one.self_compose(steps) if steps > 1 else one
            eps = pl.get_epsilon_for_delta(delta)
            if channel not in per_channel or eps < per_channel[channel][0]:
                per_channel[channel] = (eps, pl)
        if not per_channel:
            continue
        plds = [p for _, p in per_channel.values()]
        total = plds[0]
        for p in plds[1:]:
            total = total.compose(p)
        best = max(best, float(total.get_epsilon_for_delta(delta)))
    return best


def independent_upper(c: Combination, mechs, adversary: str, delta: float, *, label_sets: bool = True) -> float:
    """(c): the RDP composition of exactly the mechanisms whose outputs differ, each once: per channel the smallest
    curve of its mechanisms in series (the release is a post-processing of each), channels added. ∞ where a channel
    of the run has no mechanism that reaches it, or (against the server) where the clear training loss reaches it.
    ``label_sets``: whether W's label-set channel counts (not for the client unit's instance-level ε, which is the
    client-level mechanism's alone)."""
    channels = {"label_sets", "client_training"} if c.family == "fedalc" and label_sets else {"client_training"}
    if adversary == "server" and "dp_sgd" in c.kinds and "client_noise_shares" not in c.kinds:
        return math.inf  # the clients' training loss reaches the server in the clear (not sent with noise shares)
    curves: dict[str, np.ndarray] = {}
    k = c.bound or 1
    for kind, channel, _sp, _sq, q, _std, steps in mechs:
        if not _reaches(kind, adversary):
            continue
        rate = _rate(kind, q, adversary)
        if kind in CLIENT_KINDS:
            curve = _group_rdp(1.0, rate, k, steps)
        else:
            curve = _sampled_gaussian_rdp(1.0, rate, steps)
        curves[channel] = curve if channel not in curves else np.minimum(curves[channel], curve)
    if set(curves) != channels:
        return math.inf
    eps, _ = rdp_lib.compute_epsilon(list(ORDERS), list(np.sum(np.stack(list(curves.values())), axis=0)), delta)
    return float(eps)

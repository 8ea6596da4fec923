"""The leakage audit: every attack in ``threat_models`` against every protocol stack, FedALC on Bibtex.

Usage::

    python experiments/leakage_audit.py [--rounds N] [--out DIR] [--epsilons 1,4] [--shadows K]
                                        [--crypto-rounds K] [--workers W] [--report-only]

Stacks (``configs/leakage_audit.yaml``; each run is cached and resumable under ``DIR/runs``):

* ``none`` — the paper's protocol: plain SHA-256 tokens, clear labels, plaintext updates;
* ``keyed_hashing`` — HMAC tokens and label pseudonyms;
* ``dp_eps{ε}`` — client-level DP-FedAvg (clip 0.05, the median update norm) *and* instance-level
  DP-SGD on W (clip 1000, q = 0.1), both calibrated to target ε over the N rounds;
* ``secure_aggregation`` and ``ckks`` — the same run as ``none`` for the first N − K rounds, then
  the last K rounds (``--crypto-rounds``, default 1; the captured round is the last) under the
  protocol. Full CKKS over θ costs ≈ 6 s per client update here, so a full-length CKKS run is
  out of reach on a CPU; the protocol changes only how the server sums, not the model (tested);
* ``oracle`` — the centralised upper bound (membership inference only).

Writes ``DIR/results.json`` (stack → protocols, privacy, attack → metrics, chance, details),
``DIR/table.md`` (attack × stack with chance levels), ``DIR/roc.png`` (LiRA ROC per stack, log axes)
and ``DIR/success_vs_epsilon.png``. Each run directory also holds its own ``private/attacks.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from secure_fed.plugin_api.attacks import attacks_path, checkpoint_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS, default_workers  # noqa: E402

CONFIG = CONFIGS / "leakage_audit.yaml"
ORACLE = CONFIGS / "bibtex_oracle.yaml"
CLIENT_CLIP = 0.05
INSTANCE_CLIP = 1000.0


def stack_overrides(stack: str, rounds: int, shadow_dir: str) -> list[str]:
    ov = [f"training.rounds={rounds}", f"attacks.membership_inference.shadow_dir={shadow_dir}"]
    if stack.startswith("dp_eps"):
        eps = float(stack[len("dp_eps") :])
        ov += [
            "protocols=[dp]",
            f"privacy.client={{clip_norm: {CLIENT_CLIP}, target_epsilon: {eps}}}",
            f"privacy.instance={{clip_norm: {INSTANCE_CLIP}, target_epsilon: {eps}, sample_rate: 0.1, expected_batch_size: 488}}",
        ]
    elif stack == "keyed_hashing":
        ov.append("protocols=[keyed_hashing]")
    elif stack in ("secure_aggregation", "ckks"):
        ov.append(f"protocols=[{stack}]")
    return ov


def _audit(run_dir: Path, data_root: str | None) -> dict[str, Any]:
    from threat_models.audit import audit_run_dir

    done = attacks_path(run_dir)
    if done.is_file():
        return json.loads(done.read_text())
    return audit_run_dir(run_dir, data_root=data_root, progress=False)


def run_stack(stack: str, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Train (cached) and audit one stack; returns its attacks.json document."""
    import torch

    torch.set_num_threads(threads)
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import build_experiment

    out = Path(args.out) / "runs"
    shadow_dir = str(Path(args.out) / "shadows")
    run_dir = out / stack
    if stack == "oracle":
        plan = load_plan(ORACLE, ["output.progress=false", "attacks.run=[membership_inference]",
                                   f"attacks.membership_inference.shadows={args.shadows}",
                                 f"attacks.membership_inference.shadow_dir={shadow_dir}"])  # fmt: skip
        _train(plan, run_dir, args.data_root)
        return _audit(run_dir, args.data_root)
    common = [f"attacks.membership_inference.shadows={args.shadows}", f"attacks.one_run_audit.canaries={args.canaries}"]
    plan = load_plan(CONFIG, stack_overrides(stack, args.rounds, shadow_dir) + common)
    if stack in ("none", "secure_aggregation", "ckks") and args.crypto_rounds < args.rounds:
        base = out / "_base"
        base_plan = load_plan(CONFIG, stack_overrides("none", args.rounds - args.crypto_rounds, shadow_dir) + common)
        _train(base_plan, base, args.data_root)
        if not (run_dir / "summary.json").is_file():
            exp = build_experiment(plan, run_dir=run_dir, data_root=args.data_root)
            exp.setup()  # this stack's own setup (CKKS keys, label sets) …
            state = torch.load(checkpoint_dir(base) / "last.pt", map_location="cpu", weights_only=False)
            state["setup_facts"], state["protocols"] = exp.setup_facts, exp.stack.state_dict()
            exp.load_state_dict(state)  # … then the shared first N − K rounds
            exp.run(progress=False)
    else:
        _train(plan, run_dir, args.data_root)
    return _audit(run_dir, args.data_root)


def _train(plan, run_dir: Path, data_root: str | None) -> None:
    from secure_fed.plugin_api.attacks import build_experiment

    summary = run_dir / "summary.json"
    if summary.is_file():
        done = json.loads(summary.read_text())
        if done.get("rounds_planned") != plan.training.rounds:
            raise SystemExit(
                f"{run_dir} holds a {done.get('rounds_planned')}-round run, not {plan.training.rounds}: use another --out"
            )
        if done.get("status") in ("completed", "completed_with_aborts", "budget_exhausted"):
            return
    exp = build_experiment(plan, run_dir=run_dir, data_root=data_root)
    exp.resume()
    exp.run(progress=False)


# ---------------------------------------------------------------------------------------------- report
def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return f"{x:.{digits}f}"


def _mc(key: str, chance: str | None = None):
    """Getter of (metric, chance) for a top-level metric."""
    return lambda e: (e["metrics"].get(key), e["chance"].get(chance or key) if chance != "" else None)


def _lira(variant: str, key: str, chance: float):
    return lambda e: (e["metrics"].get(variant, {}).get(key), chance)


ROWS = [  # (attack, label, getter of (value, chance))
    ("token_linkage", "(a) token linkage: pool instances linked", _mc("linked")),
    ("token_linkage", "(a) token linkage: precision", _mc("precision", "")),
    ("label_deanonymization", "(b) label re-identification (top-1)", _mc("reidentified")),
    ("label_deanonymization", "(b) label re-identification (top-5)", _mc("reidentified_top5")),
    ("embedding_identification", "(c) class-embedding identification top-1", _mc("top1")),
    ("embedding_identification", "(c) class-embedding identification top-5", _mc("top5")),
    ("membership_inference", "(d) MI LOSS AUC [95% CI]", lambda e: (_auc(e, "loss"), "0.5")),
    ("membership_inference", "(d) MI LiRA online AUC [95% CI]", lambda e: (_auc(e, "lira_online"), "0.5")),
    ("membership_inference", "(d) MI LiRA online TPR @ 1% FPR", _lira("lira_online", "tpr_at_1pct_fpr", 0.01)),
    ("membership_inference", "(d) MI LiRA online TPR @ 0.1% FPR", _lira("lira_online", "tpr_at_0.1pct_fpr", 0.001)),
    ("membership_inference", "(d) MI LiRA offline AUC [95% CI]", lambda e: (_auc(e, "lira_offline"), "0.5")),
    ("membership_inference", "(d) MI LiRA offline TPR @ 1% FPR", _lira("lira_offline", "tpr_at_1pct_fpr", 0.01)),
    ("membership_inference", "(d) MI LiRA offline TPR @ 0.1% FPR", _lira("lira_offline", "tpr_at_0.1pct_fpr", 0.001)),
    ("one_run_audit", "(e) one-run audit: ε lower bound (95%)", _mc("epsilon_lower_bound")),
    ("one_run_audit", "(e) accountant ε (client unit)", lambda e: (_num(e["metrics"]["accountant_epsilon"]), None)),
    ("update_inversion", "(f) inversion F1, individual updates", lambda e: (_sub(e, "individual"), e["chance"]["f1"])),
    ("update_inversion", "(f) inversion F1, from the aggregate", lambda e: (_sub(e, "aggregate"), e["chance"]["f1"])),
]


def _sub(e, part):
    return e["metrics"].get(part, {}).get("f1")


def _num(x):
    return math.inf if x == "inf" else x


def _auc(e, k):
    m = e["metrics"].get(k)
    if not m:
        return None
    return f"{m['auc']:.3f} [{m['auc_ci95'][0]:.3f}, {m['auc_ci95'][1]:.3f}]"


def table(results: dict[str, Any]) -> str:
    stacks = list(results)
    head = "| attack | " + " | ".join(stacks) + " | chance |\n|---|" + "---|" * (len(stacks) + 1) + "\n"
    lines = []
    for attack, label, get in ROWS:
        cells, chance = [], None
        for s in stacks:
            e = results[s]["attacks"].get(attack)
            if e is None:
                cells.append("n/a")
                continue
            if "skipped" in e:
                cells.append("skipped")
                continue
            v, c = get(e)
            chance = c if c is not None else chance
            cells.append(_fmt(v))
        if all(c in ("n/a", "skipped", "—") for c in cells):
            continue
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_fmt(chance, 4) if chance is not None else ''} |")
    priv = "| accountant (ε client / ε instance) | " + " | ".join(_eps(results[s]["privacy"]) for s in stacks) + " | |\n"
    return head + priv + "\n".join(lines) + "\n"


def _eps(p: dict[str, Any]) -> str:
    units = p.get("units") or {}
    if not units:
        return "∞ / ∞"
    get = lambda u: _fmt(_num(units[u]["epsilon"]), 2) if u in units else "∞"  # noqa: E731
    return f"{get('client')} / {get('instance')}"


def plots(results: dict[str, Any], out: Path) -> None:
    from threat_models.plots import roc_plot, success_vs_epsilon

    curves = {}
    for s, doc in results.items():
        mi = doc["attacks"].get("membership_inference", {})
        c = (mi.get("curves") or {}).get("lira_online")
        if c:
            curves[f"{s} (AUC {mi['metrics']['lira_online']['auc']:.3f})"] = c
    if curves:
        roc_plot(curves, out / "roc.png", title="online LiRA on the released model")
    series: dict[str, list] = {
        "(c) embedding id. top-1": [],
        "(c) embedding id. top-5": [],
        "(d) LiRA online AUC": [],
        "(d) LiRA offline AUC": [],
        "(d) LOSS AUC": [],
    }
    chance: dict[str, float] = {}
    for s, doc in results.items():
        if not (s == "none" or s.startswith("dp_eps")):
            continue
        eps = _num((doc["privacy"].get("units") or {}).get("client", {}).get("epsilon", "inf"))
        a = doc["attacks"]
        if "metrics" in a.get("embedding_identification", {}):
            e = a["embedding_identification"]
            series["(c) embedding id. top-1"].append((eps, e["metrics"]["top1"]))
            series["(c) embedding id. top-5"].append((eps, e["metrics"]["top5"]))
            chance["(c) embedding id. top-1"], chance["(c) embedding id. top-5"] = e["chance"]["top1"], e["chance"]["top5"]
        mi = a.get("membership_inference", {}).get("metrics", {})
        for k, lab in (
            ("lira_online", "(d) LiRA online AUC"),
            ("lira_offline", "(d) LiRA offline AUC"),
            ("loss", "(d) LOSS AUC"),
        ):
            if k in mi:
                series[lab].append((eps, mi[k]["auc"]))
                chance[lab] = 0.5
    series = {k: v for k, v in series.items() if v}
    if series:
        success_vs_epsilon(series, out / "success_vs_epsilon.png", chance=chance)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--out", default="results/leakage_audit")
    ap.add_argument("--epsilons", default="1,4", help="client/instance target ε of the dp stacks")
    ap.add_argument("--shadows", type=int, default=16, help="LiRA shadow runs per training recipe (online and offline)")
    ap.add_argument("--canaries", type=int, default=1000, help="one-run audit canaries per run")
    ap.add_argument("--crypto-rounds", type=int, default=1, help="final rounds run under secure_aggregation / ckks")
    ap.add_argument("--stacks", default=None, help="comma-separated subset of the stacks")
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA"))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    args.crypto_rounds = max(1, min(args.crypto_rounds, args.rounds))
    eps = [float(e) for e in args.epsilons.split(",") if e]
    stacks = ["none", "keyed_hashing", *[f"dp_eps{e:g}" for e in eps], "secure_aggregation", "ckks", "oracle"]
    if args.stacks:
        keep = args.stacks.split(",")
        stacks = [s for s in stacks if s in keep]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    if not args.report_only:
        # the shared base run first (none / secure_aggregation / ckks branch from it), then the rest in parallel
        first = [s for s in stacks if s == "none"]
        rest = [s for s in stacks if s != "none"]
        threads = max(1, (os.cpu_count() or 1) // args.workers)
        for s in first:
            results[s] = run_stack(s, args, os.cpu_count() or 1)
            print(f"{s}: done", flush=True)
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            futs = {s: pool.submit(run_stack, s, args, threads) for s in rest}
            for s, f in futs.items():
                results[s] = f.result()
                print(f"{s}: done", flush=True)
    else:
        for s in stacks:
            f = attacks_path(out / "runs" / s)
            if f.is_file():
                results[s] = json.loads(f.read_text())
    results = {s: results[s] for s in stacks if s in results}
    slim = {s: {"protocols": d["protocols"], "privacy": d["privacy"],
                "attacks": {a: {k: v for k, v in e.items() if k != "curves"} for a, e in d["attacks"].items()}}
            for s, d in results.items()}  # fmt: skip
    (out / "results.json").write_text(json.dumps(slim, indent=1))
    md = table(results)
    (out / "table.md").write_text(md)
    plots(results, out)
    print(md)
    if (out / "runs" / "_base").exists() and not args.report_only:
        shutil.rmtree(out / "runs" / "_base" / "shadows", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

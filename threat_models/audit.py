"""The audit harness: run attacks on a finished run and write ``private/attacks.json`` and plots.

Everything an audit writes is computed from the members (their scores and MIA curves, the training-set size), so
it goes to the run's operator-only ``private/`` directory, never beside the released files.

For each attack: ``prepare`` (simulator: auxiliary knowledge and ground truth)
→ ``run`` (attacker: its role's view and the auxiliary knowledge only) →
``score`` (against the truth, beside the chance level).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from secure_fed.progress import track
from secure_fed.run_files import ATTACKS_RECORD, attacks_path
from threat_models import ATTACKS
from threat_models.context import AuditContext
from threat_models.plots import ROC_LABELS, plot_run


def _ci(ci) -> str:
    """`` [lo, hi]`` of a 95% interval, or nothing (a result written before intervals were reported)."""
    return "" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else "-inf"
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return _jsonable(x.item())
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    return x


def audit(
    ctx: AuditContext, names: list[str] | None = None, *, out_dir: str | Path | None = None, progress: bool = True
) -> dict[str, Any]:
    """Run ``names`` (default: the config's ``attacks.run``) on ``ctx``; write ``attacks.json`` and ``roc.png`` in
    ``out_dir`` (default: the run's operator-only ``private/``)."""
    names = names or ctx.cfg.attacks.names() or list(ATTACKS)
    out_dir = Path(out_dir) if out_dir is not None else attacks_path(ctx.exp.run_dir).parent
    results: dict[str, Any] = {}
    for name in track(names, "audit: attacks"):  # a line at least every 10 s while a long attack runs
        cls = ATTACKS[name]
        attack = cls(getattr(ctx.cfg.attacks, name, None))
        t0 = time.perf_counter()
        why = attack.applies(ctx)
        if why is not None:
            results[name] = {"role": cls.role.value, "skipped": why}
            if progress:
                print(f"  {name}: skipped ({why})")
            continue
        aux, truth = attack.prepare(ctx)
        guess = attack.run(ctx.view_for(cls.role), aux)
        res = attack.score(guess, truth)
        entry = res.to_json()
        entry["seconds"] = time.perf_counter() - t0
        if res.curves:
            entry["curves"] = res.curves
        results[name] = _jsonable(entry)
        if progress:
            print(f"  {name}: {headline(name, results[name])}  ({entry['seconds']:.1f}s)")
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = out_dir / "attacks.json"
    if previous.is_file():  # keep earlier results of attacks not re-run now
        try:
            old = json.loads(previous.read_text()).get(ATTACKS_RECORD, {})
        except json.JSONDecodeError:
            old = {}
        results = {**{k: v for k, v in old.items() if k not in results}, **results}
    doc = {
        "run_dir": str(ctx.exp.run_dir),
        "protocols": list(ctx.cfg.protocols),
        "privacy": _jsonable(ctx.privacy()),
        ATTACKS_RECORD: results,
    }
    tmp = out_dir / "attacks.json.tmp"  # written whole, then renamed: a reader never sees half a file
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out_dir / "attacks.json")
    plot_run(results, out_dir)
    return doc


def audit_run_dir(
    run_dir: str | Path, names: list[str] | None = None, *, data_root: str | None = None, progress: bool = True,
    overrides: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """:func:`audit` of a finished run; ``overrides``: ``attacks.*`` settings for this audit (``audit --set``)."""
    ctx = AuditContext.from_run_dir(run_dir, data_root=data_root, attacks=names, overrides=overrides)
    return audit(ctx, names, progress=progress)


def skipped_attacks(doc: dict[str, Any], names: list[str] | None) -> dict[str, str]:
    """Of ``names``, the attacks an audit's ``doc`` (:func:`audit`'s result) skipped, each with why, in order."""
    attacks = doc.get(ATTACKS_RECORD, {})
    return {n: attacks[n]["skipped"] for n in names or [] if "skipped" in attacks.get(n, {})}


def headline(name: str, entry: dict[str, Any]) -> str:
    """One line per attack: its main metric against chance."""
    if "skipped" in entry:
        return f"skipped: {entry['skipped']}"
    m, c = entry["metrics"], entry["chance"]
    if name == "token_linkage":
        return f"linked {m['linked']:.3f} (chance {c['linked']:.1e}), precision {m['precision']:.3f}"
    if name == "label_deanonymization":
        return f"re-identified {m['reidentified']:.3f} (chance {c['reidentified']:.4f}), top-5 {m['reidentified_top5']:.3f}"
    if name == "embedding_identification":
        return f"top-1 {m['top1']:.3f}, top-5 {m['top5']:.3f} (chance {c['top1']:.4f} / {c['top5']:.4f})"
    if name == "membership_inference":
        parts = [
            f"{ROC_LABELS.get(k, k)} AUC {v['auc']:.3f} [{v['auc_ci95'][0]:.3f}, {v['auc_ci95'][1]:.3f}] "
            f"TPR@1%FPR {v['tpr_at_1pct_fpr']:.3f}{_ci(v.get('tpr_at_1pct_fpr_ci95'))}"
            for k, v in m.items()
        ]
        d = entry.get("details", {})
        if d.get("shadows"):
            on, off = d.get("fallback", {}).get("lira_online", {}), d.get("fallback", {}).get("lira_offline", {})
            parts.append(f"{d['shadows']} shadows (fallback: online {on.get('no_in_shadow', 0)} no-IN/"
                         f"{on.get('no_out_shadow', 0)} no-OUT, offline {off.get('no_out_shadow', 0)} no-OUT)")  # fmt: skip
        return "; ".join(parts)
    if name == "one_run_audit":
        return (
            f"ε lower bound {m['epsilon_lower_bound']:.3f} ≤ ε {m['replacement_epsilon']} at the audit's δ "
            f"(ledger ε {m['accountant_epsilon']}){' — vacuous: no outcome could give a bound > 0' if m.get('vacuous') else ''}"
        )
    if name == "update_inversion":
        ind = m.get("individual")
        s = f"individual F1 {ind['f1']:.3f}, " if ind else ""
        return s + f"aggregate F1 {m['aggregate']['f1']:.3f} (no-update guess {c['f1']:.3f})"
    return json.dumps(m)[:120]

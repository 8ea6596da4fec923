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

from secure_fed.plugin_api.attacks import ATTACKS_RECORD, attack_specs, attacks_path, track
from threat_models.attacks_section import attack_settings, attacks_of
from threat_models.context import AuditContext


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
    specs = attack_specs()  # read now, not when this module was imported: attacks registered since count
    section = attacks_of(ctx.plan)
    names = names or section.names() or list(specs)
    out_dir = Path(out_dir) if out_dir is not None else attacks_path(ctx.exp.run_dir).parent
    results: dict[str, Any] = {}
    for name in track(names, "audit: attacks"):  # a line at least every 10 s while a long attack runs
        cls = specs[name].load()
        attack = cls(attack_settings(section, name))
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
        "protocols": list(ctx.plan.protocols),
        "privacy": _jsonable(ctx.privacy()),
        ATTACKS_RECORD: results,
    }
    tmp = out_dir / "attacks.json.tmp"  # written whole, then renamed: a reader never sees half a file
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out_dir / "attacks.json")
    plot_run(results, out_dir)
    return doc


def plot_run(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """The plots of one audited run: each attack's own (its spec's ``plot``; e.g. ``roc.png``), for those that ran."""
    specs = attack_specs()
    paths: list[Path] = []
    for name, entry in results.items():
        spec = specs.get(name)
        if spec is not None and spec.plot is not None and "skipped" not in entry:
            paths += spec.plot(entry, out_dir)
    return paths


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
    """One line per attack: its main metric against chance (its spec's ``headline``; else its metrics as JSON)."""
    if "skipped" in entry:
        return f"skipped: {entry['skipped']}"
    spec = attack_specs().get(name)
    if spec is not None and spec.headline is not None:
        return spec.headline(entry)
    return json.dumps(entry["metrics"])[:120]

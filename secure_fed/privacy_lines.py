"""The console's privacy lines: what ``summary.json``'s released privacy record says, one line for the released
model and one per DP unit (ε with δ, the unit and what it covers, the adversaries it holds against and those it
does not, what is not covered). Torch-free; reads only the record."""

from __future__ import annotations

from typing import Any

from secure_fed.release import findings_in


def fmt_epsilon(eps: Any) -> str:
    """``7.077``, ``∞`` (the record writes ε = ∞ as the string ``"inf"``)."""
    if isinstance(eps, (int, float)) and eps != float("inf"):
        return f"{eps:.4g}"
    return "∞"


def _adversary(name: str, adv: dict[str, Any], unit_eps: Any) -> tuple[bool, str]:
    """(whether the unit's ε holds against this adversary, its text)."""
    eps = adv.get("epsilon")
    why = adv.get("why", "")
    if fmt_epsilon(eps) != "∞" and eps == unit_eps:
        return True, f"the {name} ({why})"
    return False, f"the {name} (ε = {fmt_epsilon(eps)}: {why})"


def unit_line(name: str, u: dict[str, Any]) -> str:
    """One DP unit: ``privacy per client unit: ε = 7.077, δ = 1e-05 (rdp, 2 of 2 steps) over ...; holds against ...;
    not against ...; not covered: ...``."""
    eps = u.get("epsilon")
    text = f"  privacy per {name} unit: ε = {fmt_epsilon(eps)}, δ = {u.get('delta'):g}"
    steps = f", {u['steps']} of {u['planned_steps']} steps" if "steps" in u and "planned_steps" in u else ""
    text += f" ({u.get('accountant', 'accountant?')}{steps})"
    if u.get("scope"):
        text += f" over {u['scope']}"
    holds, against = [], []
    for adv_name, adv in (u.get("adversaries") or {}).items():
        ok, t = _adversary(adv_name, adv, eps)
        (holds if ok else against).append(t)
    text += "; holds against " + (" and ".join(holds) if holds else "no adversary the record names")
    if against:
        text += "; not against " + " and ".join(against)
    if (inst := u.get("instance_level")) is not None:
        text += (f"; per training instance (on up to {inst['group_size']} clients), by the group bound: "
                 f"ε = {fmt_epsilon(inst['epsilon'])}, δ = {inst['delta']:.3g}")  # fmt: skip
    covered = u.get("not_covered") or []
    text += "; not covered: " + ("; ".join(covered) if covered else "nothing listed")
    return text


#: short names of the steps a released tensor is shaped by without DP (the DP layer's ``unnoised`` list)
_STEPS = {"label_set_collection": "W's label-set step", "client_training": "client training"}


def infinity_line(record: dict[str, Any], config: str = "its config.yaml") -> str:
    """The released model's ε = ∞ in one short sentence: which released tensors, which steps carry no noise, each
    unit's ε for what it covers, and where the details are (``secure-fed validate`` on the run's config)."""
    units = record.get("units") or {}
    unnoised = next((u["unnoised"] for u in units.values() if u.get("unnoised")), [])
    released = " and ".join(dict.fromkeys("θ" if t == "theta" else t for x in unnoised for t in x["released"])) or "model"
    steps = " and ".join(_STEPS.get(x["step"], x["step"].replace("_", " ")) for x in unnoised) or "a released step"
    eps = ", ".join(f"{name} unit ε = {fmt_epsilon(u.get('epsilon'))}" for name, u in units.items())
    return (f"  privacy: ε = ∞ for the released {released}: {steps} {'has' if len(unnoised) < 2 else 'have'} no DP "
            f"noise ({eps} covers only part); details: secure-fed validate {config}")  # fmt: skip


def noiseless_mechanisms(record: dict[str, Any]) -> list[str]:
    """The mechanisms a privacy record lists with noise multiplier 0 (the noiseless control), in its order."""
    out = []
    for unit, u in (record.get("units") or {}).items():
        mechs = u.get("mechanisms") or {}
        out += [name for name, m in mechs.items() if m.get("noise_multiplier") == 0]
        if not mechs and u.get("noise_multiplier") == 0:  # a unit with one mechanism: its numbers are the unit's
            out.append(f"the {unit} unit")
    return list(dict.fromkeys(out))


def privacy_lines(record: dict[str, Any], config: str = "its config.yaml") -> list[str]:
    """The released privacy record (``summary.json``'s ``privacy``) as console lines: the released model's ε with δ
    and unit, then one line per DP unit; or, when the released model's ε is ∞, one short sentence (why, per unit,
    is what ``secure-fed validate`` on ``config`` prints); and a line for each release finding (a released field
    without a tag: :mod:`secure_fed.release`), as the record's ``why`` gives it."""
    units = record.get("units") or {}
    eps = record.get("epsilon")
    findings = [f"  privacy: {x}" for x in findings_in(record)]
    if not units:
        why = record.get("note") or record.get("why") or "no differential privacy mechanism in this run"
        return [f"  privacy: ε = ∞: {why}; nothing bounds what the released model and metrics reveal about the training data",
                *findings]  # fmt: skip
    unnoised = any(u.get("unnoised") for u in units.values())
    if fmt_epsilon(eps) == "∞" and not unnoised and (noiseless := noiseless_mechanisms(record)):
        return [f"  privacy: ε = ∞: the noiseless control (noise_multiplier 0 for {', '.join(noiseless)}): the units clip, "
                "bound and sample as under DP but draw no noise, so nothing bounds what the released model reveals",
                *findings]  # fmt: skip
    if fmt_epsilon(eps) == "∞":
        return [*([infinity_line(record, config)] if unnoised or not findings else []), *findings]
    head = f"  privacy: ε = {fmt_epsilon(eps)}, δ = {record.get('delta'):g} per {record.get('unit')} for the released model"
    return [head, *(unit_line(n, u) for n, u in units.items())]

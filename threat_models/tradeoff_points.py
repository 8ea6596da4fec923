"""The trade-off study's grid points: parsing ``--epsilons``, the overrides that make one (method, ε, seed) run out of
the base config (the central reference's, a method's own base), and the job a worker process runs for one point.

Shared by ``secure-fed tradeoff`` (:mod:`threat_models.tradeoff`) and its private selection
(:mod:`threat_models.private_selection`), which trains each point's candidates with the same job.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from protocols.config_sections import PrivacyConfig
from secure_fed.plugin_api.attacks import ATTACKS_RECORD, SecureFedError, attacks_path, trained

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan

INSTANCE_BLOCKS = ("instance", "local")


def parse_epsilons(text: str) -> list[float]:
    out = []
    for part in [p for p in text.split(",") if p.strip()]:
        try:
            v = float(part)
        except ValueError:
            raise SecureFedError(f"--epsilons {text!r}: {part!r} is not a number or inf") from None
        if not (v > 0):
            raise SecureFedError(f"--epsilons {text!r}: every ε must be > 0 (inf for no DP)")
        out.append(v)
    if not out:
        raise SecureFedError(f"--epsilons {text!r}: give at least one ε")
    return out


#: what the ε = ∞ point of a study runs (``--infinity``)
INFINITY_POINTS = {
    "no-dp": "the run without the dp layer (no clip, no bound, no noise)",
    "noiseless": "the same dp layer with noise_multiplier 0 (the noiseless control: the same clip, bound and sampling)",
}


def point_overrides(base: RunPlan, *, method: str, eps: float, seed: int, unit: str, attacks: list[str],
                    infinity: str = "no-dp") -> list[str]:  # fmt: skip
    """The overrides that turn the base config (``base``: its plan, as :func:`method_base` reads it) into one grid
    point. ``infinity`` (:data:`INFINITY_POINTS`) says what the ε = ∞ point runs."""
    if infinity not in INFINITY_POINTS:
        raise SecureFedError(f"--infinity {infinity!r}: choose one of {', '.join(INFINITY_POINTS)}")
    from protocols.layer_specs import LABEL_SET_ALGORITHMS

    ov = [f"algorithm.name={method}", f"seed={seed}", "output.progress=false", *central_reference(method)]
    if attacks:
        ov.append(f"attacks.run=[{', '.join(attacks)}]")
    p = base.part(PrivacyConfig)
    stack = list(base.protocols)
    plugin = statistic_mechanism(method)
    if plugin is not None:  # a method that only reads a released statistic: ε goes to that statistic's mechanism
        # its rows encode the statistic, not learned classes: the base's row post-processing does not apply
        nulls = ["privacy.instance=null", "privacy.local=null", "privacy.client=null", "evaluation.remove_shared_direction=false"]
        if math.isinf(eps):
            return [*ov, *nulls, f"protocols=[{', '.join(x for x in stack if x != 'dp')}]", f"privacy.{plugin}=null"]
        m = getattr(p, plugin).max_labels_per_instance  # the base plan's (method_base: the config's contribution bound)
        return [*ov, *nulls, f"privacy.{plugin}={{target_epsilon: {eps:g}, max_labels_per_instance: {m}}}"]
    if math.isinf(eps) and infinity == "no-dp":
        ov.append(f"protocols=[{', '.join(x for x in stack if x != 'dp')}]")
        ov += ["privacy.instance=null", "privacy.local=null", "privacy.client=null"]
        return ov
    if "dp" not in stack:
        raise SecureFedError("the tradeoff config must list 'dp' in protocols and configure the privacy unit it sweeps")
    blocks = [b for b in (INSTANCE_BLOCKS if unit == "instance" else ("client",)) if getattr(p, b) is not None]
    if method not in LABEL_SET_ALGORITHMS:  # its config may not set privacy.instance at all (the base is read without it)
        blocks = [b for b in blocks if b != "instance"]
        ov.append("privacy.instance=null")
    if not blocks:
        raise SecureFedError(
            f"--unit {unit}: the config sets none of "
            + ("privacy.instance / privacy.local" if unit == "instance" else "privacy.client")
            + f" for {method}"
        )
    # every block gets the target; the sweep calibrates the σ of the blocks the config leaves free, and a block that
    # gives its σ keeps it (e.g. a heavily noised W step beside calibrated DP-SGD), unless every block gives one; at
    # ε = ∞ (noiseless) every block keeps its clip, bound and sampling and draws no noise
    free = [b for b in blocks if getattr(p, b).noise_multiplier is None] or blocks
    for b in blocks:
        if math.isinf(eps):
            ov += [f"privacy.{b}.target_epsilon=null", f"privacy.{b}.noise_multiplier=0"]
            continue
        ov.append(f"privacy.{b}.target_epsilon={eps:g}")
        if b in free:
            ov.append(f"privacy.{b}.noise_multiplier=null")
    if unit == "instance" and p.client is not None:
        ov.append("privacy.client=null")  # one unit swept at a time
    if unit == "client":
        ov += ["privacy.instance=null", "privacy.local=null"]
    return ov


def statistic_mechanism(method: str) -> str | None:
    """The DP mechanism plugin (``privacy.<name>``) that releases the statistic a statistics-only method reads (an
    algorithm whose clients never train and whose setup asks for a statistic, such as ``label_prior``), else None."""
    from protocols.dp.mechanism_plugins import mechanism_specs
    from secure_fed.plugin_api.attacks import algorithm_specs

    spec = algorithm_specs().get(method)
    caps = None if spec is None else spec.capabilities
    if caps is None or caps.client_training or not caps.setup_statistics:
        return None
    found = [m.name for m in mechanism_specs().values() if m.statistic in caps.setup_statistics]
    if not found:
        raise SecureFedError(f"--methods {method}: no DP mechanism plugin releases its statistic {caps.setup_statistics}")
    return found[0]


def statistic_methods() -> list[str]:
    """The registered algorithms that only read a released statistic (:func:`statistic_mechanism` names its
    mechanism), in registry order: the "label prior only" baselines of a study."""
    from secure_fed.plugin_api.attacks import algorithm_specs

    out = []
    for name in algorithm_specs():
        try:
            if statistic_mechanism(name) is not None:
                out.append(name)
        except SecureFedError:  # a statistic no mechanism plugin releases: not a DP baseline
            continue
    return out


def statistic_base(plugin: str, privacy: dict) -> list[str]:
    """A statistics-only method's base overrides: no training unit; its statistic's mechanism ``privacy.<plugin>``
    with the config's contribution bound m (the run's one ``max_labels_per_instance``, whichever privacy section
    gives it, as :meth:`~protocols.config_sections.PrivacyConfig.max_labels_per_instance` reads it; else 1) and the
    config's target ε (of privacy.local, else privacy.instance; each point overrides it)."""
    blocks = [b for b in (privacy.get("local"), privacy.get("instance")) if isinstance(b, dict)]
    given = {
        int(b["max_labels_per_instance"]) for b in privacy.values() if isinstance(b, dict) and b.get("max_labels_per_instance")
    }
    m = max(given) if given else 1  # sections that differ make the config itself invalid
    eps = next((float(b["target_epsilon"]) for b in blocks if b.get("target_epsilon")), 1.0)
    return ["privacy.instance=null", "privacy.local=null", "privacy.client=null",
            f"privacy.{plugin}={{target_epsilon: {eps:g}, max_labels_per_instance: {m}}}"]  # fmt: skip


def central_reference(method: str) -> list[str]:
    """A centralised method (the oracle) reports its last epoch at every ε of a study: under dp, an epoch selected on a
    split of the training data would be a choice outside ε, and the ε = ∞ point (the run without the dp layer) reports
    its last epoch too."""
    from secure_fed.plugin_api.attacks import algorithm_specs

    spec = algorithm_specs().get(method)
    central = spec is not None and spec.capabilities.centralised and "validation_fraction" in spec.params.model_fields
    return ["algorithm.validation_fraction=0"] if central else []


def central_reference_method(config: str | None, overrides: list[str], methods: list[str], *, unit: str) -> tuple[list[str], str]:
    """``--reference auto``: the central DP reference (the centralised algorithm that takes DP-SGD on its one trainer,
    ``oracle``: the same network and levers at the same ε and accountant) beside positive-only federated methods swept
    at the instance unit, so a reader sees the price of federation apart from the price of privacy. Returns the
    methods to add and a line saying why."""
    from secure_fed.plugin_api.attacks import algorithm_specs

    refs = [name for name, spec in algorithm_specs().items() if spec.capabilities.centralised
            and "local" in spec.capabilities.dp_units and spec.capabilities.setting != "general"]  # fmt: skip
    if not refs:
        return [], "no central DP reference: no registered centralised algorithm takes DP-SGD"
    ref = refs[0]
    if ref in methods:
        return [], f"the central DP reference ({ref}) is among the methods"
    if unit != "instance":
        return [], "no central DP reference: it is drawn for the instance unit"
    try:
        base = method_base(config, overrides, ref)
    except SecureFedError as exc:
        return [], f"no central DP reference: the config does not run as {ref} ({exc})"
    if base.partition.name != "positive_only":
        return [], f"no central DP reference: it is drawn for the positive-only setting ({ref}'s)"
    if base.part(PrivacyConfig).local is None:
        return [], "no central DP reference: it needs privacy.local (DP-SGD on its one trainer)"
    return [ref], f"the central DP reference ({ref}, DP-SGD on one trainer) is drawn beside them (--reference none: not)"


def method_base(config: str | None, overrides: list[str], method: str) -> RunPlan:
    """The plan of the base config read as ``method``'s: a method without a server step over label sets is read without
    ``privacy.instance``, which its config may not set (a config written for fedalc, swept with fedaws as well)."""
    from protocols.layer_specs import LABEL_SET_ALGORITHMS
    from secure_fed.config import load_plan, raw_config
    from secure_fed.plugin_api.attacks import ConfigError

    plugin = statistic_mechanism(method)
    drop = [] if method in LABEL_SET_ALGORITHMS else ["privacy.instance=null"]
    if plugin is not None:  # it reads one released statistic: no training unit applies, the statistic's mechanism does
        try:
            drop = statistic_base(plugin, raw_config(config, overrides).get("privacy") or {})
            drop.append("evaluation.remove_shared_direction=false")  # its rows encode the statistic, not learned classes
        except ConfigError as exc:
            raise SecureFedError(f"--methods {method}: {exc}") from None
    elif drop:  # the instance unit's one budget may sit on privacy.instance: it moves to privacy.local with the drop
        try:
            privacy = raw_config(config, overrides).get("privacy") or {}
        except ConfigError as exc:
            raise SecureFedError(f"--methods {method}: {exc}") from None
        inst, loc = privacy.get("instance"), privacy.get("local")
        if isinstance(inst, dict) and inst.get("target_epsilon") is not None and isinstance(loc, dict) \
                and loc.get("noise_multiplier") is None and loc.get("target_epsilon") is None:  # fmt: skip
            drop.append(f"privacy.local.target_epsilon={inst['target_epsilon']}")
    try:
        return load_plan(config, [*overrides, f"algorithm.name={method}", *drop, *central_reference(method)])
    except ConfigError as exc:
        raise SecureFedError(f"--methods {method}: {exc}") from None


def _label(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


def _audited(run_dir: Path, attacks: list[str]) -> bool:
    """The run's private/attacks.json already holds every requested attack."""
    import json

    path = attacks_path(run_dir)
    try:
        return path.is_file() and set(attacks) <= set(json.loads(path.read_text()).get(ATTACKS_RECORD, {}))
    except json.JSONDecodeError:
        return False


@contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """The study's process pool, as a context. Its workers start from a fork server, not by forking this process: a
    fork of a process whose torch (OpenMP) thread pool already ran can die in the child when that child sets its own
    thread count, and a worker's run must not depend on what its parent did before. A worker that dies (the system
    kills it, most often for lack of memory) ends the study with one ``error:`` line, not a traceback; the runs that
    finished are on disk, and rerunning the command resumes from them."""
    import multiprocessing
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
        try:
            yield pool
        except BrokenProcessPool:
            raise SecureFedError(
                f"a worker process of the study died (killed by the system, most often for lack of memory, with "
                f"{workers} worker(s) running at once); the finished runs are kept and rerunning the command resumes "
                "from them: give fewer --workers"
            ) from None


def _job(config: str | None, overrides: list[str], run_dir: str, data_root: str | None, attacks: list[str], threads: int):
    """One grid point in a worker process: the run (cached / resumed), then its attacks (once)."""
    import torch

    torch.set_num_threads(threads)
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import run_cached

    t0 = time.time()
    summary = run_cached(load_plan(config, overrides), run_dir, data_root=data_root)
    if attacks and trained(summary["status"]) and not _audited(Path(run_dir), attacks):
        from threat_models.audit import audit_run_dir

        audit_run_dir(run_dir, attacks, data_root=data_root, progress=False)
    return summary, time.time() - t0

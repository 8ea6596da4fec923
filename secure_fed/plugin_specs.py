"""What a plugin tells the core before anything heavy is imported: layer and attack specs.

A spec is metadata plus a ``"module:attr"`` path to the implementation. ``secure-fed list`` prints
specs, ``secure-fed validate`` checks a config against them, and only a run imports the
implementations (:func:`secure_fed.plugins.load_object`). Specs arrive through the
``secure_fed.layers`` and ``secure_fed.attacks`` entry-point groups (:mod:`secure_fed.plugins`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from secure_fed.errors import unknown_name
from secure_fed.messages import Rule
from secure_fed.plugins import load_object, registry
from secure_fed.update_forms import deferred_refusal

if TYPE_CHECKING:
    from secure_fed.plan import RunPlan


@dataclass(frozen=True)
class LayerSpec:
    """A protocol layer, as the core sees it before a run.

    Attributes:
        name: the name listed under ``protocols:``.
        threat_model: what it protects, against whom, in one sentence (``secure-fed list``).
        implementation: ``"module:Class"`` of the :class:`~secure_fed.engine.layers.ProtocolLayer`.
        replaces_aggregation: it replaces how the server sums wire messages (at most one per stack).
        validate: ``validate(plan, stack)`` raises ``ValueError`` with the reason when the plan cannot
            run; called for every registered layer, listed or not (a layer may reject its own section
            being set while it is not listed).
        runs_on_flower: ``backend: flower`` carries it (see the field's comment).
        downlink_rules, uplink_rules: the message keys the layer adds, each with its rule
            (:mod:`secure_fed.messages`); the guard allows exactly the algorithm's and the listed layers' keys.
    """

    name: str
    threat_model: str
    implementation: str
    replaces_aggregation: bool = False
    validate: Callable[[Any, list[str]], None] | None = None
    #: the Flower back end carries it: its client side is a registered plan (``RoundSession.client_plan``), it has
    #: no layer-level ``client_mod`` and no setup exchange beyond registered client functions; ``validate`` refuses
    #: the settings of it that Flower does not carry (``plan.backend == "flower"``)
    runs_on_flower: bool = False
    #: ``row_sparse_updates(plan)``: the layer's client and server sides take a client update whose sparse-input
    #: table travels as the columns it touched (:class:`~secure_fed.models.sparse_rows.RowSparseDelta`), in a run
    #: with ``plan``; False for layers that sum, mask, encrypt, clip or noise whole updates (the column set reveals a
    #: client's features). A layer that takes them passes plaintext θ updates to the plain sum untouched, so it also
    #: takes the vectorised executor's deferred updates (``training.deferred_updates``,
    #: :class:`~secure_fed.models.group_updates.DeferredDelta`)
    row_sparse_updates: Callable[[Any], bool] | None = None
    #: the message keys the layer adds (its setup exchanges, its additions to updates), with their rules
    downlink_rules: dict[str, Rule] = field(default_factory=dict)
    uplink_rules: dict[str, Rule] = field(default_factory=dict)
    #: ``describe(plan, num_clients)``: lines ``secure-fed validate`` prints for the layer when it is listed (e.g. the
    #: guarantee its settings give a cohort of the configured size); public config facts only
    describe: Callable[[Any, int], list[str]] | None = None
    #: ``instance_bound(plan)``: the public contribution bound the layer's settings give a run with ``plan``, as
    #: ``(m, rule)``, or None. Where one training instance sits on several clients (the positive_only partition: one
    #: client per label) the engine bounds every instance to at most m clients before the partition
    #: (:mod:`secure_fed.data.bounding`; ``rule``: ``keep_hashed`` or ``drop``), and tells the layers m as
    #: ``StackEnv.max_clients_per_instance``
    instance_bound: Callable[[Any], tuple[int, str] | None] | None = None
    #: ``public_preprocessing(plan)``: the layer's guarantee covers θ only if the input preprocessing reads no
    #: statistic of the private training data (standardisation's per-feature mean and std are computed over the whole
    #: training split in the clear): ``model.preprocessing: auto`` then picks ``none`` for dense features instead of
    #: ``standardize``, and the layer's ``validate`` refuses an explicit ``standardize``
    public_preprocessing: Callable[[Any], bool] | None = None
    #: ``target_epsilons(config)``: for a layer that accounts privacy, the target ε of each privacy unit its settings
    #: set (``{}`` when none), read from a run's ``config.yaml`` as plain data; a report reads it for a run whose
    #: ledger has not released its targets yet (a run in progress). None: the layer accounts no privacy
    target_epsilons: Callable[[dict[str, Any]], dict[str, float]] | None = None
    #: ``settings(plan)``: the layer's own typed settings, extracted from the run's plan in this one place (its
    #: section, and the few public facts of other sections it needs); the layer is built as ``Layer(settings,
    #: env)`` and never sees the whole plan. None: the layer takes no settings (``None``)
    settings: Callable[[Any], Any] | None = None
    #: ``memory(plan, shape, params, device)``: the bytes the layer adds to the run's memory estimate
    #: (:mod:`secure_fed.memory`) when listed, for data of ``shape`` (a :class:`secure_fed.memory.DataShape`) and a θ
    #: of ``params`` parameters on ``device``: terms of one phase each, by name (a phase already counted, e.g.
    #: ``round``, grows by it); None: nothing worth counting
    memory: Callable[[Any, Any, int, str], dict[str, float]] | None = None
    #: the config sections (as key paths, e.g. ``("privacy",)``) a resumed run may not change, because they give
    #: the checkpoint its meaning (the layer's keys, its privacy ledger's units); frozen whether or not a run lists
    #: the layer (:func:`secure_fed.engine.checkpoints.frozen_on_resume` adds them to the core's own)
    frozen_on_resume: tuple[tuple[str, ...], ...] = ()
    #: inside those, the keys that may still change on resume (e.g. what is reported: ``("privacy", "report_gdp")``)
    movable_on_resume: tuple[tuple[str, ...], ...] = ()

    def load(self) -> type:
        return load_object(self.implementation)

    def layer_settings(self, plan: RunPlan) -> Any:
        """What the layer is built with from ``plan`` (:attr:`settings`)."""
        return None if self.settings is None else self.settings(plan)


@dataclass(frozen=True)
class AttackSpec:
    """An attack or audit, for ``secure-fed list``, for validating ``attacks.run`` and its own ``attacks.<name>:``
    section, and for what an audit asks of it (what it records during training, its headline, plots and cost): the
    one place the rest of the code learns about an attack."""

    name: str
    role: str
    description: str
    needs: str
    defended_by: str
    implementation: str
    extra: dict[str, Any] = field(default_factory=dict)
    #: the scores the attack reports: each key its result's ``metrics`` holds → the name ``description`` gives it
    #: (``secure-fed list`` prints the description; a test holds the two to what the attack reports)
    scores: dict[str, str] = field(default_factory=dict)
    #: ``memory(shape, plan)``: the bytes the attack allocates at its peak for data of ``shape`` (a
    #: :class:`secure_fed.memory.DataShape`), so that a run too large for it is refused before it starts (None: small)
    memory: Any = None
    #: the pydantic model of the attack's own settings, the YAML section ``attacks.<name>:`` (light: pydantic and the
    #: standard library); the attack is built with the validated section. None: the attack takes no settings
    settings: type | None = None
    #: ``records(settings, plan, exp)``: what the attack must see or insert during training when ``attacks.run`` lists
    #: it (a :class:`threat_models.recorder.Recorder`: whole uplinks, canaries), or None for nothing beyond the server's
    #: recorded view; called when the run starts. None: it needs nothing recorded
    records: Callable[[Any, Any, Any], Any] | None = None
    #: ``headline(entry)``: the one line an audit prints for the attack's result (``entry``: its ``attacks.json``
    #: record, with ``metrics``, ``chance`` and ``details``; never a skipped one). None: the metrics as JSON
    headline: Callable[[dict[str, Any]], str] | None = None
    #: the names plots and verdicts give the attack's scores, by the key its result's ``metrics`` holds (default: the key)
    score_labels: dict[str, str] = field(default_factory=dict)
    #: ``plot(entry, out_dir)``: the plots of one result (paths written in ``out_dir``), or None for none
    plot: Callable[[dict[str, Any], Any], list] | None = None
    #: ``cost(settings, plan, run_dir)``: what the attack trains beyond scoring, as ``(words, training rounds, hint)``
    #: for the time estimate an audit prints first (``hint``: how to make it cheaper, or ""); None: scoring only
    cost: Callable[[Any, Any, Any], tuple[str, int, str]] | None = None

    def load(self) -> type:
        return load_object(self.implementation)


def layer_specs() -> dict[str, LayerSpec]:
    """The registered protocol layers' specs, by name (the ``secure_fed.layers`` entry points)."""
    return registry("layers")


def attack_specs() -> dict[str, AttackSpec]:
    """The registered attacks' specs, by name (the ``secure_fed.attacks`` entry points), in registry order."""
    return registry("attacks")


def validate_stack(plan: RunPlan) -> None:
    """Raise ``ValueError`` (shown as a one-line config error) for an invalid ``protocols:`` list of ``plan``
    (:func:`secure_fed.config.build_plan` calls it as the config validates, with the plan of the config).

    The rules every stack obeys live here; each layer's own rules are its spec's ``validate``.
    """
    specs = layer_specs()
    stack = list(plan.protocols)
    for name in stack:
        if name not in specs:
            raise ValueError(unknown_name("protocol layer", name, specs))
    dup = {n for n in stack if stack.count(n) > 1}
    if dup:
        raise ValueError(f"protocol layer(s) {sorted(dup)} listed twice")
    caps = plan.algorithm.capabilities
    if stack and caps.centralised and not (stack == ["dp"] and caps.dp_units):
        raise ValueError(
            f"{plan.algorithm.name} is the centralised upper bound with one trainer: no protocol layer applies"
            + (" but dp (the central DP reference: privacy.local)" if caps.dp_units else "")
        )
    if stack and caps.shares_nothing:
        raise ValueError(
            f"{plan.algorithm.name}: each client trains alone and sends nothing, so protocol layers have nothing to protect"
        )
    if plan.backend == "flower" and (off := [n for n in stack if not specs[n].runs_on_flower]):
        raise ValueError(
            f"backend=flower: protocols {off} do not run on Flower yet (their client-side state and multi-stage "
            "exchanges are not carried as Flower messages); use backend: inprocess"
        )
    summing = [n for n in stack if specs[n].replaces_aggregation]
    if len(summing) > 1:
        raise ValueError(f"{' and '.join(summing)} both replace how the server sums updates; choose one")
    if plan.training.sparse_updates is True and (dense := dense_update_layers(plan)):
        raise ValueError(
            f"training.sparse_updates=true: protocols {dense} take only dense client updates (the touched columns "
            "would reveal a client's features to the server, or the layer clips or noises whole updates); set "
            "training.sparse_updates: auto"
        )
    if plan.training.deferred_updates is True and (why := deferred_refusal(plan, dense_layers=dense_update_layers(plan))):
        raise ValueError(why)
    for spec in specs.values():
        if spec.validate is not None:
            spec.validate(plan, stack)


def privacy_accounting_layers(plan: RunPlan) -> list[str]:
    """The listed protocol layers that account privacy (their spec gives ``target_epsilons``): a run with one spends a
    budget that a restart from round 0 would spend again."""
    specs = layer_specs()
    return [n for n in plan.protocols if n in specs and specs[n].target_epsilons is not None]


def dense_update_layers(plan: RunPlan) -> list[str]:
    """The listed protocol layers that take only dense client updates in a run with ``plan``."""
    specs = layer_specs()
    return [n for n in plan.protocols if n in specs and not (specs[n].row_sparse_updates and specs[n].row_sparse_updates(plan))]


def instance_bound(plan: RunPlan) -> tuple[int, str] | None:
    """The contribution bound ``(m, rule)`` the listed layers give (the least m when several do), or None."""
    specs = layer_specs()
    bounds = [b for n in plan.protocols if n in specs and specs[n].instance_bound and (b := specs[n].instance_bound(plan))]
    if not bounds:
        return None
    if len({rule for _, rule in bounds}) > 1:
        raise ValueError(f"protocol layers ask for different rules for instances above the bound: {sorted(set(bounds))}")
    return min(bounds)


def public_preprocessing(plan: RunPlan) -> bool:
    """A listed layer needs input preprocessing that reads no statistic of the private training data."""
    specs = layer_specs()
    return any(n in specs and specs[n].public_preprocessing and specs[n].public_preprocessing(plan) for n in plan.protocols)

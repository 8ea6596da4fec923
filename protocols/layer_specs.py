"""The protocol layers as the core sees them before a run: name, threat model, rules, implementation.

Registered through the ``secure_fed.layers`` entry points (``pyproject.toml``). Light on purpose: no
torch, no layer module is imported until a run builds its stack. Every callable of a spec receives the run's plan
(``plan: RunPlan``) and reads the layers' sections with ``plan.part(PrivacyConfig)`` (typed); each ``validate`` gives
the reason a plan cannot run, as one line.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from protocols.config_sections import ClientDPConfig, InstanceDPConfig, LocalDPConfig, PrivacyConfig, SecureAggregationConfig
from protocols.dp.mechanism_plugins import active_plugins, plugin_combination_error, plugin_sigma_source_error
from protocols.dp.share_rules import local_shares_error
from protocols.layer_settings import (
    ckks_settings,
    dp_settings,
    keyed_hashing_settings,
    secure_aggregation_encoding,
    secure_aggregation_settings,
)
from secure_fed.plugin_api.layers import (
    AlgorithmsWith,
    ByteList,
    FullTable,
    Indices,
    LayerSpec,
    Number,
    Opaque,
    Setting,
    ShortBytes,
    Vector,
    per_set_chunk_bytes,
)

if TYPE_CHECKING:
    from secure_fed.plugin_api.layers import DatasetPlan, DataShape, ModelPlan, RunPlan

#: algorithms that collect label sets at setup (their declared capabilities, read when asked)
LABEL_SET_ALGORITHMS = AlgorithmsWith("collects_label_sets")
#: algorithms whose clients report an aggregation weight computed from their own data (uplink ``weight``)
WEIGHT_REPORTING_ALGORITHMS = AlgorithmsWith("sends_weights")
SECURE_SUMS = ("secure_aggregation", "ckks")


#: secure aggregation's clip range must hold a clipped update plus this many standard deviations of a noise share
SHARE_RANGE_SIGMAS = 10.0


def noise_share_range_error(plan: RunPlan, sigma: float, dim: int | None = None) -> str | None:
    """Why secure aggregation's fixed-point encoding would clip the clients' noise shares, or None
    (:func:`share_range_error` on the plan's ``privacy.client`` and encoding)."""
    return share_range_error(plan.part(PrivacyConfig).client, secure_aggregation_encoding(plan), sigma, dim)


def share_range_error(
    client: ClientDPConfig | LocalDPConfig | None, encoding: tuple[float, int] | None, sigma: float, dim: int | None = None
) -> str | None:
    """Why secure aggregation's fixed-point encoding (``encoding``: its ``(clip_range, frac_bits)``, None when the
    stack has no secure aggregation) would clip the clients' noise shares, or None.

    Under ``privacy.client.noise: clients`` (``client``: that section) each client's noise share travels inside the
    encoding, which clips every value to ±``clip_range``: a clipped share is no longer the Gaussian the accountant
    assumes. The range must hold a clipped update's largest coordinate (S) plus :data:`SHARE_RANGE_SIGMAS` standard
    deviations of the largest share a client can draw (σS, for a sum known to hold only one update): a share beyond
    that has probability below 1e-23 a value. ``sigma`` is the client unit's noise multiplier (given, or calibrated
    at setup). With ``dim`` (the update's coordinates, known once the model is built) the share's std is the
    grid-corrected σ·(S + γ√d) of the discrete Gaussian release (:mod:`protocols.dp.discrete_gaussian`;
    γ ≥ 2^-frac_bits)."""
    p = client  # privacy.client, or privacy.local (its noise: shares travel the same way)
    if p is None or p.noise not in ("clients", "shares") or encoding is None:
        return None
    R, frac_bits = encoding
    sens = p.clip_norm
    if dim is not None:
        from protocols.dp.accountant import grid_sensitivity, noise_grid  # the accountant's module only with a model

        grid = noise_grid(p.clip_norm, dim, coarsest_below=2.0 ** -int(frac_bits))
        sens = grid_sensitivity(p.clip_norm, grid, dim)
    need = p.clip_norm + SHARE_RANGE_SIGMAS * sigma * sens
    if R >= need:
        return None
    return (
        f"secure_aggregation.clip_range {R:g} would clip the clients' noise shares: under privacy."
        f"{'client' if p.noise == 'clients' else 'local'}.noise: {p.noise} a value can reach clip_norm + "
        f"{SHARE_RANGE_SIGMAS:g}σ·(clip_norm + γ√d) = {need:.6g} (clip_norm "
        f"{p.clip_norm:g}, σ {sigma:.4g}, the grid's γ√d {sens - p.clip_norm:.3g}); raise clip_range to at least that "
        "(lowering frac_bits to fit)"
    )


def _validate_keyed_hashing(plan: RunPlan, stack: list[str]) -> None:
    """keyed_hashing only for an algorithm that collects label sets."""
    if "keyed_hashing" in stack and plan.algorithm.name not in LABEL_SET_ALGORITHMS:
        raise ValueError(
            f"keyed_hashing protects label-set collection, which {plan.algorithm.name} does not run "
            "(only fedalc and fedalc_fixed collect label sets)"
        )


def _first_step_epsilon(sigma: float, q: float, delta: float, accountant: str) -> float:
    from protocols.dp.accountant import epsilon_of  # the accountant (Opacus) only when a target must be checked

    return epsilon_of([(sigma, q, 1)], delta, accountant)


def _sigma_source_error(p: PrivacyConfig) -> str | None:
    """Why a DP mechanism has no σ: neither its ``noise_multiplier`` nor a target ε of its unit to calibrate it from
    (the instance unit's one target may come from ``privacy.instance`` or ``privacy.local``); None when each has one."""
    given = [u.target_epsilon for u in (p.instance, p.local) if u is not None and u.target_epsilon is not None]
    for name, unit, target in (("instance", p.instance, given[0] if given else None),
                               ("local", p.local, given[0] if given else None),
                               ("client", p.client, p.client.target_epsilon if p.client is not None else None)):  # fmt: skip
        if unit is None or unit.noise_multiplier is not None or target is not None:
            continue
        shared = " (the instance unit's one budget: neither privacy.instance nor privacy.local gives it)"
        return (
            f"privacy.{name} sets neither noise_multiplier nor target_epsilon{shared if name != 'client' else ''}: its σ "
            "has nothing to come from; give noise_multiplier, or a target_epsilon to calibrate σ to"
        )
    return None


def _dp_stack_rules(plan: RunPlan, stack: list[str]) -> None:
    """A dp unit is set, each mechanism has a σ to come from, and dp comes before a secure sum."""
    p = plan.part(PrivacyConfig)
    if p.instance is None and p.client is None and p.local is None and not active_plugins(p):
        raise ValueError("'dp' is listed in protocols but none of privacy.instance, privacy.local, privacy.client is set")
    if why := _sigma_source_error(p) or plugin_sigma_source_error(p) or plugin_combination_error(p):
        raise ValueError(why)
    summing = [n for n in stack if n in SECURE_SUMS]
    if summing and stack.index("dp") > stack.index(summing[0]):
        raise ValueError(f"'dp' must come before '{summing[0]}' in protocols: clients clip before they encode for it")


def _dp_public_inputs_rules(plan: RunPlan, stack: list[str]) -> None:
    """The W step's divisor and θ's input scaling are public, not statistics of the training data."""
    p = plan.part(PrivacyConfig)
    if p.instance is not None and p.instance.divisor(plan.dataset) is None:
        raise ValueError(
            f"privacy.instance.expected_batch_size: auto needs a public training-set size, which {plan.dataset.name} data "
            "has not in config: the W step divides its noisy sum by a public B̄, never by the realised count of label "
            f"sets (a private divisor); give q × a public estimate of the training set's size ({p.instance.sample_rate:g} × N)"
        )
    if plan.model.preprocessing == "standardize":
        raise ValueError(
            "model.preprocessing: standardize under dp: its per-feature mean and standard deviation are computed over the "
            "whole training split in the clear, and θ is trained on them, outside any ε; use auto (none for dense "
            "features under dp) or none"
        )
    if plan.dataset.drop_empty_labels is True:
        raise ValueError(
            "dataset.drop_empty_labels: true under dp: which labels have a training instance is a fact about the private "
            "data (removing a label's only instance would drop the label and change W's shape), outside any ε; use auto "
            "(every label kept under dp) or false"
        )


def _central_reference_rules(plan: RunPlan, stack: list[str]) -> None:
    """The central DP reference (a centralised trainer): DP-SGD alone, no data-dependent choice of epoch."""
    p, algo = plan.part(PrivacyConfig), plan.algorithm.name
    central = plan.algorithm.capabilities.centralised  # one trainer holds every instance once, whole, and every row
    if central:
        if p.instance is not None or p.client is not None or p.local is None:
            raise ValueError(
                f"{algo} under dp is the central DP reference: DP-SGD on its one trainer, privacy.local only (no "
                "privacy.instance or privacy.client: there are no clients and no server step)"
            )
        if plan.algorithm.validation_fraction:
            raise ValueError(
                f"{algo} under dp: algorithm.validation_fraction {plan.algorithm.validation_fraction:g} selects the "
                "reported epoch on a split of the training data, a data-dependent choice outside ε; set it to 0 (the "
                "last epoch is reported)"
            )


def _fixed_encoder_and_bound_rules(plan: RunPlan, stack: list[str]) -> None:
    """A fixed encoder only where no noise lands on it; a contribution bound only where it bounds something."""
    p, central = plan.part(PrivacyConfig), plan.algorithm.capabilities.centralised
    if plan.model.fixed_encoder and (p.client is not None or (p.local is not None and p.local.noise == "shares")):
        which = "privacy.client" if p.client is not None else "privacy.local.noise: shares"
        raise ValueError(
            f"model.fixed_encoder with {which}: its noise goes on every coordinate of θ's update, the fixed encoder's "
            "too, so the released encoder would not be its initialisation; use privacy.local with noise: local (DP-SGD "
            "noises only what is trained)"
        )
    units = {u.max_labels_per_instance for u in (p.instance, p.local, p.client) if u is not None} - {None}
    bound = units.pop() if units else None  # a DP mechanism plugin's bound caps each instance on its client too
    if bound is not None and plan.partition.name != "positive_only" and not central:
        raise ValueError(
            f"privacy.*.max_labels_per_instance {bound} bounds the clients an instance sits on in the positive_only "
            f"partition; in a {plan.partition.name} partition each instance is on one client: remove it"
        )


def _instance_unit_rules(plan: RunPlan, stack: list[str]) -> None:
    """privacy.instance: the algorithm has a private W step over label sets."""
    p, algo = plan.part(PrivacyConfig), plan.algorithm.name
    if p.instance is not None:
        if "instance" not in plan.algorithm.capabilities.dp_units:
            raise ValueError(
                f"privacy.instance is DP-SGD on the server's label-set regulariser, which {algo} does not have "
                "(fedaws's spreadout uses no data: it is post-processing); use privacy.client"
            )
        if why := plan.algorithm.private_w_step_error():
            raise ValueError(why)


def _client_unit_rules(plan: RunPlan, stack: list[str]) -> None:
    """privacy.client: its mechanism's settings, uniform aggregation, a weight cap exactly where clients report a weight."""
    p, algo = plan.part(PrivacyConfig), plan.algorithm.name
    if p.client is None:
        return
    if not plan.algorithm.capabilities.client_training:
        raise ValueError(
            f"privacy.client noises the clients' training updates, which {algo} does not have (its clients do not train: "
            "its noise would only blur the model it computes at setup); its DP comes from the mechanisms it declares"
        )
    t = plan.training
    if p.client.mechanism == "tree":
        from protocols.dp.tree_ledger import tree_config_error

        if why := tree_config_error(plan.training):
            raise ValueError(why)
    from protocols.dp.banded_ledger import banded_config_error

    if why := banded_config_error(p.client, t):
        raise ValueError(why)
    if t.aggregation != "uniform":
        raise ValueError("privacy.client bounds each client's contribution, so training.aggregation must be uniform")
    if algo in WEIGHT_REPORTING_ALGORITHMS and p.client.weight_cap is None:
        raise ValueError(
            f"privacy.client with {algo}: its clients weight their update by eq. 2's w = Σ_l (positives of l)^α, which "
            "has no bound; set privacy.client.weight_cap (a public W̄: each client scales its clipped update by "
            "min(w, W̄)/W̄, e.g. W̄ = the number of labels at α = 0)"
        )
    if algo not in WEIGHT_REPORTING_ALGORITHMS and p.client.weight_cap is not None:
        raise ValueError(f"privacy.client.weight_cap applies to algorithms whose clients report a weight (flag), not {algo}")


def _client_noise_rules(plan: RunPlan, stack: list[str]) -> None:
    """privacy.client: its noise shares in an exact secure sum, in range; adaptive clipping's limits; Poisson sampling."""
    p = plan.part(PrivacyConfig)
    if p.client is None:
        return
    summing, t = [n for n in stack if n in SECURE_SUMS], plan.training
    if p.client.noise == "clients" and not summing:
        raise ValueError(
            "privacy.client.noise: clients needs secure_aggregation after dp: each client adds only a "
            "1/√t share of the noise, so without a secure sum the server would see lightly-noised single updates"
        )
    if p.client.noise == "clients" and plan.model.family == "embedding" and plan.partition.name != "positive_only":
        raise ValueError(
            f"privacy.client.noise: clients with model.family embedding on a {plan.partition.name} partition: the secure "
            "sum carries each row's count of clients that trained it (which labels the clients hold) exactly, outside "
            "the noise; use model.family linear_head or ctran, or privacy.client.noise: server"
        )
    if p.client.noise == "clients" and summing == ["ckks"]:
        raise ValueError(
            "privacy.client.noise: clients with ckks: CKKS decrypts approximately, so the sum the key holders return "
            "carries data-dependent approximation error and float decryption noise, not the discrete Gaussian "
            "release the ledger accounts; use secure_aggregation (exact integer sums) or privacy.client.noise: server"
        )
    if p.client.noise_multiplier is not None and (why := noise_share_range_error(plan, p.client.noise_multiplier)):
        raise ValueError(why)  # a calibrated σ is checked when the dp layer is built
    if p.client.adaptive_clipping is not None and (p.client.noise == "clients" or summing):
        raise ValueError(
            "privacy.client.adaptive_clipping with a secure sum (privacy.client.noise: clients, secure_aggregation or "
            "ckks): each client's clip bit would have to enter the secure sum with its own noise share, which is not "
            "implemented; use privacy.client.noise: server without a secure-sum layer, or a fixed clip_norm"
        )
    if p.client.adaptive_clipping is not None and plan.backend == "flower":
        raise ValueError(
            "privacy.client.adaptive_clipping with backend: flower: a node checks the round's clip norm against its "
            "own settings and cannot know C_t; run in process, or use a fixed clip_norm"
        )
    subsampled = t.client_fraction < 1.0 or t.clients_per_round is not None
    if subsampled and t.sampling != "poisson" and p.client.mechanism != "banded":  # banded: the cyclic schedule
        raise ValueError(
            "privacy.client with training.client_fraction < 1 (or training.clients_per_round) needs "
            "training.sampling: poisson with client_fraction "
            "(the accountant's subsampling amplification assumes Poisson sampling)"
        )


def _local_unit_rules(plan: RunPlan, stack: list[str]) -> None:
    """privacy.local (DP-SGD in client training): nothing else shapes θ from the data (W update, weights, cohort, rows)."""
    p, algo, central = plan.part(PrivacyConfig), plan.algorithm.name, plan.algorithm.capabilities.centralised
    if p.local is not None and p.instance is None and algo in LABEL_SET_ALGORITHMS:
        raise ValueError(
            f"privacy.local with {algo}: the server's W update also uses every instance, through its label set; add "
            "privacy.instance so that the instance unit's ε covers both (one budget, composed)"
        )
    if p.local is not None and plan.training.aggregation != "uniform":
        raise ValueError(
            "privacy.local: training.aggregation must be uniform (weights by example count would release each client's "
            "count through θ, outside DP-SGD)"
        )
    fixed_cohort = plan.training.client_fraction < 1.0 or plan.training.clients_per_round is not None
    if p.local is not None and plan.training.sampling == "proportional" and fixed_cohort:
        raise ValueError(
            "privacy.local with training.sampling: proportional: clients are picked with probability ∝ their example "
            "count, which then shapes θ outside DP-SGD; use uniform or poisson sampling"
        )
    if p.local is not None and plan.model.family == "embedding" and plan.partition.name != "positive_only" and not central:
        raise ValueError(
            f"privacy.local with model.family embedding on a {plan.partition.name} partition: which class rows a client "
            "receives and trains is the set of labels in its data, visible outside DP-SGD; use model.family "
            "linear_head or ctran (every label scored, no per-client rows) or the positive_only partition"
        )
    if p.local is not None and "local" not in plan.algorithm.capabilities.dp_units:
        raise ValueError(
            f"privacy.local with {algo}: its clients weight their update by eq. 2's w, computed from their labels and "
            "sent outside DP-SGD; use privacy.client with weight_cap (client-level DP) for it"
        )


def _local_training_rules(plan: RunPlan, stack: list[str]) -> None:
    """privacy.local: per-sample gradients that bound one instance, and a public bound on the clients it sits on."""
    p, central = plan.part(PrivacyConfig), plan.algorithm.capabilities.centralised
    bound = p.max_labels_per_instance()
    if p.local is not None and plan.model.family == "ctran" and (rate := _explicit_dropout(plan.model)):
        raise ValueError(
            f"privacy.local with model.ctran.dropout {rate}: DP-SGD's steps run without dropout (its "
            "masks come in batch order, so removing one instance would change every later sample's gradient); set "
            "model.ctran.dropout: auto or 0"
        )
    if p.local is not None and _has_batch_norm(plan.model, plan.dataset):
        raise ValueError(
            "privacy.local (DP-SGD in client training) cannot run on a ResNet: batch norm mixes a batch's samples, so no "
            "per-sample clip bounds one instance; use a model without batch norm (model.name: mlp | sparse_text)"
        )
    if p.local is not None and p.local.copy_clip == "split" and (p.local.batch_sample_rate < 1.0 or p.local.noise != "local"):
        raise ValueError(
            "privacy.local.copy_clip: split needs batch_sample_rate 1 and noise: local: its ledger counts an instance's "
            "k copies (each clipped to C/√k) as one copy only when every copy enters every step and each client's "
            f"release is noised on its own (got batch_sample_rate {p.local.batch_sample_rate:g}, noise {p.local.noise})"
        )
    if p.local is not None and bound is None and plan.partition.name == "positive_only" and not central:
        raise ValueError(
            "privacy.local on the positive_only partition needs privacy.local.max_labels_per_instance: an instance "
            "enters the training of every client of its labels, and the steps it enters must be counted from a public "
            "bound m (instances with more labels are bounded, see privacy.over_bound), never from the data"
        )


def _local_shares_rules(plan: RunPlan, stack: list[str]) -> None:
    """privacy.local.noise: shares (:func:`protocols.dp.share_rules.local_shares_error`), its shares in range."""
    p = plan.part(PrivacyConfig)
    bound = p.max_labels_per_instance()
    if why := local_shares_error(p.local, plan.training, stack=stack, with_client_unit=p.client is not None, bound=bound):
        raise ValueError(why)
    if p.local is not None and p.local.noise_multiplier is not None and "secure_aggregation" in stack:
        s = plan.part(SecureAggregationConfig)  # privacy.local.noise: shares travel in the encoding (a calibrated σ: at build)
        if why := share_range_error(p.local, (s.clip_range, int(s.frac_bits)), p.local.noise_multiplier):
            raise ValueError(why)


def _target_epsilon_rules(plan: RunPlan, stack: list[str]) -> None:
    """Each unit's target ε can be met: by a calibrated σ (above RDP's floor), or past the given σ's first step."""
    p = plan.part(PrivacyConfig)
    for name, unit, q in (("instance", p.instance, getattr(p.instance, "sample_rate", None)),
                          ("local", p.local, getattr(p.local, "batch_sample_rate", None)),
                          ("client", p.client, plan.training.client_fraction)):  # fmt: skip
        if unit is None or unit.target_epsilon is None:
            continue
        if unit.noise_multiplier is None:  # σ is calibrated when the run starts; a target below RDP's floor never is
            with warnings.catch_warnings():  # "optimal order is the largest alpha": true of this probe, and its point
                warnings.simplefilter("ignore")
                floor = _first_step_epsilon(1e6, q, p.delta, "rdp")
            if floor > unit.target_epsilon:
                raise ValueError(
                    f"privacy.{name}.target_epsilon {unit.target_epsilon:g} cannot be met at any noise_multiplier ≤ 1e6: "
                    f"σ is calibrated by RDP and PRV together, and the RDP accountant certifies no ε below "
                    f"{floor:.3g} for even one step at δ = {p.delta:g}; raise the target (or δ)"
                )
            continue
        eps1 = _first_step_epsilon(unit.noise_multiplier, q, p.delta, p.accountant)
        if eps1 > unit.target_epsilon:
            raise ValueError(
                f"privacy.{name}.target_epsilon {unit.target_epsilon:g} cannot be met: one step at noise_multiplier "
                f"{unit.noise_multiplier:g} and sample rate {q:g} already spends ε = {eps1:.4g} (δ = {p.delta:g}, "
                f"{p.accountant}); raise noise_multiplier, or omit it to calibrate σ to the target"
            )


#: the dp layer's rules, by group, in the order they are checked: the first refusal is the plan's error
DP_RULES = (_dp_stack_rules, _dp_public_inputs_rules, _central_reference_rules, _fixed_encoder_and_bound_rules,
            _instance_unit_rules, _client_unit_rules, _client_noise_rules, _local_unit_rules, _local_training_rules,
            _local_shares_rules, _target_epsilon_rules)  # fmt: skip


def _validate_dp(plan: RunPlan, stack: list[str]) -> None:
    """The dp layer's settings against the stack and the rest of the plan: the privacy sections only with dp
    listed, then each rule group of :data:`DP_RULES`."""
    p = plan.part(PrivacyConfig)
    if "dp" not in stack:
        if p.instance is not None or p.client is not None or p.local is not None:
            raise ValueError("privacy.instance / privacy.local / privacy.client is set but 'dp' is not listed in protocols")
        if plugins := active_plugins(p):
            raise ValueError(f"privacy.{plugins[0][0].name} is set but 'dp' is not listed in protocols")
        return
    for rules in DP_RULES:
        rules(plan, stack)


def _instance_bound(plan: RunPlan) -> tuple[int, str] | None:
    """The privacy section's contribution bound ``(m, rule)`` (``privacy.*.max_labels_per_instance``), or None. A
    centralised trainer (the central DP reference) has each instance once, whole: it bounds nothing."""
    if plan.algorithm.capabilities.centralised:
        return None
    p = plan.part(PrivacyConfig)
    m = p.max_labels_per_instance()
    return None if m is None else (m, p.over_bound)


def _explicit_dropout(model: ModelPlan) -> float:
    """``model.ctran.dropout`` as the config set it explicitly; 0 when left at ``auto`` (DP-SGD's steps then run
    without dropout, whatever the rate the plan resolved ``auto`` to)."""
    return 0.0 if model.ctran.dropout_auto else model.ctran.dropout


#: the dataset formats of images (``dataset.format``; the core's ``IMAGE_FORMATS``)
IMAGE_FORMATS = ("voc", "coco")


def _has_batch_norm(model: ModelPlan, dataset: DatasetPlan) -> bool:
    """The plan's encoder is a ResNet (batch norm): named, or picked by ``auto`` for image data."""
    images = dataset.name == "digit_mosaics" or dataset.format in IMAGE_FORMATS
    return model.name.startswith("resnet") or (model.name == "auto" and images)


def _validate_secure_aggregation(plan: RunPlan, stack: list[str]) -> None:
    """secure_aggregation's threshold and clip range, when the stack lists it."""
    if "secure_aggregation" not in stack:
        return
    s = plan.part(SecureAggregationConfig)
    if s.threshold <= 0.5:
        raise ValueError(
            "secure_aggregation.threshold must exceed 0.5: with t ≤ half a neighbourhood the server can collect both "
            "a client's self-mask shares and its key shares and unmask its input"
        )
    if s.clip_range < 1.0:
        raise ValueError(
            f"secure_aggregation.clip_range {s.clip_range:g} is below 1: each client's row counts "
            "and the 1 that counts the round's clients travel in the encoded sum and would be clipped"
        )
    if s.fault_schedule is not None:
        from protocols.secagg.fault_schedule import load_fault_schedule

        sched = load_fault_schedule(s.fault_schedule)  # a bad file: one ConfigError line
        nodes = plan.flower.num_supernodes if plan.backend == "flower" else None
        if nodes is not None and nodes != sched.nodes:
            raise ValueError(
                f"secure_aggregation.fault_schedule {s.fault_schedule} places clients on {sched.nodes} nodes, but "
                f"flower.num_supernodes is {nodes}: a kill would not hit the clients of the node it names"
            )


def _always(plan: RunPlan) -> bool:
    """True, whatever the plan (a spec's flag that holds for every run)."""
    return True


#: a dealer client seals a secret to every other client's public key, the server relaying (keyed hashing, CKKS)
KEY_DEALING_DOWN = {"public_keys": Opaque(), "sealed": Opaque(), "dealer": Number(), "dealer_public_key": ShortBytes()}


KEYED_HASHING = LayerSpec(
    name="keyed_hashing",
    frozen_on_resume=(("keyed_hashing",),),
    threat_model=(
        "Stops an honest-but-curious server (or anyone holding θ⁰ and candidate instances) from recomputing instance "
        "tokens or reading label names in FedALC's label-set collection: tokens and pseudonyms are HMACs under a run key "
        "only clients hold (the key is sealed to public keys the server relays unauthenticated)."
    ),
    implementation="protocols.keyed_hashing:KeyedHashing",
    settings=keyed_hashing_settings,
    validate=_validate_keyed_hashing,
    runs_on_flower=True,  # its setup steps are client-side methods; the keyrings live in each node's context.state
    row_sparse_updates=_always,  # it keys labels and tokens; θ updates pass through untouched
    downlink_rules={
        "keyed_hashing": Setting(),
        **KEY_DEALING_DOWN,
        "label_names": Opaque(),
    },
    uplink_rules={"public_key": ShortBytes(), "sealed": Opaque(), "pseudonyms": ByteList(), "pseudonym": ShortBytes()},
)


def _describe_dp(plan: RunPlan, num_clients: int) -> list[str]:
    """:func:`_describe_dp_lines`, without the accountant's "optimal order is the largest alpha" warnings (true of
    the calibration's probes, and noise in ``validate``'s output)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _describe_dp_lines(plan, num_clients)


def unnoised_steps_of_plan(plan: RunPlan) -> list[dict]:
    """:func:`protocols.dp.released_model.unnoised_steps` for a run's config with the ``dp`` layer: the channels its
    declared mechanisms leave uncovered, by the privacy-loss graph's rule
    (:func:`protocols.dp.run_graph.planned_unnoised_steps`)."""
    from protocols.dp.run_graph import planned_unnoised_steps

    return planned_unnoised_steps(plan.part(PrivacyConfig), capabilities=plan.algorithm.capabilities)


def _released_model_line(plan: RunPlan) -> str:
    """The released model's ε (the observer's), planned: covered when every step that shapes θ and W has a DP
    mechanism (:func:`unnoised_steps_of_plan`, the layer's own rule), else ∞ and why."""
    p = plan.part(PrivacyConfig)
    instance_on = p.instance is not None or p.local is not None or bool(active_plugins(p))
    units = [u for u, on in (("instance", instance_on), ("client", p.client is not None)) if on]
    head = "dp released model (the observer: sees θ, W and the files): "
    unnoised = unnoised_steps_of_plan(plan)
    noiseless = [
        f"privacy.{n}" for n in ("instance", "local", "client") if getattr(getattr(p, n), "noise_multiplier", None) == 0.0
    ]
    if not unnoised and noiseless:
        return (head + f"ε = ∞: the noiseless control (noise_multiplier 0 in {', '.join(noiseless)}): every step that "
                "shapes θ and W runs its DP mechanism's clip, bound and sampling, and no noise")  # fmt: skip
    if not unnoised:
        return (
            head + "covered: every step that shapes θ and W has a DP mechanism; its ε is the observer's plan per "
            f"{(units or ['dp'])[0]} above (dp released model, per {(units or ['dp'])[0]})"
        )
    released = " and ".join(dict.fromkeys("θ" if t == "theta" else t for x in unnoised for t in x["released"]))
    return (head + f"ε = ∞: no ε bounds the released {released}: " + "; ".join(x["why"] for x in unnoised)
            + f"; the {' and '.join(units) or 'dp'} unit's ε above covers only what that unit names")  # fmt: skip


def _cap_text(history: list[tuple[float, float, int]], target: float, p: PrivacyConfig) -> str:
    """What a target beside given σ values does (``noise_multiplier`` and ``target_epsilon`` both set): it is a cap,
    the ledger's stop; with one mechanism, the last planned step it allows."""
    from protocols.dp.accountant import epsilon_of

    head = "a cap on the given σ: training stops before the step that would pass it"
    if epsilon_of(history, p.delta, p.accountant) <= target:
        return head + "; the planned steps stay within it"
    if len(history) > 1:
        return head + ", before the planned steps end"
    sigma, q, n = history[0]
    lo, hi = 0, n  # ε(lo) ≤ target < ε(hi): the steps allowed, by bisection
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if epsilon_of([(sigma, q, mid)], p.delta, p.accountant) <= target else (lo, mid)
    return head + f", after {lo:,} of the {n:,} planned steps"


#: a unit's planned mechanism: (name, its settings block, sample rate q, planned steps or None when unknown here)
PlannedMechanism = tuple[str, InstanceDPConfig | LocalDPConfig | ClientDPConfig, float, int | None]


def _unit_line(p: PrivacyConfig, unit: str, block: str, mechs: list[PlannedMechanism], note: str,
               planned: dict[str, tuple[float, float, int]]) -> str:  # fmt: skip
    """The line of one DP unit's plan over its ``mechs``: each σ given or calibrated (by the layer's own functions, to
    the unit's target; ``block``: the section a calibration error names), and the ε the unit plans; each mechanism's
    planned (σ, q, steps) is recorded in ``planned`` (for the run's graph)."""
    from protocols.dp.accountant import calibrate_shared_sigma, calibrate_sigma, epsilon_of
    from secure_fed.plugin_api.layers import ConfigError

    target = next((m.target_epsilon for _, m, _, _ in mechs if m.target_epsilon is not None), None)
    if any(n is None for *_, n in mechs):
        shown = "; ".join(f"{name}: q {q:g}, σ {'calibrated' if m.noise_multiplier is None else f'{m.noise_multiplier:g}'}"
                          for name, m, q, _ in mechs)  # fmt: skip
        return f"dp {unit} unit: {shown}; planned steps, σ and ε: not computed here ({note})"
    steps = [n for *_, n in mechs if n is not None]  # every one known (above)
    free = [m for _, m, _, _ in mechs if m.noise_multiplier is None]
    shared = None
    try:
        if free and len(mechs) == 1:
            shared = calibrate_sigma(target_epsilon=target, delta=p.delta, sample_rate=mechs[0][2], steps=steps[0],
                                     accountant=p.accountant)  # fmt: skip
        elif free:
            shared = calibrate_shared_sigma(target_epsilon=target, delta=p.delta, accountant=p.accountant,
                                            parts=[(q, n, m.noise_multiplier) for _, m, q, n in mechs])  # fmt: skip
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"privacy.{block}.target_epsilon: {exc}") from None
    history, parts = [], []
    for (name, m, q, _), n in zip(mechs, steps, strict=True):
        sigma = m.noise_multiplier if m.noise_multiplier is not None else shared
        history.append((sigma, q, n))
        planned[name] = (sigma, q, n)
        parts.append(f"{name}: σ {sigma:.4g} ({'calibrated' if m.noise_multiplier is None else 'given'}), q {q:g}, "
                     f"{n:,} planned steps")  # fmt: skip
    eps = epsilon_of(history, p.delta, p.accountant)
    goal = f" (target {target:g})" if target is not None else ""
    if target is not None and not free:  # every σ given: the target calibrates nothing, it caps the run
        goal = f" (target {target:g}: {_cap_text(history, target, p)})"
    return (f"dp {unit} unit: {'; '.join(parts)} -> plans ε = {eps:.4g}{goal} at δ = {p.delta:g} ({p.accountant})"
            + (f"; {note}" if note else "") + "; " + _discrete_gaussian_text(history, p.delta))  # fmt: skip


def _client_training_mechanism(plan: RunPlan, num_clients: int) -> tuple[PlannedMechanism, str]:
    """``privacy.local``'s mechanism (DP-SGD in client training) and a note on its steps: an instance's copies a
    round come from the public bound m in the positive_only partition (unknown here without one), else one."""
    from protocols.dp.local_dpsgd import copies_per_round, local_steps_per_round

    loc, t = plan.part(PrivacyConfig).local, plan.training
    assert loc is not None  # the caller's condition
    positive_only = plan.partition.name == "positive_only"
    bound = _instance_bound(plan)
    largest = num_clients if t.sampling == "poisson" else t.cohort_size(num_clients)
    per_round = local_steps_per_round(local_epochs=t.local_epochs, sample_rate=loc.batch_sample_rate)
    steps = None
    if not positive_only or plan.algorithm.capabilities.centralised:
        steps = t.rounds * copies_per_round(1, largest) * per_round
        note = "an instance sits on one client"
    elif bound is not None and loc.copy_clip == "split":  # the k ≤ m copies, each clipped to C/√k, count as one
        steps = t.rounds * per_round
        note = (f"client_training counts one copy of an instance a round: privacy.local.copy_clip split clips each of "
                f"its k ≤ {bound[0]} copies to C/√k, so together they move the clients' releases by ≤ C")  # fmt: skip
    elif bound is not None:  # the run's k is min(m, the label space's size): m is its public upper bound
        k = copies_per_round(bound[0], largest)
        steps = t.rounds * k * per_round
        note = (f"client_training counts an instance in up to {k} clients' training a round (the public bound m = "
                f"{bound[0]} capped by the largest cohort, {largest}); a label space of fewer than m labels "
                "lowers k to its size")  # fmt: skip
    else:
        note = ("positive_only partition with no public bound: an instance may sit on one client per label, so k "
                "is the number of labels; set privacy.*.max_labels_per_instance for a smaller bound")  # fmt: skip
    if loc.noise == "shares":
        note += "; " + (
            "privacy.local.noise: shares: one step a round, each client adds a 1/√t share of the noise, so "
            "against the server this ε holds only with the secure sum"
        )
    return ("client_training", loc, loc.batch_sample_rate, steps), note


def _instance_unit_line(plan: RunPlan, num_clients: int, planned: dict[str, tuple[float, float, int]]) -> str:
    """The instance unit's plan: the W step over label sets (``privacy.instance``) and DP-SGD in client training
    (``privacy.local``), one ledger."""
    p = plan.part(PrivacyConfig)
    mechs: list[PlannedMechanism] = []
    note = ""
    if p.instance is not None:
        mechs.append(("server_w_step", p.instance, p.instance.sample_rate, plan.algorithm.private_w_steps(plan.training.rounds)))
    if p.local is not None:
        mech, note = _client_training_mechanism(plan, num_clients)
        mechs.append(mech)
    for spec, section in active_plugins(p):  # one release before round 0, every client at once
        mechs.append((spec.name, section, 1.0, 1))
    blocks = {"server_w_step": "instance", "client_training": "local"}  # the sections; a plugin's is its name
    block = next((blocks.get(n, n) for n, m, _, _ in mechs if m.target_epsilon is not None), "local")
    return _unit_line(p, "instance", block, mechs, note, planned)


def _client_unit_line(plan: RunPlan, planned: dict[str, tuple[float, float, int]]) -> str:
    """The client unit's plan: client-level noise each round, DP-FTRL's tree (K Gaussian equivalents), or banded MF."""
    p, t = plan.part(PrivacyConfig), plan.training
    assert p.client is not None  # the caller's condition
    if p.client.mechanism == "tree":
        from protocols.dp.tree_aggregation import gaussian_equivalents

        k = gaussian_equivalents(t.rounds, p.client.tree_restart_every or t.rounds)
        mechs: list[PlannedMechanism] = [("client update (DP-FTRL tree, K Gaussian equivalents)", p.client, 1.0, k)]
        return _unit_line(p, "client", "client", mechs, "no sampling amplification: every client in every round", planned)
    if p.client.mechanism == "banded":
        from protocols.dp.banded_ledger import banded_plan_line

        line, planned["client update (banded MF)"] = banded_plan_line(p, t)
        return line
    return _unit_line(p, "client", "client", [("client update", p.client, t.client_fraction, t.rounds)], "", planned)


def _describe_dp_lines(plan: RunPlan, num_clients: int) -> list[str]:
    """Each DP unit's plan, as :class:`protocols.dp.layer.DifferentialPrivacy` builds it: per mechanism σ (given or
    calibrated by the layer's own functions), sample rate and planned steps, and the ε the unit plans over them.
    The plan and public facts only (the cohort, the public bound m); what needs the built data is said, not guessed."""
    p = plan.part(PrivacyConfig)
    lines: list[str] = []
    planned: dict[str, tuple[float, float, int]] = {}  #: mechanism → its planned (σ, q, steps), for the graph
    if p.instance is not None or p.local is not None or active_plugins(p):
        lines.append(_instance_unit_line(plan, num_clients, planned))
    if p.client is not None:
        lines.append(_client_unit_line(plan, planned))
    lines.extend(_plugin_lines(plan, planned))
    lines.extend(_planned_release_lines(plan, num_clients, planned))
    if plan.model.fixed_encoder:
        lines.append("dp: the encoder g_θ is fixed at its initialisation from the seed (model.fixed_encoder): never trained, "
                     "independent of the data, so every unit covers it at no cost; only "
                     + ("W's rows" if plan.model.family == "embedding" else "the linear head") + " learn")  # fmt: skip
    if plan.algorithm.capabilities.centralised:
        lines.append(f"dp: {plan.algorithm.name} under dp is the central DP reference: DP-SGD on one trainer that holds "
                     "every instance once (no contribution bound)")  # fmt: skip
    lines.append(_released_model_line(plan))
    return lines


def _plugin_lines(plan: RunPlan, planned: dict[str, tuple[float, float, int]]) -> list[str]:
    """One line per DP mechanism plugin: its release, its sensitivities and noise multipliers per unit."""
    from protocols.dp.plugin_release import client_sigma

    p, lines = plan.part(PrivacyConfig), []
    for spec, section in active_plugins(p):
        if spec.name not in planned:
            continue
        sigma = planned[spec.name][0]
        d_i = spec.sensitivity(section, "instance")
        line = (f"dp {spec.name}: releases the clients' summed {spec.statistic} once before round 0 with Gaussian noise "
                f"of std σ·Δ = {sigma * d_i:.4g} (instance: Δ {d_i:.4g}, σ {sigma:.4g}, 1 step at q 1)")  # fmt: skip
        if p.client is not None:
            line += (f"; client: Δ {spec.sensitivity(section, 'client'):.4g} (each client's vector clipped), "
                     f"σ {client_sigma(spec, section, sigma):.4g}")  # fmt: skip
        lines.append(line + "; the server sums the clients' bounded vectors and adds the noise itself (no ε against it)")
    return lines


def _planned_release_lines(plan: RunPlan, num_clients: int, planned: dict[str, tuple[float, float, int]]) -> list[str]:
    """The released model's planned ε per unit against the observer, from the run's privacy-loss graph
    (:mod:`protocols.dp.run_graph`) over the planned mechanisms, one line per unit: it differs from the unit's own
    plan where another unit's mechanism reaches it (client-level noise per instance) or a channel is un-noised."""
    from protocols.dp.banded_ledger import banded_options
    from protocols.dp.mechanisms import MECHANISMS
    from protocols.dp.plugin_release import client_sigma
    from protocols.dp.run_graph import declared_names, mechanism_kind, run_graph

    p, t = plan.part(PrivacyConfig), plan.training
    plugins = active_plugins(p)
    client_names = ["client", *(f"{spec.name}_client" for spec, _ in plugins)]
    instance_mechs = [name for name in declared_names(p) if name not in client_names]  # the instance unit's
    if any(name not in planned for name in instance_mechs):
        return []  # some step counts need the built data: said above
    client_name = next((n for n in planned if n.startswith("client update")), None)
    if p.client is not None and client_name is None:
        return []
    positive_only = plan.partition.name == "positive_only"
    k = 1
    if positive_only and not plan.algorithm.capabilities.centralised:
        bound = _instance_bound(plan)
        k = num_clients if bound is None else min(bound[0], num_clients)
    mechs = []
    for name in instance_mechs:
        sigma, q, n = planned[name]
        mechs.append(MECHANISMS[mechanism_kind(p, name)](name=name, sigma=sigma, sample_rate=q, steps=n, planned_steps=n))
    if p.client is not None:
        sigma, q, _ = planned[client_name]
        extra = {"tree_rounds": p.client.tree_restart_every or t.rounds} if p.client.mechanism == "tree" else {}
        extra.update(banded_options(p.client, t))
        mechs.append(MECHANISMS[mechanism_kind(p, "client")](name="client", sigma=sigma, sample_rate=q, steps=t.rounds,
                                                            planned_steps=t.rounds, **extra))  # fmt: skip
        for spec, section in plugins:
            name = f"{spec.name}_client"
            mechs.append(MECHANISMS[mechanism_kind(p, name)](name=name, sigma=client_sigma(spec, section, planned[spec.name][0]),
                                                           sample_rate=1.0, steps=1, planned_steps=1))  # fmt: skip
    graph = run_graph(
        p, capabilities=plan.algorithm.capabilities, mechanisms=mechs, instance_group=k,
        population=num_clients, cohort=None if t.sampling == "poisson" else t.cohort_size(num_clients),
    )  # fmt: skip
    units = (["instance"] if p.instance is not None or p.local is not None or plugins else []) + (["client"] if p.client else [])
    lines = []
    for unit in units:
        res = graph.epsilon(unit, "observer", delta=p.delta, accountant=p.accountant)
        eps = res["epsilon"]
        shown = "∞" if eps == "inf" else f"{eps:.4g}"
        how = res["why"] if "why" in res else "composes " + ", ".join(res["composed"])
        if unit == "instance" and "client" in units and "why" not in res:
            how += f" (client-level noise through a group of {k} clients, each substituted: protocols/dp/group_bound.py)"
        blocks = (p.instance, p.local) if unit == "instance" else (p.client,)
        target = next((b.target_epsilon for b in blocks if b is not None and b.target_epsilon is not None), None)
        if target is not None and eps != "inf" and eps > target * (1 + 1e-3):
            how += (f"; above the {unit} unit's target {target:g}, which bounds that unit's own ledger (its own "
                    "mechanisms) and stops training on it, not what another unit's mechanisms add")  # fmt: skip
        lines.append(f"dp released model, per {unit} (observer): plans ε = {shown} at δ = {p.delta:g}: {how}")
    return lines


def _discrete_gaussian_text(history: list[tuple[float, float, int]], delta: float) -> str:
    """The unit's ε under the proven RDP of the discrete Gaussian it draws (:mod:`protocols.dp.discrete_gaussian_accounting`:
    the subsampled Gaussian's value at integer orders, exact for the discrete one; the RDP ledger's own value), beside
    the continuous-Gaussian analysis at every order of the grid (the ledger's value before that proof)."""
    from protocols.dp.discrete_gaussian_accounting import continuous_epsilon, discrete_gaussian_epsilon

    proven, cont = discrete_gaussian_epsilon(history, delta), continuous_epsilon(history, delta)
    return (
        f"discrete Gaussian, proven bound: ε = {proven:.4g} (the RDP ledger's, proven for the discrete Gaussian: "
        f"protocols/dp/discrete_gaussian_accounting.py; the continuous-Gaussian analysis at every order: ε = {cont:.4g})"
    )


def _target_epsilons(config: dict) -> dict[str, float]:
    """The target ε of each privacy unit in a run's config.yaml (plain data): the instance unit's from
    ``privacy.instance`` or ``privacy.local`` (validation makes them agree), the client unit's from ``privacy.client``."""
    p = config.get("privacy") or {}
    out = {}
    for unit, blocks in (("instance", ("instance", "local")), ("client", ("client",))):
        settings = [p[b] for b in blocks if isinstance(p.get(b), dict)]
        targets = [s["target_epsilon"] for s in settings if s.get("target_epsilon") is not None]
        if targets:
            out[unit] = float(targets[0])
    return out


def _dp_row_sparse_updates(plan: RunPlan) -> bool:
    """The dp layer takes row-sparse updates only with the instance unit's W step alone: client-level DP clips and
    noises whole updates, DP-SGD in client training noises the whole table."""
    p = plan.part(PrivacyConfig)
    return p.client is None and p.local is None


def _dp_memory(plan: RunPlan, shape: DataShape, params: int, device: str) -> dict[str, float]:
    """DP-SGD over label sets (privacy.instance) holds a chunk of per-set gradients, in the phase of the W step the
    algorithm declares (``w_step_memory_phase``)."""
    phase = plan.algorithm.w_step_memory_phase()
    if plan.part(PrivacyConfig).instance is None or phase is None:
        return {}
    return {phase: per_set_chunk_bytes(shape.labels, plan.model.embedding_dim)}


def _secure_sum_memory(plan: RunPlan, shape: DataShape, params: int, device: str) -> dict[str, float]:
    """A secure sum holds float64 numpy vectors of the whole update layout (θ plus C·(d+1) with a row table), several
    at once, in host memory: a phase of their own on a GPU, part of the round's on the CPU."""
    layout = params + (shape.labels * (plan.model.embedding_dim + 1) if plan.model.family == "embedding" else 0)
    return {"secure sums" if device.startswith("cuda") else "round": 4 * layout * 8}


DP = LayerSpec(
    name="dp",
    frozen_on_resume=(("privacy",),),
    movable_on_resume=(("privacy", "report_gdp"),),
    threat_model=(
        "Bounds, with a tracked (ε, δ), what the released θ, W and files reveal about any one client (client-level "
        "DP-FedAvg) or any one instance (DP-SGD on the server's W update over label sets, and DP-SGD inside client "
        "training, composed in one ledger) to an observer of the release; "
        "noise and sampling come from secrets of the party that draws them. Against the server: the instance unit gives "
        "nothing (it holds the label sets; with privacy.local.noise: shares and no privacy.instance it holds, only "
        "with the secure sum), the client unit holds only with noise: clients under a secure sum, without "
        "amplification by sampling."
    ),
    implementation="protocols.dp.layer:DifferentialPrivacy",
    settings=dp_settings,
    validate=_validate_dp,
    runs_on_flower=True,  # every mechanism: the clients' secret streams live on their nodes (client_state_on_nodes)
    # the instance unit steps W on the server and never sees θ updates; client-level DP clips and noises whole
    # updates, DP-SGD in client training noises the whole table: those take dense updates
    row_sparse_updates=_dp_row_sparse_updates,
    instance_bound=_instance_bound,
    target_epsilons=_target_epsilons,
    public_preprocessing=_always,  # θ is covered only if its inputs read no statistic of the training split
    # noise: clients — each client's noise share on every row of W, packed with its row deltas for the secure sum
    # the DP mechanism plugins' setup exchange (protocols.dp.plugin_release): which plugin and its public bounds down,
    # the client's bounded vector up
    downlink_rules={"mechanism": Setting(), "instance_bound": Number(), "client_clip": Number()},
    uplink_rules={"row_noise": FullTable("W"), "mechanism_vector": Vector()},
    describe=_describe_dp,
    memory=_dp_memory,
)


def _describe_secure_aggregation(plan: RunPlan, num_clients: int) -> list[str]:
    """The SecAgg+ graph a cohort of the configured size gets, and what it guarantees (protocols.secagg.graph_bounds)."""
    import math

    from protocols.secagg.graph_bounds import (
        colluders_needed,
        graph_choice_colluders,
        graph_choice_private,
        graph_for,
        round_dropout,
    )

    s, t = plan.part(SecureAggregationConfig), plan.training
    n = t.cohort_size(num_clients)
    about = "about " if t.sampling == "poisson" else ""  # the cohort's size varies from round to round (and is secret)
    g = graph_for(n, s, population=num_clients)
    graph = "complete graph" if g.neighbors is None else f"SecAgg+ graph, {g.neighbors} neighbours"
    setting = "null" if s.neighbors is None else s.neighbors
    fmt = lambda x: "0" if x == -math.inf else f"2^{x:.1f}"  # noqa: E731
    line = (
        f"secure_aggregation: {about}{n} of {num_clients} clients a round → {graph} (neighbors: {setting}), "
        f"t = {g.threshold}; with ≤ {s.corrupt_fraction:g} of the clients colluding and each dropping with "
        f"probability ≤ {round_dropout(s):.3g}, a round's privacy failure ≤ {fmt(g.log2_privacy_failure)}, "
        f"abort ≤ {fmt(g.log2_abort)}"
    )
    if not g.meets_targets:
        line += f" (targets 2^-{s.security_bits:g} and 2^-{s.correctness_bits:g} not met: no sparse graph meets them)"
    client_dp = plan.part(PrivacyConfig).client if "dp" in plan.protocols else None
    if client_dp is not None and client_dp.noise == "clients":
        line += (f"; privacy.client.noise: clients sizes each share for t = {g.threshold}, so a sum of all {n} holds "
                 f"{n / g.threshold:.1f}× the noise variance DP needs (a denser graph: larger t, less excess)")  # fmt: skip
    # a server that picks the graph (module protocols.secagg.graph_bounds): the colluders all in one neighbourhood
    colluders = graph_choice_colluders(s.corrupt_fraction, num_clients)
    k = n - 1 if g.neighbors is None else g.neighbors
    need = colluders_needed(k + 1, g.threshold, server="checked" if s.consistency_check else "unchecked")
    split = ("" if g.neighbors is None else f", and it may split the graph and learn sums over groups of ≥ {k + 1} "
             "clients")  # fmt: skip
    if graph_choice_private(need, corrupt_fraction=s.corrupt_fraction, population=num_clients):
        line += f"; against a server that picks the graph: private (its ⌊γN⌋ = {colluders} colluders < {need}){split}"
    else:
        line += (f"; against a server that picks the graph: NOT private (it can place all ⌊γN⌋ = {colluders} "
                 f"colluders, ≥ the {need} that open an input, in one client's neighbourhood; the bounds above assume a "
                 f"server that follows the random graph){split}")  # fmt: skip
    if t.sampling == "poisson":
        from scipy.stats import binom

        from protocols.secagg.graph_bounds import poisson_cohort_floor

        floor = poisson_cohort_floor(num_clients, s)
        line += (f"; under Poisson sampling the server states the cohort's size, hence k and t: clients refuse a size "
                 f"below {floor} (the least whose graph needs more than ⌊γN⌋ colluders), so a round whose cohort is "
                 f"smaller aborts (probability {binom.cdf(floor - 1, num_clients, t.client_fraction):.3g} a round)")  # fmt: skip
    if t.sampling == "proportional":
        line += "; sampling: proportional favours large clients, and the bounds assume uniform cohorts"
    if s.graph_seed is not None:
        line += "; graph_seed set: the graph is public, and the bounds do not hold against colluders who know it"
    return [line]


SECURE_AGGREGATION = LayerSpec(
    name="secure_aggregation",
    frozen_on_resume=(("secure_aggregation",),),
    threat_model=(
        "A server (honest-but-curious, or deviating after the signing-key set-up: advertisements are signed and, with "
        "consistency_check, the survivor set too; protocols.secagg.signing) learns only the round's sum of "
        "client updates (θ, class rows, weights, losses), not any one client's nor any partial sum: the round aborts unless "
        "≥ t of every neighbourhood survive and the survivors' graph stays connected (on the default neighbors: auto "
        "graph also with up to corrupt_fraction of the clients colluding, fixed before the run, but for probability "
        "2^-security_bits a round); in the positive-only setting a class row has one client, so its row sum is that "
        "client's row delta."
    ),
    implementation="protocols.secagg.layer:SecureAggregation",
    settings=secure_aggregation_settings,
    replaces_aggregation=True,
    validate=_validate_secure_aggregation,
    describe=_describe_secure_aggregation,
    memory=_secure_sum_memory,
    runs_on_flower=True,  # its stages are query messages to the layer's client side; the mask is the plan's last step
    # the stages' messages (public keys, sealed shares, the survivors, the shares the server is entitled to) and the
    # masked update: none carries a client's data in the clear
    downlink_rules={"secagg": Setting(), "secagg_round": Number(), "secagg_neighbours": Opaque(),
                    "secagg_threshold": Number(), "secagg_keys": Opaque(), "secagg_sealed": Opaque(),
                    "secagg_survived": Opaque(), "secagg_dropped": Opaque(), "directory": Opaque(),
                    "secagg_signatures": Opaque(), "secagg_cohort": Number()},
    uplink_rules={"c_pk": ShortBytes(), "s_pk": ShortBytes(), "secagg_sealed": Opaque(), "secagg_shares": Opaque(),
                  "masked": Opaque(), "sign_pk": ShortBytes(), "pinned": Number(), "nbrs": Opaque(), "t": Number(),
                  "sig": ShortBytes(), "secagg_signature": ShortBytes()},
)  # fmt: skip

CKKS = LayerSpec(
    name="ckks",
    frozen_on_resume=(("ckks",),),
    threat_model=(
        "The server holds only a public CKKS context and adds encrypted client updates, so it sees no individual update "
        "of the encrypted groups; only the sum is decrypted, by key-holding clients. One secret key, not a threshold "
        "scheme: a key holder colluding with the server decrypts every update. Exact decryptions of two rounds' sums "
        "would give the server the key (Li and Micciancio 2021; tested), so the key holders add Gaussian noise from "
        "their own secret to every value they return (ckks.decryption_noise); that stops the tested recoveries but is "
        "not the flooding an IND-CPA-D proof needs. The server also learns which ciphertexts a client sent: with "
        "ckks.row_blocks own (the default), those holding the rows it sent that client, which it chose itself."
    ),
    implementation="protocols.ckks:CKKSAggregation",
    settings=ckks_settings,
    replaces_aggregation=True,
    memory=_secure_sum_memory,
    runs_on_flower=True,  # setup and decryption are messages to its client side; encryption is the plan's last step
    # the public context to every client, summed ciphertexts to the key holder (the sum only)
    downlink_rules={"ckks": Setting(), **KEY_DEALING_DOWN, "ckks_public": Opaque(), "ckks_sums": Opaque()},
    # the key exchange; the decrypted sum (what the server learns by design); an update as ciphertexts and the
    # groups ckks.encrypt leaves in plaintext (the config's choice, reported in the summary)
    uplink_rules={"public_key": ShortBytes(), "sealed": Opaque(), "public_context": Opaque(), "ckks_sum": Opaque(),
                  "ciphertexts": Opaque(), "ciphertext_blocks": Indices(), "plain": Opaque()},
)  # fmt: skip

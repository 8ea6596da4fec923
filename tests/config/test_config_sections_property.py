"""Every privacy/protocol section the schema admits either validates or is one config error (issue 52).

Hypothesis draws the sections the protocol layers own (``privacy`` with its ``instance``/``local``/``client`` units
and their keys, ``protocols`` lists, ``secure_aggregation``, ``ckks``, ``keyed_hashing``) and the core settings they
are checked against (the algorithm, the partition, the model family, client sampling, the backend), with plausible
and implausible values. Each document goes through ``secure-fed validate``'s whole path in process
(:func:`secure_fed.config.load_plan`, then :func:`secure_fed.validation.validation_lines`: the data, the
partition, each layer's plan with σ calibrated to the target ε, the memory estimate) on tiny synthetic data. The
only exception allowed out is :class:`~secure_fed.errors.SecureFedError` (the CLI's one ``error:`` line, exit 2).

The run is derandomised (the same 2,000 documents each time) and counted: the test fails unless it drew at least
2,000, and unless enough of them validate with ``dp`` listed for σ's calibration to be exercised.
"""

from __future__ import annotations

import math
import time

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from secure_fed.algorithms.registry import algorithm_specs
from secure_fed.config import load_plan
from secure_fed.errors import SecureFedError
from secure_fed.validation import validation_lines

EXAMPLES = 2000

#: tiny synthetic data: the plan of each document, not the data, is under test
BASE = {
    "seed": 0,
    "device": "cpu",
    "dataset": {
        "name": "synthetic",
        "synthetic": {"num_train": 60, "num_test": 20, "num_labels": 6, "num_groups": 2, "num_features": 8},
    },  # fmt: skip
    "model": {"name": "mlp", "embedding_dim": 8, "hidden_dims": [8]},
    "training": {"rounds": 3, "batch_size": 8},
    "evaluation": {"every": 1},
    "output": {"progress": False},
}

#: values no section should take: wrong types, out of range, non-finite, empty
BAD = [0, -1, -0.5, 1e13, math.nan, math.inf, "x", "", True, [], {}, None, "auto", 10**20]


def _strategies(wild: bool) -> dict[str, st.SearchStrategy]:
    """The layers' sections: plausible values only, or (``wild``) each key sometimes a bad value and, rarely, a key
    no section has."""

    def value(*good):
        return st.one_of(st.sampled_from(list(good)), st.sampled_from(list(good)), st.sampled_from(BAD)) if wild \
            else st.sampled_from(list(good))  # fmt: skip

    def section(keys: dict):
        return st.fixed_dictionaries({}, optional={**keys, **({"no_such_key": st.just(1)} if wild else {})})

    # few distinct values: σ's calibration (seconds) runs once per distinct (target ε, q, steps, accountant)
    eps, sigma, rate = (1.0, 4.0, 1e-4), (0.8, 2.0, 1e5), (0.1, 0.5, 1.0)
    unit = {"clip_norm": value(0.5, 1.0, 1000.0), "noise_multiplier": value(*sigma), "target_epsilon": value(*eps),
            "max_labels_per_instance": value(1, 2, 3, 8)}  # fmt: skip
    instance = section({**unit, "sample_rate": value(*rate), "expected_batch_size": value(6.0, 30.0, "auto")})
    local = section({**unit, "batch_sample_rate": value(*rate), "noise": value("local", "shares")})
    adaptive = section({"target_quantile": value(0.1, 0.5, 0.9), "learning_rate": value(0.2, 1.0),
                        "count_noise_multiplier": value(0.5, 2.0, 10.0)})  # fmt: skip
    client = section({**unit, "noise": value("server", "clients"), "weight_cap": value(1.0, 6.0),
                      "adaptive_clipping": st.one_of(st.none(), adaptive), "mechanism": value("gaussian", "tree"),
                      "tree_restart_every": value(1, 2, 4)})  # fmt: skip
    privacy = st.fixed_dictionaries(
        {"instance": st.one_of(st.none(), instance), "local": st.one_of(st.none(), local),
         "client": st.one_of(st.none(), client)},
        optional={"delta": value(1e-5, 0.1), "accountant": value("rdp", "prv", *(["gdp"] if wild else [])),
                  "report_gdp": value(True, False), "noise_seed": value(1, 7), "over_bound": value("keep_hashed", "drop"),
                  **({"no_such_key": st.just(1)} if wild else {})},
    )  # fmt: skip
    secure_aggregation = section({
        "threshold": value(0.4, 0.6, 1.0), "neighbors": value("auto", None, 2, 4, 1), "corrupt_fraction": value(0.0, 0.05, 0.4),
        "dropout_bound": value(0.0, 0.05), "security_bits": value(20.0, 40.0), "correctness_bits": value(10.0, 20.0),
        "graph_seed": value(None, 3), "clip_range": value(0.5, 1e4, 1e12), "frac_bits": value(8, 24, 40),
        "modulus_bits": value(16, 32, 64), "dropout": value(0.0, 0.1), "consistency_check": value(True, False),
        "key_source": value("setup", "file"), "keys_dir": value(None, "/nonexistent/keys"),
    })  # fmt: skip
    ckks = section({
        "poly_modulus_degree": value(4096, 8192, 16384, 5000), "global_scale_bits": value(20, 40, 60),
        "coeff_mod_bit_sizes": value([60, 40, 40, 60], [40, 21, 40], [60], [30, 30, 30], [61, 40]),
        "key_holders": value(1, 3, 100), "encrypt": value(["all"], ["theta"], ["rows"], ["nope"]),
        "row_blocks": value("own", "all"), "decryption_noise": value(2.0**-26, 1e-3, 1e-12),
    })  # fmt: skip
    layers = ["dp", "secure_aggregation", "ckks", "keyed_hashing"]
    unique = st.lists(st.sampled_from(layers), max_size=3, unique=True)
    with_dp = unique.map(lambda x: ["dp", *[n for n in x if n != "dp"]])
    protocols = [unique, with_dp, with_dp]
    if wild:  # duplicates, unknown names, not a list
        protocols += [st.lists(st.sampled_from([*layers, "no_such_layer"]), max_size=4), st.sampled_from(BAD)]
    return {"privacy": privacy, "protocols": st.one_of(*protocols), "secure_aggregation": secure_aggregation, "ckks": ckks,
            "keyed_hashing": section({"pseudonymize_labels": value(True, False)})}  # fmt: skip


SECTIONS = {wild: _strategies(wild) for wild in (False, True)}
ALGORITHMS = sorted(algorithm_specs())
MAIN = ["fedalc", "fedavg", "fedaws"]  # drawn more often: the families most privacy sections apply to


@st.composite
def simple_privacy(draw, algorithm: str) -> dict:
    """One or two DP units with a σ source each (given, or a target ε), the contribution bound where the partition
    needs one: the documents most likely to validate, so that σ's calibration runs often."""
    eps, sigma = st.sampled_from([1.0, 4.0, 1e-4]), st.sampled_from([0.8, 2.0])
    source = st.one_of(st.fixed_dictionaries({"target_epsilon": eps}), st.fixed_dictionaries({"noise_multiplier": sigma}),
                       st.fixed_dictionaries({"target_epsilon": eps, "noise_multiplier": sigma}))  # fmt: skip
    units = ["client", "local", *(["instance", "instance"] if algorithm == "fedalc" else [])]
    chosen = draw(st.lists(st.sampled_from(units), min_size=1, max_size=2, unique=True))
    if "local" in chosen and algorithm == "fedalc" and "instance" not in chosen:
        chosen.append("instance")  # the W step uses every instance too
    privacy = {"accountant": draw(st.sampled_from(["rdp", "prv"]))}
    for unit in chosen:
        privacy[unit] = {**draw(source), "clip_norm": draw(st.sampled_from([0.5, 1.0]))}
    if "instance" in privacy:
        privacy["instance"]["sample_rate"] = 0.5
    if "local" in privacy:
        privacy["local"].update(batch_sample_rate=0.5, max_labels_per_instance=3)
    if "client" in privacy and draw(st.booleans()):
        privacy["client"]["max_labels_per_instance"] = 3
    return privacy


@st.composite
def documents(draw) -> dict:
    """One config document: the tiny base, the core settings the layers check against, and the layers' sections."""
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    wild = draw(st.integers(0, 2)) == 0  # a third of the documents: bad values, unknown keys and names
    sections = SECTIONS[wild]
    doc["algorithm"] = {"name": draw(st.sampled_from([*ALGORITHMS, *MAIN * 2, *(["no_such_algorithm"] if wild else [])]))}
    if doc["algorithm"]["name"] in ("fedalc",) and draw(st.integers(0, 3)):
        doc["algorithm"]["normalize_gamma"] = False  # what privacy.instance needs (eq. 9's σ weights)
    doc["partition"] = {"name": draw(st.sampled_from(["positive_only", "positive_only", "iid", "dirichlet"]))}
    doc["model"] = {**doc["model"], "family": draw(st.sampled_from(["embedding", "embedding", "linear_head"])),
                    "fixed_encoder": draw(st.booleans())}  # fmt: skip
    doc["training"] = {
        **doc["training"],
        "client_fraction": draw(st.sampled_from([1.0, 1.0, 0.5])),
        "sampling": draw(st.sampled_from(["uniform", "poisson", "proportional"])),
        "aggregation": draw(st.sampled_from(["uniform", "uniform", "num_examples"])),
        "rounds": draw(st.sampled_from([1, 3])),
        "server_optimizer": {"name": draw(st.sampled_from(["fedadam", "fedavg"]))},
    }
    if draw(st.integers(0, 9)) == 0:
        doc["backend"] = "flower"
    if not wild and draw(st.booleans()):  # half the plausible documents: a simple DP plan that should mostly validate
        doc["algorithm"] = {"name": draw(st.sampled_from(MAIN))}
        if doc["algorithm"]["name"] == "fedalc":
            doc["algorithm"]["normalize_gamma"] = False
        doc["partition"], doc["protocols"] = {"name": "positive_only"}, ["dp"]
        doc["model"].update(family="embedding", fixed_encoder=False)
        doc["training"].update(aggregation="uniform", sampling="poisson")
        doc["privacy"] = draw(simple_privacy(doc["algorithm"]["name"]))
        return doc
    doc["protocols"] = draw(sections["protocols"])
    doc["privacy"] = draw(sections["privacy"])
    for name in ("secure_aggregation", "ckks", "keyed_hashing"):
        if draw(st.booleans()):
            doc[name] = draw(sections[name])
    return doc


#: issue 52's finding 7: privacy.instance with a noise_multiplier and a privacy.local with neither noise_multiplier nor
#: target_epsilon ended in a TypeError traceback in validate (a ValueError one in run); always tried, besides the draws
ISSUE_52 = {
    **BASE,
    "algorithm": {"name": "fedalc", "normalize_gamma": False},
    "partition": {"name": "positive_only"},
    "protocols": ["dp"],
    "privacy": {"instance": {"noise_multiplier": 1.0, "sample_rate": 0.5},
                "local": {"clip_norm": 1.0, "batch_sample_rate": 0.5, "max_labels_per_instance": 3}},
}  # fmt: skip


def _memo(fn, calls: dict):
    """``fn`` remembered by its arguments, its exception included: σ's calibration (RDP and PRV, seconds a call) is a
    pure function of (target ε, δ, q, steps, accountant), which the documents repeat; each distinct call runs once."""

    def wrapped(*args, **kwargs):
        key = (fn.__name__, repr(args), repr(sorted(kwargs.items())))
        if key not in calls:
            try:
                calls[key] = (True, fn(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - replayed as raised, whatever it is
                calls[key] = (False, exc)
        ok, out = calls[key]
        if not ok:
            raise out
        return out

    return wrapped


def test_every_drawn_privacy_and_protocol_section_validates_or_is_one_config_error(monkeypatch):
    import protocols.dp.accountant as accountant

    calls: dict = {}
    for name in ("calibrate_sigma", "calibrate_shared_sigma", "epsilon_of"):
        monkeypatch.setattr(accountant, name, _memo(getattr(accountant, name), calls))
    seen = {"drawn": 0, "valid": 0, "valid_dp": 0, "refused": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(documents())
    @example(ISSUE_52)
    def check(doc):
        seen["drawn"] += 1
        try:
            plan = load_plan(doc)
            lines = list(validation_lines(plan))
        except SecureFedError as exc:  # the CLI's `error:` line; anything else escapes and fails the test
            assert str(exc).strip(), doc
            seen["refused"] += 1
            return
        seen["valid"] += 1
        if "dp" in plan.protocols:
            seen["valid_dp"] += 1
            assert any(line.startswith("dp ") for line in lines), lines  # the plan (σ, steps, ε) was made

    start = time.perf_counter()
    check()
    took = time.perf_counter() - start
    print(f"drew {seen['drawn']} configs in {took:.1f} s: {seen['valid']} valid ({seen['valid_dp']} with dp listed), "
          f"{seen['refused']} refused with one config error, 0 tracebacks; {len(calls)} distinct accountant calls")  # fmt: skip
    assert seen["drawn"] >= EXAMPLES
    assert seen["valid_dp"] >= 100, seen  # σ's calibration and the plans are exercised, not only the refusals

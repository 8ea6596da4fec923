"""The combinations of DP mechanisms the worst-case check runs (tests/protocols/test_worst_case_combinations.py):
generated from the mechanism registry (:data:`protocols.dp.mechanisms.MECHANISMS`) and the factors below, each
kept only where ``secure-fed validate`` (called in process) accepts it, and the all-pairs cover of the accepted set.

A combination is one value per factor: the algorithm family, the instance unit's W step, DP-SGD in client training
(local noise or noise shares), the client-level mechanism (server noise, client noise shares, DP-FTRL's tree, adaptive
clipping, banded MF), the fixed encoder and the secure layer (none, secure aggregation, CKKS). Each value is a list of config
overrides on a small synthetic experiment (one round)."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
from dataclasses import dataclass

from secure_fed.errors import SecureFedError

#: the most clients one instance may enter (positive-only families); 1 under noise shares (one client per instance)
BOUND, BOUND_SHARES = 2, 1
#: the client-level clip norm: below the updates' norms (0.1 to 0.3 in round 1 here), so every update is clipped
CLIENT_CLIP = 0.02
#: the W step's and DP-SGD's clip norms
INSTANCE_CLIP = LOCAL_CLIP = 1.0

#: one round on a small synthetic data set (6 labels: 6 clients in the positive-only setting)
BASE = [
    "training.rounds=1", "evaluation.every=1", "output.progress=false", "output.checkpoint_every=1",
    "dataset.synthetic.num_train=96", "dataset.synthetic.num_test=48", "dataset.synthetic.num_labels=6",
    "dataset.synthetic.num_groups=2", "dataset.synthetic.num_features=8", "dataset.synthetic.feature_noise=0.6",
    "model.embedding_dim=8", "model.hidden_dims=[8]", "device=cpu", "training.batch_size=16", "privacy.noise_seed=7",
]  # fmt: skip

#: the algorithm families: positive-only (one client per label) and general (a partition of the instances)
FAMILIES: dict[str, list[str]] = {
    "fedalc": ["algorithm.name=fedalc", "algorithm.normalize_gamma=false"],
    "fedaws": ["algorithm.name=fedaws"],
    "fedavg_positive": ["algorithm.name=fedavg"],
    "fedavg_general": ["algorithm.name=fedavg", "partition.name=iid", "partition.num_clients=4"],
    "flag_general": ["algorithm.name=flag", "partition.name=cmda", "partition.num_clients=4", "partition.kmodes_inits=1",
                     "training.server_optimizer={name: fedavg, lr: 1.0}"],
    "fedlgt_general": ["algorithm.name=fedlgt", "model.family=ctran", "model.ctran={layers: 1, heads: 2, token_size: 4}",
                       "partition.name=iid", "partition.num_clients=4", "training.client_optimizer=adam",
                       "training.client_lr=0.003", "algorithm.ule=false"],
}  # fmt: skip
GENERAL = {"fedavg_general", "flag_general", "fedlgt_general"}

#: the factors other than the family, each value → the registered mechanism kinds it declares
W_STEP = {"off": (), "on": ("w_step",)}
LOCAL = {"off": (), "local": ("dp_sgd",), "shares": ("dp_sgd_shares",), "split": ("dp_sgd",)}
CLIENT = {"off": (), "server": ("client_server_noise",), "clients": ("client_noise_shares",), "tree": ("client_tree",),
          "adaptive": ("adaptive_clipping",), "banded": ("client_banded",)}  # fmt: skip
ENCODER = ("trained", "fixed")
SECURE = {"none": [], "secure_aggregation": ["secure_aggregation"], "ckks": ["ckks"]}

FACTORS = ("family", "w_step", "local", "client", "encoder", "secure")


@dataclass(frozen=True)
class Combination:
    family: str
    w_step: str
    local: str
    client: str
    encoder: str
    secure: str

    @property
    def name(self) -> str:
        return "-".join(getattr(self, f) for f in FACTORS)

    @property
    def kinds(self) -> set[str]:
        """The registered mechanism kinds this combination declares."""
        return {*W_STEP[self.w_step], *LOCAL[self.local], *CLIENT[self.client]}

    @property
    def bound(self) -> int | None:
        if self.family in GENERAL:
            return None
        return BOUND_SHARES if self.local == "shares" else BOUND

    def overrides(self) -> list[str]:
        """The config overrides of this combination."""
        k = self.bound
        kb = "" if k is None else f', "max_labels_per_instance": {k}'
        out = [*BASE, *FAMILIES[self.family], f"protocols={['dp', *SECURE[self.secure]]}".replace("'", '"')]
        if self.w_step == "on":
            out.append('privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.5, "clip_norm": 1.0' + kb + "}")
        if self.local == "local":
            out.append('privacy.local={"noise_multiplier": 1.0, "clip_norm": 1.0, "batch_sample_rate": 0.5' + kb + "}")
        elif self.local == "split":  # the clip split over an instance's copies: full-batch steps, one a round here
            out += ['privacy.local={"noise_multiplier": 1.0, "clip_norm": 1.0, "batch_sample_rate": 1.0, "copy_clip": "split"'
                    + kb + "}", "training.local_epochs=1"]  # fmt: skip
        elif self.local == "shares":
            out += ['privacy.local={"noise_multiplier": 1.0, "clip_norm": 1.0, "batch_sample_rate": 1.0, "noise": "shares"'
                    + kb + "}", "training.local_epochs=1"]  # fmt: skip
        if self.client != "off":
            extra = {"server": "", "clients": ', "noise": "clients"', "tree": ', "mechanism": "tree"',
                     "adaptive": ', "adaptive_clipping": {"count_noise_multiplier": 2.0}',
                     "banded": ', "mechanism": "banded", "bands": 1'}[self.client]  # fmt: skip
            if self.family == "flag_general":
                extra += ', "weight_cap": 100.0'
            out.append(f'privacy.client={{"noise_multiplier": 1.0, "clip_norm": {CLIENT_CLIP}' + kb + extra + "}")
            if self.client == "tree":
                out += ["training.client_fraction=1.0", "training.server_optimizer={name: fedavg, lr: 1.0}"]
            elif self.client == "banded":  # one round: every client (period 1), one band, as any b ≤ P would start
                out += ["training.client_fraction=1.0", "training.sampling=cyclic"]
            else:
                out += ["training.client_fraction=0.75", "training.sampling=poisson"]
        if self.encoder == "fixed":
            out.append("model.fixed_encoder=true")
        return out


def every_combination() -> list[Combination]:
    """The full product of the factors, less the one with no mechanism (no DP layer, nothing to check)."""
    out = []
    for vals in itertools.product(FAMILIES, W_STEP, LOCAL, CLIENT, ENCODER, SECURE):
        c = Combination(*vals)
        if c.kinds:
            out.append(c)
    return out


def validate(c: Combination) -> str | None:
    """None where ``secure-fed validate`` accepts the combination, else its refusal (the error line)."""
    from secure_fed.cli import cmd_validate

    args = argparse.Namespace(config=None, overrides=c.overrides(), data_root=None)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cmd_validate(args)
    except SecureFedError as exc:
        return str(exc).splitlines()[0]
    return None


def pairwise_cover(combos: list[Combination]) -> list[Combination]:
    """A greedy all-pairs cover of ``combos``: every pair of factor values that occurs together in some combination
    of ``combos`` occurs in a chosen one (deterministic: ties go to the earliest)."""

    def pairs(c: Combination) -> set[tuple]:
        vals = [(f, getattr(c, f)) for f in FACTORS]
        return {(a, b) for a, b in itertools.combinations(vals, 2)}

    todo = set().union(*(pairs(c) for c in combos)) if combos else set()
    chosen = []
    while todo:
        best = max(combos, key=lambda c: len(pairs(c) & todo))
        chosen.append(best)
        todo -= pairs(best)
    return chosen

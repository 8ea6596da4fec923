"""What a DP mechanism plugin (e.g. ``privacy.label_prior``) cannot run beside, and a banded run's schedule on resume.

Each refusal guards an ε that would otherwise not hold as reported (an independent review reproduced each):
a tree or banded client unit rebuilds its ledger from its own mechanism, leaving the plugin's release out of the
client unit's ε and its budget stop; a client target ε is calibrated before the release joins that ledger; two targets
for one instance ledger leave one unmet. A banded run's sensitivity holds for one cyclic period over the whole run.
"""

from __future__ import annotations

import pytest

from protocols.dp.banded_release import BandedNoise
from protocols.randomness import SecretStream
from secure_fed.config import load_plan
from secure_fed.errors import ConfigError

BASE = [
    "protocols=[dp]",
    "algorithm.name=fedaws",
    "privacy.label_prior={target_epsilon: 1, max_labels_per_instance: 4, client_clip_norm: 1}",
]


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["privacy.client={noise_multiplier: 1, clip_norm: 1, mechanism: banded, bands: 2}", "training.sampling=cyclic",
          "training.client_fraction=0.5"], "mechanism: banded"),
        (["privacy.client={noise_multiplier: 1, clip_norm: 1, mechanism: tree}", "training.sampling=uniform",
          "training.server_optimizer.name=fedavg"],
         "mechanism: tree"),
        (["privacy.client={target_epsilon: 4, clip_norm: 1}"], "privacy.client.target_epsilon"),
        (["privacy.instance={target_epsilon: 8}"], "beside the instance unit's target"),
    ],
)  # fmt: skip
def test_a_plugin_is_refused_where_its_release_would_escape_a_ledger_or_a_target(extra, why):
    with pytest.raises(ConfigError, match=why.replace(".", r"\.")):
        load_plan(overrides=[*BASE, *extra])


def test_a_plugin_runs_beside_a_gaussian_client_unit_with_its_own_noise_multiplier():
    plan = load_plan(overrides=[*BASE, "privacy.client={noise_multiplier: 1, clip_norm: 1}"])
    assert plan.protocols == ("dp",)


def test_a_banded_resume_with_another_cyclic_period_is_refused():
    """The recursion's state records the period P it was derived for; a resume under another P (another
    ``training.client_fraction``) is one error line, the same P loads."""
    stream = SecretStream(b"p" * 32)
    state = BandedNoise(stream, "lbl", 2, period=2).state_dict()
    BandedNoise(stream, "lbl", 2, period=2).load_state_dict(state)
    with pytest.raises(ConfigError, match="cyclic period of banded noise from 2 to 4"):
        BandedNoise(stream, "lbl", 2, period=4).load_state_dict(state)

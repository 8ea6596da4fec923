"""The example clipping layer (``examples/plugins/clipping_layer``), registered by entry points alone: its section
validates, it runs with the built-in layers around it, and every client update it lets out is clipped."""

from __future__ import annotations

import math

import pytest

from tests.config.test_bad_input import assert_one_error_line
from tests.examples.helpers import CLIENT_DP, norm, run, uplinks, validate

MAX_NORM = 0.05  # below the clients' update norms on the small default (~0.1-0.4), below dp's clip_norm 1.0


@pytest.fixture
def clip_spy(plugin_path, monkeypatch):
    """The norms of each update before and after the layer's clip (the client side, in process)."""
    from clipping_layer import layer

    seen: list[tuple[float, float]] = []
    real = layer.clip

    def spy(reply, max_norm):
        out = real(reply, max_norm)
        seen.append((norm(reply), norm(out)))
        return out

    monkeypatch.setattr(layer, "clip", spy)
    return seen


@pytest.mark.parametrize("stack", [["clipping", "dp"], ["clipping", "dp", "secure_aggregation"]], ids="+".join)
def test_every_client_update_is_clipped_under_dp(tmp_path, clip_spy, stack):
    protocols = ", ".join(f'"{n}"' for n in stack)
    result = run(tmp_path, "algorithm.name=fedavg", f"protocols=[{protocols}]", f"clipping.max_norm={MAX_NORM}", CLIENT_DP)
    assert result.summary["rounds_completed"] == 2 and result.summary["protocols"] == stack
    assert len(clip_spy) == 2 * result.summary["num_clients"]  # every client, every round (cohort: all of them)
    assert all(after <= MAX_NORM * (1 + 1e-6) for _, after in clip_spy), clip_spy
    assert any(before > MAX_NORM * 1.5 for before, _ in clip_spy), "no update needed clipping: the test shows nothing"
    assert math.isfinite(result.summary["privacy"]["epsilon"])
    if "secure_aggregation" not in stack:  # the server's noise: what the clients sent is the plaintext clipped update
        sent = uplinks(result)
        assert len(sent) == len(clip_spy) and all(norm(u) <= MAX_NORM * (1 + 1e-6) for u in sent)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["clipping.max_norm=-1"], "clipping.max_norm"),
        (["clipping.max_norm=.nan"], "clipping.max_norm"),
        (["clipping.norm=1"], "clipping.norm: unknown key"),
        (['protocols=["secure_aggregation", "clipping"]'], "'clipping' must come before 'secure_aggregation'"),
    ],
    ids=["negative", "nan", "unknown-key", "after-secure-sum"],
)
def test_a_bad_clipping_section_is_refused_with_one_error_line(plugin_path, overrides, needle):
    assert_one_error_line(*validate(plugin_path, 'protocols=["clipping"]', *overrides), needle)


def test_the_default_with_the_layer_validates(plugin_path):
    code, err = validate(plugin_path, 'protocols=["clipping"]', "clipping.max_norm=0.5")
    assert code == 0, err

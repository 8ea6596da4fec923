"""The engine redesign changed no result: each golden run (tests/engine/golden.py) reproduces the figures
recorded before it — metrics, ε and the SHA-256 of the final θ and W bit for bit, and the CKKS case to
CKKS precision (fresh encryption noise each run).

Re-recorded once on purpose (θ, W, metrics and norms; never ε): when FedALC's and FedAwS's top-k regularisers
moved to neighbour pairs and sparse co-occurrence weights (no C × C matrix), floating-point sums reassociated;
every figure stayed within 1e-5 relative of the earlier recording except Bibtex P@1/nDCG@1 (one test instance
of 2,515). Re-recorded a second time (the same figures) when every case began to run with one torch thread
(``golden.RECORDED_THREADS``: a matrix product's sums split by thread, so the hashes depended on the machine's core
count): every figure within 7e-6 relative except Bibtex mAP and O-AP (within 3e-4) and the bias norms (1.3e-4).
The JSON's ``rerecorded`` field says so."""

from __future__ import annotations

import json

import pytest

from secure_fed.config import load_config
from tests.engine.golden import CASES, GOLDEN, close, run_case


@pytest.mark.parametrize("name", list(CASES))
def test_golden_run_is_reproduced(tmp_path, name, request):
    exact = CASES[name][2]
    data_root = request.getfixturevalue("data_root") if "bibtex" in name else None
    recorded = json.loads(GOLDEN.read_text())["cases"][name]
    now = run_case(name, tmp_path, str(data_root) if data_root else None)
    _changed_on_purpose(now, recorded)
    if exact:
        assert now == recorded
    else:  # CKKS: θ, W and ε to its precision; the exact hashes necessarily differ
        for key in ("privacy", "theta_norms", "W_norm_of_difference_from_init"):
            assert close(now[key], recorded[key], rel=1e-3, abs_=1e-4), key
        # fresh encryption error (about 1e-8 on the scores) can swap two near-tied scores, which moves a ranking
        # metric by one test instance (100/1,000 points); ε in each line stays to CKKS precision
        assert len(now["metrics"]) == len(recorded["metrics"])
        one = 100 / load_config(None, CASES[name][1]).dataset.synthetic.num_test
        for now_m, rec_m in zip([now["final"], *now["metrics"]], [recorded["final"], *recorded["metrics"]], strict=True):
            assert now_m.keys() == rec_m.keys()
            for k in now_m:  # ranking and threshold metrics (P@k, nDCG@k, O-AP, mAP, C-F1, ...) to one instance
                ranked = k.startswith(("P@", "nDCG@", "O-", "C-", "mAP"))
                assert close(now_m[k], rec_m[k], rel=1e-3, abs_=one + 1e-9 if ranked else 1e-4), k


def _changed_on_purpose(now: dict, recorded: dict) -> None:
    """The one figure a bug fix changed after recording: client DP's instance-level bound. Removing an instance
    replaces (not removes) each of its k clients' data, two add/remove changes each, so the group is 2k, not k
    (review of the privacy-correctness work). Checked here as that relation, then set aside."""
    a = now["privacy"].get("units", {}).get("client", {}).pop("instance_level", None)
    b = recorded["privacy"].get("units", {}).get("client", {}).pop("instance_level", None)
    assert (a is None) == (b is None)
    if a is not None:
        assert a["group_size"] == 2 * b["group_size"]
        assert a["epsilon"] == pytest.approx(2 * b["epsilon"])
    # `not_covered` of the instance unit, disclosures added after recording: the label space is public (review of
    # the privacy-correctness work), feature standardisation statistics are computed in the clear (review of client
    # DP-SGD), and the advice for client training now names privacy.local (client DP-SGD) instead of privacy.client
    new = now["privacy"].get("units", {}).get("instance", {}).get("not_covered")
    old = recorded["privacy"].get("units", {}).get("instance", {}).get("not_covered")
    if new is not None:
        added = ("which labels have a training instance", "feature standardisation")
        kept = [x for x in new if not x.startswith(added)]
        kept = [x.replace("add privacy.local to cover it", "add privacy.client to cover it") for x in kept]
        assert kept == old and any(x.startswith(added[0]) for x in new)
        now["privacy"]["units"]["instance"]["not_covered"] = old

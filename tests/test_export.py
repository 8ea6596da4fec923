"""``secure-fed export``: the release-safe model holds θ, W, the public config and the privacy report, nothing else."""

from __future__ import annotations

import json

import scipy.sparse as sp
import torch

from tests.config.test_bad_input import assert_one_error_line, cli
from tests.conftest import SMALL

#: fedalc (its label sets in the algorithm's state), client-level DP with a seeded noise stream (a secret setting)
RUN = [*SMALL, "training.rounds=2", "algorithm.name=fedalc", "algorithm.normalize_gamma=false", 'protocols=["dp"]',
       'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}', "privacy.noise_seed=7"]  # fmt: skip


def _tensors(obj, path="") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj``, with a sparse matrix (e.g. fedalc's label sets) as a dense tensor of its values."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if sp.issparse(obj):
        return [(path, torch.from_numpy(obj.toarray()))]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _tensors(v, f"{path}/{k}")]
    if isinstance(obj, (list, tuple)):
        return [x for i, v in enumerate(obj) for x in _tensors(v, f"{path}[{i}]")]
    return []


def _run(tmp_path):
    run = tmp_path / "run"
    code, out, err = cli("run", "--out", str(run), *[x for o in RUN for x in ("--set", o)])
    assert code == 0, err
    assert "privacy: ε = ∞ for the released W: W's label-set step has no DP noise (client unit ε = " in out
    return run


def test_export_holds_exactly_the_release_safe_parts(tmp_path):
    run = _run(tmp_path)
    code, out, err = cli("export", str(run), "--out", str(tmp_path / "model.pt"))
    assert code == 0 and "wrote" in out, err
    doc = torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=True)  # plain tensors and data only
    assert set(doc) == {"theta", "W", "config", "privacy"}

    final = torch.load(run / "private" / "checkpoints" / "final.pt", map_location="cpu", weights_only=False)
    assert set(doc["theta"]) == set(final["theta"])
    for name, t in doc["theta"].items():
        assert torch.equal(t, final["theta"][name])
    assert torch.equal(doc["W"], final["W"])
    assert doc["privacy"] == json.loads((run / "summary.json").read_text())["privacy"]
    assert "noise_seed" not in doc["config"]["privacy"] and doc["config"]["algorithm"]["name"] == "fedalc"

    # no tensor of the private parts: the rest of final.pt (label sets, optimiser moments, ledger, records), the
    # clients' and the server's checkpoints
    private = [(p, t) for p, t in _tensors(final) if not p.startswith(("/theta/", "/W"))]
    for f in ("clients.pt", "server_secrets.pt"):
        private += _tensors(torch.load(run / "private" / "checkpoints" / f, map_location="cpu", weights_only=False), f)
    assert any(p.endswith("label_sets") for p, _ in private)  # the check has the label sets to look for
    exported = _tensors({k: doc[k] for k in ("theta", "W")})
    for ep, e in exported:
        for pp, p in private:
            assert not (e.shape == p.shape and e.dtype == p.dtype and torch.equal(e, p)), f"{ep} is {pp}"
    # and the file holds no more bytes than θ and W themselves (no shared storage carrying other data)
    size = sum(t.untyped_storage().nbytes() for _, t in exported)
    assert size == sum(t.numel() * t.element_size() for _, t in exported)


def test_export_refuses_a_missing_or_unfinished_run_and_writes_nothing(tmp_path):
    out = tmp_path / "model.pt"
    code, _, err = cli("export", str(tmp_path / "nope"), "--out", str(out))
    assert_one_error_line(code, err, "not a run directory")
    assert not out.exists()
    run = _run(tmp_path)
    summary = run / "summary.json"
    doc = json.loads(summary.read_text())
    summary.write_text(json.dumps({**doc, "status": "interrupted"}))
    code, _, err = cli("export", str(run), "--out", str(out))
    assert_one_error_line(code, err, "did not train to its end")
    summary.unlink()
    code, _, err = cli("export", str(run), "--out", str(out))
    assert_one_error_line(code, err, "has not finished")
    summary.write_text(json.dumps(doc))
    (run / "private" / "checkpoints" / "final.pt").unlink()
    code, _, err = cli("export", str(run), "--out", str(out))
    assert_one_error_line(code, err, "final.pt is missing")
    assert not out.exists() and not list(tmp_path.glob("model.pt*"))

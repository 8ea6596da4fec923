"""``secure-fed export RUN --out model.pt``: the release-safe model file of a finished run.

A run directory's checkpoints (``private/checkpoints/``, never released) hold far more than the model: ``final.pt``
also carries the optimiser moments,
the algorithm's state (e.g. fedalc's label sets), the ledger and the records with their diagnostics; beside
it lie the clients' and the server's secrets. The export holds exactly :data:`EXPORT_KEYS`:

* ``theta``: the encoder's parameters, ``W``: the class embeddings (None for a model without them), each tensor
  copied into its own storage (``torch.save`` writes a view's whole storage, which could hold more);
* ``config``: the run's config, less every setting its section marks secret
  (:mod:`secure_fed.secret_settings`: e.g. the seeds of DP noise or of secure aggregation's graph);
* ``privacy``: the released privacy report (``summary.json``'s ``privacy``).

The document goes through the release gate (:func:`secure_fed.release.release_fields`): θ and W are tagged as the
released model, the config and the report public; a field left untagged makes the file's ε ∞ with its one-line why
(strict mode: raises).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from secure_fed.errors import SecureFedError
from secure_fed.release import RELEASED_MODEL, protected, public, release_fields, with_infinite_epsilon
from secure_fed.run_files import EXPORT_FILE, PRIVACY_RECORD, checkpoint_dir
from secure_fed.run_status import trained

EXPORT_KEYS = ("theta", "W", "config", PRIVACY_RECORD)


def public_config(doc: dict[str, Any]) -> dict[str, Any]:
    """The config mapping without the settings its sections mark secret (found in the config model, plugin sections
    included, so the core names none)."""
    from secure_fed.config import config_secret_paths
    from secure_fed.secret_settings import without_secrets

    return without_secrets(doc, config_secret_paths())


def _finished(run_dir: Path) -> tuple[dict[str, Any], Path]:
    """The summary and ``final.pt`` of a run that trained to its end; one error naming what is missing otherwise."""
    if not (run_dir / "config.yaml").is_file():
        raise SecureFedError(f"cannot export {run_dir}: not a run directory (no config.yaml)")
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise SecureFedError(f"cannot export {run_dir}: the run has not finished (no summary.json)")
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError:
        raise SecureFedError(f"cannot export {run_dir}: {summary_path} is not valid JSON") from None
    if not trained(summary.get("status")):
        raise SecureFedError(f"cannot export {run_dir}: it did not train to its end (status {summary.get('status')!r})")
    final = checkpoint_dir(run_dir) / "final.pt"
    if not final.is_file():
        raise SecureFedError(f"cannot export {run_dir}: {final} is missing")
    return summary, final


def export_model(run_dir: str | Path, out: str | Path) -> Path:
    """Write the release-safe model of ``run_dir`` to ``out`` (whole, or nothing: a temporary file renamed)."""
    import torch
    import yaml

    from secure_fed.engine.checkpoints import load_checkpoint_file

    run_dir, out = Path(run_dir), Path(out)
    summary, final = _finished(run_dir)
    if out.is_dir():
        raise SecureFedError(f"--out {out}: a directory; give the path of the model file to write")
    from secure_fed.io import check_writable_dir

    check_writable_dir(out.parent, what="--out's folder")
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except yaml.YAMLError:
        raise SecureFedError(f"cannot export {run_dir}: its config.yaml is not valid YAML") from None
    sd = load_checkpoint_file(final)
    tagged = {
        "theta": protected({name: t.detach().clone() for name, t in sd["theta"].items()}, RELEASED_MODEL),
        "W": protected(None if sd.get("W") is None else sd["W"].detach().clone(), RELEASED_MODEL),
        "config": public(public_config(config), "the run's released config.yaml, less every setting marked secret"),
        PRIVACY_RECORD: public(summary[PRIVACY_RECORD], "summary.json's privacy report, as the run released it"),
    }
    doc, findings = release_fields(tagged, EXPORT_FILE)
    if findings:
        doc[PRIVACY_RECORD] = with_infinite_epsilon(doc[PRIVACY_RECORD], findings)
    assert tuple(doc) == EXPORT_KEYS
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(doc, tmp)
    tmp.replace(out)
    return out

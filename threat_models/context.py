"""The simulator's knowledge of a finished run, and the views it hands to attackers.

:class:`AuditContext` holds everything: the data, the partition, the label
re-indexing, the server's recorded view, what the attacks inserted (the auditor's canaries). Attacks use it
only in :meth:`~threat_models.base.Attack.prepare` (to build auxiliary
knowledge and ground truth); their attacking step sees one view.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from protocols.config_sections import KeyedHashingConfig
from secure_fed.plugin_api.attacks import SecureFedError, load_checkpoint_file
from threat_models.base import Role
from threat_models.recording import recording_of
from threat_models.views import ClientView, ObserverView, RoundCapture, ServerView


class AuditContext:
    def __init__(self, exp):
        self.exp = exp
        #: the run's settings
        self.plan = exp.plan
        self.dataset = exp.dataset
        self.fed = exp.fed
        taps = recording_of(exp)
        #: the server's recorded view (None when the run did not record it)
        self.tap = taps.tap if taps is not None else None
        #: attack name → what it inserted into training (e.g. the auditor's canaries; :meth:`inserted`)
        self.insertions: dict[str, Any] = taps.inserted() if taps is not None else {}
        self._files = {n: r.file for n, r in taps.recorders.items()} if taps is not None else {}

    @classmethod
    def from_run_dir(
        cls, run_dir: str | Path, *, data_root: str | None = None, attacks: list[str] | None = None,
        overrides: list[str] | None = None,
    ) -> AuditContext:  # fmt: skip
        """Rebuild a finished run from ``RUN_DIR`` (the operator's ``private/config.yaml`` and checkpoints);
        ``overrides`` (``attacks.*`` settings, as ``audit --set``) apply to its config."""
        from secure_fed.config import load_plan
        from secure_fed.plugin_api.attacks import build_experiment, checkpoint_dir, operator_config_path

        run_dir = Path(run_dir)
        if not (run_dir / "config.yaml").is_file():
            raise SecureFedError(f"{run_dir} is not a run directory (no config.yaml)")
        if not operator_config_path(run_dir).is_file():
            raise SecureFedError(f"{run_dir} holds no {operator_config_path(run_dir)} (the operator's config, with the "
                                 "checkpoints under private/): the run cannot be rebuilt from its released files")  # fmt: skip
        overrides = [*(overrides or []), *([f"attacks.run=[{','.join(attacks)}]"] if attacks else [])]
        plan = load_plan(operator_config_path(run_dir), overrides)
        ckpt = checkpoint_dir(run_dir)
        exp = build_experiment(plan, run_dir=run_dir, data_root=data_root)
        if not exp.resume():
            raise SecureFedError(f"{run_dir} has no checkpoint (private/checkpoints/last.pt); run it first")
        summary = run_dir / "summary.json"
        if not summary.is_file():
            raise SecureFedError(f"{run_dir} has not finished (no summary.json); finish it with: secure-fed resume {run_dir}")
        status = json.loads(summary.read_text()).get("status")
        if status == "interrupted":  # the attacks would score a partial model, and their file outlive the finished run
            raise SecureFedError(f"{run_dir} has not finished (status interrupted); finish it with: secure-fed resume {run_dir}")
        final = ckpt / "final.pt"
        if final.is_file():  # the released model (a centralised baseline's is the epoch it selected, not the last)
            sd = load_checkpoint_file(final)
            exp.theta = {n: t.to(exp.device) for n, t in sd["theta"].items()}
            exp.W = None if sd["W"] is None else sd["W"].to(exp.device)
        ctx = cls(exp)
        if not (ckpt / "server_view.pt").is_file():
            ctx.tap = None  # trained without attacks configured: the server's view was not recorded
        for name in [n for n in ctx.insertions if not (ckpt / ctx._files[n]).is_file()]:
            del ctx.insertions[name]  # trained without this attack listed: it inserted nothing in this run
        return ctx

    def inserted(self, attack: str) -> Any:
        """What ``attack`` inserted into this run's training and kept (its recorder's secrets, e.g. canaries), or
        None when it inserted nothing (not listed in ``attacks.run`` before training, or its settings turned it off)."""
        return self.insertions.get(attack)

    # ------------------------------------------------------------------ facts the simulator knows
    @property
    def row_of_label(self) -> np.ndarray:
        """W row of each label (keyed pseudonyms re-index rows; identity otherwise)."""
        perm = self.exp.label_perm
        return np.arange(self.dataset.num_labels) if perm is None else np.asarray(perm)

    @property
    def pseudonymized(self) -> bool:
        return "keyed_hashing" in self.plan.protocols and self.plan.part(KeyedHashingConfig).pseudonymize_labels

    def privacy(self) -> dict[str, Any]:
        return self.exp.privacy_summary()

    def new_encoder(self) -> torch.nn.Module:
        """The public architecture of θ's module (the model family's, e.g. the encoder with its linear head),
        weights to be loaded from a view."""
        from secure_fed.plugin_api.attacks import build_model

        return build_model(self.plan, self.dataset, cache_dir=self.exp.run_dir / "cache")

    def _rows(self) -> torch.Tensor | None:
        """The server's W on the CPU (None for a model family without a row table)."""
        return None if self.exp.W is None else self.exp.W.detach().cpu()

    # ------------------------------------------------------------------ views
    def server_view(self) -> ServerView:
        exp, tap = self.exp, self.tap
        algo = exp.algorithm
        label_sets = getattr(algo, "label_sets", None)
        tokenizer = None
        if label_sets is not None:
            tokenizer = "hmac-sha256" if "keyed_hashing" in self.plan.protocols else self.plan.algorithm.tokenizer
        names = tuple(self.dataset.label_names)
        capture = None
        if tap is not None and tap.capture is not None:
            capture = RoundCapture(**tap.capture)
        return ServerView(
            config=self.plan.config_yaml,
            tokenizer=tokenizer,
            token_messages=tuple(tap.token_messages) if tap is not None else (),
            label_sets=None if label_sets is None else label_sets.copy(),
            row_names=None if self.pseudonymized else names,
            label_vocabulary=tuple(sorted(names)),
            theta0=self.theta0(),
            theta={n: t.detach().cpu().clone() for n, t in exp.theta.items()},
            W=None if exp.W is None else self._rows().clone(),
            capture=capture,
            privacy=self.privacy(),
        )

    def theta0(self) -> dict[str, torch.Tensor]:
        if self.tap is not None:
            return {n: t.clone() for n, t in self.tap.theta0.items()}
        enc = self.new_encoder()  # θ⁰ is public: it follows from the config's seed
        return {n: p.detach().cpu().clone() for n, p in enc.named_parameters()}

    def observer_view(self) -> ObserverView:
        exp = self.exp
        W = self._rows()
        W = None if W is None else W[torch.as_tensor(self.row_of_label)].clone()
        return ObserverView(
            config=self.plan.config_yaml,
            theta0=self.theta0(),
            theta={n: t.detach().cpu().clone() for n, t in exp.theta.items()},
            W=W,
            label_names=tuple(self.dataset.label_names),
            privacy=self.privacy(),
        )

    def client_view(self, cid: int) -> ClientView:
        c = self.fed.clients[cid]
        W = self._rows()
        rows = None if W is None else W[c.known_labels].clone()
        return ClientView(
            client_id=cid, raw=c.raw.copy(), labels=tuple(int(i) for i in c.known_labels),
            theta={n: t.detach().cpu().clone() for n, t in self.exp.theta.items()}, rows=rows,
        )  # fmt: skip

    def view_for(self, role: Role, **kw):
        if role is Role.SERVER:
            return self.server_view()
        if role in (Role.OBSERVER, Role.AUDITOR):
            return self.observer_view()
        return self.client_view(kw.get("client_id", 0))

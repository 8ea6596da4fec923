"""Attack (g): gradient inversion on images — rebuild a client's pictures from its FedAvg update.

Geiping, Bauermeister, Dröge & Moeller (NeurIPS 2020), "Inverting Gradients — How easy is it to break privacy in
federated learning?": the server knows θ, the public architecture and loss, and a client's update. With one local
step of plain SGD on a batch of ``n`` images (``training.local_epochs: 1``, the client holding at most
``training.batch_size`` rows) the update is ``Δθ = −η·∇L(θ; x, y)``, a gradient up to its (unknown) scale. The
attacker draws ``n`` dummy images ``x̂`` in [0, 1], takes the gradient ``ĝ = ∇L(θ; x̂, y)`` with
``create_graph``, and minimises ``1 − cos(ĝ, −Δθ)`` (over all parameters at once; cosine: the step size and any
clipping scale drop out) plus ``tv · TV(x̂)`` (the total-variation image prior) by Adam, with the paper's step
decay, projecting onto [0, 1] after each step.

Labels: for one image the head's bias gradient is ``σ(z) − y`` per label under BCE (and of the same sign for the
other multi-label losses), negative exactly on the image's labels, so ``Δb > 0`` reads them (iDLG's sign argument
for a multi-label head). For a batch of more than one they are *given* to the attacker (stated in the result's
``details``): a generous attacker, so a low score is not an artefact of wrong labels.

Scored: PSNR (dB, pixels in [0, 1]) and SSIM of each reconstruction against the client's true images (the
reconstructions matched to the images by the assignment with the highest total PSNR), beside the chance level:
the PSNR of the mean image of public data (the test split) against the same true images.

Defences measured (:func:`measure`): DP (the update clipped to C, Gaussian noise of std σC with σ calibrated to
ε ≤ 8 for the round: what the server sees under ``privacy.client.noise: clients`` with a secure sum, or anyone
who sees the noisy sum) and secure aggregation (only the sum of ≥ 10 clients' updates, attacked as if it were one
client's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from secure_fed.plugin_api.attacks import IMAGENET_MEAN, IMAGENET_STD, LOSSES, full_label_targets
from threat_models.attacks.gradient_inversion_spec import SPEC
from threat_models.base import Attack, AttackResult

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ---------------------------------------------------------------------------------------------------- image scores
def psnr(x: torch.Tensor, y: torch.Tensor, peak: float = 1.0) -> torch.Tensor:
    """Per-image PSNR in dB of ``x`` against ``y`` (same shape ``(n, ...)``, values in [0, peak])."""
    mse = ((x.double() - y.double()) ** 2).flatten(1).mean(dim=1)
    return 10 * torch.log10(peak**2 / mse.clamp_min(1e-12))


def ssim(x: torch.Tensor, y: torch.Tensor, win: int = 7) -> torch.Tensor:
    """Per-image SSIM of ``x`` against ``y`` ``(n, C, H, W)`` in [0, 1]: Wang et al. 2004 with a uniform ``win``-pixel
    window and sample covariances (scikit-image's defaults), averaged over channels and valid windows."""
    x, y = x.double(), y.double()
    c1, c2 = 0.01**2, 0.03**2
    cov = win * win / (win * win - 1)

    def avg(t):
        return F.avg_pool2d(t, win, stride=1)

    mx, my = avg(x), avg(y)
    vx, vy = cov * (avg(x * x) - mx * mx), cov * (avg(y * y) - my * my)
    vxy = cov * (avg(x * y) - mx * my)
    s = ((2 * mx * my + c1) * (2 * vxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return s.flatten(1).mean(dim=1)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels (anisotropic TV), the image prior."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def matched_scores(recon: torch.Tensor, truth: torch.Tensor) -> dict[str, np.ndarray]:
    """PSNR and SSIM of each true image against the reconstruction assigned to it (maximum total PSNR)."""
    n, m = len(truth), len(recon)
    table = torch.stack([psnr(recon, truth[i].expand_as(recon)) for i in range(n)]).numpy()  # (true, recon)
    rows, cols = linear_sum_assignment(-table)
    order = np.empty(n, dtype=np.int64)
    order[rows] = cols
    if n > m:  # more true images than reconstructions: the rest take their best reconstruction
        rest = np.setdiff1d(np.arange(n), rows)
        order[rest] = table[rest].argmax(axis=1)
    matched = recon[torch.as_tensor(order)]
    return {"psnr": psnr(matched, truth).numpy(), "ssim": ssim(matched, truth).numpy(), "order": order}


# ---------------------------------------------------------------------------------------------------- the attack
def labels_from_head_update(head_bias_delta: torch.Tensor) -> torch.Tensor:
    """One image's labels from the head bias's update: the labels it moved up (``Δb = −η(σ(z) − y) > 0``)."""
    return (head_bias_delta > 0).float().unsqueeze(0)


def _cosine_distance(grads: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> torch.Tensor:
    dot = sum((g * t).sum() for g, t in zip(grads, target, strict=True))
    gn = torch.sqrt(sum((g * g).sum() for g in grads))
    tn = torch.sqrt(sum((t * t).sum() for t in target))
    return 1 - dot / (gn * tn + 1e-12)


def invert_gradients(
    model: torch.nn.Module,
    loss_fn: LossFn,
    update: dict[str, torch.Tensor],
    labels: torch.Tensor,
    image_shape: tuple[int, int, int],
    to_input: Callable[[torch.Tensor], torch.Tensor],
    *,
    steps: int = 300,
    lr: float = 0.1,
    tv: float = 1e-2,
    seed: int = 0,
    match: bool = True,
) -> torch.Tensor:
    """Images ``(n, C, H, W)`` in [0, 1] whose gradient at ``model``'s weights best matches ``−update`` in cosine.

    ``update``: Δθ per parameter name (parameters it lacks, or that do not require grad, are not matched);
    ``labels``: ``(n, L)`` targets for ``loss_fn(model(x), labels)``; ``to_input`` maps pixel images to the model's
    input (the public preprocessing). ``match=False`` skips the optimisation (the random start: a control).
    """
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad and k in update]
    params = [p for _, p in named]
    target = [-update[k].detach().to(p.dtype) for k, p in named]
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((len(labels), *image_shape), generator=gen).requires_grad_(True)
    if not match:
        return x.detach()
    opt = torch.optim.Adam([x], lr=lr)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[int(steps * f) for f in (3 / 8, 5 / 8, 7 / 8)], gamma=0.1)
    model.eval()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(to_input(x)), labels)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        obj = _cosine_distance(grads, target) + tv * total_variation(x)
        x.grad = torch.autograd.grad(obj, x)[0]
        opt.step()
        sched.step()
        with torch.no_grad():
            x.clamp_(0, 1)
    return x.detach()


def image_input(mean: Sequence[float], std: Sequence[float]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The ``image`` preprocessing (:class:`secure_fed.models.preprocess.Preprocessor`) on pixel tensors in [0, 1]:
    per-channel normalisation, rows flattened channel-major."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return lambda x: ((x - m) / s).flatten(1)


# ---------------------------------------------------------------------------------------------------- the audit's attack
def pixel_images(raw, shape: tuple[int, int, int]) -> torch.Tensor:
    """Raw image rows (uint8, CSR or dense, channel-major) as pixel tensors ``(n, C, H, W)`` in [0, 1]."""
    dense = raw.toarray() if sp.issparse(raw) else np.asarray(raw)
    scale = 1 / 255 if dense.dtype == np.uint8 else 1.0
    return torch.from_numpy(dense.astype(np.float32) * np.float32(scale)).view(-1, *shape)


class GradientInversion(Attack):
    """The server's attack on the captured round (the last run; record it with ``attacks.run`` set before training):
    each of ``targets`` clients' own update when the wire carries it in the clear, else the cohort's sum attacked as
    if it were the target's. A run of one local step of plain SGD (local_epochs 1, rows ≤ batch_size) is the
    paper's setting; other recipes are attacked all the same (the update is then not one gradient)."""

    spec = SPEC

    def applies(self, ctx) -> str | None:
        if ctx.dataset.feature_kind != "image" or ctx.dataset.image_shape is None:
            return "needs image data (dataset.name: digit_mosaics, or dataset.format: voc | coco)"
        if ctx.plan.model.family != "linear_head":
            return "needs model.family: linear_head (the model's scores are the logits the client's loss takes)"
        if ctx.plan.model.preprocessing not in ("auto", "image"):
            return "needs the image preprocessing (model.preprocessing: auto or image)"
        cap = None if ctx.tap is None else ctx.tap.capture
        if cap is None:
            return "the run recorded no round of uplinks (set attacks.run before training)"
        if cap.get("aggregate_update") is None or cap.get("theta_start") is None:
            return "the run recorded only the first parameter's update (put gradient_inversion in attacks.run before training)"
        return None

    def prepare(self, ctx):
        shape = tuple(int(d) for d in ctx.dataset.image_shape)
        o = self.options
        targets = sorted(ctx.tap.capture["cohort"])[: o.targets]
        clients = {cid: ctx.fed.clients[cid] for cid in targets}
        images = {cid: pixel_images(c.raw, shape) for cid, c in clients.items()}
        labels = {cid: full_label_targets(c).float().cpu() for cid, c in clients.items()}
        n = {cid: min(len(images[cid]), ctx.plan.training.batch_size, o.max_images) for cid in targets}
        aux = {
            "model": ctx.new_encoder(), "loss": LOSSES[ctx.exp.algorithm.client_loss], "shape": shape, "targets": targets,
            "images_per_target": n, "mean_image": pixel_images(ctx.dataset.test.features, shape).mean(dim=0, keepdim=True),
            # stated: one image's labels are read from the update; a batch's are given to the attacker
            "given_labels": {cid: labels[cid][: n[cid]] for cid in targets if n[cid] > 1},
            "steps": o.steps, "lr": o.lr, "tv": o.tv, "seed": int(ctx.plan.seed),
        }  # fmt: skip
        return aux, {"images": images}

    def run(self, view, aux):
        cap = view.capture
        model = aux["model"]
        model.load_state_dict({k: v.float() for k, v in cap.theta_start.items()}, strict=False)
        to_input = image_input(IMAGENET_MEAN, IMAGENET_STD)
        source = "individual" if cap.updates is not None else "aggregate"
        recon = {}
        for i, cid in enumerate(aux["targets"]):
            update = cap.updates[cid] if cap.updates is not None else cap.aggregate_update
            labels = aux["given_labels"].get(cid)
            if labels is None:
                labels = labels_from_head_update(update["head.bias"])
            recon[cid] = invert_gradients(model, aux["loss"], update, labels, aux["shape"], to_input, steps=aux["steps"],
                                          lr=aux["lr"], tv=aux["tv"], seed=aux["seed"] + i)  # fmt: skip
        return {"recon": recon, "source": source, "kind": cap.uplink_kind, "cohort": len(cap.cohort),
                "mean_image": aux["mean_image"], "given": sorted(aux["given_labels"])}  # fmt: skip

    def score(self, guess, truth):
        rows, base = [], []
        for cid, rec in guess["recon"].items():
            x = truth["images"][cid]
            s = matched_scores(rec, x)
            rows.append((float(s["psnr"].mean()), float(s["ssim"].mean())))
            m = guess["mean_image"].expand_as(x)
            base.append((float(psnr(m, x).mean()), float(ssim(m, x).mean())))
        r, b = np.array(rows), np.array(base)
        key = guess["source"]
        return AttackResult(
            attack=self.name, role=self.role.value,
            metrics={"psnr": float(r[:, 0].mean()), "ssim": float(r[:, 1].mean()), "source": key},
            chance={"psnr": float(b[:, 0].mean()), "ssim": float(b[:, 1].mean()), "prior": "mean image of the test split"},
            details={"uplinks": guess["kind"], "cohort": guess["cohort"], "targets": len(rows),
                     "labels_given_for": guess["given"], "per_target_psnr": r[:, 0].tolist()},
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------------- measurement
#: the measured setting: 16×16 digit mosaics (2×2 tiles of 8 px), an MLP on the flattened pixels (no batch norm)
MEASURE_CONFIG = [
    "dataset.name=digit_mosaics",
    "dataset.mosaics={grid: 2, tile_size: 8, num_train: 400, num_test: 200}",
    "model.name=mlp",
    "model.hidden_dims=[256]",
    "model.family=linear_head",
    "model.embedding_dim=64",
    "algorithm.name=fedavg",
    "algorithm.loss=bce",
    "partition.name=iid",
    "device=cpu",
]


#: one round in which each of 10 clients takes one plain-SGD step on its whole batch (``training.batch_size`` ≥ its
#: rows), so that its update is −η times a gradient: the paper's setting, for the attack recorded before training
ONE_STEP_ROUND = [
    "partition.num_clients=10",
    "training.rounds=1",
    "training.local_epochs=1",
    "training.client_optimizer=sgd",
    "training.client_lr=0.1",
    "training.server_optimizer.name=fedavg",
    "training.server_optimizer.lr=1.0",
    "output.progress=false",
    "attacks.run=[gradient_inversion]",
]


def client_update(model, loss_fn, x, y, to_input, lr: float = 0.1) -> dict[str, torch.Tensor]:
    """A client's FedAvg update after one plain-SGD step on its whole batch: ``Δθ = −η·∇L``."""
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss_fn(model(to_input(x)), y), [p for _, p in named])
    return {k: -lr * g.detach() for (k, _), g in zip(named, grads, strict=True)}


def dp_noised(update: dict[str, torch.Tensor], sigma: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The update clipped to C = its own norm (the clip that favours the attacker most: nothing is scaled away) plus
    Gaussian noise of std σC on every coordinate, as DP-FedAvg releases it."""
    c = float(torch.sqrt(sum((u.double() ** 2).sum() for u in update.values())))
    return {k: u + sigma * c * torch.randn(u.shape, generator=gen) for k, u in update.items()}


def measure(
    *, batch: int = 1, targets: int = 4, cohort: int = 10, epsilon: float = 8.0, delta: float = 1e-5, steps: int = 300,
    seed: int = 0, conditions: Sequence[str] = ("none", "dp", "secure_sum", "random_init"),
) -> dict[str, dict[str, float]]:  # fmt: skip
    """PSNR / SSIM of the attack on ``targets`` clients of ``batch`` images each, per condition, beside the mean-image
    baseline. ``dp``: σ calibrated for ε at δ for one release (the round); ``secure_sum``: the sum of ``cohort``
    clients' updates (the target's and ``cohort − 1`` others') attacked as one client's; ``random_init``: the attack's
    start without optimisation (a control). Labels: read from the head update for ``batch == 1``, else given."""
    from protocols.dp.accountant import calibrate_sigma
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import build_dataset, build_model

    plan = load_plan(overrides=[*MEASURE_CONFIG, f"seed={seed}"])
    ds = build_dataset(plan)
    model = build_model(plan, ds)
    loss_fn = LOSSES[plan.algorithm.loss]
    shape = tuple(ds.image_shape)
    to_input = image_input(IMAGENET_MEAN, IMAGENET_STD)

    def pixels(split, rows):
        return torch.from_numpy(np.asarray(split.features[rows], dtype=np.float32)).view(-1, *shape) / 255

    mean_image = pixels(ds.test, slice(None)).mean(dim=0, keepdim=True)  # public data
    sigma = calibrate_sigma(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=1, accountant="rdp")
    gen = torch.Generator().manual_seed(seed + 1)
    rows = np.random.default_rng(seed).permutation(ds.train.num_instances)  # iid clients: disjoint random blocks
    blocks = [rows[i * batch : (i + 1) * batch] for i in range(targets + cohort - 1)]
    data = [(pixels(ds.train, b), torch.from_numpy(ds.train.labels[b].toarray()).float()) for b in blocks]
    updates = [client_update(model, loss_fn, x, y, to_input) for x, y in data]
    out: dict[str, dict[str, list]] = {c: {"psnr": [], "ssim": []} for c in (*conditions, "mean_image")}
    for t in range(targets):
        x, y = data[t]
        views = {"none": updates[t], "random_init": updates[t], "dp": dp_noised(updates[t], sigma, gen)}
        others = [u for i, u in enumerate(updates) if i != t][: cohort - 1]
        views["secure_sum"] = {k: sum(u[k] for u in [updates[t], *others]) for k in updates[t]}
        for c in conditions:
            labels = labels_from_head_update(views[c]["head.bias"]) if batch == 1 else y
            rec = invert_gradients(model, loss_fn, views[c], labels, shape, to_input, steps=steps, seed=seed + t,
                                   match=c != "random_init")  # fmt: skip
            s = matched_scores(rec, x)
            out[c]["psnr"] += s["psnr"].tolist()
            out[c]["ssim"] += s["ssim"].tolist()
        base = mean_image.expand_as(x)
        out["mean_image"]["psnr"] += psnr(base, x).tolist()
        out["mean_image"]["ssim"] += ssim(base, x).tolist()
    summary = {c: {k: float(np.mean(v)) for k, v in d.items()} for c, d in out.items()}
    labels = "from the head update" if batch == 1 else "given"
    summary["setting"] = {"batch": batch, "targets": targets, "cohort": cohort, "epsilon": epsilon, "delta": delta,
                          "sigma": sigma, "steps": steps, "labels": labels}  # fmt: skip
    return summary


if __name__ == "__main__":  # the documented measurement: python -m threat_models.attacks.gradient_inversion [BATCH ...]
    import json
    import sys

    torch.set_num_threads(1)
    for b in [int(a) for a in sys.argv[1:]] or [1, 4, 8]:
        print(json.dumps(measure(batch=b)))

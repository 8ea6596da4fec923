"""What a run plan picks for its data, decided without torch: the encoder, its preprocessing and hidden widths
(:func:`model_choice`), whether input rows stay sparse (:func:`sparse_input_choice`) and the precision clients train
in (:func:`precision_choice`). The engine builds what these name; ``secure-fed validate`` and the memory estimate
(:mod:`secure_fed.memory`) read them without building.

These ``auto`` choices are functions of the plan *and the loaded data* (not fields the plan builder resolves): a
data set's feature kind (``sparse``, ``dense``, ``image``), its image side and its size are known once it is read
(an ARFF or XC file's header, a generated set's spec), and the precision also depends on the device the run starts
on. A run decides each once: :func:`resolve_run_choices` (when the data and the device are known) and
:func:`resolve_client_choices` (when the clients and the callbacks are) put every remaining ``auto`` of the plan's
fields to the value these functions pick, and the run holds that plan; on a resolved plan each function returns the
field as resolved (``secure-fed validate`` and the memory estimate call them on a plan no run holds yet).

The names they pick from live here too (:data:`RESNETS`, :data:`IMAGE_FORMATS`, :data:`SPARSE_KINDS`), so that
neither the engine nor a plugin reads them from the config's schema."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING

from secure_fed import hardware
from secure_fed.errors import ConfigError

if TYPE_CHECKING:
    from secure_fed.data.dataset import MultiLabelDataset
    from secure_fed.plan import RunPlan

#: ``dataset.format`` values that read images (``dataset.root`` or ``dataset.train`` is their folder)
IMAGE_FORMATS = ("voc", "coco")
#: the torchvision ResNet backbones (image data; secure_fed.models.backbones)
RESNETS = ("resnet18", "resnet50")
NO_WEIGHTS = (
    "model.name={name}: ImageNet weights cannot be downloaded here: give a local file (model.weights: PATH to a "
    "torchvision state dict) or model.weights: random"
)

#: preprocessing kinds that keep zeros zero (sparse rows can use them)
SPARSE_KINDS = ("rsqrt_nnz", "none")


#: a ResNet's last stage sees a 1×1 map (where bf16 on CPU is broken, see model_choice) for images up to this side
BF16_MIN_SIDE = 16


def _on_cpu(plan: RunPlan) -> bool:
    if plan.device == "cpu":
        return True
    import torch  # only for bf16 ResNet configs on device auto

    return plan.device == "auto" and not torch.cuda.is_available()


def model_choice(plan: RunPlan, ds: MultiLabelDataset) -> tuple[str, str, list[int]]:
    """The encoder name, preprocessing kind and hidden widths the plan picks for ``ds``.

    ``auto`` picks ``resnet18`` for image data, ``sparse_text`` for sparse data, else ``mlp``; preprocessing ``auto``
    picks ``image`` for image data, ``rsqrt_nnz`` for ``sparse_text``, else ``standardize`` (``none`` under a layer that
    needs preprocessing without statistics of the private data, :func:`secure_fed.plugin_specs.public_preprocessing`).
    A ResNet on data that are not images, a ResNet without ``model.weights``,
    ``model.weights`` for an encoder that is not a ResNet, or bf16 training of a ResNet on CPU with images of 16 px or
    less (a PyTorch bug: garbage gradients, measured on torch 2.14) is a one-line :class:`ConfigError`.
    """
    name = plan.model.name
    if name == "auto":
        name = "resnet18" if ds.feature_kind == "image" else "sparse_text" if ds.feature_kind == "sparse" else "mlp"
    resnet = name in RESNETS
    if resnet and (ds.feature_kind != "image" or ds.image_shape is None):
        raise ConfigError(
            f"model.name={name} needs image data (dataset.name: digit_mosaics, or dataset.format: voc | coco); "
            f"dataset '{ds.name}' has {ds.feature_kind} features"
        )
    if resnet and plan.model.weights is None:
        raise ConfigError(NO_WEIGHTS.format(name=name) + f" (model.name=auto picks {name} for image data)")
    if resnet and plan.training.precision == "bf16" and min(ds.image_shape[1:]) <= BF16_MIN_SIDE and _on_cpu(plan):
        raise ConfigError(
            f"training.precision=bf16 with model.name={name} on {ds.image_shape[1]}×{ds.image_shape[2]} images on CPU: "
            "PyTorch's bf16 CPU kernels give garbage weight gradients for a stride-2 3×3 convolution of a 1×1 feature map "
            f"(the ResNet's last stage for images of {BF16_MIN_SIDE} px or less); use training.precision: fp32 or larger images"
        )
    if not resnet and plan.model.weights is not None:
        raise ConfigError(
            f"model.weights is for {' and '.join(RESNETS)}; model.name={plan.model.name} picks {name} for "
            f"{ds.feature_kind} data, which has no pretrained weights"
        )
    prep = plan.model.preprocessing
    if prep == "auto":
        from secure_fed.plugin_specs import public_preprocessing

        # under a layer whose guarantee must cover θ (DP), no statistic of the private data: raw dense features
        dense = "none" if public_preprocessing(plan) else "standardize"
        prep = "image" if ds.feature_kind == "image" else "rsqrt_nnz" if name == "sparse_text" else dense
    hidden = plan.model.hidden_dims
    if resnet:
        hidden = []  # a ResNet has no hidden_dims
    elif hidden is None:
        hidden = [1024, 1024] if name == "sparse_text" else [256]
    return name, prep, list(hidden)


def small_image_resnet(plan: RunPlan, ds: MultiLabelDataset) -> bool:
    """Whether the plan trains a ResNet on images of :data:`BF16_MIN_SIDE` px or less (where bf16 on CPU is broken)."""
    name = plan.model.name
    if name == "auto":
        name = "resnet18" if ds.feature_kind == "image" else name
    return name in RESNETS and ds.image_shape is not None and min(ds.image_shape[1:]) <= BF16_MIN_SIDE


def precision_choice(plan: RunPlan, ds: MultiLabelDataset, device_type: str, *, warn: bool = False) -> str:
    """``fp32`` or ``bf16``, the precision the clients train in on a device of ``device_type``: ``auto`` is bf16 where
    the device computes bf16 natively (:func:`secure_fed.hardware.resolve_precision`), except for a ResNet on small
    images on CPU (fp32: see :func:`model_choice`); an explicit value as asked. ``warn``: an explicit bf16 on a device
    that emulates it prints one warning line with the measured slowdown (the engine's, once a process)."""
    requested = plan.training.precision
    if requested == "auto" and device_type == "cpu" and small_image_resnet(plan, ds):
        return "fp32"
    if warn and requested == "bf16":
        hardware.warn_emulated_bf16(device_type)
    return hardware.resolve_precision(requested, device_type)


def precision_line(plan: RunPlan, ds: MultiLabelDataset | None = None) -> str:
    """``secure-fed validate``'s line on the precision the clients will train in on this machine, without torch: the
    CPU's answer from its flags; on a GPU (``device: cuda``, or ``auto`` where one is found) the run decides when it
    starts. ``ds``: the data (None: not read; images are taken at the side the config resizes them to)."""
    requested = plan.training.precision
    if requested == "fp32":
        return "precision: fp32"
    flags = hardware.cpu_flags() or frozenset()
    native = hardware.cpu_native_bf16()
    why = (
        f"this CPU computes bf16 natively: {', '.join(f for f in hardware.NATIVE_BF16_FLAGS if f in flags) or 'torch says so'}"
        if native
        else f"this CPU has none of {', '.join(hardware.NATIVE_BF16_FLAGS)}: bf16 is emulated"
    )
    gpu = "on a CUDA device the run decides when it starts (bf16 where the device computes it natively)"
    if plan.device == "cuda":
        return f"precision: {requested}: {gpu}" if requested == "auto" else "precision: bf16 (on the CUDA device)"
    on_gpu = "; " + gpu if plan.device == "auto" and requested == "auto" else ""
    if requested == "bf16":
        slow = "" if native else ", many times slower than fp32 (`run` measures and warns)"
        return f"precision: bf16 on CPU ({why}{slow})"
    if ds is None and (plan.dataset.name == "digit_mosaics" or plan.dataset.format in IMAGE_FORMATS):  # images, not read
        d = plan.dataset
        side = d.mosaics.grid * d.mosaics.tile_size if d.name == "digit_mosaics" else d.image_size
        ds = SimpleNamespace(feature_kind="image", image_shape=(3, side, side))  # the side the run resizes to
    resolved = precision_choice(plan, ds, "cpu") if ds is not None else hardware.resolve_precision(requested, "cpu")
    return f"precision: auto → {resolved} on CPU ({why}){on_gpu}"


#: ``model.sparse_input: auto`` keeps rows sparse when the clients' dense float32 copies would exceed this
SPARSE_AUTO_BYTES = 2**30


def sparse_input_choice(plan: RunPlan, ds: MultiLabelDataset, dense_rows: int) -> bool:
    """Whether the clients' and the test rows stay sparse (:class:`~secure_fed.models.sparse_rows.SparseRows`):
    ``model.sparse_input`` true, or ``auto`` with ``dense_rows`` rows of ``D`` float32 features over
    :data:`SPARSE_AUTO_BYTES`. Sparse rows need sparse data, the ``sparse_text`` encoder (its first layer reads
    them) and a preprocessing that keeps zeros zero; ``true`` without them is a :class:`ConfigError`."""
    want = plan.model.sparse_input
    if want is False:
        return False
    name, prep, _ = model_choice(plan, ds)
    why = (
        f"dataset '{ds.name}' has {ds.feature_kind} features" if ds.feature_kind != "sparse"
        else f"model.name={name} (only sparse_text reads sparse rows)" if name != "sparse_text"
        else f"model.family={plan.model.family} (its tokens read dense rows)" if plan.model.family == "ctran"
        else f"model.preprocessing={prep} (only {' and '.join(SPARSE_KINDS)} keep zeros zero)" if prep not in SPARSE_KINDS
        else None
    )  # fmt: skip
    if want is True:
        if why is not None:
            raise ConfigError(f"model.sparse_input=true needs sparse data, the sparse_text encoder and rsqrt_nnz or none "
                              f"preprocessing: {why}")  # fmt: skip
        return True
    return why is None and dense_rows * ds.num_features * 4 > SPARSE_AUTO_BYTES


def dense_rows(plan: RunPlan, ds: MultiLabelDataset) -> int:
    """The rows of ``D`` features the clients and the test would hold as dense copies (what ``model.sparse_input:
    auto`` weighs, and the memory estimate counts): an instance once per label it has (``partition: positive_only``)
    or once, plus the test rows evaluated (``evaluation.max_test``)."""
    train, test = ds.train.num_instances, ds.test.num_instances
    rows = int(ds.train.labels.nnz) if plan.partition.name == "positive_only" else train
    return rows + (test if plan.evaluation.max_test is None else min(plan.evaluation.max_test, test))


#: Mulan scene's feature count: 6 colour moments of 7×7 blocks
SCENE_FEATURES = 294


def ctran_tokens_choice(plan: RunPlan, ds: MultiLabelDataset) -> str:
    """C-Tran's tokens for dense data (``model.ctran.tokens``): ``auto`` picks ``scene_blocks`` (49 blocks × 6 colour
    moments, moment-major; :mod:`secure_fed.models.ctran`) for Mulan scene, else ``chunks`` of ``token_size``."""
    tokens = plan.model.ctran.tokens
    if tokens != "auto":
        return tokens
    return "scene_blocks" if ds.name == "scene" and ds.num_features == SCENE_FEATURES else "chunks"


def resolve_run_choices(plan: RunPlan, ds: MultiLabelDataset, device_type: str, *, loss: str) -> RunPlan:
    """``plan`` with every ``auto`` that the loaded data ``ds`` and the run's device (``cpu`` or ``cuda``) decide put
    to the value this module's functions pick for them: ``device``, ``dataset.feature_kind``, ``model.name``,
    ``model.preprocessing``, ``model.sparse_input`` (its row count as the memory estimate counts it,
    :func:`dense_rows`), ``model.ctran.tokens``, ``algorithm.loss`` (to ``loss``, the clients' loss of the
    algorithm built for the run: ``algorithm.loss``, else the model family's, else the algorithm's own) and
    ``training.precision``. A copy: ``plan`` and its ``config_yaml`` (what a resume compares) are left as they are."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"a run's device is cpu or cuda, not {device_type!r}")
    plan = dataclasses.replace(plan, device=device_type)  # the choices below read the device the run starts on
    name, prep, _ = model_choice(plan, ds)
    m = plan.model
    model = dataclasses.replace(
        m,
        name=name,
        preprocessing=prep,
        sparse_input=sparse_input_choice(plan, ds, dense_rows(plan, ds)),
        ctran=dataclasses.replace(m.ctran, tokens=ctran_tokens_choice(plan, ds)),
    )
    return dataclasses.replace(
        plan,
        dataset=dataclasses.replace(plan.dataset, feature_kind=ds.feature_kind),
        model=model,
        algorithm=plan.algorithm.model_copy(update={"loss": loss}),
        training=dataclasses.replace(plan.training, precision=precision_choice(plan, ds, device_type)),
    )


def resolve_client_choices(
    plan: RunPlan, *, num_clients: int, dense_layers: Sequence[str], callbacks: Sequence[str], ceiling: int | None
) -> RunPlan:
    """``plan`` with the ``auto`` choices that the run's clients decide put to their values: ``training.threads``
    (:func:`secure_fed.threads.resolve_threads` for ``num_clients`` clients on this machine, at most ``ceiling``,
    torch's count when the run is built) and ``training.deferred_updates`` (:func:`secure_fed.update_forms.deferred_updates`
    with the stack's ``dense_layers`` and the run's ``callbacks``, their class names)."""
    from secure_fed.threads import other_processes_cpus, resolve_threads, usable_cpus
    from secure_fed.update_forms import deferred_updates

    t = plan.training
    threads, why = t.threads, t.threads_why
    if threads == "auto":
        cpus = usable_cpus()
        threads, why = resolve_threads("auto", others=other_processes_cpus(plan, num_clients, cpus), ceiling=ceiling, cpus=cpus)
    deferred = deferred_updates(plan, dense_layers=dense_layers, callbacks=callbacks)
    return dataclasses.replace(plan, training=dataclasses.replace(t, threads=threads, threads_why=why, deferred_updates=deferred))

"""Turn a validated config into data, clients, model and algorithm objects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from secure_fed.algorithms import ALGORITHMS, Algorithm, ClientData
from secure_fed.config.schema import NO_WEIGHTS, RESNETS, ExperimentConfig
from secure_fed.data import (
    GENERATED,
    ClientShard,
    MultiLabelDataset,
    MultiLabelSplit,
    SyntheticSpec,
    load_from_paths,
    load_registered,
    make_synthetic,
    partitioner_from_config,
)
from secure_fed.errors import ConfigError
from secure_fed.models import Preprocessor, build_encoder
from secure_fed.models.sparse_rows import SparseRows


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when a GPU is visible, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available (use 'auto' or 'cpu')")
    return torch.device(name)


def build_dataset(cfg: ExperimentConfig, data_root: str | None = None) -> MultiLabelDataset:
    """The configured data; labels no training instance has are dropped (``dataset.drop_empty_labels``)."""
    ds = _load_dataset(cfg, data_root)
    if cfg.dataset.drop_empty_labels:
        ds, dropped = ds.without_empty_labels()
        if dropped:
            shown = ", ".join(dropped[:5]) + (f" and {len(dropped) - 5} more" if len(dropped) > 5 else "")
            print(f"note: dropped {len(dropped)} label(s) with no training instance ({shown}); dataset.drop_empty_labels")
    return ds


def _load_dataset(cfg: ExperimentConfig, data_root: str | None = None) -> MultiLabelDataset:
    d = cfg.dataset
    if d.format in ("voc", "coco") or (d.format is None and d.name == "digit_mosaics"):
        return _with_feature_kind(_load_images(cfg, data_root), d.feature_kind)
    if d.format is not None:
        return load_from_paths(
            format=d.format,
            train=d.train,
            test=d.test,
            labels=d.labels,
            train_split=d.train_split,
            test_split=d.test_split,
            fold=d.fold,
            test_fraction=d.test_fraction,
            split_seed=d.split_seed,
            feature_kind=d.feature_kind,
            name=d.name if d.name != "synthetic" else None,
        )
    if d.name == "synthetic":
        return make_synthetic(SyntheticSpec(**d.synthetic.model_dump()), seed=cfg.seed)
    return _with_feature_kind(load_registered(d.name, data_root or d.root), d.feature_kind)


def _with_feature_kind(ds: MultiLabelDataset, kind: str) -> MultiLabelDataset:
    """``ds`` relabelled with ``dataset.feature_kind`` when that is not ``auto`` (e.g. pixels as ``dense`` features
    for an MLP)."""
    if kind != "auto" and kind != ds.feature_kind:
        ds = MultiLabelDataset(ds.name, ds.train, ds.test, ds.label_names, kind, ds.meta)
    return ds


def _load_images(cfg: ExperimentConfig, data_root: str | None) -> MultiLabelDataset:
    """Digit mosaics (generated from the run seed), or a VOC / COCO folder: ``dataset.train`` if given, else
    ``--data-root``, else ``dataset.root``."""
    from secure_fed.data.images import MosaicSpec, load_coco, load_voc, make_digit_mosaics  # torchvision: on demand

    d = cfg.dataset
    if d.format is None:
        return make_digit_mosaics(MosaicSpec(**d.mosaics.model_dump()), seed=cfg.seed)
    root = d.train or data_root or d.root
    name = d.name if d.name not in GENERATED else None
    if d.format == "voc":
        return load_voc(root, size=d.image_size, train_set=d.train_set or "trainval", test_set=d.test_set or "test", name=name)
    return load_coco(
        root,
        size=d.image_size,
        train_set=d.train_set or "train2014",
        test_set=d.test_set or "val2014",
        train_annotations=d.train_annotations,
        test_annotations=d.test_annotations,
        name=name,
    )


#: a ResNet's last stage sees a 1×1 map (where bf16 on CPU is broken, see model_choice) for images up to this side
BF16_MIN_SIDE = 16


def _on_cpu(cfg: ExperimentConfig) -> bool:
    return cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())


def model_choice(cfg: ExperimentConfig, ds: MultiLabelDataset) -> tuple[str, str, list[int]]:
    """The encoder name, preprocessing kind and hidden widths the config picks for ``ds``.

    ``auto`` picks ``resnet18`` for image data, ``sparse_text`` for sparse data, else ``mlp``; preprocessing ``auto``
    picks ``image`` for image data. A ResNet on data that are not images, a ResNet without ``model.weights``,
    ``model.weights`` for an encoder that is not a ResNet, or bf16 training of a ResNet on CPU with images of 16 px or
    less (a PyTorch bug: garbage gradients, measured on torch 2.14) is a one-line :class:`ConfigError`.
    """
    name = cfg.model.name
    if name == "auto":
        name = "resnet18" if ds.feature_kind == "image" else "sparse_text" if ds.feature_kind == "sparse" else "mlp"
    resnet = name in RESNETS
    if resnet and (ds.feature_kind != "image" or ds.image_shape is None):
        raise ConfigError(
            f"model.name={name} needs image data (dataset.name: digit_mosaics, or dataset.format: voc | coco); "
            f"dataset '{ds.name}' has {ds.feature_kind} features"
        )
    if resnet and cfg.model.weights is None:
        raise ConfigError(NO_WEIGHTS.format(name=name) + f" (model.name=auto picks {name} for image data)")
    if resnet and cfg.training.precision == "bf16" and min(ds.image_shape[1:]) <= BF16_MIN_SIDE and _on_cpu(cfg):
        raise ConfigError(
            f"training.precision=bf16 with model.name={name} on {ds.image_shape[1]}×{ds.image_shape[2]} images on CPU: "
            "PyTorch's bf16 CPU kernels give garbage weight gradients for a stride-2 3×3 convolution of a 1×1 feature map "
            f"(the ResNet's last stage for images of {BF16_MIN_SIDE} px or less); use training.precision: fp32 or larger images"
        )
    if not resnet and cfg.model.weights is not None:
        raise ConfigError(
            f"model.weights is for {' and '.join(RESNETS)}; model.name={cfg.model.name} picks {name} for "
            f"{ds.feature_kind} data, which has no pretrained weights"
        )
    prep = cfg.model.preprocessing
    if prep == "auto":
        prep = "image" if ds.feature_kind == "image" else "rsqrt_nnz" if name == "sparse_text" else "standardize"
    hidden = cfg.model.hidden_dims
    if resnet:
        hidden = []  # a ResNet has no hidden_dims
    elif hidden is None:
        hidden = [1024, 1024] if name == "sparse_text" else [256]
    return name, prep, hidden


def build_encoder_for(cfg: ExperimentConfig, ds: MultiLabelDataset, seed_offset: int = 0) -> nn.Module:
    """The configured encoder g_θ for ``ds``, initialised from the run seed (and ``seed_offset``).

    Every call with the same arguments builds the same module: the server's model and the worker model (the two
    calls in :class:`~secure_fed.engine.Experiment`) start equal, ResNets from the same ``model.weights`` file.
    """
    name, _, hidden = model_choice(cfg, ds)
    torch.manual_seed(cfg.seed * 7919 + seed_offset)
    return build_encoder(
        name,
        ds.num_features,
        embedding_dim=cfg.model.embedding_dim,
        hidden_dims=hidden,
        embed_dim=cfg.model.embed_dim,
        image_shape=ds.image_shape,
        weights=cfg.model.weights,
    )


def build_model(cfg: ExperimentConfig, ds: MultiLabelDataset, *, cache_dir: str | Path | None = None) -> nn.Module:
    """θ's module: the model family's model around the configured encoder (every call with the same arguments
    builds the same module). ``cache_dir`` holds FedLGT's cached label embeddings."""
    from secure_fed.models.families import model_family

    family = model_family(cfg.model.family)
    if family.name == "ctran":
        return build_ctran(cfg, ds, cache_dir=cache_dir)
    encoder = build_encoder_for(cfg, ds)
    return family.build(encoder, num_labels=ds.num_labels, embedding_dim=cfg.model.embedding_dim)


def build_ctran(cfg: ExperimentConfig, ds: MultiLabelDataset, *, cache_dir: str | Path | None = None) -> nn.Module:
    """C-Tran for ``ds`` (:mod:`secure_fed.models.ctran`): ResNet tokens for images, the text network's output as
    tokens for sparse data, chunks of the feature vector for dense data; FedLGT's universal label embeddings when
    ``algorithm.name: fedlgt`` with ``algorithm.ule``."""
    from secure_fed.models.ctran import ChunkTokens, CTran, EncoderTokens, ResNetTokens

    c, width = cfg.model.ctran, cfg.model.embedding_dim
    name, _, _ = model_choice(cfg, ds)
    text = None
    if cfg.algorithm.name == "fedlgt" and cfg.algorithm.ule:
        from secure_fed.models.text_encoder import universal_label_embeddings

        text = universal_label_embeddings(
            list(ds.label_names), template=cfg.model.label_prompt, encoder_spec=cfg.model.text_encoder, cache_dir=cache_dir
        )
    if name in RESNETS:
        tokens = ResNetTokens(build_encoder_for(cfg, ds), width=width)
    elif name == "sparse_text":
        tokens = EncoderTokens(build_encoder_for(cfg, ds), out_dim=cfg.model.embedding_dim, num_tokens=c.text_tokens, width=width)
    else:
        torch.manual_seed(cfg.seed * 7919)
        token_size, feature_major = c.token_size, False
        if c.tokens == "auto" and ds.name == "scene" and ds.num_features == SCENE_FEATURES:
            token_size, feature_major = 6, True  # 49 blocks × 6 colour moments, moment-major (see ctran's docstring)
        tokens = ChunkTokens(ds.num_features, token_size=token_size, width=width, feature_major=feature_major)
    model = CTran(
        tokens, num_labels=ds.num_labels, width=width, layers=c.layers, heads=c.heads, dropout=c.dropout,
        min_unknown=c.min_unknown, label_source="learned" if text is None else "text",
        text_dim=None if text is None else int(text[0].shape[1]),
    )  # fmt: skip
    if text is not None:
        model.set_text_embeddings(*text)
    return model


#: Mulan scene's feature count: 6 colour moments of 7×7 blocks
SCENE_FEATURES = 294


@dataclass
class Federation:
    """The clients' data (each :class:`ClientData` holds only its own rows) and test tensors."""

    clients: list[ClientData]
    shards: list[ClientShard]
    x_test: torch.Tensor | SparseRows
    y_test: np.ndarray
    preprocessor: Preprocessor
    #: centralised baselines only: a validation split carved from the training data (never the test split)
    x_val: torch.Tensor | SparseRows | None = None
    y_val: np.ndarray | None = None
    #: the general multi-label setting: each client's own test rows (the partitioner's ``assign`` of the test
    #: split to the same clients), as row indices into ``x_test``/``y_test``; GmAP scores the server's model on
    #: each, AmAP each client's own model. A centralised baseline gets the same clients' test rows (same
    #: partition, same seed) so its GmAP is comparable. None in the positive-only setting.
    client_test: list[np.ndarray] | None = None
    #: raw feature rows (the dataset's CSR or dense rows) → the model's input, as the clients' rows were made
    #: (preprocessed; dense, or :class:`SparseRows` when ``model.sparse_input`` picked sparse rows)
    encode: Callable[[Any], torch.Tensor | SparseRows] | None = None


#: ``model.sparse_input: auto`` keeps rows sparse when the clients' dense float32 copies would exceed this
SPARSE_AUTO_BYTES = 2**30


def sparse_input_choice(cfg: ExperimentConfig, ds: MultiLabelDataset, dense_rows: int) -> bool:
    """Whether the clients' and the test rows stay sparse (:class:`~secure_fed.models.sparse_rows.SparseRows`):
    ``model.sparse_input`` true, or ``auto`` with ``dense_rows`` rows of ``D`` float32 features over
    :data:`SPARSE_AUTO_BYTES`. Sparse rows need sparse data, the ``sparse_text`` encoder (its first layer reads
    them) and a preprocessing that keeps zeros zero; ``true`` without them is a :class:`ConfigError`."""
    from secure_fed.models.preprocess import SPARSE_KINDS

    want = cfg.model.sparse_input
    if want is False:
        return False
    name, prep, _ = model_choice(cfg, ds)
    why = (
        f"dataset '{ds.name}' has {ds.feature_kind} features" if ds.feature_kind != "sparse"
        else f"model.name={name} (only sparse_text reads sparse rows)" if name != "sparse_text"
        else f"model.family={cfg.model.family} (its tokens read dense rows)" if cfg.model.family == "ctran"
        else f"model.preprocessing={prep} (only {' and '.join(SPARSE_KINDS)} keep zeros zero)" if prep not in SPARSE_KINDS
        else None
    )  # fmt: skip
    if want is True:
        if why is not None:
            raise ConfigError(f"model.sparse_input=true needs sparse data, the sparse_text encoder and rsqrt_nnz or none "
                              f"preprocessing: {why}")  # fmt: skip
        return True
    return why is None and dense_rows * ds.num_features * 4 > SPARSE_AUTO_BYTES


def build_federation(
    cfg: ExperimentConfig, ds: MultiLabelDataset, algorithm: type[Algorithm], device: torch.device
) -> Federation:
    _, prep_kind, _ = model_choice(cfg, ds)
    prep = Preprocessor.fit(prep_kind, ds.train.features)
    sparse = False  # decided once the shards are known (their total size)

    def features(rows: np.ndarray) -> torch.Tensor | SparseRows:  # per shard: no second full copy of the training set
        return encode(ds.train.features[rows])

    def encode(raw) -> torch.Tensor | SparseRows:
        if sparse:
            return SparseRows.from_csr(prep.transform_sparse(raw), device=device)
        return torch.from_numpy(prep.transform(raw)).to(device)

    y_train = ds.train.labels.toarray().astype(bool)
    rng = np.random.default_rng([cfg.seed, 11])
    val = None
    part = partitioner_from_config(cfg.partition, seed=cfg.seed)
    client_test = None
    n_test = ds.test.num_instances if cfg.evaluation.max_test is None else min(cfg.evaluation.max_test, ds.test.num_instances)
    if not part.positive_only:  # general setting: the test rows of each client (same clients for every algorithm)
        fed_shards = part.partition(ds.train, rng)
        test_split = ds.test if n_test == ds.test.num_instances else _head(ds.test, n_test)
        client_test = [s.indices for s in part.assign(test_split, np.random.default_rng([cfg.seed, 17]))]
    if algorithm.centralized:  # select epochs on a validation split of the training data, never on the test split
        order = np.random.default_rng([cfg.seed, 13]).permutation(ds.train.num_instances)
        n_val = int(round(cfg.algorithm.validation_fraction * ds.train.num_instances))
        val, rest = np.sort(order[:n_val]), np.sort(order[n_val:])
        shards = [ClientShard(0, rest)]
    else:
        shards = fed_shards if client_test is not None else part.partition(ds.train, rng)
    sparse = sparse_input_choice(cfg, ds, sum(len(s.indices) for s in shards) + n_test)
    clients = []
    for s in shards:
        if s.label is not None:
            known = np.array([s.label])
        elif algorithm.centralized:
            known = np.arange(ds.num_labels)
        else:
            known = np.flatnonzero(y_train[s.indices].any(axis=0))
        clients.append(
            ClientData(
                client_id=s.client_id,
                x=features(s.indices),
                pos=torch.from_numpy(y_train[np.ix_(s.indices, known)]).to(device),
                known_labels=torch.from_numpy(known.astype(np.int64)),
                raw=ds.train.features[s.indices],
                num_labels=ds.num_labels,
            )
        )
    x_test = encode(ds.test.features[:n_test])
    y_test = ds.test.labels[:n_test].toarray().astype(np.int8)
    fed = Federation(clients, shards, x_test, y_test, prep, client_test=client_test, encode=encode)
    if client_test is not None and not algorithm.centralized:
        for c, rows in zip(clients, client_test, strict=True):  # each client holds its own test rows
            c.eval_x, c.eval_y = x_test[rows], y_test[rows]
    if val is not None and len(val):
        fed.x_val = features(val)
        fed.y_val = ds.train.labels[val].toarray().astype(np.int8)
    return fed


def _head(split: MultiLabelSplit, n: int) -> MultiLabelSplit:
    """The first ``n`` rows of a split (``evaluation.max_test``)."""
    return MultiLabelSplit(split.features[:n], split.labels[:n])


def build_algorithm(cfg: ExperimentConfig, device: torch.device) -> Algorithm:
    """The configured algorithm; its client loss is ``algorithm.loss``, else the model family's, else its own."""
    from secure_fed.models.families import model_family

    loss = cfg.algorithm.loss if cfg.algorithm.loss != "auto" else model_family(cfg.model.family).default_loss
    return ALGORITHMS[cfg.algorithm.name](cfg.algorithm, device=device, loss=loss)

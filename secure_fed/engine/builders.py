"""Turn a validated config into data, clients, model and algorithm objects."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from secure_fed.algorithms import ALGORITHMS, Algorithm, ClientData
from secure_fed.config.schema import ExperimentConfig
from secure_fed.data import (
    ClientShard,
    MultiLabelDataset,
    SyntheticSpec,
    load_from_paths,
    load_registered,
    make_synthetic,
    partitioner_from_config,
)
from secure_fed.errors import ConfigError
from secure_fed.models import Preprocessor, build_encoder


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
    if d.format is not None:
        return load_from_paths(
            format=d.format,
            train=d.train,
            test=d.test,
            labels=d.labels,
            train_split=d.train_split,
            test_split=d.test_split,
            fold=d.fold,
            feature_kind=d.feature_kind,
            name=d.name if d.name != "synthetic" else None,
        )
    if d.name == "synthetic":
        return make_synthetic(SyntheticSpec(**d.synthetic.model_dump()), seed=cfg.seed)
    ds = load_registered(d.name, data_root or d.root)
    if d.feature_kind != "auto" and d.feature_kind != ds.feature_kind:
        ds = MultiLabelDataset(ds.name, ds.train, ds.test, ds.label_names, d.feature_kind, ds.meta)
    return ds


def model_choice(cfg: ExperimentConfig, ds: MultiLabelDataset) -> tuple[str, str, list[int]]:
    name = cfg.model.name
    if name == "auto":
        name = "sparse_text" if ds.feature_kind == "sparse" else "mlp"
    prep = cfg.model.preprocessing
    if prep == "auto":
        prep = "rsqrt_nnz" if name == "sparse_text" else "standardize"
    hidden = cfg.model.hidden_dims
    if hidden is None:
        hidden = [1024, 1024] if name == "sparse_text" else [256]
    return name, prep, hidden


def build_encoder_for(cfg: ExperimentConfig, ds: MultiLabelDataset, seed_offset: int = 0) -> nn.Module:
    name, _, hidden = model_choice(cfg, ds)
    torch.manual_seed(cfg.seed * 7919 + seed_offset)
    return build_encoder(
        name, ds.num_features, embedding_dim=cfg.model.embedding_dim, hidden_dims=hidden, embed_dim=cfg.model.embed_dim
    )


@dataclass
class Federation:
    """The clients' data (each :class:`ClientData` holds only its own rows) and test tensors."""

    clients: list[ClientData]
    shards: list[ClientShard]
    x_test: torch.Tensor
    y_test: np.ndarray
    preprocessor: Preprocessor
    #: centralised baselines only: a validation split carved from the training data (never the test split)
    x_val: torch.Tensor | None = None
    y_val: np.ndarray | None = None
    #: the general multi-label setting: each client's own test rows (the partitioner's ``assign`` of the test
    #: split to the same clients), as row indices into ``x_test``/``y_test``; GmAP scores the server's model on
    #: each, AmAP each client's own model. A centralised baseline gets the same clients' test rows (same
    #: partition, same seed) so its GmAP is comparable. None in the positive-only setting.
    client_test: list[np.ndarray] | None = None


def build_federation(
    cfg: ExperimentConfig, ds: MultiLabelDataset, algorithm: type[Algorithm], device: torch.device
) -> Federation:
    _, prep_kind, _ = model_choice(cfg, ds)
    prep = Preprocessor.fit(prep_kind, ds.train.features)
    x_train = torch.from_numpy(prep.transform(ds.train.features))
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
                x=x_train[s.indices].to(device),
                pos=torch.from_numpy(y_train[np.ix_(s.indices, known)]).to(device),
                known_labels=torch.from_numpy(known.astype(np.int64)),
                raw=ds.train.features[s.indices],
                num_labels=ds.num_labels,
            )
        )
    x_test = torch.from_numpy(prep.transform(ds.test.features[:n_test])).to(device)
    y_test = ds.test.labels[:n_test].toarray().astype(np.int8)
    fed = Federation(clients, shards, x_test, y_test, prep, client_test=client_test)
    if client_test is not None and not algorithm.centralized:
        for c, rows in zip(clients, client_test, strict=True):  # each client holds its own test rows
            c.eval_x, c.eval_y = x_test[rows], y_test[rows]
    if val is not None and len(val):
        fed.x_val = x_train[val].to(device)
        fed.y_val = ds.train.labels[val].toarray().astype(np.int8)
    return fed


def _head(split, n: int):
    """The first ``n`` rows of a split (``evaluation.max_test``)."""
    from secure_fed.data import MultiLabelSplit

    return MultiLabelSplit(split.features[:n], split.labels[:n])


def build_algorithm(cfg: ExperimentConfig, device: torch.device) -> Algorithm:
    """The configured algorithm; its client loss is ``algorithm.loss``, else the model family's, else its own."""
    from secure_fed.models.families import model_family

    loss = cfg.algorithm.loss if cfg.algorithm.loss != "auto" else model_family(cfg.model.family).default_loss
    return ALGORITHMS[cfg.algorithm.name](cfg.algorithm, device=device, loss=loss)

"""Turn a run plan into data, clients, model and algorithm objects."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from secure_fed.algorithms import Algorithm, ClientData
from secure_fed.algorithms.base import SharedRows
from secure_fed.algorithms.registry import algorithm_specs
from secure_fed.data import (
    ClientShard,
    MultiLabelDataset,
    MultiLabelSplit,
    partitioner_from_config,
)
from secure_fed.data.bounding import bound_labels, bounding_key
from secure_fed.errors import ConfigError
from secure_fed.model_choices import RESNETS, ctran_tokens_choice, model_choice
from secure_fed.models import Preprocessor, build_encoder
from secure_fed.models.encoders import ENCODER_INITS
from secure_fed.models.sparse_rows import SparseRows
from secure_fed.plan import RunPlan


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when a GPU is visible, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available (use 'auto' or 'cpu')")
    return torch.device(name)


def use_deterministic_cuda() -> None:
    """Make CUDA work repeat bit for bit, so that a run resumed from a checkpoint ends exactly where an uninterrupted
    one ends. On CUDA, ``index_add_`` with repeated indices (the backward of FedAwS's and FedALC's spread-out
    regulariser, which gathers each class's neighbours) sums with atomic adds whose order changes between runs; torch's
    deterministic mode replaces it with a sorted sum (and makes cuDNN pick deterministic convolutions); attention runs
    its plain kernel, since the flash, memory-efficient and cuDNN ones sum their backward with atomic adds (torch's own
    warning); cuBLAS gets the fixed workspace its reproducibility needs (read when cuBLAS first starts in the process).

    Process-wide, as torch's switches are, and left on: a CPU run later in the same process gives the same bits
    (``test_the_cuda_switches_leave_cpu_runs_bit_identical``), without the filling of fresh tensors with NaN that
    the mode would add (a cost on every allocation; nothing here reads memory it did not write). An op without a
    deterministic kernel warns (``warn_only``) instead of stopping the run; ``tests/engine/test_cuda.py`` turns that
    warning into a failure."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    for kernel in ("flash", "mem_efficient", "cudnn"):  # (cuDNN attention came in torch 2.3)
        switch = getattr(torch.backends.cuda, f"enable_{kernel}_sdp", None)
        if switch is not None:
            switch(False)


def build_encoder_for(plan: RunPlan, ds: MultiLabelDataset, seed_offset: int = 0) -> nn.Module:
    """The configured encoder g_θ for ``ds``, initialised from the run seed (and ``seed_offset``).

    Every call with the same arguments builds the same module: the server's model and the worker model (the two
    calls in :class:`~secure_fed.engine.Experiment`) start equal, ResNets from the same ``model.weights`` file.
    """
    name, _, hidden = model_choice(plan, ds)
    seed = plan.seed * 7919 + seed_offset
    torch.manual_seed(seed)
    encoder = build_encoder(
        name,
        ds.num_features,
        embedding_dim=plan.model.embedding_dim,
        hidden_dims=hidden,
        embed_dim=plan.model.embed_dim,
        image_shape=ds.image_shape,
        weights=plan.model.weights,
    )
    if plan.model.encoder_init != "kaiming" and name not in ("sparse_text", "mlp"):
        raise ConfigError(f"model.encoder_init={plan.model.encoder_init} is for the sparse_text and mlp encoders, not {name}")
    if plan.model.encoder_init != "kaiming":  # re-drawn from the same seed: every call builds the same module
        torch.manual_seed(seed)
        ENCODER_INITS[plan.model.encoder_init](encoder)
    return encoder


def build_model(plan: RunPlan, ds: MultiLabelDataset, *, cache_dir: str | Path | None = None) -> nn.Module:
    """θ's module: the model family's model around the configured encoder (every call with the same arguments
    builds the same module). ``cache_dir`` holds FedLGT's cached label embeddings."""
    from secure_fed.models.families import model_family

    family = model_family(plan.model.family)
    if family.name == "ctran":
        return build_ctran(plan, ds, cache_dir=cache_dir)
    encoder = build_encoder_for(plan, ds)
    if plan.model.fixed_encoder:
        fix_encoder(encoder)
    return family.build(encoder, num_labels=ds.num_labels, embedding_dim=plan.model.embedding_dim)


def fix_encoder(encoder: nn.Module) -> None:
    """``model.fixed_encoder``: the encoder's parameters are not trained (``requires_grad`` off: the clients' updates
    of them are exactly zero and the server keeps them as initialised). A batch-norm layer would still learn the
    data's statistics in its forward passes, so it is refused."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in encoder.modules()):
        raise ConfigError("model.fixed_encoder: the encoder has batch-norm layers, whose statistics the clients would train")
    for p in encoder.parameters():
        p.requires_grad_(False)


def build_ctran(plan: RunPlan, ds: MultiLabelDataset, *, cache_dir: str | Path | None = None) -> nn.Module:
    """C-Tran for ``ds`` (:mod:`secure_fed.models.ctran`): ResNet tokens for images, the text network's output as
    tokens for sparse data, chunks of the feature vector for dense data; FedLGT's universal label embeddings when
    ``algorithm.name: fedlgt`` with ``algorithm.ule``."""
    from secure_fed.models.ctran import ChunkTokens, CTran, EncoderTokens, ResNetTokens

    c, width = plan.model.ctran, plan.model.embedding_dim
    name, _, _ = model_choice(plan, ds)
    text = None
    if plan.algorithm.uses_text_encoder:
        from secure_fed.models.text_encoder import universal_label_embeddings

        text = universal_label_embeddings(
            list(ds.label_names), template=plan.model.label_prompt, encoder_spec=plan.model.text_encoder, cache_dir=cache_dir
        )
    if name in RESNETS:
        tokens = ResNetTokens(build_encoder_for(plan, ds), width=width)
    elif name == "sparse_text":
        tokens = EncoderTokens(
            build_encoder_for(plan, ds), out_dim=plan.model.embedding_dim, num_tokens=c.text_tokens, width=width
        )
    else:
        torch.manual_seed(plan.seed * 7919)
        token_size, feature_major = c.token_size, False
        if ctran_tokens_choice(plan, ds) == "scene_blocks":
            token_size, feature_major = 6, True  # 49 blocks × 6 colour moments, moment-major (see ctran's docstring)
        tokens = ChunkTokens(ds.num_features, token_size=token_size, width=width, feature_major=feature_major)
    model = CTran(
        tokens, num_labels=ds.num_labels, width=width, layers=c.layers, heads=c.heads, dropout=c.dropout_rate,
        min_unknown=c.min_unknown, label_source="learned" if text is None else "text",
        text_dim=None if text is None else int(text[0].shape[1]),
    )  # fmt: skip
    if text is not None:
        model.set_text_embeddings(*text)
    return model


@dataclass
class Federation:
    """The clients' data (each :class:`ClientData` holds only its own rows) and test tensors."""

    clients: list[ClientData]
    shards: list[ClientShard]
    x_test: torch.Tensor | SparseRows
    #: the test rows' labels, (n_test, C) 0/1 CSR (an XC test split's dense matrix does not fit)
    y_test: sp.csr_matrix
    preprocessor: Preprocessor
    #: centralised baselines only: a validation split carved from the training data (never the test split)
    x_val: torch.Tensor | SparseRows | None = None
    y_val: sp.csr_matrix | None = None
    #: the general multi-label setting: each client's own test rows (the partitioner's ``assign`` of the test
    #: split to the same clients), as row indices into ``x_test``/``y_test``; GmAP scores the server's model on
    #: each, AmAP each client's own model. A centralised baseline gets the same clients' test rows (same
    #: partition, same seed) so its GmAP is comparable. None in the positive-only setting.
    client_test: list[np.ndarray] | None = None
    #: raw feature rows (the dataset's CSR or dense rows) → the model's input, as the clients' rows were made
    #: (preprocessed; dense, or :class:`SparseRows` when ``model.sparse_input`` picked sparse rows)
    encode: Callable[[Any], torch.Tensor | SparseRows] | None = None
    #: the most clients one training instance sits on, as a public fact: the contribution bound m where the
    #: partition puts an instance on one client per label and a layer gives m (:mod:`secure_fed.data.bounding`),
    #: the number of labels where it gives none (the worst case the label space allows), else 1
    max_clients_per_instance: int = 1
    #: how many training instances the bound changed (a statistic of private data: private diagnostics only)
    bounded_instances: int = 0


def build_federation(
    plan: RunPlan,
    ds: MultiLabelDataset,
    algorithm: type[Algorithm],
    device: torch.device,
    *,
    bound: tuple[int, str] | None = None,
    rows_on_read: bool = False,
) -> Federation:
    """The clients' data. ``bound`` = ``(m, rule)`` (a layer's public contribution bound,
    :func:`secure_fed.plugin_specs.instance_bound`): in a partition that puts an instance on one client per label, every
    instance enters at most m clients (:func:`secure_fed.data.bounding.bound_labels`). ``rows_on_read``: every
    client's preprocessed rows are made when read (a :class:`SharedRows` over the raw training rows, the same values)
    instead of held: a node's copy of the run, which reads only its own clients' rows (Bibtex: 81 MiB of dense rows
    per copy otherwise)."""
    resolved = {"model.preprocessing": plan.model.preprocessing, "model.sparse_input": plan.model.sparse_input}
    if "auto" in resolved.values():  # the run's plan (resolve_run_choices) decides them, once
        raise ValueError(f"build_federation takes a run's resolved plan; {resolved} left auto")
    prep = Preprocessor.fit(plan.model.preprocessing, ds.train.features)
    sparse = plan.model.sparse_input is True

    def features(rows: np.ndarray) -> torch.Tensor | SparseRows:  # per shard: no second full copy of the training set
        return encode(ds.train.features[rows])

    def encode(raw) -> torch.Tensor | SparseRows:
        if sparse:
            return SparseRows.from_csr(prep.transform_sparse(raw), device=device)
        return torch.from_numpy(prep.transform(raw)).to(device)

    labels = sp.csr_matrix(ds.train.labels, copy=True)  # never a dense (n, C) copy: XC label matrices do not fit
    labels.eliminate_zeros()
    rng = np.random.default_rng([plan.seed, 11])
    val = None
    part = partitioner_from_config(plan.partition, seed=plan.seed)
    train, per_instance, bounded = ds.train, 1, 0
    multi_copy = part.positive_only and not algorithm.centralized  # an instance sits on one client per label
    if multi_copy:
        per_instance = ds.num_labels
        if bound is not None:
            m, rule = bound
            labels, bounded = bound_labels(labels, ds.train.features, m, rule, bounding_key(plan.seed))
            train, per_instance = MultiLabelSplit(ds.train.features, labels), min(m, ds.num_labels)
    client_test = None
    n_test = ds.test.num_instances if plan.evaluation.max_test is None else min(plan.evaluation.max_test, ds.test.num_instances)
    if not part.positive_only:  # general setting: the test rows of each client (same clients for every algorithm)
        fed_shards = part.partition(train, rng)
        test_split = ds.test if n_test == ds.test.num_instances else _head(ds.test, n_test)
        client_test = [s.indices for s in part.assign(test_split, np.random.default_rng([plan.seed, 17]))]
    if algorithm.centralized:  # select epochs on a validation split of the training data, never on the test split
        order = np.random.default_rng([plan.seed, 13]).permutation(ds.train.num_instances)
        n_val = int(round(plan.algorithm.validation_fraction * ds.train.num_instances))
        val, rest = np.sort(order[:n_val]), np.sort(order[n_val:])
        shards = [ClientShard(0, rest)]
    else:
        # a label the bound emptied, or (under dp, where no label is dropped) one with no training instance, keeps
        # its client, with no data: whether a run starts must not depend on one instance
        if (bound is not None or "dp" in plan.protocols) and part.positive_only:
            part.allow_empty = True
        shards = fed_shards if client_test is not None else part.partition(train, rng)
    # sparse rows: the training rows preprocessed once, each client reading its own when it trains (an XC instance
    # sits on every client of its labels: ~5 copies); dense rows: each client's own copy, as before
    store = SparseRows.from_csr(prep.transform_sparse(ds.train.features), device=device) if sparse else None
    clients = []
    # positive-only: how many clients each training instance sits on (its kept labels); each client holds its own
    # rows' counts (what the bound's rule reads of an instance), never sends them
    row_copies = np.diff(labels.indptr).astype(np.int64) if multi_copy else None
    for s in shards:
        if s.label is not None:
            known = np.array([s.label])
        elif algorithm.centralized:
            known = np.arange(ds.num_labels)
        else:
            known = np.flatnonzero(np.diff(labels[s.indices].tocsc().indptr))  # the labels its rows have
        rows = s.indices
        copies = None if row_copies is None else torch.from_numpy(row_copies[rows])
        clients.append(
            ClientData(
                client_id=s.client_id,
                x=SharedRows(partial(_store_rows, store), rows)
                if sparse
                else (SharedRows(features, rows) if rows_on_read else features(rows)),
                pos=torch.from_numpy(labels[rows][:, known].toarray().astype(bool)).to(device),
                known_labels=torch.from_numpy(known.astype(np.int64)),
                raw=SharedRows(partial(_feature_rows, ds.train.features), rows),
                num_labels=ds.num_labels,
                copies=copies,
            )
        )
    x_test = encode(ds.test.features[:n_test])
    y_test = sp.csr_matrix(ds.test.labels[:n_test], dtype=np.int8)
    fed = Federation(clients, shards, x_test, y_test, prep, client_test=client_test, encode=encode,
                     max_clients_per_instance=per_instance, bounded_instances=bounded)  # fmt: skip
    if client_test is not None and not algorithm.centralized:
        for c, rows in zip(clients, client_test, strict=True):  # each client holds its own test rows
            c.eval_x, c.eval_y = x_test[rows], y_test[rows].toarray()
    if val is not None and len(val):
        fed.x_val = features(val)
        fed.y_val = sp.csr_matrix(ds.train.labels[val], dtype=np.int8)
    return fed


def _store_rows(store: SparseRows, rows: np.ndarray) -> SparseRows:
    """Rows ``rows`` of the shared preprocessed training rows (a client's ``x``, read when it trains)."""
    return store[torch.from_numpy(rows)]


def _feature_rows(features, rows: np.ndarray):
    """Raw feature rows ``rows`` of the training split (a client's ``raw``, read when it computes tokens)."""
    return features[rows]


def _head(split: MultiLabelSplit, n: int) -> MultiLabelSplit:
    """The first ``n`` rows of a split (``evaluation.max_test``)."""
    return MultiLabelSplit(split.features[:n], split.labels[:n])


def build_algorithm(plan: RunPlan, device: torch.device) -> Algorithm:
    """The configured algorithm; its client loss is ``algorithm.loss``, else the model family's, else its own."""
    from secure_fed.models.families import model_family

    loss = plan.algorithm.loss if plan.algorithm.loss != "auto" else model_family(plan.model.family).default_loss
    # the registry when the run is built (an algorithm registered after import, e.g. in a notebook, counts)
    return algorithm_specs()[plan.algorithm.name].load()(plan.algorithm, device=device, loss=loss)

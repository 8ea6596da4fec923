"""The planned run's peak memory, estimated before anything is built, and the refusal of a run that cannot fit.

:func:`estimate_memory` adds up the large allocations of a run from its plan (:class:`~secure_fed.plan.RunPlan`) and
the data's shape (:class:`DataShape`), term by term; :func:`check_memory` refuses a run whose estimate exceeds what the device has
available with one :class:`~secure_fed.errors.ConfigError` naming the largest term, before the federation, the
models or any file are made. ``secure-fed validate`` prints the terms (without importing torch, except to count
a ResNet's or C-Tran's parameters).

The terms follow the code that allocates them (bytes; P = the model's parameters, C labels, d = embedding_dim):

* ``data``: the loaded splits as they are held (CSR: 8 bytes a stored value plus row pointers; dense: n·D);
* ``client rows``: sparse rows keep one preprocessed copy of the training rows (12 bytes a value); dense rows are a
  float32 copy per client row (positive-only: an instance on each of its labels' clients);
* ``model``: :data:`MODEL_HELD` float32 copies of θ (the server's θ and its scoring copy, the worker model,
  FedAdam's two moments), and in a ``round`` :data:`MODEL_ROUND` more (the round's sum and mean, one client's
  update and gradient);
* ``row table``: W, its round sums and its optimiser state (:data:`ROW_COPIES` copies of C·d floats);
* ``evaluation``: one block of test scores with its sort buffers (:mod:`secure_fed.metrics.blocks`; the whole
  matrix when it is small), and the test rows' embeddings;
* ``label sets`` (FedALC): the tokens of every client's instances and the merged CSR sets;
* ``co-occurrence`` (FedALC): the sparse counts of the label pairs that occur (Σ_j |L_j|², at most C²); a round
  adds one block of the top-k regulariser's pair tensors;
* ``neighbour index`` (FedALC with ``neighbour_search: approximate``): during the server step, two float32 copies
  of the rows (the unit rows and the index's own), its links, and the search's (C, K + 1) results;
* ``eq. 12 pairs`` (FedALC-fixed): a block of rows against all C labels (eq. 12's β term is over every pair),
  a chunk of co-occurring pairs and a few C·d tables; under ``privacy.instance`` a chunk of per-set gradients
  (:data:`~secure_fed.kernel_sizes.PER_SET_CHUNK_ELEMENTS`) with their per-set pair terms;
* ``attack NAME``: a plugin's config section may declare terms of its own (``memory_phases``): the attacks section
  asks each configured attack that densifies label matrices for its peak (``AttackSpec.memory``);
* a protocol layer declares what it adds (``LayerSpec.memory``): one that sums flat vectors (secure aggregation,
  CKKS) adds float64 vectors of the whole update layout (θ plus C·(d+1)) to a round, several at once; DP-SGD over
  label sets a chunk of per-set gradients.

An algorithm's own terms (label sets, co-occurrence counts, its regulariser's blocks) are its parameters model's
``memory_terms`` (:mod:`secure_fed.algorithms.params`).

Terms held for the whole run add up; the phases (setup's label sets, a round, an evaluation) do not overlap, so only
the largest of them counts.

On a GPU (``device: cuda``) the terms live in two memories, each checked against its own: the data, the label sets,
the co-occurrence counts, the neighbour index (faiss), the secure layers' flat vectors (``secure sums``) and the
attacks' peaks stay in host memory (:data:`HOST_TERMS`); the rest (the clients' and test rows, the models, the row
table, a round's tensors, an evaluation's scores, eq. 12's blocks) is on the GPU.

It is an estimate (within about 10% above the peaks measured in the README), meant to stop a run that is far past the machine, not
to budget one to the last megabyte.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from secure_fed.errors import ConfigError
from secure_fed.kernel_sizes import (  # noqa: F401 - the estimate's factors, read here by name
    COOCCURRENCE_BYTES,
    FIXED_BLOCKS,
    FIXED_TABLES,
    PAIR_BLOCK_ELEMENTS,
    PAIR_TENSORS,
    PER_SET_CHUNK_ELEMENTS,
    PER_SET_TENSORS,
    ROW_BLOCK_ELEMENTS,
    TOKEN_BYTES,
)

if TYPE_CHECKING:
    from secure_fed.plan import RunPlan

GB = 1e9
#: float32 copies of θ held throughout (the server's θ, its scoring copy, the worker model, FedAdam's two moments)
MODEL_HELD = 5
#: ... and held during a round (its sum and mean, one client's update and gradient)
MODEL_ROUND = 4
#: float32 copies of W (the table, the round's row sums, FedAdam's moments when rows are optimised, the scores' copy)
ROW_COPIES = 6
#: the process before any data (Python, torch, numpy, scipy)
BASELINE = 0.6 * GB
#: terms that stay in host memory on a GPU run (numpy, scipy and faiss structures, the protocols' float64 vectors)
HOST_TERMS = frozenset({"data", "label sets", "co-occurrence", "neighbour index", "secure sums"})


def on_host(name: str) -> bool:
    """Whether term ``name`` lives in host memory when the run's device is a GPU (attacks work on CPU copies)."""
    return name in HOST_TERMS or name.startswith("attack ")


@dataclass(frozen=True)
class DataShape:
    """What the estimate needs of the data: sizes, stored values, and how the rows are kept."""

    train: int
    test: int
    features: int
    labels: int
    train_values: int  #: stored feature values of the training split (n·D when dense)
    test_values: int
    label_entries: int  #: stored (instance, label) pairs of the training split
    dense: bool  #: features held as a dense array (images, dense numeric data)
    value_bytes: int = 4  #: bytes per dense feature value (uint8 images: 1)

    @classmethod
    def of(cls, ds) -> DataShape:
        """The shape of a loaded :class:`~secure_fed.data.MultiLabelDataset`."""
        tr, te = ds.train, ds.test
        dense = not sp.issparse(tr.features)
        vb = int(np.asarray(tr.features).dtype.itemsize) if dense else 4
        values = lambda x: int(np.prod(x.shape)) if dense else int(x.nnz)  # noqa: E731
        return cls(
            train=tr.num_instances, test=te.num_instances, features=int(ds.num_features), labels=int(ds.num_labels),
            train_values=values(tr.features), test_values=values(te.features), label_entries=int(tr.labels.nnz),
            dense=dense, value_bytes=vb,
        )  # fmt: skip


@dataclass
class MemoryEstimate:
    """Bytes per term, the total, and what is available."""

    terms: dict[str, float] = field(default_factory=dict)
    #: allocations of one phase each (setup, a round, an evaluation): only the largest counts toward the peak
    transient: dict[str, float] = field(default_factory=dict)
    #: what ``device`` has available (on a GPU: its free memory)
    available: float | None = None
    device: str = "cpu"
    #: on a GPU run, the host memory available to the terms that stay there (:func:`on_host`)
    host_available: float | None = None
    #: what to change when a term a plugin declared is too large (the others' are :data:`HINTS`)
    hints: dict[str, str] = field(default_factory=dict)

    @property
    def gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def total(self) -> float:
        return BASELINE + sum(self.terms.values()) + max(self.transient.values(), default=0.0)

    @property
    def needed(self) -> float:
        """What this estimate's memory must hold: the total, less the process's baseline on a GPU (it is host memory)."""
        return self.total - (BASELINE if self.gpu else 0.0)

    def part(self, host: bool) -> MemoryEstimate:
        """A GPU run's terms in host memory (``host=True``, with the process's baseline) or on the GPU (without it),
        each against what that memory has available."""
        keep = lambda d: {n: b for n, b in d.items() if on_host(n) == host}  # noqa: E731
        return MemoryEstimate(keep(self.terms), keep(self.transient), self.host_available if host else self.available,
                              "host memory" if host else self.device, hints=self.hints)  # fmt: skip

    def largest(self) -> tuple[str, float]:
        return max({**self.terms, **self.transient}.items(), key=lambda kv: kv[1])

    def lines(self) -> list[str]:
        """The estimate as text: one line a term, largest first, then the total against what is available."""
        rows = [(n, b, "held") for n, b in self.terms.items()] + [(n, b, "one phase") for n, b in self.transient.items()]
        where = lambda n: (", host memory" if on_host(n) else f", {self.device}") if self.gpu else ""  # noqa: E731
        out = [f"  {name:<16} {b / GB:8.2f} GB  {kind}{where(name)}" for name, b, kind in sorted(rows, key=lambda r: -r[1])]
        if self.gpu:
            for host in (False, True):
                part = self.part(host)
                avail = f" of {part.available / GB:.1f} GB available" if part.available else ""
                out.append(f"  {'total':<16} {part.needed / GB:8.2f} GB on {part.device}{avail}")
            return out
        avail = f" of {self.available / GB:.1f} GB available on {self.device}" if self.available else ""
        out.append(f"  {'total':<16} {self.total / GB:8.2f} GB (with {BASELINE / GB:.1f} GB for the process){avail}")
        return out


def parameter_count(plan: RunPlan, ds) -> int:
    """θ's parameter count: in closed form for the text network and the MLP (with the embedding or linear-head
    family; torch is not imported), else from the model built on torch's meta device (no memory)."""
    from secure_fed.model_choices import model_choice

    name, _, hidden = model_choice(plan, ds)
    d = plan.model.embedding_dim
    if name in ("sparse_text", "mlp") and plan.model.family in ("embedding", "linear_head"):
        widths = [plan.model.embed_dim, *hidden] if name == "sparse_text" else [ds.num_features, *hidden]
        n = ds.num_features * plan.model.embed_dim if name == "sparse_text" else 0  # the text network's bias-free embed
        n += sum(a * b + b for a, b in zip(widths, [*widths[1:], d], strict=True))  # Linear layers with biases, the last one to d
        if plan.model.family == "linear_head":
            n += d * ds.num_labels + ds.num_labels
        return n
    import torch

    from secure_fed.engine.builders import build_model

    if plan.model.family == "ctran" and plan.algorithm.uses_text_encoder:
        model = build_model(plan, ds)  # the text encoder's weights load from disk, which the meta device cannot do
    else:
        with torch.device("meta"):
            model = build_model(plan, ds)
    return sum(p.numel() for p in model.parameters())


def needs_torch(plan: RunPlan, ds) -> bool:
    """Whether :func:`parameter_count` builds the model (ResNets, C-Tran) rather than counting in closed form."""
    from secure_fed.model_choices import model_choice

    return model_choice(plan, ds)[0] not in ("sparse_text", "mlp") or plan.model.family not in ("embedding", "linear_head")


def estimate_memory(plan: RunPlan, shape: DataShape, *, params: int, sparse_rows: bool, device: str = "cpu") -> MemoryEstimate:
    """The planned run's large allocations (see the module docstring), in bytes per term."""
    C, d, D = shape.labels, plan.model.embedding_dim, shape.features
    n_test = shape.test if plan.evaluation.max_test is None else min(plan.evaluation.max_test, shape.test)
    t: dict[str, float] = {}
    if shape.dense:
        t["data"] = (shape.train_values + shape.test_values) * shape.value_bytes + shape.label_entries * 13
    else:
        t["data"] = (shape.train_values + shape.test_values) * 8 + (shape.train + shape.test) * 16 + shape.label_entries * 13
    positive_only = plan.partition.name == "positive_only"
    client_rows = shape.label_entries if positive_only else shape.train
    if sparse_rows:
        t["client rows"] = shape.train_values * 12 + shape.train * 8
    else:
        t["client rows"] = client_rows * D * 4
        t["test rows"] = n_test * D * 4
    t["model"] = MODEL_HELD * params * 4
    phase: dict[str, float] = {"round": MODEL_ROUND * params * 4}
    has_rows = plan.model.family == "embedding"
    if has_rows:
        t["row table"] = ROW_COPIES * C * d * 4
    from secure_fed.metrics.blocks import BLOCK_ELEMENTS, BYTES_PER_SCORE

    block = min(n_test * C, BLOCK_ELEMENTS) if has_rows else n_test * C
    phase["evaluation"] = block * BYTES_PER_SCORE + n_test * d * 4
    held, transient = plan.algorithm.memory_terms(plan.model.embedding_dim, shape)  # the algorithm's own terms (its declaration)
    t.update(held)
    _add(phase, transient)
    _add(phase, _layer_phases(plan, shape, params, device))
    sections, hints = _section_phases(plan, shape)
    phase.update(sections)
    host = available_bytes("cpu") if device.startswith("cuda") else None
    return MemoryEstimate(t, phase, available_bytes(device), device, host, hints)


def _add(phase: dict[str, float], more: dict[str, float]) -> None:
    """Add ``more``'s terms to ``phase``: a new term joins it, one already there (e.g. ``round``) grows."""
    for name, b in more.items():
        phase[name] = phase.get(name, 0) + b


def _layer_phases(plan: RunPlan, shape: DataShape, params: int, device: str) -> dict[str, float]:
    """The listed protocol layers' own terms (each registered layer declares its cost, if any: ``LayerSpec.memory``)."""
    from secure_fed.plugin_specs import layer_specs

    specs = layer_specs()
    out: dict[str, float] = {}
    for name in plan.protocols:
        if name in specs and specs[name].memory is not None:
            _add(out, specs[name].memory(plan, shape, params, device))
    return out


def _section_phases(plan: RunPlan, shape: DataShape) -> tuple[dict[str, float], dict[str, str]]:
    """The terms the plugins' config sections declare (a section model's ``memory_phases(plan, shape)``, e.g. the
    configured attacks' peaks, each from its ``AttackSpec.memory``), one phase each, and each term's hint (the
    section's ``memory_hint``: what to change when the term is too large)."""
    from secure_fed.plugins import registry

    phases: dict[str, float] = {}
    hints: dict[str, str] = {}
    for name in registry("config_sections"):
        section = plan.sections.get(name)
        if hasattr(section, "memory_phases"):
            terms = section.memory_phases(plan, shape)
            phases.update(terms)
            hints.update(dict.fromkeys(terms, getattr(section, "memory_hint", "")))
    return phases, hints


def plan_memory(plan: RunPlan, ds, device) -> MemoryEstimate:
    """The estimate for ``plan`` on the loaded data ``ds`` and ``device`` (a torch device or its name)."""
    from secure_fed.model_choices import dense_rows, model_choice, sparse_input_choice

    shape = DataShape.of(ds)
    model_choice(plan, ds)  # a config the data cannot run is its own error, before any estimate
    sparse = sparse_input_choice(plan, ds, dense_rows(plan, ds))  # on a run's (resolved) plan, its field
    return estimate_memory(plan, shape, params=parameter_count(plan, ds), sparse_rows=sparse, device=str(device))


def available_bytes(device: str) -> float | None:
    """Memory the run can use: free memory of that GPU on CUDA (only the terms that live there are checked against
    it), else MemAvailable (Linux) or the physical memory."""
    if device.startswith("cuda"):
        import torch  # the engine's check on a GPU run (validate stays on CPU memory)

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return float(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(est: MemoryEstimate) -> None:
    """A one-line :class:`ConfigError` when the estimate exceeds what is available, naming the largest term; on a
    GPU the terms on the GPU are checked against its free memory and those in host memory against the host's."""
    for part in (est.part(host=False), est.part(host=True)) if est.gpu else (est,):
        if part.available is None or part.needed <= part.available or not (part.terms or part.transient):
            continue
        name, b = part.largest()
        hint = est.hints.get(name, HINTS.get(name, ""))
        raise ConfigError(
            f"the planned run needs about {part.needed / GB:.1f} GB but {part.device} has {part.available / GB:.1f} GB "
            f"available; the largest term is {name} ({b / GB:.1f} GB){hint} (secure-fed validate CONFIG lists every term)"
        )


#: what to change when a term is too large
HINTS = {
    "client rows": ": keep sparse rows (model.sparse_input: auto or true) or use fewer instances",
    "test rows": ": keep sparse rows (model.sparse_input) or set evaluation.max_test",
    "model": ": lower model.embed_dim / hidden_dims / embedding_dim",
    "row table": ": lower model.embedding_dim",
    "eq. 12 pairs": ": a smaller embedding_dim, or fedalc (eq. 12 pushes every label from every other: C² · d work a step)",
    "evaluation": ": set evaluation.max_test",
    "neighbour index": ": lower model.embedding_dim or algorithm.k",
    "label sets": "",
    "round": ": a smaller model (a round holds several copies of θ; secure sums hold it as float64 vectors)",
}

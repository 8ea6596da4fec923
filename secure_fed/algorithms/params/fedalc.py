"""FedALC's and FedALC-fixed's parameters and registration (:mod:`secure_fed.algorithms.fedalc`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from secure_fed.algorithms.capabilities import DP_UNITS, AlgorithmCapabilities
from secure_fed.algorithms.params.base import MAX_SIZE, AlgorithmParams
from secure_fed.algorithms.params.fedaws import RegularizerParams
from secure_fed.algorithms.spec import AlgorithmSpec
from secure_fed.kernel_sizes import (
    COOCCURRENCE_BYTES,
    FIXED_BLOCKS,
    FIXED_TABLES,
    NNDESCENT,
    PAIR_BLOCK_ELEMENTS,
    PAIR_TENSORS,
    ROW_BLOCK_ELEMENTS,
    TOKEN_BYTES,
    top_k_pair_block_bytes,
)

#: what both FedALC variants are: label-set collection at setup and a W step over the sets that DP-SGD can wrap
_LABEL_SETS = {"has_rows": True, "collects_label_sets": True, "private_w_step": True, "dp_units": DP_UNITS,
               "setting": "positive_only"}  # fmt: skip


def label_set_terms(shape: Any) -> tuple[dict[str, float], dict[str, float]]:
    """Label-set collection's memory: the tokens of every client's instances and the merged CSR sets (setup), and
    the sparse counts of the label pairs that occur (Σ_j |L_j|², at most C²), built by a sparse product (held)."""
    per_set = shape.label_entries / max(1, shape.train)
    held = {"co-occurrence": min(shape.labels * shape.labels, shape.label_entries * per_set) * COOCCURRENCE_BYTES}
    return held, {"label sets": shape.label_entries * TOKEN_BYTES}


class _LabelSetParams(AlgorithmParams):
    tokenizer: Literal["sha256"] = "sha256"


class FedALCParams(_LabelSetParams, RegularizerParams):
    """``algorithm.name: fedalc``: the label-correlation regulariser (eq. 11) with top-K neighbour mining."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(**_LABEL_SETS)
    name: Literal["fedalc"] = "fedalc"
    neighbour_search: Literal["exact", "approximate"] = Field(
        "exact",
        description="fedalc: N_K(u) by the exact blocked search, or by an approximate index (faiss, ann_index; for "
        "hundreds of thousands of labels, where the exact search costs C²·d); its recall is in the private diagnostics",
    )
    ann_index: Literal["hnsw", "ivf", "nndescent"] = Field(
        "hnsw",
        description="neighbour_search approximate: a graph index (faiss IndexHNSWFlat; cost ~C·log C on structured "
        "rows), an inverted-file index (IndexIVFFlat, ⌈4√C⌉ lists; cost ~C^1.5) or the k-NN graph by NN-descent "
        "(IndexNNDescentFlat, on one thread: deterministic)",
    )
    ann_ef_search: int = Field(64, ge=1, le=65_536, description="ann_index hnsw: candidates kept per query (efSearch)")
    ann_hnsw_m: int = Field(32, ge=2, le=512, description="ann_index hnsw: links a node keeps (M)")
    ann_ef_construction: int = Field(80, ge=1, le=65_536, description="ann_index hnsw: candidates while inserting")
    ann_nprobe: int = Field(256, ge=1, le=65_536, description="ann_index ivf: index lists searched per query")
    gamma_scale: Literal["classes_minus_one"] | Annotated[float, Field(gt=0.0, le=1e9)] = "classes_minus_one"
    normalize_gamma: bool = Field(True, description="fedalc: use γ (eq. 10) rather than σ (eq. 9)")

    def private_w_step_error(self) -> str | None:
        if self.normalize_gamma:
            return (
                "privacy.instance with fedalc needs algorithm.normalize_gamma: false — eq. 10 normalises γ by all "
                "label sets, which is not a per-label-set sum; DP-SGD runs on the σ weights of eq. 9"
            )
        return None

    def _index_row_bytes(self) -> int:
        """Bytes an approximate neighbour index holds a row besides its copy of the row: HNSW's links (2·M at the base
        level, M on each level above, where about 1 in M rows has one); an NN-descent build's candidate pool (L
        entries of id, similarity and flag, 12 bytes each), its four sampled and reverse neighbour lists (up to R ids
        each) and its final list; IVF's list ids."""
        if self.ann_index == "hnsw":
            return 4 * (2 * self.ann_hnsw_m + 2)
        if self.ann_index == "nndescent":
            degree = max(NNDESCENT["degree"], self.k + 1)
            return 12 * (degree + NNDESCENT["pool_extra"]) + 16 * NNDESCENT["reverse"] + 4 * degree
        return 8

    def memory_terms(self, embedding_dim: int, shape: Any) -> tuple[dict[str, float], dict[str, float]]:
        """Label sets and co-occurrence counts; with ``neighbour_search: approximate`` the server step's index (the
        rows' unit copy and the index's own, its links, the search's results); a round's top-k pair block."""
        held, phase = label_set_terms(shape)
        C, d, k = shape.labels, embedding_dim, self.k
        if self.neighbour_search == "approximate":
            phase["neighbour index"] = 4 * 2 * C * d + C * self._index_row_bytes() + C * (k + 1) * 12 + C * k * 8
        phase["round"] = top_k_pair_block_bytes(C, k, d)
        return held, phase


#: the top-k block FedALC-fixed's estimate has always counted in a round, at the regulariser's default k (it keys no k)
_FIXED_ROUND_K = 5


class FedALCFixedParams(_LabelSetParams):
    """``algorithm.name: fedalc_fixed``: W pre-trained on the server with reg_fc (eq. 12), then fixed."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(**_LABEL_SETS, trains_rows=False, fixed_w=True)
    name: Literal["fedalc_fixed"] = "fedalc_fixed"
    lam: float = Field(10.0, ge=0.0, le=1e9, description="λ, the regulariser's learning-rate multiplier")
    margin: float = Field(1.0, gt=0.0, le=4.0, description="ν in cosine distance (fedalc eq. 11/12, fedaws eq. 7)")
    alpha: float = Field(1.0, ge=0.0, le=1e6, description="fedalc_fixed: weight of positive pairs in eq. 12")
    beta: float = Field(1.0, ge=0.0, le=1e6, description="fedalc_fixed: weight of negative pairs in eq. 12")
    fixed_steps: int = Field(500, ge=0, le=MAX_SIZE, description="fedalc_fixed: server steps on reg_fc before training")
    fixed_lr: float = Field(1.0, gt=0.0, le=1e6, description="fedalc_fixed: η of the reg_fc steps")

    def private_w_steps(self, rounds: int) -> int:
        return self.fixed_steps

    def w_step_memory_phase(self) -> str | None:
        return "eq. 12 pairs"

    def memory_terms(self, embedding_dim: int, shape: Any) -> tuple[dict[str, float], dict[str, float]]:
        """Label sets and co-occurrence counts; eq. 12 in blocks of rows and chunks of pairs (never C × C): a block
        of rows against all C labels, a chunk of co-occurring pairs and a few C·d tables."""
        held, phase = label_set_terms(shape)
        C, d = shape.labels, embedding_dim
        block = min(C * C, ROW_BLOCK_ELEMENTS) * FIXED_BLOCKS + PAIR_TENSORS * PAIR_BLOCK_ELEMENTS
        phase["eq. 12 pairs"] = 4 * (block + FIXED_TABLES * C * d)
        phase["round"] = top_k_pair_block_bytes(C, _FIXED_ROUND_K, d)
        return held, phase


FEDALC = AlgorithmSpec(
    FedALCParams,
    "secure_fed.algorithms.fedalc:FedALC",
    "FedAvg + server label-correlation regulariser with top-K mining (FedALC eq. 11)",
)
FEDALC_FIXED = AlgorithmSpec(
    FedALCFixedParams,
    "secure_fed.algorithms.fedalc:FedALCFixed",
    "W trained once on the server with reg_fc (FedALC eq. 12), then fixed; clients train θ",
)

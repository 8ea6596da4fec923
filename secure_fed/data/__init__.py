"""Datasets: readers (Mulan ARFF, XC), the registry, downloads, synthetic data, partitioners; images in
:mod:`secure_fed.data.images` (imported on demand: it needs torch and torchvision)."""

from secure_fed.data.arff import read_arff, read_label_names
from secure_fed.data.dataset import Features, MultiLabelDataset, MultiLabelSplit, as_dense, row_nnz, stack_rows
from secure_fed.data.partitions import PARTITIONERS, ClientShard, Partitioner, build_partitioner, partitioner_from_config
from secure_fed.data.registry import GENERATED, REGISTRY, load_from_paths, load_registered, resolve_root
from secure_fed.data.synthetic import SyntheticSpec, make_synthetic
from secure_fed.data.xc import read_xc, read_xc_split

__all__ = [
    "GENERATED",
    "PARTITIONERS",
    "REGISTRY",
    "ClientShard",
    "MultiLabelDataset",
    "MultiLabelSplit",
    "Partitioner",
    "SyntheticSpec",
    "Features",
    "as_dense",
    "stack_rows",
    "build_partitioner",
    "load_from_paths",
    "load_registered",
    "make_synthetic",
    "partitioner_from_config",
    "read_arff",
    "read_label_names",
    "read_xc",
    "read_xc_split",
    "resolve_root",
    "row_nnz",
]

"""Names and one-line descriptions of the registered algorithms and the core's models, importable without torch.

``secure-fed list`` prints these; the algorithm and model classes take their descriptions from here,
so each is written once. An algorithm's description is its spec's (:mod:`secure_fed.algorithms.registry`), so
``ALGORITHMS`` lists the third-party algorithms registered by entry point too.
"""

from __future__ import annotations

from typing import Any

MODELS: dict[str, str] = {
    "sparse_text": "the FedALC/FedAwS text network: linear embedding 512, then 1024-1024-512 (ReLU after the first two)",
    "mlp": "ReLU MLP for dense numeric features",
    "resnet18": "torchvision ResNet-18 for images, fc replaced by a linear map to embedding_dim; model.weights: file | random",
    "resnet50": "torchvision ResNet-50 for images, fc replaced by a linear map to embedding_dim; model.weights: file | random",
}


def __getattr__(name: str) -> Any:
    if name == "ALGORITHMS":  # read when asked: the registered algorithms, entry points included
        from secure_fed.algorithms.registry import algorithm_specs

        return {n: spec.description for n, spec in algorithm_specs().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

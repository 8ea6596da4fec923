"""Names and one-line descriptions of the core's algorithms and models, importable without torch.

``secure-fed list`` prints these; the algorithm and model classes take their descriptions from here,
so each is written once.
"""

from __future__ import annotations

ALGORITHMS: dict[str, str] = {
    "fedavg": "positive loss only, clients train θ and their own row; W may collapse",
    "fedavg_fixed": "positive loss only, W frozen at its random spread-out initialisation",
    "fedaws": "FedAvg + server spreadout regulariser with top-k negative mining (FedAwS eq. 8)",
    "fedalc": "FedAvg + server label-correlation regulariser with top-K mining (FedALC eq. 11)",
    "fedalc_fixed": "W trained once on the server with reg_fc (FedALC eq. 12), then fixed; clients train θ",
    "flag": "FedAvg weighted by FLAG eq. 2: each client's w = Σ_l (its positives of label l)^α, computed locally",
    "oracle": "centralised training with all labels and negatives (upper bound)",
    "local": "each client trains its own model alone and shares nothing (general setting's lower reference)",
    "centralised": "all training data on one trainer, evaluated on each client's test data (general setting's upper bound)",
    "fedctran": "C-Tran (model.family: ctran) trained with FedAvg and label mask training (FedLGT's FedC-Tran baseline)",
    "fedlgt": "FedC-Tran + universal label embeddings from a text encoder + CA-MLE (FedLGT eq. 4)",
}

MODELS: dict[str, str] = {
    "sparse_text": "the FedALC/FedAwS text network: linear embedding 512, then 1024-1024-512 (ReLU after the first two)",
    "mlp": "ReLU MLP for dense numeric features",
    "resnet18": "torchvision ResNet-18 for images, fc replaced by a linear map to embedding_dim; model.weights: file | random",
    "resnet50": "torchvision ResNet-50 for images, fc replaced by a linear map to embedding_dim; model.weights: file | random",
}

"""secure-fed: a privacy-hardened federated learning framework for positive-label multi-label learning."""

__version__ = "0.1.0"

"""secure-fed: a privacy-hardened federated learning framework for positive-label multi-label learning."""

from importlib.metadata import version as _version

__version__ = _version("secure-fed")  # one source: pyproject.toml's [project] version, through the installed metadata

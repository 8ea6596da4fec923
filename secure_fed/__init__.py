"""secure-fed: a privacy-hardened federated learning framework for positive-label multi-label learning."""

from importlib.metadata import version as _version

from secure_fed.threads import set_wait_policy as _set_wait_policy

# OpenMP's wait policy is read when torch is imported: set it first (unless the user did), for this process and the
# ones it starts (secure_fed.threads)
_set_wait_policy()

__version__ = _version("secure-fed")  # one source: pyproject.toml's [project] version, through the installed metadata


def __getattr__(name: str):
    """``secure_fed.run``, ``secure_fed.load_config``, ``secure_fed.load_plan`` and ``secure_fed.Callback``, imported
    when first used (so that ``import secure_fed`` stays light: the CLI checks a config before importing torch)."""
    if name == "run":
        from secure_fed.api import run

        return run
    if name in ("load_config", "load_plan"):
        import secure_fed.config

        return getattr(secure_fed.config, name)
    if name == "Callback":
        from secure_fed.engine.callbacks import Callback

        return Callback
    raise AttributeError(f"module 'secure_fed' has no attribute {name!r}")


__all__ = ["Callback", "__version__", "load_config", "load_plan", "run"]

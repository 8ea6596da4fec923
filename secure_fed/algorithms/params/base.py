"""The base of every algorithm's parameters model: the keys all algorithms take, and the questions the framework
asks an algorithm's parameters instead of testing its name."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from secure_fed.algorithms.capabilities import AlgorithmCapabilities

#: upper bound of a size-like setting (as the core schema's): a typo should not ask for more than a machine has
MAX_SIZE = 10_000_000


class AlgorithmParams(BaseModel):
    """``algorithm:`` of one algorithm. Subclasses set ``name`` to a ``Literal`` of their name (the discriminator of
    the section's union), add their own keys and declare :attr:`capabilities`; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    #: what the algorithm is (read by validation, the layers and the memory estimate)
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities()

    name: str
    loss: Literal["auto", "positive", "softmax", "contrastive", "bce", "asl"] = Field(
        "auto",
        description="client loss; auto: the model family's (bce for linear_head), else the algorithm's own; "
        "asl: Asymmetric Loss (γ+ = 0, γ- = 4, clip 0.05) on logits",
    )

    def private_w_steps(self, rounds: int) -> int:
        """Planned steps of the private W step (``capabilities.private_w_step``) in a run of ``rounds`` rounds: one a
        round, unless W is fixed at setup (``capabilities.fixed_w``), whose count the algorithm's keys give."""
        return rounds

    def private_w_step_error(self) -> str | None:
        """Why these settings cannot run the W step under DP-SGD over label sets (``privacy.instance``), or None."""
        return None

    @property
    def uses_text_encoder(self) -> bool:
        """The model carries a text encoder's label embeddings, loaded from disk (not built on the meta device)."""
        return False

    def memory_terms(self, embedding_dim: int, shape: Any) -> tuple[dict[str, float], dict[str, float]]:
        """Bytes the algorithm adds to the run's memory estimate (:mod:`secure_fed.memory`) for data of ``shape``
        (a :class:`~secure_fed.memory.DataShape`) and rows of ``embedding_dim`` (``model.embedding_dim``): terms held
        for the whole run, and terms of one phase each (a ``round`` entry adds to the round's own term)."""
        return {}, {}

    def w_step_memory_phase(self) -> str | None:
        """The memory-estimate phase that holds the private W step's per-set tensors (a layer that wraps the W step
        adds them there), or None where the estimate does not count them."""
        return None

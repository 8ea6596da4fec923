"""The ``attacks:`` YAML section (owned by ``threat_models``; registered with the core's schema through the
``secure_fed.config_sections`` entry points). Pydantic only: validating a config imports no attack.

The section is built from the registered attacks: ``run`` plus one key per attack that registers settings (its
spec's ``settings`` model, the attack's own section ``attacks.<name>:``). Nothing here names an attack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from secure_fed.plugin_api.attacks import attack_specs, unknown_name

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import DataShape, RunPlan


class AttacksSection(BaseModel):
    """Attacks and audits (``threat_models``) run on the finished run; ``secure-fed list`` shows them. Each registered
    attack with settings adds its own key (``attacks.<name>:``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    run: list[str] = Field(default_factory=list, description="attack names; [all] for every registered attack")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """An unknown key is one line naming the section's keys: ``run`` and the attacks' sections."""
        if isinstance(data, dict):
            keys = list(cls.model_fields)
            specs = attack_specs()
            for key in data:
                if key in keys:
                    continue
                if key in specs:
                    raise ValueError(f"attack '{key}' takes no settings (attacks.{key}); the section's keys: {', '.join(keys)}")
                raise ValueError(unknown_name("key", str(key), keys))
        return data

    @model_validator(mode="after")
    def _known(self) -> AttacksSection:
        specs = attack_specs()
        for name in self.run:
            if name != "all" and name not in specs:
                raise ValueError(unknown_name("attack", name, specs))
        return self

    def names(self) -> list[str]:
        """The attacks to run, in registry order for ``[all]``."""
        return list(attack_specs()) if "all" in self.run else list(dict.fromkeys(self.run))

    #: the memory estimate's hint for an attack's term that is too large (:mod:`secure_fed.memory`)
    memory_hint: ClassVar[str] = ": leave it out of attacks.run for data of this size"

    def memory_phases(self, plan: RunPlan, shape: DataShape) -> dict[str, float]:
        """The configured attacks' own peaks for the memory estimate of ``plan`` (whose ``attacks:`` section this
        is), one phase each (``AttackSpec.memory(shape, plan)``, if any)."""
        specs = attack_specs()
        chosen = [n for n in self.names() if n in specs and specs[n].memory is not None]
        return {f"attack {n}": float(specs[n].memory(shape, plan)) for n in chosen}


#: the built models, by the registered (attack, settings model) pairs they were built from
_MODELS: dict[tuple, type[AttacksSection]] = {}


def attacks_config_model() -> type[AttacksSection]:
    """The ``attacks:`` model of the attacks registered now: :class:`AttacksSection` plus one field per attack with
    settings, named as the attack and defaulting to its settings' defaults."""
    specs = attack_specs()
    owned = tuple((name, spec.settings) for name, spec in specs.items() if spec.settings is not None)
    if owned not in _MODELS:
        clash = [name for name, _ in owned if name in AttacksSection.model_fields]
        if clash:
            raise RuntimeError(f"attacks {clash} clash with the attacks section's own keys")
        fields: dict[str, Any] = {
            name: (model, Field(default_factory=model, description=f"{name}'s settings")) for name, model in owned
        }
        _MODELS[owned] = create_model("AttacksConfig", __base__=AttacksSection, **fields)
    return _MODELS[owned]


def attacks_of(plan: RunPlan) -> AttacksSection:
    """The ``attacks:`` section of ``plan``."""
    return plan.part(AttacksSection)


def attack_settings(attacks: AttacksSection, name: str) -> Any:
    """Attack ``name``'s validated settings in the ``attacks:`` section (``attacks.<name>``), or None when it
    registers none."""
    return getattr(attacks, name) if attack_specs()[name].settings is not None else None


def __getattr__(name: str) -> Any:
    if name == "AttacksConfig":  # the entry point's target: built when the config schema is
        return attacks_config_model()
    raise AttributeError(name)

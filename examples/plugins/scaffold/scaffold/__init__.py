"""SCAFFOLD (Karimireddy et al., ICML 2020) as a plugin: ``algorithm: {name: scaffold}``.

:mod:`.params` (light: pydantic) is what ``secure-fed validate`` imports; :mod:`.algorithm` (torch) only a run. Both
import secure-fed through :mod:`secure_fed.plugin_api` alone.
"""

"""MOON (Li, He and Song, CVPR 2021) as a plugin: ``algorithm: {name: moon, mu: 1.0, temperature: 0.5}``.

:mod:`.params` (light: pydantic) is what ``secure-fed validate`` imports; :mod:`.algorithm` (torch) only a run. Both
import secure-fed through :mod:`secure_fed.plugin_api` alone.
"""

"""The public plugin API for protocol layers (protocols/): the stable types and helpers they import from secure-fed.

A name is listed here because a plugin needs it; everything else in secure_fed is internal and may change.
"""

from __future__ import annotations

__all__: list[str] = []

"""Privacy and security protocol layers (keyed hashing, DP, CKKS, secure aggregation).

No layer is implemented yet: a config that lists any entry under ``protocols:``
is rejected with a clear error, and every run reports ε = ∞.
"""

#: Registered layers by name (none yet).
LAYERS: dict[str, type] = {}

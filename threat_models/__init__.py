"""Attack simulators and privacy audits. No attack is implemented yet."""

#: Registered attacks by name (none yet).
ATTACKS: dict[str, type] = {}

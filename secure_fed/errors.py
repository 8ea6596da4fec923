"""User-facing error types.

Anything raised as a :class:`SecureFedError` is a user mistake (bad config,
missing file, ...). The CLI prints its message on one line and exits with
status 2, without a traceback.
"""

import re


def one_line(message: str) -> str:
    """The message with control characters and Unicode line breaks written as escapes: one line, always."""
    return re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", lambda m: repr(m.group())[1:-1], message)


class SecureFedError(Exception):
    """Base class for errors caused by user input."""


class ConfigError(SecureFedError):
    """The experiment configuration is invalid."""


class DataError(SecureFedError):
    """A dataset file is missing or malformed."""


class PrivacyViolation(RuntimeError):
    """A message would give a party more than the algorithm allows.

    This is a programming error in an algorithm or protocol layer, never a user
    error, so it is not a :class:`SecureFedError`.
    """


class RoundAborted(RuntimeError):
    """A protocol could not complete this round (e.g. too few clients survived secure aggregation).

    The engine skips the round — no update is applied and no privacy is spent —
    and records why in ``metrics.jsonl``.
    """


def unknown_name(kind: str, name: str, known) -> str:
    """``unknown {kind} 'name' (did you mean 'x'?); available: a, b`` — the one-line message for a bad name."""
    import difflib

    known = list(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown {kind} '{name}'{hint}; available: {', '.join(known)}"

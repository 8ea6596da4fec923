"""Whether a SecAgg+ round completes or aborts, decided from its graph, its threshold and who dropped at each stage.

The server's decision (:class:`~protocols.secagg.protocol.SecAggServer`, driven by :mod:`protocols.secagg.layer` or
:func:`~protocols.secagg.protocol.secure_sum`) depends on nothing else when every party that answers is honest: the
cryptography only carries it out. :func:`predict_round` replays the same checks, in the same order, on sets alone:

1. AdvertiseKeys: U1 = the cohort less the ``advertise`` drops; ``need(U1)``.
2. ShareKeys: U2 = U1 less the ``share`` drops; ``need(U2)``. Client u sealed shares to H_u = {u} ∪ (N(u) ∩ U1).
3. MaskedInput: U3 = U2 less the ``input`` drops; ``need(U3)`` (before any share is asked for).
4. ConsistencyCheck (``consistency_check``): the signers are U3 less any ``consistency`` drops (only
   :func:`secure_sum` has those; the layer asks every member of U3); for every u ∈ U2 the signers in H_u ∩ U3 must
   reach the quorum ⌈(|H_u| + t)/2⌉.
5. Unmasking: U4 = U3 less the ``unmask`` drops (and the ``consistency`` drops); ``need(U3)`` again, then
   ``need(U4)`` with connectivity on U3; then every u ∈ U3 needs t shares of its self-mask seed, from
   ({u} ∪ N(u)) ∩ U4, and every u ∈ U2 \\ U3 t shares of its mask key, from N(u) ∩ U4.

``need(A)`` (``SecAggServer._need``) aborts unless |A| ≥ t, every u ∈ A keeps ≥ t live members of {u} ∪ N(u), and
the graph on A (on U3 at Unmasking) is connected. The layer itself also aborts a cohort of one client before the
protocol starts. The stage names are those of the server's abort messages.

The test ``tests/protocols/test_abort_prediction.py`` runs the protocol on many seeded drop patterns (node-level at
several rates, and adversarial ones at each threshold's edge) and checks that this prediction matches it every time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from protocols.secagg.protocol import components
from protocols.secagg.signing import consistency_quorum

#: the server's stages, as its abort messages name them
ABORT_STAGES = ("AdvertiseKeys", "ShareKeys", "MaskedInput", "ConsistencyCheck", "Unmasking")


@dataclass(frozen=True)
class Prediction:
    """The round's outcome: ``completes``, else the ``stage`` it aborts at and why; ``summed``: the clients whose
    inputs a completed round sums (U3), empty after an abort; ``survivors``: U1, U2, U3, U4 as far as the round got."""

    completes: bool
    stage: str | None = None
    reason: str = ""
    summed: frozenset[int] = frozenset()
    survivors: dict[str, frozenset[int]] = field(default_factory=dict)


class _Abort(Exception):
    def __init__(self, stage: str, reason: str):
        super().__init__(reason)
        self.stage, self.reason = stage, reason


def _need(
    graph: Mapping[int, list[int]], t: int, alive: set[int], stage: str, linked: set[int] | None = None, *, complete: bool
) -> None:
    """``SecAggServer._need`` on sets: ≥ t alive, ≥ t live in every live client's closed neighbourhood, connected
    (always, on a ``complete`` graph: the search is skipped)."""
    if len(alive) < t:
        raise _Abort(stage, f"{len(alive)} clients alive, fewer than the threshold t = {t}")
    for u in sorted(alive):
        live = len(({u} | set(graph[u])) & alive)
        if live < t:
            raise _Abort(stage, f"client {u}'s neighbourhood has {live} live members, fewer than t = {t}")
    if complete:
        return
    parts = components(graph, alive if linked is None else linked)
    if len(parts) > 1:
        raise _Abort(stage, f"the graph on the survivors splits into {len(parts)} parts")


def predict_round(
    graph: Mapping[int, list[int]],
    threshold: int,
    drops: Mapping[str, Iterable[int]],
    *,
    consistency_check: bool = True,
    cohort: Iterable[int] | None = None,
) -> Prediction:
    """The outcome of one round on ``graph`` (client → neighbours, the cohort being its keys unless ``cohort`` is
    given) with threshold t = ``threshold``, when the clients in ``drops[stage]`` send nothing at ``stage`` (stages
    ``advertise``, ``share``, ``input``, ``unmask`` and, for :func:`secure_sum` only, ``consistency``: the shape of
    the layer's dropped sets and of :meth:`~protocols.secagg.fault_schedule.FaultSchedule.drops`)."""
    members = sorted(int(u) for u in (graph if cohort is None else cohort))
    t = int(threshold)
    d = {s: {int(u) for u in drops.get(s, ())} for s in ("advertise", "share", "input", "consistency", "unmask")}
    seen: dict[str, frozenset[int]] = {}
    everyone = set(members)
    complete = all(set(graph[u]) | {u} == everyone for u in members)  # any nonempty part of it is connected
    if len(members) == 1:
        return Prediction(False, "cohort", "a cohort of one client, whose secure sum would be its own update")
    try:
        u1 = {u for u in members if u not in d["advertise"]}
        seen["U1"] = frozenset(u1)
        _need(graph, t, u1, "AdvertiseKeys", complete=complete)
        u2 = u1 - d["share"]
        seen["U2"] = frozenset(u2)
        _need(graph, t, u2, "ShareKeys", complete=complete)
        holders = {u: {u} | (set(graph[u]) & u1) for u in u2}
        u3 = u2 - d["input"]
        seen["U3"] = frozenset(u3)
        _need(graph, t, u3, "MaskedInput", complete=complete)
        if consistency_check:
            signers = u3 - d["consistency"]
            for u in sorted(u2):
                need = consistency_quorum(len(holders[u]), t)
                if (got := len(signers & holders[u] & u3)) < need:
                    raise _Abort("ConsistencyCheck", f"{got} of client {u}'s share holders signed, fewer than {need}")
        u4 = u3 - d["unmask"] - d["consistency"]  # a client gone at the consistency stage is not asked to unmask
        seen["U4"] = frozenset(u4)
        _need(graph, t, u4, "Unmasking", linked=u3, complete=complete)
        for u in sorted(u3):
            if (got := len(({u} | set(graph[u])) & u4)) < t:
                raise _Abort("Unmasking", f"{got} shares of client {u}'s self-mask, below t = {t}")
        for u in sorted(u2 - u3):
            if (got := len(set(graph[u]) & u4)) < t:
                raise _Abort("Unmasking", f"{got} shares of dropped client {u}'s key, below t = {t}")
    except _Abort as e:
        return Prediction(False, e.stage, e.reason, survivors=seen)
    return Prediction(True, summed=frozenset(u3), survivors=seen)


def abort_stage(message: str) -> str:
    """The stage a :class:`~protocols.secagg.protocol.SecAggAbort` message names (``Unmasking`` for the shares'
    count, which the server checks while unmasking; ``cohort`` for the layer's cohort of one)."""
    for stage in ABORT_STAGES:
        if f"aborted at {stage}" in message:
            return stage
    if "a cohort of one client" in message:
        return "cohort"
    if "shares of" in message:
        return "Unmasking"
    raise ValueError(f"not a secure aggregation abort this module knows: {message!r}")

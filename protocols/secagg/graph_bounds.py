"""How many SecAgg+ neighbours a cohort needs: ``secure_aggregation.neighbors: auto``.

Bell et al. (CCS 2020) replace SecAgg's complete graph by a sparse one of logarithmic degree and show that the
protocol keeps its guarantees when three events are unlikely. For the graph :func:`~protocols.secagg.protocol.
neighbour_graph` builds (a ring over a uniformly random order of the cohort, each client joined to the h = k/2
nearest on either side, so its k neighbours are a uniformly random k-subset of the others), this module bounds
their probabilities and picks the least even k that makes them small. The bounds are union bounds computed here for
that graph, under Bell et al.'s conditions; their paper's own tables are for another graph (Erdős–Rényi) and are not
used. Every bound is **per round**: over R rounds the chance that some round fails is at most R times as large.

Model: the federation has N clients, of which a set C of ⌊γ·N⌋ colludes with the honest-but-curious server, fixed
before the round's order is drawn (static corruption, as in Bell et al.; the layer draws each round's order from a
secret of the server's, ``secure_aggregation.graph_seed: null``). The round's cohort of n clients is drawn uniformly
(fixed-size or Poisson sampling: given its size, a uniform subset), so a cohort member's k neighbours are a uniform
k-subset of the other N − 1 clients as far as C is concerned. Each client drops out of the round (at any stage)
with probability at most δ, independently of the others; t = ⌈τ·(k + 1)⌉ (``secure_aggregation.threshold`` τ).

**Privacy fails** (the server and C learn more than the sum of the honest survivors' inputs) only if

* (P1) some honest client u has ≥ t colluders among its k neighbours: they hold t shares of its mask-agreement
  key, and the protocol hands the server t shares of its self-mask seed, so its input is in the clear. The number
  of colluders among u's neighbours is hypergeometric:
  ``P1 ≤ n · P[Hyp(N − 1, ⌊γN⌋, k) ≥ t]``;
* (P2) the graph on the honest survivors splits: the masks between two parts would no longer cancel within each
  part, so the server learns each part's sum. On a ring joined h deep, the remaining clients split only if two
  disjoint runs of h consecutive clients are all removed (colluding or dropped); a given set of j positions is all
  removed with probability ≤ (⌊γN⌋/N + δ)^j, and there are fewer than n²/2 pairs of runs:
  ``P2 ≤ n(n − 1)/2 · (⌊γN⌋/N + δ)^k``.

**The round aborts** (safely: nothing is applied) only if

* (A1) some client's neighbourhood loses more than k − t clients, leaving fewer than t shares of a secret the server
  needs: ``A1 ≤ n · P[Bin(k, δ) ≥ k − t + 1]``;
* (A2) the survivors' graph splits (the server's own check): ``A2 ≤ n(n − 1)/2 · δ^k``.

**Against a server that deviates** (it may tell different clients different dropout sets, so that some release
shares of u's self-mask seed b_u and others shares of u's mask key s_u), each bound needs its own assumption:

* with ``consistency_check: true`` (default; signed advertisements and a signed survivor set, a client releasing
  u's share only when ⌈(|G_u| + t)/2⌉ of u's share holders signed the same set, :mod:`protocols.secagg.signing`)
  two views need t colluders in G_u, so P1 above holds as written for an active server too, provided the signing
  keys' set-up was honest (``key_source``). The quorum adds an abort: a group of share holders H_u (≤ k + 1)
  with d₁ members gone before ShareKeys and d₂ after has too few signers iff d₁ + 2·d₂ > k + 1 − t, which needs
  more than (k + 1 − t)/2 of its k + 1 to drop: ``A1 ≤ n · P[Bin(k + 1, δ) ≥ ⌊(k + 1 − t)/2⌋ + 1]``
  (in place of the A1 below, which it exceeds);
* with ``consistency_check: false`` an active server needs only 2t − (k + 1) colluders in G_u (each half of the
  honest holders releases one kind of share): P1 counts ``≥ max(1, 2t − (k + 1))`` colluders instead of t. The
  bound so reported covers an active server; the plain-t bound would hold only for an honest-but-curious one.

**Against a server that picks the graph itself.** The bounds above assume the graph is the ring over a uniformly
random order. A deviating server chooses each client's neighbours: every client checks only that it got the k
neighbours and the t the config gives the round's cohort (:meth:`protocols.secagg.layer.SecureAggregation.
_check_neighbourhood`; its neighbours' signed advertisements must show the same k and t), so a target cannot be
isolated with one colluder. Yet the server can still put all ⌊γN⌋ colluders of the federation into one target's
neighbourhood, so privacy against it holds deterministically only when ⌊γN⌋ < t (with the consistency check;
2t − (k + 1) without it; :func:`graph_choice_private`),
and it can build a graph that splits into components (each of ≥ k + 1 clients, the clients' degree being k), so
it learns one sum per component rather than the cohort's sum. With fixed-size sampling the cohort's size is the
config's; under Poisson sampling the server states it (from 2 to N), and so sets k and t within that range.

**Node-level drops.** The bounds above take the clients' drops as independent. On a deployment the clients sit on
nodes (client c on node c mod N_nodes, as ``flower.num_supernodes`` places them) and a node that fails takes all its
clients out together, at the same stage. :func:`node_abort_bound` re-derives the abort bound for that model (each
node fails in a round with probability p, independently, at any stage, the stage even chosen by an adversary); its
docstring holds the derivation. ``neighbors: auto`` still picks the graph from the client-level model above.

``neighbors: auto`` takes the least even k with ``P1 + P2 ≤ 2^−security_bits`` and ``A1 + A2 ≤ 2^−correctness_bits``;
if no k below n − 1 (and at most :data:`MAX_AUTO_NEIGHBOURS`) meets both, the round uses the complete graph (plain
SecAgg, t = ⌈τ·n⌉), whose own bounds are reported and may miss the targets (``GraphChoice.meets_targets``): a small
cohort, or dropouts near 1 − τ, which no graph survives. Colluders beyond ``corrupt_fraction``, colluders chosen
with knowledge of the order (a public ``graph_seed``), dropouts that are not independent (a network failure that
takes out a region), or a sampling that favours some clients (``sampling: proportional``) are outside the bounds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from protocols.secagg.protocol import threshold_for

if TYPE_CHECKING:
    from protocols.config_sections import SecureAggregationConfig

#: the most neighbours ``auto`` tries before it takes the complete graph (keeps the search short when dropouts make
#: every sparse graph miss the abort target; the defaults need 30–42 from 40 to 100,000 clients)
MAX_AUTO_NEIGHBOURS = 1024


@dataclass(frozen=True)
class GraphChoice:
    """The graph a round of n clients uses: ``neighbors`` None means complete, else the degree built (even); the
    bounds as log2 probabilities (−inf: 0); whether they meet the targets asked for (always True for a fixed k)."""

    n: int
    neighbors: int | None
    threshold: int
    log2_privacy_failure: float
    log2_abort: float
    meets_targets: bool = True


def _log2(p: float) -> float:
    return math.log2(p) if p > 0 else -math.inf


def _log_comb(n: int, k: int) -> float:
    if k < 0 or k > n:
        return -math.inf  # C(n, k) = 0
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeom_tail(population: int, marked: int, draws: int, at_least: int) -> float:
    """P[X ≥ at_least] for X the marked items among ``draws`` taken without replacement (terms in log space)."""
    lo, hi = max(at_least, 0), min(marked, draws)
    if lo > hi:
        return 0.0
    total = _log_comb(population, draws)
    terms = (_log_comb(marked, i) + _log_comb(population - marked, draws - i) - total for i in range(lo, hi + 1))
    return min(1.0, math.fsum(math.exp(x) for x in terms))


def binom_tail(trials: int, p: float, at_least: int) -> float:
    """P[Bin(trials, p) ≥ at_least] (terms in log space: no overflow for thousands of trials)."""
    if at_least <= 0:
        return 1.0
    if at_least > trials or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = (_log_comb(trials, i) + i * lp + (trials - i) * lq for i in range(at_least, trials + 1))
    return min(1.0, math.fsum(math.exp(x) for x in terms))


#: the server the bounds are for: ``honest-but-curious`` (it follows the protocol), ``checked`` (it may deviate;
#: the clients run the consistency check), ``unchecked`` (it may deviate; no consistency check). :func:`graph_for`
#: takes ``checked`` or ``unchecked`` from ``consistency_check``.
SERVER_MODELS = ("honest-but-curious", "checked", "unchecked")


def colluders_needed(group: int, t: int, *, server: str) -> int:
    """Colluders in one group of ``group`` share holders that hand the server a client's input: t, unless the server
    may deviate without the consistency check: 2t − group (module docstring)."""
    if server not in SERVER_MODELS:
        raise ValueError(f"server model {server!r}: one of {SERVER_MODELS}")
    return max(1, 2 * t - group) if server == "unchecked" else t


def quorum_abort_drops(group: int, t: int) -> int:
    """The fewest drops in a group of ``group`` after which the consistency check's quorum can fail."""
    return (group - t) // 2 + 1


def failure_bounds(
    n: int,
    k: int,
    *,
    threshold: float,
    corrupt_fraction: float,
    dropout: float,
    population: int | None = None,
    server: str = "honest-but-curious",
) -> tuple[float, float]:
    """(privacy failure, abort) probability bounds for a round of ``n`` of ``population`` clients (default n) on
    the ring joined k/2 deep, against a ``server`` of :data:`SERVER_MODELS` (``checked``: the consistency check's
    abort term; ``unchecked``: the privacy term counts the 2t − (k + 1) colluders a deviating server needs)."""
    if k % 2 or k < 2 or k >= n - 1:
        raise ValueError(f"k must be even, ≥ 2 and below n − 1 = {n - 1}, got {k}")
    N = n if population is None else population
    t = threshold_for(k + 1, threshold)
    corrupt = math.floor(corrupt_fraction * N)
    pairs = n * (n - 1) / 2
    m = colluders_needed(k + 1, t, server=server)
    privacy = n * hypergeom_tail(N - 1, corrupt, k, m) + pairs * (corrupt / N + dropout) ** k
    a1 = binom_tail(k + 1, dropout, quorum_abort_drops(k + 1, t)) if server == "checked" else binom_tail(k, dropout, k - t + 1)
    abort = n * a1 + pairs * dropout**k
    return min(1.0, privacy), min(1.0, abort)


@lru_cache(maxsize=512)
def auto_neighbours(
    n: int,
    *,
    threshold: float,
    corrupt_fraction: float,
    dropout: float,
    security_bits: float,
    correctness_bits: float,
    population: int | None = None,
    server: str = "honest-but-curious",
) -> GraphChoice:
    """The least even k whose bounds (module docstring) meet ``2^−security_bits`` and ``2^−correctness_bits``.

    The complete graph when no k below n − 1 and up to :data:`MAX_AUTO_NEIGHBOURS` does, with ``meets_targets``
    saying whether its own bounds meet them.
    """
    for k in range(2, min(n - 1, MAX_AUTO_NEIGHBOURS + 1), 2):
        privacy, abort = failure_bounds(
            n,
            k,
            threshold=threshold,
            corrupt_fraction=corrupt_fraction,
            dropout=dropout,
            population=population,
            server=server,
        )
        if privacy <= 2.0**-security_bits and abort <= 2.0**-correctness_bits:
            return GraphChoice(n, k, threshold_for(k + 1, threshold), _log2(privacy), _log2(abort))
    full = complete_graph(n, threshold=threshold, corrupt_fraction=corrupt_fraction, dropout=dropout, population=population,
                          server=server)  # fmt: skip
    met = full.log2_privacy_failure <= -security_bits and full.log2_abort <= -correctness_bits
    return GraphChoice(n, None, full.threshold, full.log2_privacy_failure, full.log2_abort, meets_targets=met)


def complete_graph(
    n: int,
    *,
    threshold: float,
    corrupt_fraction: float,
    dropout: float,
    population: int | None = None,
    server: str = "honest-but-curious",
) -> GraphChoice:
    """Plain SecAgg: every client shares with all n − 1 others, t = ⌈τ·n⌉; the survivors cannot split, and the
    colluders hold an honest client's secrets only if ≥ t of them are in the cohort; the round aborts if more than
    n − t drop. A cohort of one client is always aborted (its sum would be its update)."""
    N = n if population is None else population
    t = threshold_for(n, threshold)
    if n <= 1:
        return GraphChoice(n, None, t, -math.inf, 0.0 if n == 1 else -math.inf)
    corrupt = math.floor(corrupt_fraction * N)
    # the colluders in a uniform cohort of n: hypergeometric; an honest member's n − 1 others hold them
    privacy = n * hypergeom_tail(N - 1, corrupt, n - 1, colluders_needed(n, t, server=server))
    abort = binom_tail(n, dropout, quorum_abort_drops(n, t) if server == "checked" else n - t + 1)
    return GraphChoice(n, None, t, _log2(min(1.0, privacy)), _log2(abort))


def round_dropout(section: SecureAggregationConfig) -> float:
    """δ for the bounds: ``dropout_bound``, or the simulated chance to drop at any of the round's 4 stages if larger."""
    return max(section.dropout_bound, 1.0 - (1.0 - section.dropout) ** 4)


def graph_for(n: int, section: SecureAggregationConfig, *, population: int | None = None) -> GraphChoice:
    """The graph of a round of ``n`` of ``population`` clients (default n) under the ``secure_aggregation`` section."""
    common: dict[str, Any] = {"threshold": section.threshold, "corrupt_fraction": section.corrupt_fraction,
                              "dropout": round_dropout(section), "population": population,
                              "server": "checked" if section.consistency_check else "unchecked"}  # fmt: skip
    if section.neighbors == "auto":
        return auto_neighbours(n, security_bits=section.security_bits, correctness_bits=section.correctness_bits, **common)
    k = section.neighbors
    if k is None or k >= n - 1:  # neighbour_graph's own rule
        return complete_graph(n, **common)
    even = 2 * max(1, k // 2)  # the ring joins k // 2 on either side: degree 2·(k // 2)
    privacy, abort = failure_bounds(n, even, **common)
    return GraphChoice(n, even, threshold_for(even + 1, section.threshold), _log2(privacy), _log2(abort))


def graph_choice_colluders(corrupt_fraction: float, population: int) -> int:
    """⌊γN⌋: the colluders a server that picks the graph can place in one client's neighbourhood."""
    return math.floor(corrupt_fraction * population)


def graph_choice_private(needed: int, *, corrupt_fraction: float, population: int) -> bool:
    """Whether a round stays private (deterministically) against a server that picks the graph and places all ⌊γN⌋
    colluders in one neighbourhood: ⌊γN⌋ < ``needed``, the colluders that open an input (:func:`colluders_needed`:
    t with the consistency check). A sum over a component of ≥ k + 1 clients is all it then learns."""
    return graph_choice_colluders(corrupt_fraction, population) < needed


def poisson_cohort_floor(population: int, section: SecureAggregationConfig) -> int:
    """The least cohort size a client accepts under Poisson sampling, a function of the section and N alone.

    Under Poisson sampling only the server knows the realised cohort size n, and every client derives its
    neighbourhood size k and threshold t from the n the server states: a server that claimed n = 2 would give a
    client one neighbour (a colluder) and t = 2. Clients therefore refuse any stated n whose graph (:func:`graph_for`)
    would need no more colluders to open an input (:func:`colluders_needed`) than the ⌊γN⌋ the config declares; the
    floor is the least n ≥ 2 whose graph needs more. A round whose real cohort is below it aborts (the cost: P[Bin(N,
    q) < floor] of the rounds; ``validate`` prints it). N itself when no n qualifies (every round then aborts)."""
    key = (population, section.model_dump_json())
    if key not in _FLOORS:  # a function of the section and N: computed once a process (clients ask every round)
        _FLOORS[key] = _cohort_floor(population, section)
    return _FLOORS[key]


_FLOORS: dict[tuple[int, str], int] = {}


def _cohort_floor(population: int, section: SecureAggregationConfig) -> int:
    server = "checked" if section.consistency_check else "unchecked"
    declared = graph_choice_colluders(section.corrupt_fraction, population)
    # a graph on n clients needs at most t ≤ n colluders: no n ≤ ⌊γN⌋ can qualify
    for n in range(max(2, declared + 1), population + 1):
        choice = graph_for(n, section, population=population)
        group = n if choice.neighbors is None else choice.neighbors + 1
        if colluders_needed(group, choice.threshold, server=server) > declared:
            return n
    return population


# ---------------------------------------------------------------------------------------------- node-level drops


def node_loads(cohort: Iterable[int], nodes: int) -> list[int]:
    """The round's clients on each node (client c on node c mod ``nodes``); nodes without one are left out."""
    counts = Counter(int(c) % nodes for c in cohort)
    return [counts[v] for v in sorted(counts)]


def weighted_tail(loads: Sequence[int], p: float, at_least: int) -> float:
    """P[Σ_j B_j·loads_j ≥ at_least] for B_j independent Bernoulli(p): the chance that the nodes that fail carry at
    least ``at_least`` of the clients, when node j carries ``loads[j]``. Exact: the distribution of the failed clients'
    count, built one node at a time (a polynomial product; O(nodes · clients))."""
    if at_least <= 0:
        return 1.0
    dist = [1.0]  # dist[x] = P[the nodes so far lose x clients]
    for m in loads:
        nxt = [0.0] * (len(dist) + m)
        for x, q in enumerate(dist):
            nxt[x] += q * (1.0 - p)
            nxt[x + m] += q * p
        dist = nxt
    return min(1.0, math.fsum(dist[at_least:]))


def abort_drops(group: int, t: int, *, server: str) -> int:
    """The fewest clients of a group of ``group`` (a client and its neighbours) whose drop can abort the round: the
    consistency check's quorum (``checked``, :func:`quorum_abort_drops`), else ``group − t + 1`` (node_abort_bound)."""
    if server not in SERVER_MODELS:
        raise ValueError(f"server model {server!r}: one of {SERVER_MODELS}")
    return quorum_abort_drops(group, t) if server == "checked" else group - t + 1


def node_abort_bound(
    n: int, k: int | None, *, threshold: float, node_dropout: float, loads: Sequence[int], server: str = "checked"
) -> float:
    """An upper bound on a round's abort probability when whole nodes fail: ``n`` clients on the nodes ``loads``
    (the round's clients on each node, :func:`node_loads`), each node failing with probability p = ``node_dropout``
    independently (all its clients drop together, at any one stage); the ring joined k/2 deep (``k`` None: complete).

    Derivation. Let G_u be client u and its k neighbours (the whole cohort on the complete graph), t the threshold
    and X_u the clients of G_u on failed nodes. Reading the server's checks (:mod:`protocols.secagg.abort_prediction`
    replays them), a round aborts only if (a) some G_u loses X_u ≥ D clients, or (b) the survivors' graph splits:

    * a live u whose G_u keeps fewer than t live members, or a u ∈ U3 whose G_u holds fewer than t self-mask shares
      in U4, has lost ≥ k + 2 − t of G_u; a u gone after ShareKeys whose neighbours hold fewer than t shares of its
      key has lost ≥ k − t + 1 neighbours and itself; an empty stage has lost all of G_u. So D = k + 2 − t =
      |G_u| − t + 1;
    * with the consistency check, u's share holders H_u (the members of G_u that advertised, d₁ of G_u having gone
      at AdvertiseKeys) must reach the quorum ⌈(|H_u| + t)/2⌉ among the signers U3: a of H_u gone at ShareKeys or
      MaskedInput abort it iff d₁ + 2a > |G_u| − t, which needs X_u ≥ d₁ + a > (|G_u| − t)/2, i.e. D =
      ⌊(|G_u| − t)/2⌋ + 1 (:func:`quorum_abort_drops`, no larger than the other D) — :func:`abort_drops`.

    (a) Node-level, X_u = Σ_j B_j·c_uj with c_uj the members of G_u on node j and B_j node j's failure. On the
    complete graph every G_u is the cohort and the graph on any survivors is connected, so P[abort] ≤ P[Σ_j B_j·m_j
    ≥ D] over the nodes' loads m_j, computed exactly (:func:`weighted_tail`). It is the exact abort probability
    when every failure happens after ShareKeys and before Unmasking (at ``input``: then 2X > n − t aborts and
    nothing less does); failures at other stages abort less often. On a sparse graph, union over u:
    ``A1 ≤ Σ_u P[X_u ≥ D]``, each term exact (:func:`group_loss_tail`): the ring is drawn over a uniformly random
    order, so u's k neighbours are a uniform k-subset of the other n − 1 clients, and how many sit on each node is
    multivariate hypergeometric; u's own node holds u too.

    (b) The ring splits only if two disjoint runs of k/2 consecutive clients are gone (module docstring); their k
    clients sit on ≥ ⌈k/L⌉ distinct nodes, all failed: ``A2 ≤ n(n − 1)/2 · p^⌈k/L⌉``.

    The client-level bound (:func:`complete_graph`, :func:`failure_bounds` with each client dropping with
    probability p, the marginal rate) is **not** valid here: it treats the ≥ D drops as independent, while a node
    of L clients brings L of them at the cost of one failure (``tests/protocols/test_node_level_bound.py``)."""
    if not 0.0 <= node_dropout <= 1.0:
        raise ValueError(f"node_dropout must be a probability, got {node_dropout}")
    loads = [int(m) for m in loads if m > 0]
    if sum(loads) != n:
        raise ValueError(f"the nodes' loads {loads} hold {sum(loads)} clients, not the round's {n}")
    p = node_dropout
    if k is None or k >= n - 1:
        t = threshold_for(n, threshold)
        return weighted_tail(loads, p, abort_drops(n, t, server=server))
    if k % 2 or k < 2:
        raise ValueError(f"k must be even and ≥ 2, got {k}")
    t = threshold_for(k + 1, threshold)
    most = min(max(loads), k + 1)
    need = abort_drops(k + 1, t, server=server)
    # Σ_u over the nodes: the m_j clients of node j share one term
    a1 = math.fsum(m * group_loss_tail(m, loads[:j] + loads[j + 1 :], k, p, need) for j, m in enumerate(loads))
    a2 = n * (n - 1) / 2 * p ** -(-k // most)
    return min(1.0, a1 + a2)


def group_loss_tail(own: int, others: Sequence[int], k: int, p: float, at_least: int) -> float:
    """P[X ≥ ``at_least``] for X the members of a client's group (itself and k neighbours drawn uniformly from the
    round's other clients) that sit on failed nodes, each node failing with probability p: the client's node holds
    ``own`` of the round's clients (itself included), the other nodes ``others``. Exact: the neighbours' counts per
    node are drawn one node at a time (hypergeometric given those left), each node failing or not."""
    pool = own - 1 + sum(others)
    if not 0 <= k <= pool:
        raise ValueError(f"{k} neighbours from {pool} other clients")
    # (neighbours placed so far, members lost so far) → probability; the client's own node first (it holds the client)
    state: dict[tuple[int, int], float] = {(0, 0): 1.0}
    remaining = pool  # the other clients on the nodes not yet placed
    for m, itself in [(own - 1, 1), *((m, 0) for m in others)]:
        nxt: dict[tuple[int, int], float] = {}
        for (a, x), q in state.items():
            want = k - a
            for c in range(max(0, want - (remaining - m)), min(m, want) + 1):  # c of the neighbours on this node
                pc = q * math.exp(_log_comb(m, c) + _log_comb(remaining - m, want - c) - _log_comb(remaining, want))
                for key, w in (((a + c, x + itself + c), p), ((a + c, x), 1.0 - p)):  # the node fails, or not
                    nxt[key] = nxt.get(key, 0.0) + pc * w
        state, remaining = nxt, remaining - m
    return min(1.0, math.fsum(q for (a, x), q in state.items() if a == k and x >= at_least))

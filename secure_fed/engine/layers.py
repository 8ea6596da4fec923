"""The protocol-layer interface, and the stack that composes the configured layers.

A layer wraps an algorithm the way Flower strategies wrap strategies and client *mods* wrap client apps. Its
interface is six hooks, by phase (:class:`ProtocolLayer`):

=====================  ==========================  ==========================================================
phase                  hook                        what it may see
=====================  ==========================  ==========================================================
before round 0         ``setup(ctx)``              :class:`ProtocolSetup`: guarded exchanges with the clients,
                       → :class:`SetupResult`      the public label names; its client functions run with the
                                                   clients' data, the server half sees only their replies.
                                                   Gives facts, W's row order, a wrapper of the label-set query
build time             ``wrap_algorithm(algo)``    the algorithm's server step on W (e.g. DP-SGD over label sets)
client side            ``clients()``              a :class:`ClientSide`: the client mod, the local DP-SGD
                       → :class:`ClientSide`       privatizer, the plan steps and their check on a remote node,
                                                   the client's row order; reads the clients' own state only
each round             ``open_round(r, inner)``    a :class:`RoundWrapper` around the round's session: how wire
                       → :class:`RoundSession`     messages are summed (secure aggregation, CKKS) or what the
                                                   server does to the sums (DP noise); the server half sees wire
                                                   messages and sums only
across rounds          ``ledger()``                a :class:`Ledger`: budget stop, secret cohort sampling,
                       → :class:`Ledger`           after-round bookkeeping, privacy report, round stats and the
                                                   operator's private report (server side, public facts and the
                                                   server's own secrets)
checkpoints            ``state()``                 a :class:`LayerState`: server, client and secret scopes, each
                       → :class:`LayerState`       stored apart (the server never holds the client scope)
=====================  ==========================  ==========================================================

A layer is built as ``Layer(settings, env)``: its spec's ``settings(plan)`` (:class:`~secure_fed.plugin_specs.LayerSpec`)
extracts, in one place, the layer's own typed settings from the run's config (its section and the few public facts
of other sections it needs); :class:`StackEnv` holds the run's public facts (the federation's size, the model's
shapes, a guarded exchange with clients). No layer receives the whole config. Shared randomness that a guarantee
relies on comes from :class:`protocols.randomness.SecretStream`, drawn by the party that holds its key.

In process, one layer object holds both halves (the simulator); on Flower each node builds its own copy of the
layers from the same config and holds its clients' state, the server's copy none (:mod:`secure_fed.engine.flower`).
A layer's client-side methods that a remote node may run by name are marked
:func:`~secure_fed.client_functions.client_side`.

Layers compose in the order of the YAML ``protocols:`` list, innermost (closest to the client's training) first:
for ``[dp, secure_aggregation]`` a client clips, then masks; the server unmasks, then adds noise.

This module is the interface only; the layers themselves live above the core (``protocols/``) and are found
through the ``secure_fed.layers`` entry points (:mod:`secure_fed.plugin_specs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from secure_fed.algorithms.base import ClientData, ClientFn, Payload
from secure_fed.algorithms.per_sample import GradientPrivatizer
from secure_fed.engine.aggregation import Aggregate, RoundSession, UpdateLayout

if TYPE_CHECKING:
    from secure_fed.algorithms.base import Algorithm
    from secure_fed.plan import RunPlan


@dataclass
class ProtocolSetup:
    """What a layer's :meth:`~ProtocolLayer.setup` may use.

    Attributes:
        query: a guarded one-off exchange with every client, ``query(payload_fn, client_fn)``.
        query_one: the same with one client, ``query_one(cid, payload, client_fn)``.
        clients: the client-side data objects (client code only; never given to server code).
        label_names: the dataset's label names (known to clients; public in the ARFF header).
    """

    query: Callable[[Callable[[int], Payload], ClientFn], list[tuple[int, Payload]]]
    query_one: Callable[[int, Payload, ClientFn], Payload]
    clients: list[ClientData]
    label_names: list[str]


@dataclass
class StackEnv:
    """Public facts about the federation that layers may use (the server knows all of these)."""

    num_clients: int
    #: torch.Tensor (C,): the public count of clients each row is averaged over (1 per row where each label has its
    #: own client, else the federation's client count; never the data's count of clients holding a label)
    clients_per_row: Any
    num_labels: int
    embedding_dim: int
    theta: dict  # name → tensor (shapes only are used)
    device: Any
    seed: int
    #: the most clients one training instance sits on, a public fact: the contribution bound m in the positive-only
    #: setting when a layer gives one (every instance is bounded to m clients), the number of labels when none does,
    #: 1 when each instance is on one client; the group size that turns client-level DP into instance-level DP
    max_clients_per_instance: int = 1
    #: the model family keeps a per-label row table W (``num_labels`` × ``embedding_dim``)
    has_rows: bool = True
    #: reply keys the listed layers declare as added to every row of W (``FullTable`` rule)
    full_table_keys: tuple[str, ...] = ()
    #: a guarded exchange with some clients during a round, ``call_clients(cids, payload_fn, client_fn,
    #: partial=False)`` → ``[(cid, reply)]``: in process, or as messages to their Flower nodes (``client_fn`` must
    #: then be a registered client function or a layer's ``client_side`` method); with ``partial`` a client whose
    #: node fails or times out is left out of the answers (it dropped out), else the run stops; set by the engine
    call_clients: Any = None

    def update_layout(self) -> UpdateLayout:
        """How one client's update is packed into a flat vector (for layers that sum vectors)."""
        rows = self.num_labels if self.has_rows else 0
        return UpdateLayout.for_model(self.theta, rows, self.embedding_dim, full_table_keys=self.full_table_keys)


@dataclass(frozen=True)
class Bounds:
    """A plan argument that a remote node checks as a range, because it cannot know the exact value (e.g. a noise
    share's standard deviation, which depends on how many updates the round's secure sum holds): a finite number
    in ``[low, high]`` passes."""

    low: float
    high: float


def _finite_number(v: Any) -> bool:
    """An int or float (not a bool) that is a finite float (JSON can carry 1e999 as inf, and ints of any size)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def plan_mismatch(plan: Any, expected: list[dict]) -> str | None:
    """Why ``plan`` (as a node received it) is not ``expected`` (as the node's own config gives it), or None. Every
    step, its order, its keys and its values must match; a :class:`Bounds` value is a range."""
    if not isinstance(plan, list) or not all(isinstance(s, dict) and isinstance(s.get("op"), str) for s in plan):
        return "is not a list of steps, each a mapping with an 'op' name"
    ops = [s["op"] for s in plan]
    want = [str(s.get("op")) for s in expected]
    if ops != want:
        return f"names the steps {ops}, where this run's layers ask for {want}"
    for got, exp in zip(plan, expected, strict=True):
        if set(got) != set(exp):
            return f"gives step {exp['op']!r} the arguments {sorted(got)}, where it takes {sorted(exp)}"
        for key, want_v in exp.items():
            v = got[key]
            if isinstance(want_v, Bounds):
                if not (_finite_number(v) and want_v.low <= v <= want_v.high):
                    return (
                        f"gives step {exp['op']!r} {key}={v!r}, outside the [{want_v.low:.6g}, {want_v.high:.6g}] this "
                        "run's config allows"
                    )
            elif type(v) is not type(want_v) or v != want_v:  # the plan travels as JSON: types survive it
                return f"gives step {exp['op']!r} {key}={v!r}, where this run's config gives {want_v!r}"
    return None


class RoundWrapper(RoundSession):
    """A round session that wraps another; by default it forwards everything."""

    def __init__(self, inner: RoundSession):  # noqa: D107 - no base __init__: state lives in ``inner``
        self.inner = inner
        self.cohort = inner.cohort
        self.min_summands = inner.min_summands
        self.weighting = inner.weighting
        self.device = inner.device

    def client_mod(self, fn: ClientFn) -> ClientFn:
        return self.inner.client_mod(fn)

    def client_plan(self) -> list[dict]:
        """A wrapper whose ``client_mod`` adds a client-side step must describe it here too (a registered step,
        :func:`~secure_fed.client_functions.client_step`), or refuse: by default it adds none. Build it with the
        layer's :attr:`ClientSide.plan_steps`, which a remote node uses to check the plan it receives."""
        return self.inner.client_plan()

    def _set_min_summands(self, n: int) -> None:
        """Tell every session inside this one how few updates a completed sum can hold."""
        session: RoundSession | None = self
        while session is not None:
            session.min_summands = n
            session = getattr(session, "inner", None)

    def submit(self, cid: int, reply: Payload) -> None:
        self.inner.submit(cid, reply)

    def drop(self, cid: int, reason: str) -> None:
        self.inner.drop(cid, reason)

    @property
    def dropped(self) -> dict[int, str]:
        return self.inner.dropped

    def finish(self) -> Aggregate:
        return self.post_own(self.inner.finish())

    def post(self, agg: Aggregate) -> Aggregate:
        return self.post_own(self.inner.post(agg))

    def post_own(self, agg: Aggregate) -> Aggregate:
        return agg


@dataclass(frozen=True)
class SetupResult:
    """What a layer's one-off protocol (:meth:`ProtocolLayer.setup`) gives the run.

    Attributes:
        facts: facts for the (private) summary.
        row_order: the row of W each label lives in (``order[l]``, a permutation), when the layer decided W's row
            order (keyed label pseudonyms); None leaves rows in label order. The engine re-indexes the clients'
            labels and the test labels with it (simulator bookkeeping; the server only knows rows).
        wrap_query: wraps the setup-time exchange the algorithm runs next (label-set collection), or None.
    """

    facts: dict[str, Any] = field(default_factory=dict)
    row_order: Any = None
    wrap_query: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class ClientSide:
    """What a layer runs on the clients (in process, or in a remote node's copy of the run): each field None where
    the layer adds nothing. It reads the clients' own state (their keys and secret streams), which server code
    never receives.

    Attributes:
        mod: ``mod(fn) -> fn``: wraps the client's training function every round (e.g. keyed tokens, clipping).
        privatizer: ``privatizer(cid, round_idx)``: a :class:`~secure_fed.algorithms.per_sample.GradientPrivatizer`
            that turns client ``cid``'s local training in this round into DP-SGD (its randomness the client's own
            secret), or None.
        plan_steps: ``plan_steps(inner, *, round_idx, min_summands=None, on_node=False)``: the round's client plan
            (:meth:`RoundSession.client_plan`) as this layer's session builds it around the plan of the sessions
            inside it (``inner``), from this copy of the run's settings. The server's session builds its plan with
            it (and the round's ``min_summands``); a remote node calls it ``on_node``, through
            :meth:`ProtocolStack.check_client_plan`, with the count its own state knows (``min_summands`` below)
            or None: a value the node cannot know exactly is then a :class:`Bounds` range.
        check_payload: ``check_payload(cid, round_idx, payload, plan)``: on a remote node, before client ``cid``
            trains round ``round_idx`` on ``payload`` under ``plan``, refuse (PermissionError) what this layer's
            client-side randomness cannot take (e.g. a round trained before on another payload or plan), and
            remember what it needs in the client's state.
        min_summands: ``min_summands(cid, round_idx)``: the fewest updates the round's secure sum holds, as client
            ``cid``'s own state knows it (e.g. the SecAgg threshold it checked against its settings), or None.
        row_order: ``row_order(held, label_names)``: in a remote client's copy of the run, the row order the
            layer's setup gave the server, computed from this client's own state (``held``: client id → its labels
            in label order), or None.
    """

    mod: Callable[[ClientFn], ClientFn] | None = None
    privatizer: Callable[[int, int], GradientPrivatizer | None] | None = None
    plan_steps: Callable[..., list[dict]] | None = None
    check_payload: Callable[[int, int, Payload, list[dict]], None] | None = None
    min_summands: Callable[[int, int], int | None] | None = None
    row_order: Callable[[dict[int, list[int]], list[str]], Any] | None = None


@dataclass(frozen=True)
class Ledger:
    """A layer's accounting across rounds (server side): each field None where the layer keeps none.

    Attributes:
        budget_stop: ``budget_stop(round_idx)``: a reason to stop *before* this round, or None.
        cohort_uniforms: ``cohort_uniforms(round_idx, num_clients)``: uniform draws (one per client) for this
            round's client sampling when the layer's guarantee needs the sample to be secret (DP amplification by
            sampling), from the server's secret; None leaves sampling to the public seed.
        after_round: ``after_round(round_idx)``: called once the round's updates are applied.
        accounting: ``accounting()``: the per-unit privacy entries (ε, δ, σ, steps) this layer accounts for.
        round_stats: ``round_stats()``: this round's diagnostics (private: private/diagnostics.jsonl, never a
            released file).
        private_report: ``private_report()``: run-level diagnostics of private data for the operator
            (private/summary.json).
    """

    budget_stop: Callable[[int], str | None] | None = None
    cohort_uniforms: Callable[[int, int], Any] | None = None
    after_round: Callable[[int], None] | None = None
    accounting: Callable[[], dict[str, Any]] | None = None
    round_stats: Callable[[], dict[str, Any]] | None = None
    private_report: Callable[[], dict[str, Any]] | None = None


def _no_state() -> dict[str, Any]:
    return {}


def _load_nothing(state: dict[str, Any]) -> None:
    pass


@dataclass(frozen=True)
class StateScope:
    """One scope of a layer's state: ``save() -> dict`` and ``load(dict)`` (a missing scope saves ``{}``)."""

    save: Callable[[], dict[str, Any]] = _no_state
    load: Callable[[dict[str, Any]], None] = _load_nothing


@dataclass(frozen=True)
class LayerState:
    """A layer's state in its three scopes, each stored apart.

    Attributes:
        server: server-side state, in the server checkpoint (with the model).
        client: the clients' state (their keys, secret streams), in the clients' own storage (``clients.pt``, or
            the Flower nodes' state), never in a server file.
        secret: the server's secrets (e.g. the key behind DP noise), in a private checkpoint of their own, never
            the server checkpoint that holds the model, never a released file.
    """

    server: StateScope = StateScope()
    client: StateScope = StateScope()
    secret: StateScope = StateScope()


class ProtocolLayer:
    """Base class of a protocol layer: set ``name``, take the layer's settings, override the hooks it needs.

    The hooks, by phase (the stack calls nothing else on a layer):

    * :meth:`setup`: once before round 0 (the one-off protocol: key agreement, W's row order, the wrapper of the
      algorithm's label-set query);
    * :meth:`wrap_algorithm`: once, when the run is built (the server's step on W);
    * :meth:`clients`: what runs on the clients (:class:`ClientSide`);
    * :meth:`open_round`: each round, the session that sums the wire messages (secure sum, encryption) or
      post-processes the sum (noise);
    * :meth:`ledger`: the accounting across rounds (:class:`Ledger`: budget, secret sampling, reports);
    * :meth:`state`: what a checkpoint saves, in three scopes (:class:`LayerState`).

    The layer is built as ``Layer(settings, env)``: ``settings`` is what its spec's ``settings(plan)`` extracts from
    the run's config (:class:`~secure_fed.plugin_specs.LayerSpec`; the layer's own section and the few public facts of
    other sections it needs), ``env`` the run's public facts (:class:`StackEnv`); never the whole plan. The
    layer's spec holds its threat model and config rules."""

    name: ClassVar[str] = ""
    #: its clients keep secrets (e.g. keyrings) on the Flower nodes: in the nodes' ``context.state`` and their own
    #: storage, which a resumed run takes up again (each node must have it; :mod:`secure_fed.engine.flower.client_app`)
    client_state_on_nodes: ClassVar[bool] = False

    def __init__(self, settings: Any, env: StackEnv):
        self.settings = settings
        self.env = env

    def setup(self, ctx: ProtocolSetup) -> SetupResult:
        """The one-off protocol before round 0 (:class:`SetupResult`)."""
        return SetupResult()

    def wrap_algorithm(self, algorithm: Algorithm) -> None:
        """Replace the algorithm's server steps where the layer must (e.g. DP-SGD on W)."""

    def clients(self) -> ClientSide:
        """What the layer runs on the clients (asked once, when the stack is built)."""
        return ClientSide()

    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        """This round's session around ``inner`` (a :class:`RoundWrapper`), or ``inner`` itself."""
        return inner

    def ledger(self) -> Ledger:
        """The layer's accounting across rounds (asked once, when the stack is built)."""
        return Ledger()

    def state(self) -> LayerState:
        """The layer's state, by scope (asked once, when the stack is built)."""
        return LayerState()


class ProtocolStack:
    """The configured layers, built from the registered specs and composed in list order.

    Each layer gets its spec's settings (``spec.settings(plan)``) and the run's public facts; the stack asks each
    layer once for its :class:`ClientSide`, :class:`Ledger` and :class:`LayerState` and composes them."""

    def __init__(self, plan: RunPlan, env: StackEnv):
        from secure_fed.plugin_specs import layer_specs

        specs = layer_specs()
        self.layers: list[ProtocolLayer] = [specs[n].load()(specs[n].layer_settings(plan), env) for n in plan.protocols]
        self._clients = [layer.clients() for layer in self.layers]
        self._ledgers = [layer.ledger() for layer in self.layers]
        self._states = [layer.state() for layer in self.layers]
        self._query_wrappers: list[Callable[[Any], Any]] = []

    def __bool__(self) -> bool:
        return bool(self.layers)

    def _hooks(self, parts: list, field_name: str) -> list[Callable]:
        """The non-None ``field_name`` of each layer's part (its :class:`ClientSide` or :class:`Ledger`), in order."""
        return [f for part in parts if (f := getattr(part, field_name)) is not None]

    def _merged(self, field_name: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self._hooks(self._ledgers, field_name):
            out.update(f())
        return out

    def by_name(self) -> dict[str, ProtocolLayer]:
        return {layer.name: layer for layer in self.layers}

    # ------------------------------------------------------------------ before round 0
    def setup(self, ctx: ProtocolSetup, *, on_row_order: Callable[[Any], None]) -> dict[str, Any]:
        """Each layer's setup in order; after each, its row order (if it set one) goes to ``on_row_order``
        before the next layer sets up (so every later layer sees the rows as they will be)."""
        facts: dict[str, Any] = {}
        self._query_wrappers = []
        for layer in self.layers:
            result = layer.setup(ctx)
            facts.update(result.facts)
            if result.row_order is not None:
                on_row_order(result.row_order)
            if result.wrap_query is not None:
                self._query_wrappers.append(result.wrap_query)
        return facts

    def wrap_query(self, query):
        """The algorithm's setup query, wrapped by the layers whose setup gave a wrapper (innermost first)."""
        for wrap in self._query_wrappers:
            query = wrap(query)
        return query

    def wrap_algorithm(self, algorithm) -> None:
        for layer in self.layers:
            layer.wrap_algorithm(algorithm)

    # ------------------------------------------------------------------ client side
    def client_row_order(self, held: dict[int, list[int]], label_names: list[str]) -> Any:
        for f in self._hooks(self._clients, "row_order"):
            if (perm := f(held, label_names)) is not None:
                return perm
        return None

    def client_mod(self, fn):
        for mod in self._hooks(self._clients, "mod"):
            fn = mod(fn)
        return fn

    def local_privatizer(self, cid: int, round_idx: int) -> GradientPrivatizer | None:
        """The privatizer of client ``cid``'s local training (at most one layer may give one)."""
        found = [p for f in self._hooks(self._clients, "privatizer") if (p := f(cid, round_idx)) is not None]
        if len(found) > 1:
            raise ValueError("two protocol layers each turn client training into DP-SGD; list one")
        return found[0] if found else None

    def check_client_plan(self, plan: Any, *, round_idx: int, cid: int | None = None) -> None:
        """Client side, on a remote node (client ``cid``): refuse (PermissionError, one line) a round plan that is
        not the one this node's copy of the run's settings gives, i.e. every layer's
        :attr:`ClientSide.plan_steps` composed as the server's sessions compose them. A server cannot drop a step
        (the clip, the mask), add one, reorder them, weaken one (a larger clip norm, a smaller noise share than the
        round's secure sum allows) or point one at another round."""
        mins = self._hooks(self._clients, "min_summands")
        known = [n for f in mins if cid is not None and (n := f(cid, round_idx))]
        expected: list[dict] = []
        for steps in self._hooks(self._clients, "plan_steps"):
            expected = steps(expected, round_idx=round_idx, min_summands=known[0] if known else None, on_node=True)
        if (why := plan_mismatch(plan, expected)) is not None:
            raise PermissionError(f"the server's plan for round {round_idx} {why}: refused")

    def check_round_payload(self, cid: int, round_idx: int, payload: Payload, plan: list[dict]) -> None:
        """Client side, on a remote node: every layer's :attr:`ClientSide.check_payload`."""
        for f in self._hooks(self._clients, "check_payload"):
            f(cid, round_idx, payload, plan)

    # ------------------------------------------------------------------ rounds
    def open_round(self, round_idx: int, base: RoundSession) -> RoundSession:
        session = base
        for layer in self.layers:
            session = layer.open_round(round_idx, session)
        return session

    # ------------------------------------------------------------------ the ledgers
    def after_round(self, round_idx: int) -> None:
        for f in self._hooks(self._ledgers, "after_round"):
            f(round_idx)

    def budget_stop(self, round_idx: int) -> str | None:
        for f in self._hooks(self._ledgers, "budget_stop"):
            if why := f(round_idx):
                return why
        return None

    def cohort_uniforms(self, round_idx: int, num_clients: int):
        for f in self._hooks(self._ledgers, "cohort_uniforms"):
            if (u := f(round_idx, num_clients)) is not None:
                return u
        return None

    def accounting(self) -> dict[str, Any]:
        """The per-unit privacy entries of every layer that accounts privacy (the released record's source)."""
        return self._merged("accounting")

    def private_report(self) -> dict[str, Any]:
        return self._merged("private_report")

    def round_stats(self) -> dict[str, Any]:
        return self._merged("round_stats")

    # ------------------------------------------------------------------ state, by scope
    def _save(self, scope: str) -> dict[str, Any]:
        return {layer.name: getattr(st, scope).save() for layer, st in zip(self.layers, self._states, strict=True)}

    def _load(self, scope: str, state: dict[str, Any]) -> None:
        for layer, st in zip(self.layers, self._states, strict=True):
            getattr(st, scope).load(state.get(layer.name, {}))

    def state_dict(self) -> dict[str, Any]:
        return self._save("server")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load("server", state)

    def client_state_dict(self) -> dict[str, Any]:
        return self._save("client")

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        self._load("client", state)

    def secret_state_dict(self) -> dict[str, Any]:
        return self._save("secret")

    def load_secret_state_dict(self, state: dict[str, Any]) -> None:
        self._load("secret", state)

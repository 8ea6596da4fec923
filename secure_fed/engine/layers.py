"""The protocol-layer interface, and the stack that composes the configured layers.

A layer wraps an algorithm the way Flower strategies wrap strategies and
client *mods* wrap client apps. It may

* run a one-off protocol before training (:meth:`ProtocolLayer.setup`, e.g.
  run-key agreement), with client-side state that the server never holds;
* wrap the client function (:meth:`ProtocolLayer.client_mod`, e.g. keyed
  tokens, clipping);
* wrap each round's aggregation (:meth:`ProtocolLayer.open_round`: secure
  aggregation and CKKS replace how wire messages are summed, DP post-processes
  the sums);
* wrap the server's step on W (:meth:`ProtocolLayer.wrap_algorithm`);
* keep a privacy ledger and stop training before its budget is exceeded.

Layers compose in the order of the YAML ``protocols:`` list, innermost (closest
to the client's training) first: for ``[dp, secure_aggregation]`` a client
clips, then masks; the server unmasks, then adds noise.

This module is the interface only; the layers themselves live above the core
(``protocols/``) and are found through the ``secure_fed.layers`` entry points
(:mod:`secure_fed.specs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from secure_fed.algorithms.base import ClientData, ClientFn, Payload
from secure_fed.algorithms.per_sample import GradientPrivatizer
from secure_fed.engine.aggregation import Aggregate, RoundSession, UpdateLayout

if TYPE_CHECKING:
    from secure_fed.algorithms.base import Algorithm
    from secure_fed.config.schema import ExperimentConfig


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
        layer's :meth:`ProtocolLayer.client_plan_steps`, which a remote node uses to check the plan it receives."""
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


class ProtocolLayer:
    """Base class. Subclasses set ``name`` and override hooks; the layer's spec
    (:class:`~secure_fed.specs.LayerSpec`) holds its threat model and config rules."""

    name: ClassVar[str] = ""
    #: its clients keep secrets (e.g. keyrings) on the Flower nodes: in the nodes' ``context.state`` and their own
    #: storage, which a resumed run takes up again (each node must have it; :mod:`secure_fed.engine.flower.apps`)
    client_state_on_nodes: ClassVar[bool] = False

    def __init__(self, cfg: ExperimentConfig, env: StackEnv):
        self.cfg = cfg
        self.env = env

    def setup(self, ctx: ProtocolSetup) -> dict[str, Any]:
        """A one-off protocol before round 0; returns facts for the (private) summary."""
        return {}

    def row_order(self) -> Any:
        """After :meth:`setup`: the row of W each label lives in (``order[l]``, a permutation), when the layer
        decided W's row order (keyed label pseudonyms); None leaves rows in label order. The engine re-indexes
        the clients' labels and the test labels with it (simulator bookkeeping; the server only knows rows)."""
        return None

    def wrap_query(self, query):
        """Wrap the setup-time exchange the algorithm uses (label-set collection)."""
        return query

    def client_row_order(self, held: dict[int, list[int]], label_names: list[str]) -> Any:
        """Client side, in a remote client's copy of the run: the row order :meth:`row_order` gave the server,
        computed from this client's own state (``held``: client id → its labels in label order), or None."""
        return None

    def wrap_algorithm(self, algorithm: Algorithm) -> None:
        """Replace the algorithm's server steps where the layer must (e.g. DP-SGD on W)."""

    def client_mod(self, fn: ClientFn) -> ClientFn:
        """Wrap the client's training function (every round)."""
        return fn

    def local_privatizer(self, cid: int, round_idx: int) -> GradientPrivatizer | None:
        """Client side: a :class:`~secure_fed.algorithms.per_sample.GradientPrivatizer` that turns client ``cid``'s
        local training in this round into DP-SGD (its randomness the client's own secret), or None."""
        return None

    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        return inner

    def client_plan_steps(
        self, inner: list[dict], *, round_idx: int, min_summands: int | None = None, on_node: bool = False
    ) -> list[dict]:
        """The round's client plan (:meth:`RoundSession.client_plan`) as this layer's session builds it around the
        plan of the sessions inside it (``inner``), from this copy of the run's config. The server's session calls
        it with the round's ``min_summands`` (the fewest updates a completed sum holds); a remote node calls it
        ``on_node``, through :meth:`ProtocolStack.check_client_plan`, to check the plan the server sent, with the
        count its own protocol state knows (:meth:`client_min_summands`) or None: a value the node cannot know
        exactly is then a :class:`Bounds` range. The default: the layer adds no client step."""
        return inner

    def check_round_payload(self, cid: int, round_idx: int, payload: Payload, plan: list[dict]) -> None:
        """Client side, on a remote node, before client ``cid`` trains round ``round_idx`` on ``payload`` under
        ``plan``: refuse (PermissionError) what this layer's client-side randomness cannot take, e.g. a round
        trained before on another payload or plan (randomness addressed by the round would repeat); remember what
        it needs in the client's state. The default: nothing to check."""

    def client_min_summands(self, cid: int, round_idx: int) -> int | None:
        """Client side: the fewest updates round ``round_idx``'s secure sum holds, as client ``cid``'s own state for
        this layer knows it (e.g. the SecAgg threshold it checked against its config), or None."""
        return None

    def budget_stop(self, round_idx: int) -> str | None:
        """A reason to stop *before* this round, or None."""
        return None

    def cohort_uniforms(self, round_idx: int, num_clients: int) -> Any:
        """Uniform draws (one per client) for this round's client sampling when the layer's guarantee needs the
        sample to be secret (DP amplification by sampling); None leaves sampling to the public seed."""
        return None

    def after_round(self, round_idx: int) -> None:
        """Called once the round's updates are applied."""

    def privacy(self) -> dict[str, Any]:
        """Per-unit privacy entries this layer accounts for (``{}`` if none)."""
        return {}

    def round_stats(self) -> dict[str, Any]:
        """This round's diagnostics (private: they go to private/diagnostics.jsonl, never to a released file)."""
        return {}

    def private_report(self) -> dict[str, Any]:
        """Run-level diagnostics of private data for the operator (private/summary.json)."""
        return {}

    # server-side state (goes into the server checkpoint) and client-side state (clients' own storage)
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def client_state_dict(self) -> dict[str, Any]:
        return {}

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # server-side secrets (e.g. the key behind DP noise): a private checkpoint of their own, never the
    # server checkpoint that holds the model, never a released file
    def secret_state_dict(self) -> dict[str, Any]:
        return {}

    def load_secret_state_dict(self, state: dict[str, Any]) -> None:
        pass


class ProtocolStack:
    """The configured layers, built from the registered specs and composed in list order."""

    def __init__(self, cfg, env: StackEnv):
        from secure_fed.specs import layer_specs

        specs = layer_specs()
        self.layers: list[ProtocolLayer] = [specs[n].load()(cfg, env) for n in cfg.protocols]

    def __bool__(self) -> bool:
        return bool(self.layers)

    def _fold(self, method: str, value):
        for layer in self.layers:
            value = getattr(layer, method)(value)
        return value

    def _merged(self, method: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for layer in self.layers:
            out.update(getattr(layer, method)())
        return out

    def setup(self, ctx: ProtocolSetup, *, on_row_order: Callable[[Any], None]) -> dict[str, Any]:
        """Each layer's setup in order; after each, its row order (if it set one) goes to ``on_row_order``
        before the next layer sets up (so every later layer sees the rows as they will be)."""
        facts: dict[str, Any] = {}
        for layer in self.layers:
            facts.update(layer.setup(ctx))
            if (order := layer.row_order()) is not None:
                on_row_order(order)
        return facts

    def wrap_query(self, query):
        return self._fold("wrap_query", query)

    def by_name(self) -> dict[str, ProtocolLayer]:
        return {layer.name: layer for layer in self.layers}

    def client_row_order(self, held: dict[int, list[int]], label_names: list[str]) -> Any:
        for layer in self.layers:
            if (perm := layer.client_row_order(held, label_names)) is not None:
                return perm
        return None

    def wrap_algorithm(self, algorithm) -> None:
        for layer in self.layers:
            layer.wrap_algorithm(algorithm)

    def client_mod(self, fn):
        return self._fold("client_mod", fn)

    def local_privatizer(self, cid: int, round_idx: int) -> GradientPrivatizer | None:
        """The privatizer of client ``cid``'s local training (at most one layer may give one)."""
        found = [p for layer in self.layers if (p := layer.local_privatizer(cid, round_idx)) is not None]
        if len(found) > 1:
            raise ValueError("two protocol layers each turn client training into DP-SGD; list one")
        return found[0] if found else None

    def open_round(self, round_idx: int, base: RoundSession) -> RoundSession:
        session = base
        for layer in self.layers:
            session = layer.open_round(round_idx, session)
        return session

    def check_client_plan(self, plan: Any, *, round_idx: int, cid: int | None = None) -> None:
        """Client side, on a remote node (client ``cid``): refuse (PermissionError, one line) a round plan that is
        not the one this node's copy of the run's config gives, i.e. every layer's
        :meth:`~ProtocolLayer.client_plan_steps` composed as the server's sessions compose them. A server cannot
        drop a step (the clip, the mask), add one, reorder them, weaken one (a larger clip norm, a smaller noise
        share than the round's secure sum allows) or point one at another round."""
        known = [n for layer in self.layers if cid is not None and (n := layer.client_min_summands(cid, round_idx))]
        expected: list[dict] = []
        for layer in self.layers:
            expected = layer.client_plan_steps(
                expected, round_idx=round_idx, min_summands=known[0] if known else None, on_node=True
            )
        if (why := plan_mismatch(plan, expected)) is not None:
            raise PermissionError(f"the server's plan for round {round_idx} {why}: refused")

    def check_round_payload(self, cid: int, round_idx: int, payload: Payload, plan: list[dict]) -> None:
        """Client side, on a remote node: every layer's :meth:`~ProtocolLayer.check_round_payload`."""
        for layer in self.layers:
            layer.check_round_payload(cid, round_idx, payload, plan)

    def after_round(self, round_idx: int) -> None:
        for layer in self.layers:
            layer.after_round(round_idx)

    def budget_stop(self, round_idx: int) -> str | None:
        for layer in self.layers:
            if why := layer.budget_stop(round_idx):
                return why
        return None

    def cohort_uniforms(self, round_idx: int, num_clients: int):
        for layer in self.layers:
            u = layer.cohort_uniforms(round_idx, num_clients)
            if u is not None:
                return u
        return None

    def privacy(self) -> dict[str, Any]:
        return self._merged("privacy")

    def private_report(self) -> dict[str, Any]:
        return self._merged("private_report")

    def round_stats(self) -> dict[str, Any]:
        return self._merged("round_stats")

    def state_dict(self) -> dict[str, Any]:
        return {layer.name: layer.state_dict() for layer in self.layers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for layer in self.layers:
            layer.load_state_dict(state.get(layer.name, {}))

    def client_state_dict(self) -> dict[str, Any]:
        return {layer.name: layer.client_state_dict() for layer in self.layers}

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        for layer in self.layers:
            layer.load_client_state_dict(state.get(layer.name, {}))

    def secret_state_dict(self) -> dict[str, Any]:
        return {layer.name: layer.secret_state_dict() for layer in self.layers}

    def load_secret_state_dict(self, state: dict[str, Any]) -> None:
        for layer in self.layers:
            layer.load_secret_state_dict(state.get(layer.name, {}))

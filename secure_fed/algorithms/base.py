"""What an algorithm is: a client update plus a server update over the shared round engine.

The engine (``secure_fed.engine``) owns the loop, sampling, aggregation and the
server optimiser. An algorithm says

* what the server sends a client (:meth:`Algorithm.downlink`),
* which loss clients minimise and whether they train their class row(s),
* what a client minimises beyond the loss, through the trainer's hooks (:meth:`Algorithm.client_objective`),
* what the server does to W after aggregation (:meth:`Algorithm.server_step`),
* any one-off protocol before round 0 (:meth:`Algorithm.setup`).

Clients are plain functions of ``(payload, data)``: see ``client.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from secure_fed.messages import Number, Params, RowIds, Rows, Rules, Setting, Visibility
from secure_fed.models.sparse_rows import apply_delta

if TYPE_CHECKING:
    from secure_fed.algorithms.objective import ClientObjective
    from secure_fed.algorithms.params.base import AlgorithmParams


class SharedRows:
    """A client's rows kept as row numbers into one shared matrix, read when used (:class:`ClientData`'s ``x``
    and ``raw``). In the positive-only setting an instance sits on every client of its labels (AmazonCat-13K:
    6M copies of 1.2M rows), so the simulator stores each row once and a client's rows are gathered when it
    trains; ``read(rows)`` returns exactly what an eager copy would hold."""

    __slots__ = ("read", "rows")

    def __init__(self, read: Callable[[np.ndarray], Any], rows: np.ndarray):
        self.read, self.rows = read, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __call__(self) -> Any:
        return self.read(self.rows)


@dataclass
class ClientData:
    """Everything one client holds, and nothing else.

    Attributes:
        client_id: the client's index.
        x: its preprocessed features ``(n, D)``, on the compute device.
        pos: ``(n, k)`` bool; ``pos[i, j]`` says instance i has label ``known_labels[j]``.
        known_labels: ``(k,)`` the labels this client knows. In the positive-only
            setting this is the client's single class.
        raw: its raw features (CSR), used only to compute tokens.
        num_labels: C, the size of the label space (public).
        eval_x, eval_y: its own held-out test rows (features ``(m, D)`` and full label vectors ``(m, C)``) in the
            general multi-label setting, where each client is evaluated on its own data (AmAP); else None.
        copies: ``(n,)`` int64, how many clients each of its instances sits on, this client included (in the
            positive-only setting the instance's labels after the contribution bound: what the bound's rule already
            reads of the instance); None where every instance sits on one client. Held by the client, never sent: a
            privatizer may scale each copy's clip by it (``privacy.local.copy_clip: split``).
        state: what the client keeps from one round to the next (e.g. ``local``'s own model); saved with the
            clients' checkpoint, never sent.

    ``x`` and ``raw`` may be given as :class:`SharedRows` (the simulator's shared storage of large data): reading the
    attribute then gathers the client's rows, the same values an eager copy holds. The reader holds a reference to
    the simulator's whole store (one process simulates every client); what a client function reads through this
    object is still only its own rows.
    """

    client_id: int
    x: torch.Tensor
    pos: torch.Tensor
    known_labels: torch.Tensor
    raw: sp.csr_matrix
    num_labels: int = 0
    eval_x: torch.Tensor | None = None
    eval_y: np.ndarray | None = None
    state: dict[str, Any] = field(default_factory=dict)
    copies: torch.Tensor | None = None

    @property
    def num_examples(self) -> int:
        x = self.__dict__["_x"]
        return len(x) if isinstance(x, SharedRows) else int(x.shape[0])

    def with_rows_read(self) -> ClientData:
        """This client with ``x`` read once (for a training turn that indexes it batch by batch); the same object
        when ``x`` is stored eagerly. The copy shares everything else, ``state`` included."""
        if not isinstance(self.__dict__["_x"], SharedRows):
            return self
        out = copy.copy(self)
        out.__dict__ = {**self.__dict__, "_x": self.x}
        return out


def _lazy(name: str) -> property:
    """A :class:`ClientData` attribute that may be stored as :class:`SharedRows` and is then read on access."""
    key = "_" + name

    def get(self):
        v = self.__dict__[key]
        return v() if isinstance(v, SharedRows) else v

    def set_(self, v) -> None:
        self.__dict__[key] = v

    return property(get, set_)


ClientData.x = _lazy("x")  # after @dataclass: its __init__ assigns through the properties
ClientData.raw = _lazy("raw")


Payload = dict[str, Any]
ClientFn = Callable[[Payload, ClientData], Payload]
#: local training as the engine runs it for one client: payload in, the trainer's reply out
TrainFn = Callable[[Payload], Payload]


class SetupContext:
    """What :meth:`Algorithm.setup` may use: a guarded one-off exchange with every client."""

    def __init__(
        self,
        *,
        query: Callable[[Callable[[int], Payload], ClientFn], list[tuple[int, Payload]]],
        num_labels: int,
        W: torch.Tensor,
        device: torch.device,
        num_clients: int = 0,
        theta: dict[str, torch.Tensor] | None = None,
    ):
        self.query = query
        #: N, how many clients the federation has (public)
        self.num_clients = num_clients
        self.num_labels = num_labels
        self.W = W
        #: the server's θ at round 0 (name → tensor): setup may set it in place, as it may W (a model that the
        #: algorithm computes at setup, e.g. ``label_prior``'s, which no client trains)
        self.theta = theta if theta is not None else {}
        self.device = device


class Algorithm:
    """Base class; subclasses set the class attributes and override hooks."""

    #: its parameters model (``algorithm:``), whose ``capabilities`` declare what the algorithm is: a subclass that sets
    #: it takes its ``name``, ``description``, ``trains_rows`` and ``centralized`` from there (:meth:`__init_subclass__`)
    params: ClassVar[type[AlgorithmParams] | None] = None
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: clients train their own class-embedding row(s) and send the delta back
    trains_rows: ClassVar[bool] = True
    #: its clients keep state between rounds (``ClientData.state``); on Flower it lives on the nodes (their
    #: ``context.state`` and own storage), and a node sends at most one message at a time
    keeps_client_state: ClassVar[bool] = False
    #: the server reads each round's aggregate update of θ (:meth:`server_aggregate`)
    reads_aggregate: ClassVar[bool] = False
    #: one client holding all data and all labels (the oracle)
    centralized: ClassVar[bool] = False
    #: the server's model is the algorithm's result (False for ``local``, where each client keeps its own and the
    #: server's is never trained: the pooled test metrics and GmAP are then not computed)
    has_global_model: ClassVar[bool] = True
    #: the algorithm's client loss, a key of ``secure_fed.algorithms.losses.LOSSES`` (``algorithm.loss`` or the
    #: model family may choose another; see :attr:`client_loss`)
    default_loss: ClassVar[str] = "positive"
    #: what a client may receive of each named server tensor: θ whole, only its own rows of W
    visibility: ClassVar[dict[str, Visibility]] = {"theta": Visibility.ALL, "W": Visibility.OWN_ROWS}
    #: the keys this algorithm sends a client and receives back, with their rules (the guard refuses any other)
    downlink_rules: ClassVar[Rules] = {
        "theta": Params("theta"), "rows": Rows("W"), "row_ids": RowIds("W"), "train_rows": Setting(), "loss": Setting(),
    }  # fmt: skip
    uplink_rules: ClassVar[Rules] = {
        "theta_delta": Params("theta", row_sparse=True, deferred=True), "rows_delta": Rows("W"), "row_ids": RowIds("W"),
        "num_examples": Number(), "loss": Number(),
    }  # fmt: skip

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("params") is not None:
            from secure_fed.catalog import ALGORITHMS as CATALOG  # the registered descriptions (light)

            caps = cls.params.capabilities
            cls.name = cls.params.model_fields["name"].default
            cls.description = CATALOG.get(cls.name, "")
            cls.trains_rows, cls.centralized = caps.trains_rows, caps.centralised

    def __init__(self, cfg: AlgorithmParams, *, device: torch.device | None = None, loss: str | None = None):
        self.cfg = cfg
        #: where the algorithm's server-side tensors live
        self.device = device or torch.device("cpu")
        self._loss = loss

    @property
    def client_loss(self) -> str:
        """The loss clients minimise: the one chosen for this run, else the algorithm's default."""
        return self._loss or self.default_loss

    def setup(self, ctx: SetupContext) -> dict[str, Any]:
        """One-off protocol before round 0. Returns facts to log in the summary."""
        return {}

    def downlink(self, theta: dict[str, torch.Tensor], W: torch.Tensor | None, known_labels: torch.Tensor) -> Payload:
        """The payload for a client that knows ``known_labels``: θ and only its own rows (no rows when the model
        family keeps no row table)."""
        if W is None:
            return {"theta": theta, "train_rows": False, "loss": self.client_loss}
        return {
            "theta": theta,
            "rows": W[known_labels],
            "row_ids": known_labels,
            "train_rows": self.trains_rows,
            "loss": self.client_loss,
        }

    def client_update(self, payload: Payload, data: ClientData, train: TrainFn) -> Payload:
        """Client side: one round's work on the client, given ``train`` (local training on ``data`` from the
        payload's θ). Runs on the client with only its own data; its reply is checked against
        :attr:`uplink_rules`. Default: the trainer's reply as is."""
        return train(payload)

    def client_objective(self, payload: Payload, data: ClientData) -> ClientObjective | None:
        """Client side: the hooks this algorithm adds to the client's local training this round
        (:class:`~secure_fed.algorithms.objective.ClientObjective`: a per-example term, a weight term, the client's
        own state), or None for the loss alone (the default). Called on the client, with its own data; the
        trainer calls the hooks on every path (sequential, DP-SGD, vectorised)."""
        return None

    def client_model(self, payload: Payload, data: ClientData, reply: Payload) -> dict[str, torch.Tensor]:
        """Client side: θ of the client's own model after :meth:`client_update` (what AmAP evaluates on the
        client's own test data). Default: the θ it received plus its update."""
        return {n: apply_delta(t, reply["theta_delta"][n]) for n, t in payload["theta"].items()}

    def server_aggregate(self, theta_mean: dict[str, torch.Tensor], num_clients: float) -> None:
        """Server side, when :attr:`reads_aggregate`: the round's mean update of θ as the server receives it (what the
        layers release: under ``dp`` the noised sum over the denominator, under secure aggregation the unmasked sum),
        before the server optimiser applies it, and the count it averages over: under ``dp`` the layer's public fixed
        denominator (q·N, never the realised number of updates, which a secret Poisson cohort and dropouts make
        private), else the number of updates summed. Server state derived from them (e.g. a correction the clients
        apply in the next round) is post-processing of that release. Default: nothing."""

    def server_step(self, W: torch.Tensor, round_idx: int, participating: torch.Tensor) -> dict[str, float]:
        """Modify W in place after aggregation; return stats to log. Default: nothing.

        ``participating`` holds the labels whose clients took part in this round (𝔆ᵗ).
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

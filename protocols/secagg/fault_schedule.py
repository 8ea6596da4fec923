"""A scripted, seeded fault schedule for SecAgg+ rounds: which nodes die at which stage of which round.

One file format serves the in-process engine (``secure_aggregation.fault_schedule: PATH``, which then replaces the
random ``secure_aggregation.dropout`` draws of :mod:`protocols.secagg.layer`) and a real deployment's fault
injector (the same kills done with ``kill -9``). YAML or JSON::

    nodes: 8                 # clients sit on nodes: client c on node c mod nodes (as flower.num_supernodes)
    events:
      - {round: 1, stage: advertise, kill: [2, 5]}   # stage ∈ advertise | share | input | unmask; node ids
      - {round: 2, stage: unmask, kill: [0]}
      - {round: 3, stage: superlink}                 # deployment only: kill -9 the SuperLink after round 3's start

``round`` numbers rounds as ``metrics.jsonl`` does: 1 is the run's first round, i.e. the layer's ``round_idx`` 0
(the ``secagg_round`` of the round's messages) — ``round = round_idx + 1``.

Semantics: a node killed at stage s of round r drops out of SecAgg+ from stage s on in round r, all its clients
together. A client dropped at ``advertise`` never advertised; at ``share`` it advertised but sent no shares; at
``input`` it shared keys (and trained) but its masked input never reached the server; at ``unmask`` it sent its
input (and, with ``consistency_check``, signed the survivor set) but sent no unmasking shares. The node is restarted
and its clients take part again from round r + 1's AdvertiseKeys, with fresh round keys. ``superlink`` events
are ignored in process (the replay of a resumed deployment is the uninterrupted in-process run).

A node is killed at most once a round (a dead node cannot die again before its restart at the next round), and
``superlink`` at most once a round. Anything else in the file is refused with one :class:`ConfigError` line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from secure_fed.errors import ConfigError

#: the SecAgg+ stages a node can be killed at, in the order a round runs them
STAGES = ("advertise", "share", "input", "unmask")
#: the deployment-only event: kill -9 the SuperLink after the round's start
SUPERLINK = "superlink"


@dataclass(frozen=True)
class FaultEvent:
    """One event: in ``round`` (metrics.jsonl's numbering, 1 = first), at ``stage``, kill the nodes ``kill``
    (empty for ``superlink``)."""

    round: int
    stage: str
    kill: tuple[int, ...] = ()


@dataclass(frozen=True)
class FaultSchedule:
    """A validated schedule: ``nodes`` nodes (client c on node c mod nodes) and its events, in file order."""

    nodes: int
    events: tuple[FaultEvent, ...]

    def node_of(self, cid: int) -> int:
        """The node client ``cid`` sits on (as ``flower.num_supernodes`` places clients)."""
        return int(cid) % self.nodes

    def kills(self, round_idx: int) -> dict[int, str]:
        """Node → the stage it is killed at in the round of layer index ``round_idx`` (file round ``round_idx + 1``)."""
        return {v: e.stage for e in self.events if e.round == round_idx + 1 and e.stage in STAGES for v in e.kill}

    def superlink_killed(self, round_idx: int) -> bool:
        """Whether the schedule kills the SuperLink in the round of layer index ``round_idx`` (deployment only)."""
        return any(e.round == round_idx + 1 and e.stage == SUPERLINK for e in self.events)

    def drops(self, round_idx: int, cohort: Iterable[int]) -> dict[str, set[int]]:
        """Each stage's dropped clients of ``cohort`` in the round of layer index ``round_idx``: a client whose node
        is killed at stage s is in the sets of s and of every later stage (it sends nothing from s on), so a stage's
        set is every cohort client that does not send that stage's message. The shape of the layer's random draws
        (``secure_aggregation.dropout``), and of :func:`~protocols.secagg.protocol.secure_sum`'s ``drop``."""
        killed = self.kills(round_idx)
        out: dict[str, set[int]] = {s: set() for s in STAGES}
        for cid in cohort:
            stage = killed.get(self.node_of(int(cid)))
            if stage is not None:
                for s in STAGES[STAGES.index(stage) :]:
                    out[s].add(int(cid))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The schedule in the file's form (what :func:`parse_fault_schedule` reads back)."""
        events = [{"round": e.round, "stage": e.stage, **({"kill": list(e.kill)} if e.stage != SUPERLINK else {})}
                  for e in self.events]  # fmt: skip
        return {"nodes": self.nodes, "events": events}


def _whole(value: Any, what: str, *, least: int) -> int:
    """``value`` as a whole number ≥ ``least``, or one ConfigError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value != int(value):
        raise ConfigError(f"{what} must be a whole number, not {value!r}")
    if int(value) < least:
        raise ConfigError(f"{what} must be at least {least}, not {int(value)}")
    return int(value)


def parse_fault_schedule(raw: Any, *, source: str = "fault schedule") -> FaultSchedule:
    """A :class:`FaultSchedule` from the file's parsed content; anything malformed is one :class:`ConfigError`
    naming ``source`` and the offending entry."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with 'nodes' and 'events', got {type(raw).__name__}")
    if extra := sorted(set(raw) - {"nodes", "events"}):
        raise ConfigError(f"{source}: unknown key {extra[0]!r} (a schedule has 'nodes' and 'events')")
    if "nodes" not in raw:
        raise ConfigError(f"{source}: 'nodes' is missing (clients sit on nodes: client c on node c mod nodes)")
    nodes = _whole(raw["nodes"], f"{source}: nodes", least=1)
    events_raw = raw.get("events") or []
    if not isinstance(events_raw, list):
        raise ConfigError(f"{source}: 'events' must be a list, got {type(events_raw).__name__}")
    events: list[FaultEvent] = []
    killed: dict[tuple[int, int], str] = {}  # (round, node) → the stage it was killed at
    superlink: set[int] = set()
    for i, ev in enumerate(events_raw):
        where = f"{source}: event {i + 1}"
        if not isinstance(ev, dict):
            raise ConfigError(f"{where}: expected a mapping like {{round: 1, stage: share, kill: [2]}}, got {ev!r}")
        if extra := sorted(set(ev) - {"round", "stage", "kill"}):
            raise ConfigError(f"{where}: unknown key {extra[0]!r} (an event has round, stage and kill)")
        if "round" not in ev or "stage" not in ev:
            raise ConfigError(f"{where}: needs 'round' and 'stage'")
        rnd = _whole(ev["round"], f"{where}: round", least=1)
        stage = ev["stage"]
        if stage == SUPERLINK:
            if ev.get("kill"):
                raise ConfigError(f"{where}: a superlink event kills the SuperLink, not nodes: drop 'kill'")
            if rnd in superlink:
                raise ConfigError(f"{where}: the SuperLink is already killed in round {rnd}")
            superlink.add(rnd)
            events.append(FaultEvent(rnd, SUPERLINK))
            continue
        if stage not in STAGES:
            raise ConfigError(f"{where}: stage {stage!r} is not one of {', '.join(STAGES)} or {SUPERLINK}")
        kill = ev.get("kill")
        if not isinstance(kill, list) or not kill:
            raise ConfigError(f"{where}: 'kill' must be a non-empty list of node ids (0 to {nodes - 1})")
        ids = [_whole(v, f"{where}: node id", least=0) for v in kill]
        for v in ids:
            if v >= nodes:
                raise ConfigError(f"{where}: node {v} does not exist (nodes: {nodes}, ids 0 to {nodes - 1})")
            if (rnd, v) in killed:
                raise ConfigError(f"{where}: node {v} is already killed in round {rnd} (at {killed[(rnd, v)]}); a "
                                  "killed node rejoins only at the next round")  # fmt: skip
            killed[(rnd, v)] = stage
        events.append(FaultEvent(rnd, stage, tuple(ids)))
    return FaultSchedule(nodes, tuple(events))


def load_fault_schedule(path: str | Path) -> FaultSchedule:
    """Read and validate a schedule file (YAML or JSON); a missing, unreadable or malformed file is one
    :class:`ConfigError` naming the file."""
    p = Path(path)
    source = f"secure_aggregation.fault_schedule {path}"
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: a folder, not a file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{source}: cannot be read ({type(e).__name__})") from None
    try:
        raw = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{source}: not valid {'JSON' if p.suffix == '.json' else 'YAML'} ({first})") from None
    return parse_fault_schedule(raw, source=source)

"""Benchmark: a deployment node's state (its clients' SecAgg+ and keyed-hashing secrets) through the Flower codec,
against pickling the same state with ``torch.save``/``torch.load``, in one process.

    python experiments/benchmark_node_state.py [--state FILE] [--clients 10] [--peers 159] [--repeat 3]

A node writes its state into ``context.state`` (which Flower serialises on every message of a deployment) and into
its state file after each message, and reads it back before the next one. The state is a node's state file
(``--state nodes/<i>/<session>/node-<i>.state``, written by a run) or, by default, a synthetic one of the shape a
16-node Bibtex FedALC run's node holds (``--clients`` clients, each with ``--peers`` peers' 32-byte keys, 110
neighbours' session keys for each of 102 peers, their share pairs and groups: about 120,000 bytes values and
250,000 ints). Prints the codec's round trip (encode, Flower's protobuf and back, decode), the pickle round trip,
their ratio, the sizes, and whether both come back equal to the original.
"""

from __future__ import annotations

import argparse
import io
import time

import torch


def synthetic_state(clients: int, peers: int) -> dict:
    """A node's protocol state of the shape SecAgg+ and keyed hashing keep per client (random keys)."""
    g = torch.Generator().manual_seed(0)

    def key() -> bytes:
        return bytes(torch.randint(0, 256, (32,), generator=g, dtype=torch.uint8).tolist())

    neighbours = list(range(min(110, peers)))
    hashing, secagg = {}, {}
    for c in range(clients):
        hashing[c] = {"sk": key(), "run_key": key(), "salt": key()[:16], "pseudonym": key()}
        secagg[c] = {
            "sign_sk": key(),
            "directory": {p: key() for p in range(peers)},
            "round": {
                "cid": c,
                "round_idx": 2,
                "neighbours": neighbours,
                "threshold": 67,
                "c_sk": key(),
                "s_sk": key(),
                "b_seed": key(),
                "peers_c": {p: key() for p in neighbours},
                "peers_s": {p: key() for p in neighbours},
                "held_shares": {p: [[p + 1, 2**61 - p], [p + 2, 2**60 + p]] for p in neighbours[:102]},
                "masked": True,
                "consistency": True,
                "peer_groups": {p: [neighbours + [p], neighbours[::-1] + [p]] for p in neighbours + [peers]},
                "peer_sessions": {p: {q: key() for q in neighbours + [peers]} for p in neighbours[:102]},
                "signed_u3": None,
                "unmasked": False,
            },
            "advertised": {0: key(), 1: key(), 2: key()},
        }
    return {"protocols": {"keyed_hashing": hashing, "dp": {}, "secure_aggregation": secagg}, "clients": {}}


def codec_round_trip(state: dict) -> tuple[dict, int]:
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
    from flwr.proto.recorddict_pb2 import RecordDict

    from secure_fed.engine.flower.codec import decode, encode

    wire = recorddict_to_proto(encode(state)).SerializeToString()
    proto = RecordDict()
    proto.ParseFromString(wire)
    return decode(recorddict_from_proto(proto)), len(wire)


def pickle_round_trip(state: dict) -> tuple[dict, int]:
    buf = io.BytesIO()
    torch.save(state, buf)
    size = buf.tell()
    buf.seek(0)
    return torch.load(buf, weights_only=False), size


def same(a, b) -> bool:
    """Equal with the same types all the way down (``True`` is not ``1``; tensors by dtype, shape and values)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def best_of(fn, state: dict, repeat: int) -> tuple[float, dict, int]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        back, size = fn(state)
        times.append(time.perf_counter() - t0)
    return min(times), back, size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default=None, help="a node's state file (node-<i>.state) instead of the synthetic one")
    ap.add_argument("--clients", type=int, default=10, help="clients on the node (synthetic state)")
    ap.add_argument("--peers", type=int, default=159, help="clients in the run, less one (synthetic state)")
    ap.add_argument("--repeat", type=int, default=3, help="round trips of each kind; the fastest is reported")
    a = ap.parse_args(argv)
    if a.state:
        from secure_fed.engine.flower.client_app import read_node_state_file

        state = read_node_state_file(a.state)
    else:
        state = synthetic_state(a.clients, a.peers)
    codec_s, codec_back, codec_size = best_of(codec_round_trip, state, a.repeat)
    pickle_s, pickle_back, pickle_size = best_of(pickle_round_trip, state, a.repeat)
    print(f"codec (encode, protobuf, decode): {codec_s:.3f} s, {codec_size / 1e6:.1f} MB, equal: {same(state, codec_back)}")
    print(f"torch.save/torch.load (pickle):   {pickle_s:.3f} s, {pickle_size / 1e6:.1f} MB, equal: {same(state, pickle_back)}")
    print(f"codec / pickle time: {codec_s / pickle_s:.2f}")
    return 0 if same(state, codec_back) else 1


if __name__ == "__main__":
    raise SystemExit(main())

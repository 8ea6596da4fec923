"""Per-round overhead of the secure-aggregation and CKKS layers for Bibtex-sized updates.

Usage::

    python experiments/benchmark_protocols.py [--clients 159] [--parts theta,rows] [--neighbors 16]
                                              [--ckks-clients N] [--prg]

``theta`` is the FedALC text encoder's parameter vector on Bibtex (1836 → 512 → 1024 → 1024 → 512),
``rows`` the class-row block (159 × 512 deltas + 159 counts). Secure aggregation runs the whole protocol
with all ``--clients`` clients (no dropout, then 10% dropped before masked input); CKKS encrypts
``--ckks-clients`` clients' vectors for real and scales the per-client costs to ``--clients``
(stated in the output). Prints seconds per round and bytes per client. ``--prg`` first times one mask of each
part's size from the PRG (AES-256-CTR written into the output) against encrypting a fresh zero buffer of the
output's size (the PRG before), measured in the same run, and prints the ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tenseal as ts

from protocols.ckks import make_context, public_bytes
from protocols.secagg.encoding import FixedPoint
from protocols.secagg.protocol import secure_sum

SIZES = {"theta": 1836 * 512 + 512 + 512 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 512 + 512, "rows": 159 * 513}


def bench_secagg(n: int, size: int, neighbors: int, drop_frac: float) -> dict:
    rng = np.random.default_rng(0)
    fp = FixedPoint(1e4, 24, 64)
    base = fp.encode(rng.normal(scale=0.01, size=size))
    inputs = {u: base for u in range(n)}  # content does not change the cost
    drop = {"input": set(rng.choice(n, int(drop_frac * n), replace=False).tolist())} if drop_frac else None
    t0 = time.perf_counter()
    _, u3, _ = secure_sum(inputs, threshold=0.6, neighbors=neighbors, drop=drop)
    return {"seconds": time.perf_counter() - t0, "survivors": len(u3), "bytes_per_client": size * 8}


def bench_prg(size: int, repeats: int = 20) -> dict:
    """Seconds per mask: ``prg_words`` against the whole-buffer encryption it replaced, alternating, same key."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from protocols.crypto import prg_words

    key = bytes(range(32))

    def whole_buffer() -> np.ndarray:
        enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()
        return np.frombuffer(enc.update(bytes(8 * size)), dtype="<u8")

    from protocols.crypto import prg_scratch

    assert np.array_equal(prg_words(key, size), whole_buffer())
    scratch = prg_scratch(size)
    times = {"prg_words": 0.0, "prg_words_scratch": 0.0, "whole_buffer": 0.0}
    for _ in range(repeats):
        for name, fn in (("prg_words", lambda: prg_words(key, size)), ("whole_buffer", whole_buffer),
                         ("prg_words_scratch", lambda: prg_words(key, size, scratch=scratch))):  # fmt: skip
            t0 = time.perf_counter()
            fn()
            times[name] += time.perf_counter() - t0
    return {k: v / repeats for k, v in times.items()}


def bench_ckks(n_real: int, n_total: int, size: int) -> dict:
    ctx = make_context(8192, [60, 40, 40, 60], 40)
    pub = ts.context_from(public_bytes(ctx))
    slots = 4096
    x = np.random.default_rng(0).normal(scale=0.01, size=size)
    t0 = time.perf_counter()
    blobs = [ts.ckks_vector(pub, x[o : o + slots]).serialize() for o in range(0, size, slots)]
    enc = time.perf_counter() - t0
    nbytes = sum(len(b) for b in blobs)
    t0 = time.perf_counter()
    acc = [ts.ckks_vector_from(pub, b) for b in blobs]
    for _ in range(n_real - 1):
        acc = [a + ts.ckks_vector_from(pub, b) for a, b in zip(acc, blobs, strict=True)]
    agg_per_client = (time.perf_counter() - t0) / n_real
    t0 = time.perf_counter()
    for c in acc:
        c.link_context(ctx)
        c.decrypt()
    dec = time.perf_counter() - t0
    return {
        "encrypt_s_per_client": enc,
        "encrypt_s_all_clients": enc * n_total,
        "aggregate_s": agg_per_client * n_total,
        "decrypt_s": dec,
        "bytes_per_client": nbytes,
        "ciphertexts_per_client": len(blobs),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=159)
    ap.add_argument("--parts", default="rows,theta")
    ap.add_argument("--neighbors", type=int, default=16)
    ap.add_argument("--ckks-clients", type=int, default=4, help="clients actually encrypted; costs scaled to --clients")
    ap.add_argument("--skip-secagg", action="store_true")
    ap.add_argument("--skip-ckks", action="store_true")
    ap.add_argument("--prg", action="store_true", help="also time the mask PRG against the whole-buffer encryption")
    args = ap.parse_args(argv)
    for part in args.parts.split(","):
        size = SIZES[part]
        print(f"== {part}: {size:,} values per client, {args.clients} clients")
        if args.prg:
            r = bench_prg(size)
            print(f"mask PRG, {size:,} words: {r['whole_buffer'] * 1e3:.2f} ms (a fresh zero buffer encrypted, before) "
                  f"vs {r['prg_words'] * 1e3:.2f} ms (into a fresh output: x{r['whole_buffer'] / r['prg_words']:.2f}) "
                  f"vs {r['prg_words_scratch'] * 1e3:.2f} ms (into a reused buffer, as a client's pairwise masks: "
                  f"x{r['whole_buffer'] / r['prg_words_scratch']:.2f})", flush=True)  # fmt: skip
        if not args.skip_secagg:
            for frac in (0.0, 0.1):
                r = bench_secagg(args.clients, size, args.neighbors, frac)
                print(f"secure_aggregation (k={args.neighbors}, t=0.6, {int(frac * 100)}% drop before input): "
                      f"{r['seconds']:.2f} s/round, {r['bytes_per_client'] / 1e6:.2f} MB masked input per client, "
                      f"{r['survivors']} summed", flush=True)  # fmt: skip
        if not args.skip_ckks:
            r = bench_ckks(args.ckks_clients, args.clients, size)
            print(f"ckks (8192, [60,40,40,60], 2^40; {args.ckks_clients} clients measured, scaled to {args.clients}): "
                  f"encrypt {r['encrypt_s_per_client']:.3f} s/client ({r['encrypt_s_all_clients']:.1f} s all), "
                  f"aggregate {r['aggregate_s']:.2f} s, decrypt {r['decrypt_s']:.3f} s, "
                  f"{r['bytes_per_client'] / 1e6:.2f} MB in {r['ciphertexts_per_client']} ciphertexts per client",
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

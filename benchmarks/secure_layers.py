"""Secure aggregation and CKKS rounds against the plaintext round, measured in the same run, with where the time goes.

    python benchmarks/secure_layers.py [--rounds 2] [--neighbors auto[,16,...]] [--executor sequential] [--precision fp32]
                                   [--secagg-32] [--ckks-coeffs 60,40,40,60] [--ckks-all-blocks] [--skip-ckks]
                                   [--json FILE]

Runs whole rounds of ``experiments/configs/bibtex_fedalc.yaml`` (all 159 clients; needs ``$SECURE_FED_DATA``)
through the engine, one warm-up round each and then the median of ``--rounds`` rounds, the variants' rounds
interleaved, for:

* **plaintext**: no protocol layer;
* **secure_aggregation** on θ and the class rows (the whole update), on the SecAgg+ graph ``--neighbors`` gives
  (default ``auto``, the config's default: k = 32 for 159 clients, see ``protocols.secagg.graph_bounds``; more
  values, comma-separated, add one variant each), each client masking with k + 1 AES-256-CTR streams (its self
  mask and one per neighbour), mod 2^64
  (the default: 8-byte words); with ``--secagg-32`` also mod 2^32 (4-byte words, half the key stream), values
  clipped to ±8 (Flower's SecAgg+ default range; the run stops if a weight or loss would be clipped) with the most
  fractional bits that 159 clients' sum allows (20: a step of 9.5e-7);
* **ckks** on the class rows (``ckks.encrypt: [rows]``; θ in plaintext), at the default parameters and at each
  ``--ckks-coeffs`` set (``poly_modulus_degree`` 8192, scale 2^40), each client encrypting the ciphertexts of its
  own rows (``ckks.row_blocks: own``, the default); with ``--ckks-all-blocks`` also every ciphertext (``all``).

Prints seconds per round, each layer's ratio to the plaintext round, and the layers' own timers (SecAgg: key
set-up with Shamir sharing, the clients' masking, the server's unmasking; CKKS: encryption with serialisation,
the server's deserialisation and additions, decryption). For secure aggregation it also measures, in the same
run, the AES-CTR key stream of one θ-sized mask on this process's threads and multiplies it by the round's
number of streams: the key-stream floor, and its share of the round. In process the masked vectors are not
serialised (they are numpy arrays), so serialisation costs nothing here; on Flower they travel as bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BIBTEX = REPO / "experiments/configs/bibtex_fedalc.yaml"


def run_interleaved(variants: dict[str, list[str]], rounds: int) -> dict[str, dict]:
    """Per variant (name → config overrides): seconds per round, the median of ``rounds`` rounds after one warm-up,
    the variants' rounds interleaved (plaintext, layer, plaintext, layer, …) so that a drift in the machine's speed
    falls on all of them alike; and the last round's statistics."""
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment
    from secure_fed.engine.collector import long_lived_frozen

    with tempfile.TemporaryDirectory() as tmp:
        exps = {}
        for name, overrides in variants.items():
            cfg = load_config(BIBTEX, [*overrides, "output.progress=false", "device=cpu"])
            exps[name] = Experiment(cfg, run_dir=Path(tmp) / name.replace(" ", "_"))
            exps[name].setup()
            exps[name].train_round()  # warm-up
        times: dict[str, list[float]] = {n: [] for n in exps}
        stats: dict[str, dict] = {}
        with long_lived_frozen():  # as a run's rounds (``Experiment.run_rounds``): set-up objects out of gc's scans
            for _ in range(rounds):
                for name, exp in exps.items():
                    t0 = time.perf_counter()
                    stats[name] = exp.train_round()
                    times[name].append(time.perf_counter() - t0)
        sizes = {n: (e.stack.layers[0].layout.size if e.stack.layers else None) for n, e in exps.items()}
    return {
        n: {"s_per_round": statistics.median(times[n]), "rounds": times[n], "stats": stats[n], "vector_size": sizes[n]}
        for n in exps
    }


def keystream_seconds(size: int, terms: int, bits: int = 64, repeats: int = 3) -> dict:
    """Per mask of ``size`` words (mod 2^``bits``: 4-byte words up to 2^32, else 8), on one thread and on
    :func:`~protocols.crypto.mask_threads` threads: the AES-256-CTR key stream alone (written block by block into a
    cache-sized buffer, as ``add_masks`` does, nothing added), and ``add_masks`` with ``terms`` masks into a fresh
    vector (key streams, the modular sums and the output), divided by ``terms``."""
    from concurrent.futures import ThreadPoolExecutor

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from protocols.crypto import MASK_BLOCK_WORDS, add_masks, mask_threads, word_dtype

    w = word_dtype(bits).itemsize
    zeros = bytes(w * MASK_BLOCK_WORDS)
    blocks = list(range(0, size, MASK_BLOCK_WORDS))

    def stream_only(key: bytes, first: int, last: int) -> None:
        enc = Cipher(algorithms.AES(key), modes.CTR((blocks[first] * w // 16).to_bytes(16, "big"))).encryptor()
        buf = bytearray(w * MASK_BLOCK_WORDS + 15)
        for o in blocks[first:last]:
            m = min(MASK_BLOCK_WORDS, size - o)
            enc.update_into(zeros[: w * m], memoryview(buf)[: w * m + 15])

    x = np.zeros(size, dtype=word_dtype(bits))
    res: dict = {}
    for threads in sorted({1, mask_threads()}):
        cuts = [len(blocks) * i // threads for i in range(threads + 1)]
        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            for i in range(repeats * terms):
                list(pool.map(lambda ab, i=i: stream_only(bytes([i % 256]) * 32, *ab), zip(cuts, cuts[1:], strict=False)))
            aes = (time.perf_counter() - t0) / (repeats * terms)
        seeds = [(bytes([i]) * 32, 1 if i % 2 else -1) for i in range(terms)]
        t0 = time.perf_counter()
        for _ in range(repeats):
            add_masks(np.empty(size, dtype=x.dtype), seeds, base=x, bits=bits, threads=threads)
        full = (time.perf_counter() - t0) / (repeats * terms)
        res[threads] = {"aes_s": aes, "add_masks_s": full}
    return res


def report_secagg(name: str, sa: dict, bits: int, plaintext_s: float) -> None:
    """Print one secure aggregation variant's round against the plaintext round, its timers, and the key-stream
    floor measured now for its vector size and word width."""
    s, st = sa["s_per_round"], sa["stats"]
    k = st["secagg_neighbours"]
    streams = st["secagg_survivors"] * (k + 1) + st["secagg_survivors"]  # clients' k + 1 masks, the server's self masks
    ks = keystream_seconds(sa["vector_size"], k + 1, bits)
    threads = max(ks)
    aes, full = streams * ks[threads]["aes_s"], streams * ks[threads]["add_masks_s"]
    train = s - st["secagg_setup_s"] - st["secagg_mask_s"] - st["secagg_unmask_s"]
    sa.update(ratio=s / plaintext_s, keystream=ks, streams=streams, aes_s=aes, masks_s=full, modulus_bits=bits)
    from protocols.crypto import word_dtype

    width = word_dtype(bits).itemsize
    print(f"{name} (k = {k}, {st['secagg_survivors']} clients, {sa['vector_size']:,} words of {width} bytes, mod 2^{bits}): "
          f"{s:.2f} s/round = {s / plaintext_s:.2f}× plaintext")  # fmt: skip
    bound = lambda x: "0" if x is None else f"2^{x:g}"  # noqa: E731
    print(f"  graph: t = {st['secagg_threshold']}; privacy failure ≤ {bound(st.get('secagg_log2_privacy_bound'))}, "
          f"abort ≤ {bound(st.get('secagg_log2_abort_bound'))} (protocols.secagg.graph_bounds)")  # fmt: skip
    print(f"  set-up (X25519, HKDF, Shamir, AES-GCM) {st['secagg_setup_s']:.2f} s, clients' masking (flatten, encode, "
          f"masks) {st['secagg_mask_s']:.2f} s, server's unmasking (Shamir, self masks) {st['secagg_unmask_s']:.2f} s, "
          f"the rest (training, aggregation, server step) {train:.2f} s")  # fmt: skip
    for n, r in ks.items():
        print(f"  one mask of {sa['vector_size']:,} words on {n} thread(s): AES-256-CTR key stream {r['aes_s'] * 1e3:.2f} ms, "
              f"with its share of the mod-2^{bits} sums (add_masks, {k + 1} masks) {r['add_masks_s'] * 1e3:.2f} ms")  # fmt: skip
    print(f"  {streams:,} streams a round ({st['secagg_survivors']} × {k + 1} by the clients, {st['secagg_survivors']} self "
          f"masks by the server) on {threads} thread(s): AES key stream {aes:.2f} s ({aes / s:.0%} of the round), mask "
          f"arithmetic {full - aes:.2f} s ({(full - aes) / s:.0%})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--neighbors", default="auto", help="secure_aggregation.neighbors: auto, null or k; a comma list adds variants"
    )
    ap.add_argument("--executor", default="sequential", choices=["sequential", "vectorized"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--ckks-coeffs", default="", help="extra coeff_mod_bit_sizes sets to time, e.g. '60,40,60;60,60'")
    ap.add_argument(
        "--ckks-all-blocks",
        action="store_true",
        help="also time CKKS rows with ckks.row_blocks: all (every client encrypts every ciphertext)",
    )
    ap.add_argument(
        "--secagg-32",
        action="store_true",
        help="also time secure aggregation mod 2^32 (4-byte words: half the key stream), clip_range 8 and the most "
        "frac_bits that fit the round's 159 clients (20)",
    )
    ap.add_argument("--skip-ckks", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    base = [f"training.executor={args.executor}", f"training.precision={args.precision}"]
    out: dict = {"executor": args.executor, "precision": args.precision, "neighbors": args.neighbors}

    first, *more = args.neighbors.split(",")
    variants = {
        "plaintext": base,
        "secure_aggregation": [*base, "protocols=[secure_aggregation]", f"secure_aggregation.neighbors={first}"],
    }
    for k in more:
        variants[f"secure_aggregation (neighbors {k})"] = [*variants["plaintext"], "protocols=[secure_aggregation]",
                                                           f"secure_aggregation.neighbors={k}"]  # fmt: skip
    if args.secagg_32:
        from protocols.secagg.encoding import FixedPoint

        f32 = FixedPoint.max_frac_bits(8.0, 32, 159)  # 20
        variants["secure_aggregation (32-bit)"] = [
            *variants["secure_aggregation"],
            "secure_aggregation.modulus_bits=32",
            "secure_aggregation.clip_range=8",
            f"secure_aggregation.frac_bits={f32}",
        ]
    if not args.skip_ckks:
        for coeffs in ["default", *[c for c in args.ckks_coeffs.split(";") if c]]:
            ov = [*base, "protocols=[ckks]", "ckks.encrypt=[rows]"]
            variants[f"ckks rows ({coeffs})"] = ov if coeffs == "default" else [*ov, f"ckks.coeff_mod_bit_sizes=[{coeffs}]"]
        if args.ckks_all_blocks:
            variants["ckks rows (default, row_blocks all)"] = [*base, "protocols=[ckks]", "ckks.encrypt=[rows]",
                                                               "ckks.row_blocks=all"]  # fmt: skip
    res = run_interleaved(variants, args.rounds)
    out.update(res)
    p = res["plaintext"]["s_per_round"]
    print(
        f"plaintext ({args.executor}, {args.precision}): {p:.2f} s/round (median of {args.rounds}, interleaved with the others)"
    )

    for name in res:
        if name.startswith("secure_aggregation"):
            report_secagg(name, res[name], 32 if "32-bit" in name else 64, p)

    for name, r in res.items():
        if not name.startswith("ckks"):
            continue
        s, st = r["s_per_round"], r["stats"]
        r["ratio"] = s / p
        print(f"{name}: {s:.2f} s/round = {s / p:.2f}× plaintext; encrypt + serialise {st['ckks_encrypt_s']:.2f} s "
              f"(at most {st['ckks_ciphertexts_per_client']} ciphertexts a client, {st['ckks_ciphertexts_summed']} summed), "
              f"server deserialise + add "
              f"{st['ckks_aggregate_s']:.2f} s, decrypt {st['ckks_decrypt_s']:.2f} s")  # fmt: skip

    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=float))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

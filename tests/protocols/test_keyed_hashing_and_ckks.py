"""Keyed hashing keeps FedALC's label sets intact; CKKS sums match; no key ever reaches the server."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import tenseal as ts
import torch

from protocols.ckks import make_context, public_bytes
from protocols.keyed_hashing import keyed_token, quantized_embedding_bytes
from secure_fed.algorithms.label_sets import Sha256Tokenizer, canonical_instance_bytes
from secure_fed.algorithms.regularizers import correlation_gamma, correlation_sigma
from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from secure_fed.plugin_specs import layer_specs
from tests.conftest import small_config, small_plan


def _blob(obj) -> bytes:
    """Every byte an object would put on disk: pickle protocol 4 and torch.save (which pickles bytes as latin-1 text)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue() + pickle.dumps(obj, protocol=4)


def _holds(blob: bytes, secret: bytes) -> bool:
    return secret in blob or secret.decode("latin-1").encode("utf-8") in blob


def _file_holds(path, secret: bytes) -> bool:
    raw = path.read_bytes()
    return _holds(raw, secret) or _holds(pickle.dumps(torch.load(path, weights_only=False), protocol=4), secret)


def test_keyed_tokens_differ_from_plain_and_across_runs():
    row = sp.csr_matrix(np.array([[0.0, 1.5, 0.0, 2.0]]))
    enc = canonical_instance_bytes(row)
    plain = Sha256Tokenizer().tokens(row)[0]
    a = keyed_token(b"k" * 32, b"s" * 16, enc)
    assert a != plain and a != keyed_token(b"k" * 32, b"t" * 16, enc) and a != keyed_token(b"j" * 32, b"s" * 16, enc)


def test_quantized_embedding_encoding_is_stable_across_devices_and_dtypes():
    e = torch.randn(64, dtype=torch.float64)
    assert quantized_embedding_bytes(e) == quantized_embedding_bytes(e.float())  # fp32 vs fp64 on the grid
    assert quantized_embedding_bytes(e) == quantized_embedding_bytes(e + 1e-7)
    assert quantized_embedding_bytes(e) != quantized_embedding_bytes(e + 5e-3)


@pytest.mark.parametrize("algo", ["fedalc", "fedalc_fixed"])
def test_pseudonymous_label_sets_give_the_same_weights_as_clear_labels(tmp_path, algo):
    ov = [f"algorithm.name={algo}", "training.rounds=1", *(["algorithm.fixed_steps=3"] if algo == "fedalc_fixed" else [])]
    clear = Experiment(small_plan(*ov), run_dir=tmp_path / "clear")
    clear.setup()
    keyed = Experiment(small_plan(*ov, 'protocols=["keyed_hashing"]', "output.log_messages=true"), run_dir=tmp_path / "k")
    keyed.setup()
    perm = torch.as_tensor(keyed.label_perm)
    assert sorted(perm.tolist()) == list(range(len(perm))) and not torch.equal(perm, torch.arange(len(perm)))
    # the server's label sets, in its pseudonym-ranked rows, are the clear ones with columns permuted
    Yc, Yk = (torch.from_numpy(e.algorithm.label_sets.toarray()) for e in (clear, keyed))  # the server's CSR
    Yc_perm = torch.zeros_like(Yc)
    Yc_perm[:, perm] = Yc
    assert sorted(map(tuple, Yk.tolist())) == sorted(map(tuple, Yc_perm.tolist()))
    sc, sk = correlation_sigma(Yc), correlation_sigma(Yk)
    assert torch.allclose(sk[perm][:, perm], sc)
    assert torch.allclose(correlation_gamma(sk)[perm][:, perm], correlation_gamma(sc))
    # the server saw HMAC tokens, never the plain SHA-256 ones
    plain = {t for c in clear.fed.clients for t in Sha256Tokenizer().tokens(c.raw)}
    seen = {t for m in keyed.messages if m["direction"] == "up" for t in m["message"].get("tokens", [])}
    assert seen and not (seen & plain)


STACKS = [
    ["keyed_hashing"],
    ["dp"],
    ["secure_aggregation"],
    ["ckks"],
    ["keyed_hashing", "dp", "secure_aggregation"],
    ["keyed_hashing", "dp", "ckks"],
]


def _overrides(algo: str, stack: list[str]) -> list[str]:
    stack = [s for s in stack if s != "keyed_hashing" or algo in ("fedalc", "fedalc_fixed")]
    ov = [f"algorithm.name={algo}", "training.rounds=2", f"protocols={stack}".replace("'", '"')]
    ov += ["algorithm.fixed_steps=5"] if algo == "fedalc_fixed" else []  # a key of fedalc_fixed's own
    if "dp" in stack:
        if algo in ("fedalc", "fedalc_fixed"):
            ov += ['privacy.instance={"target_epsilon": 4, "sample_rate": 0.3}']
            ov += ["algorithm.normalize_gamma=false"] if algo == "fedalc" else []
        ov += ['privacy.client={"target_epsilon": 8, "clip_norm": 1.0}']
    return ov


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: "+".join(s))
@pytest.mark.parametrize("algo", ["fedavg", "fedavg_fixed", "fedaws", "fedalc", "fedalc_fixed"])
def test_every_algorithm_runs_with_every_stack_and_reports_epsilon(tmp_path, algo, stack):
    cfg = small_config(*_overrides(algo, stack))
    res = Experiment(build_plan(cfg), run_dir=tmp_path).run(progress=False)
    s = res.summary
    assert s["status"] == "completed" and np.isfinite(s["final"]["P@1"])
    lines = [__import__("json").loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all("epsilon" in x["privacy"] for x in lines)
    if "dp" in cfg.protocols:
        assert isinstance(s["privacy"]["epsilon"], float) and s["privacy"]["delta"] == 1e-5
    else:
        assert s["privacy"]["epsilon"] == "inf"


@pytest.mark.parametrize("layer", ["secure_aggregation", "ckks"])
def test_secure_sum_equals_plaintext_aggregation(tmp_path, layer):
    """Same seed, same updates: the round's result through the protocol matches the plaintext one."""
    ov = ["algorithm.name=fedaws", "training.rounds=2"]
    plain = Experiment(small_plan(*ov), run_dir=tmp_path / "p")
    plain.run(progress=False)
    sec = Experiment(small_plan(*ov, f'protocols=["{layer}"]'), run_dir=tmp_path / "s")
    sec.run(progress=False)
    for n in plain.theta:
        err = (plain.theta[n] - sec.theta[n]).norm() / plain.theta[n].norm()
        assert err < 1e-4, n
    assert (plain.W - sec.W).norm() / plain.W.norm() < 1e-4


@pytest.mark.parametrize("log_messages", [False, True])
def test_the_secagg_layer_keeps_masked_inputs_only_when_messages_are_logged(tmp_path, monkeypatch, log_messages):
    """Unless ``output.log_messages``, a round's server holds the running sum only, not every client's masked
    vector (159 Bibtex clients × 25 MB would be 4 GB)."""
    import protocols.secagg.layer as secagg_layer

    servers = []

    class Recording(secagg_layer.SecAggServer):
        def __init__(self, **kw):
            super().__init__(**kw)
            servers.append(self)

    monkeypatch.setattr(secagg_layer, "SecAggServer", Recording)
    ov = ["algorithm.name=fedaws", "training.rounds=1", 'protocols=["secure_aggregation"]']
    Experiment(small_plan(*ov, f"output.log_messages={str(log_messages).lower()}"), run_dir=tmp_path).run(progress=False)
    kept = [y for s in servers for kind, _, y in s.transcript if kind == "masked_input"]
    assert servers and kept and all((y is not None) == log_messages for y in kept)


CKKS_ROWS = ["algorithm.name=fedaws", 'protocols=["ckks"]', "training.rounds=1", "output.log_messages=true",
             "dataset.synthetic.num_labels=40", "model.embedding_dim=307", "ckks.encrypt=[rows]"]  # fmt: skip


def test_ckks_clients_send_the_ciphertexts_of_the_rows_the_server_sent_them(tmp_path):
    """40 rows of 307 values (12,280 slots), then 40 counts and 3 meta slots, 4,096 slots a ciphertext (block b holds
    slots [4096·b, 4096·(b+1))): row 13 lies across blocks 0 and 1, the counts of rows 0–7 in block 2 and the others'
    with the meta slots in block 3. Each client sends the blocks of the rows its downlink
    named, of their counts, and the meta block; the sums equal those of every client sending every block."""
    runs = {}
    for mode in ("own", "all"):
        e = Experiment(small_plan(*CKKS_ROWS, f"ckks.row_blocks={mode}"), run_dir=tmp_path / mode)
        e.run(progress=False)
        runs[mode] = e
    e = runs["own"]
    sent = {m["client"]: [int(i) for i in m["message"]["row_ids"]] for m in e.messages if m["direction"] == "down"
            and "row_ids" in m["message"]}  # fmt: skip
    ups = {m["client"]: m["message"] for m in e.messages if m["direction"] == "up" and "ciphertexts" in m["message"]}
    assert len(ups) == 40 and set(ups) <= set(sent)
    for cid, msg in ups.items():
        rows = {b for r in sent[cid] for b in range(r * 307 // 4096, (r * 307 + 306) // 4096 + 1)}
        want = sorted(rows | {(40 * 307 + r) // 4096 for r in sent[cid]} | {3})
        assert msg["ciphertext_blocks"].tolist() == want and len(msg["ciphertexts"]) == len(want), cid
    every = [m["message"] for m in runs["all"].messages if m["direction"] == "up" and "ciphertexts" in m["message"]]
    assert all(m["ciphertext_blocks"].tolist() == [0, 1, 2, 3] for m in every)
    for run in runs.values():  # the decrypted sum against the exact one (the simulator's measurement)
        assert 0 < run.stack.by_name()["ckks"].max_abs_error < 1e-5
    assert (e.W - runs["all"].W).abs().max() < 1e-5
    for n in e.theta:
        assert torch.equal(e.theta[n], runs["all"].theta[n]), n  # θ is in plaintext here: the same bits
    assert ups[13]["ciphertext_blocks"].tolist() == [0, 1, 3] and ups[20]["ciphertext_blocks"].tolist() == [1, 3]
    assert ups[3]["ciphertext_blocks"].tolist() == [0, 2, 3]
    assert e.diagnostics[-1]["ckks_ciphertexts_per_client"] == 3 and e.diagnostics[-1]["ckks_ciphertexts_summed"] == 4


def test_ckks_blocks_that_no_client_sent_decrypt_as_zeros_in_their_place(tmp_path):
    """Two clients a round (one would be aborted: its sum is its update): the summed blocks miss the other rows'
    blocks (with seed 0's cohorts, 2 or 3 of the 4 every round), and the decrypted sum still lands in the right slots
    (against the exact sum)."""
    e = Experiment(small_plan(*CKKS_ROWS, "training.rounds=3", "training.clients_per_round=2"), run_dir=tmp_path)
    e.run(progress=False)
    summed = [d["ckks_ciphertexts_summed"] for d in e.diagnostics if "ckks_ciphertexts_summed" in d]
    assert len(summed) == 3 and max(summed) < 4
    assert 0 < e.stack.by_name()["ckks"].max_abs_error < 1e-5


@pytest.mark.parametrize("groups", ["[theta]", "[body.2]", "[body.0.bias, rows]"])
def test_ckks_groups_apart_in_the_layout_decrypt_into_their_places(tmp_path, groups):
    """Encrypted and plaintext groups interleaved in the layout (θ and meta encrypted around plaintext rows; one θ
    layer between plaintext ones): the decrypted and plaintext parts go back to their slots (against the exact
    sum), and the model matches the plaintext run's."""
    ov = ["algorithm.name=fedaws", "training.rounds=1"]
    plain = Experiment(small_plan(*ov), run_dir=tmp_path / "p")
    plain.run(progress=False)
    e = Experiment(small_plan(*ov, 'protocols=["ckks"]', f"ckks.encrypt={groups}"), run_dir=tmp_path / "c")
    e.run(progress=False)
    assert 0 < e.stack.by_name()["ckks"].max_abs_error < 1e-5
    for n in plain.theta:
        assert (plain.theta[n] - e.theta[n]).norm() <= 1e-4 * plain.theta[n].norm(), n


def test_ckks_blocks_do_not_depend_on_the_update_values_and_values_outside_them_are_refused(tmp_path):
    """The blocks of a reply are those of its rows' ids whatever the values (a zero row delta, a zero θ: the same
    blocks; choosing them by non-zero values would leak); an update with a value outside its blocks raises."""
    e = Experiment(small_plan(*CKKS_ROWS), run_dir=tmp_path)
    e.setup()
    layer = e.stack.by_name()["ckks"]
    theta = {n: torch.randn_like(t) for n, t in e.theta.items()}
    zero_theta = {n: torch.zeros_like(t) for n, t in e.theta.items()}
    base = {"num_examples": 3, "loss": 0.5, "row_ids": torch.tensor([13])}
    got = [layer.blocks_for({**base, "theta_delta": th, "rows_delta": rd}).tolist()
           for th in (theta, zero_theta) for rd in (torch.randn(1, 307), torch.zeros(1, 307))]  # fmt: skip
    assert got == [[0, 1, 3]] * 4
    assert layer.blocks_for({**base, "theta_delta": theta}).tolist() == [3]  # rows not trained: meta only
    r13 = {**base, "theta_delta": theta, "rows_delta": torch.randn(1, 307)}
    r35 = {**r13, "row_ids": torch.tensor([35])}
    v = layer.layout.flatten(r13, "uniform")
    assert len(layer.encrypt_vector(v, layer.blocks_for(r13))["ciphertexts"]) == 3
    with pytest.raises(RuntimeError, match="outside the ciphertexts"):
        layer.encrypt_vector(v, layer.blocks_for(r35))


def test_ckks_refuses_a_reply_naming_rows_it_was_not_sent(tmp_path, monkeypatch):
    """The blocks follow the reply's row ids, so they must be the downlink's: a client function that changes them
    (e.g. to the rows it has positives for) stops the run instead of sending blocks chosen by its data."""
    real = Experiment.client_fn

    def shifted(self, cid):
        fn = real(self, cid)

        def run(payload, data):
            reply = fn(payload, data)
            return {**reply, "row_ids": (reply["row_ids"] + 1) % 40} if "row_ids" in reply else reply

        return run

    monkeypatch.setattr(Experiment, "client_fn", shifted)
    e = Experiment(small_plan(*CKKS_ROWS), run_dir=tmp_path)
    with pytest.raises(Exception, match="names rows other than those it was sent"):
        e.run(progress=False)


def test_ckks_sends_every_block_for_a_reply_with_a_value_on_every_row(tmp_path):
    """A reply with a value on every row (the dp layer's full-table key, a noise share): its update is dense, so every
    ciphertext goes. (Noise shares themselves are refused under CKKS; the layer still honours the declared key.)"""
    cfg = small_config("algorithm.name=fedaws", 'protocols=["dp", "ckks"]', "dataset.synthetic.num_labels=40",
                       "model.embedding_dim=256", 'privacy.client={"noise_multiplier": 0.5, "clip_norm": 0.2, '
                       '"noise": "server"}')  # fmt: skip
    layer = Experiment(build_plan(cfg), run_dir=tmp_path).stack.by_name()["ckks"]
    (key,) = layer.layout.full_table_keys
    n = layer.num_blocks
    reply = {"rows_delta": torch.ones(1, 256), "row_ids": torch.tensor([3])}
    assert len(layer.blocks_for(reply)) < n  # θ's blocks, row 3's and the last (counts, meta)
    assert layer.blocks_for({**reply, key: torch.zeros(40, 256)}).tolist() == list(range(n))


def test_ckks_decrypted_sum_within_1e4_relative():
    ctx = make_context(8192, [60, 40, 40, 60], 40)
    pub = ts.context_from(public_bytes(ctx))
    rng = np.random.default_rng(0)
    xs = [rng.normal(scale=0.01, size=4096) for _ in range(50)]
    acc = None
    for x in xs:
        c = ts.ckks_vector_from(pub, ts.ckks_vector(pub, x).serialize())
        acc = c if acc is None else acc + c
    acc.link_context(ctx)
    dec, ref = np.array(acc.decrypt()), np.sum(xs, axis=0)
    assert np.linalg.norm(dec - ref) / np.linalg.norm(ref) < 1e-4


def test_server_context_is_public_only(tmp_path):
    e = Experiment(small_plan('protocols=["ckks"]', "training.rounds=1"), run_dir=tmp_path)
    e.run(progress=False)
    layer = e.stack.layers[0]
    ctx = ts.context_from(layer.server_context_bytes)
    assert not ctx.is_private() and not layer.server_context.is_private()
    with pytest.raises(ValueError):
        ctx.secret_key()


def test_a_ckks_decryption_noise_below_its_floor_is_refused():
    """σ must be at least 64 in the decryption polynomial's coefficients (2^scale_bits · σ / √N)."""
    with pytest.raises(ConfigError, match=r"ckks.decryption_noise 1e-09 is 12.1 .* below 64 .* at least 5.27e-09"):
        small_config('protocols=["ckks"]', "ckks.decryption_noise=1e-9")  # 2^40 · 1e-9 / √8192 = 12.1
    small_config('protocols=["ckks"]', "ckks.decryption_noise=1e-9", "ckks.global_scale_bits=50")  # 12,400: fine


def test_a_ckks_run_with_a_noise_seed_says_its_decryption_noise_is_derivable(tmp_path, caplog):
    """privacy.noise_seed derives the key holders' noise secrets: the log and private/summary.json say so (and the
    holders' keys are the seed's); without it there is no such warning."""
    from protocols.randomness import SecretStream

    runs = {}
    for name, extra in (("seeded", ["privacy.noise_seed=4"]), ("fresh", [])):
        e = Experiment(small_plan('protocols=["ckks"]', "algorithm.name=fedavg", "training.rounds=1", *extra),
                       run_dir=tmp_path / name)  # fmt: skip
        with caplog.at_level("WARNING"):
            e.run(progress=False)
        runs[name] = e
    seeded = runs["seeded"].stack.by_name()["ckks"]
    assert "noise_seed" in seeded.private_report()["ckks_warning"] and "decryption noise follows from" in caplog.text
    assert all(v["noise"] == SecretStream.from_noise_seed(4, f"ckks holder {h}").state_dict()["key"]
               for h, v in seeded._holders.items())  # fmt: skip
    assert "ckks_warning" not in runs["fresh"].stack.by_name()["ckks"].private_report()


def test_a_ckks_checkpoint_without_decryption_noise_secrets_is_refused(tmp_path):
    """Key holders' state saved before 2026-11-26 has no noise secret: those runs released exact decryptions, from
    which two rounds give the server the key (threat_models.ckks_key_recovery), so resuming one is refused."""
    e = Experiment(small_plan('protocols=["ckks"]', "algorithm.name=fedavg", "training.rounds=1"), run_dir=tmp_path)
    e.run(progress=False)
    ck = e.stack.by_name()["ckks"]
    state = ck.client_state_dict()
    ck.load_client_state_dict(state)  # today's state loads
    for holder in state["holders"].values():
        holder.pop("noise")
    with pytest.raises(ConfigError, match="predates 2026-11-26.*start a new run"):
        ck.load_client_state_dict(state)


def test_keys_never_reach_server_objects_logs_or_checkpoints(tmp_path):
    cfg = small_config('protocols=["keyed_hashing", "dp", "ckks"]', "algorithm.normalize_gamma=false",
                       'privacy.instance={"target_epsilon": 4}', "training.rounds=2", "output.log_messages=true")  # fmt: skip
    e = Experiment(build_plan(cfg), run_dir=tmp_path)
    e.run(progress=False)
    kh, ck = e.stack.layers[0], e.stack.layers[2]
    run_keys = {ring.run_key for ring in kh._clients.values()} | {ring.salt for ring in kh._clients.values()}
    assert len(run_keys) == 2  # every client holds the same run key and salt
    secret_ctx = next(v["secret"] for v in ck._holders.values())
    assert ts.context_from(secret_ctx).is_private()
    secrets = [*run_keys, secret_ctx[-4096:]]  # the tail of the serialised secret context holds the secret key
    noise_keys = [v["noise"] for v in ck._holders.values()]  # the key holders' decryption-noise secrets
    assert len(noise_keys) == cfg.ckks.key_holders and all(len(k) == 32 for k in noise_keys)
    secrets += noise_keys
    for ring in kh._clients.values():
        secrets.append(ring.pair.private_bytes())
    server_side = {
        "algorithm": _blob(e.algorithm.state_dict()),
        "server state": _blob(e.state_dict()),
        "keyed_hashing server half": _blob(kh.state_dict()),
        "ckks server half": _blob(ck.state_dict()) + ck.server_context.serialize(),
        "message log": _blob(e.messages),
        "summary": (tmp_path / "summary.json").read_bytes(),
        "metrics": (tmp_path / "metrics.jsonl").read_bytes(),
    }
    for where, blob in server_side.items():
        for s in secrets:
            assert not _holds(blob, s), f"a client secret is in the {where}"
    for name in ("last.pt", "final.pt"):
        for s in secrets:
            assert not _file_holds(tmp_path / "private" / "checkpoints" / name, s), f"a client secret is in checkpoint {name}"
    # the clients' own storage does hold them (so resume works): the same check finds them there
    assert all(_file_holds(tmp_path / "private" / "checkpoints" / "clients.pt", k) for k in [*run_keys, *noise_keys])


@pytest.mark.parametrize("layer", ["secure_aggregation", "ckks"])
def test_server_sees_no_individual_update(tmp_path, layer):
    e = Experiment(small_plan("algorithm.name=fedaws", f'protocols=["{layer}"]', "training.rounds=1",
                                "output.log_messages=true"), run_dir=tmp_path)  # fmt: skip
    e.run(progress=False)
    # public keys, sealed shares, contexts: the layers' setup and stage messages (not the masked update itself)
    update_keys = {"masked", "ciphertexts", "ciphertext_blocks", "plain"}
    setup_keys = set().union(*(set(spec.uplink_rules) for spec in layer_specs().values())) - update_keys
    ups = [m["message"] for m in e.messages if m["direction"] == "up" and m["message"] and not (set(m["message"]) & setup_keys)]
    plaintext = {"theta_delta", "rows_delta", "num_examples", "loss"}
    assert len(ups) == len(e.fed.clients) and all(not (plaintext & set(m)) for m in ups)
    want = {"masked"} if layer == "secure_aggregation" else {"ciphertexts", "ciphertext_blocks", "plain"}
    assert all(set(m) == want for m in ups)


@pytest.mark.parametrize("modulus", [[], ["secure_aggregation.modulus_bits=32", "secure_aggregation.clip_range=8",
                                            "secure_aggregation.frac_bits=20"]], ids=["64-bit", "32-bit"])  # fmt: skip
def test_dp_then_secure_aggregation_equals_dp_alone(tmp_path, modulus):
    """Clip on the client, mask, unmask, then noise: the same model as DP without secure aggregation (in the default
    64-bit words and in 32-bit ones)."""
    ov = ["algorithm.name=fedaws", "training.rounds=2", 'privacy.client={"noise_multiplier": 0.5, "clip_norm": 0.2}',
          "privacy.noise_seed=3"]  # the same noise in both runs  # fmt: skip
    a = Experiment(small_plan(*ov, 'protocols=["dp"]'), run_dir=tmp_path / "a")
    ra = a.run(progress=False)
    b = Experiment(small_plan(*ov, 'protocols=["dp", "secure_aggregation"]', *modulus), run_dir=tmp_path / "b")
    rb = b.run(progress=False)
    assert b.stack.by_name()["secure_aggregation"].codec.word_dtype == (np.uint32 if modulus else np.uint64)
    for n in a.theta:
        assert (a.theta[n] - b.theta[n]).norm() <= 1e-4 * a.theta[n].norm(), n
    assert ra.privacy == rb.privacy and ra.privacy["epsilon"] < float("inf")


@pytest.mark.parametrize("pseudonyms", [True, False])
def test_label_names_stay_off_the_uplink_with_pseudonyms(tmp_path, pseudonyms):
    cfg = small_config('protocols=["keyed_hashing"]', f"keyed_hashing.pseudonymize_labels={str(pseudonyms).lower()}",
                       "training.rounds=1", "output.log_messages=true")  # fmt: skip
    e = Experiment(build_plan(cfg), run_dir=tmp_path)
    e.run(progress=False)
    token_msgs = [m["message"] for m in e.messages if m["direction"] == "up" and "tokens" in m["message"]]
    assert token_msgs
    if pseudonyms:
        assert all("label" not in m and len(m["pseudonym"]) == 32 for m in token_msgs)
        assert e.label_perm is not None
    else:
        assert all("pseudonym" not in m and isinstance(m["label"], int) for m in token_msgs)
        assert e.label_perm is None


def test_a_keyed_hashing_run_resumes_from_the_clients_own_storage(tmp_path):
    """2 rounds, then resume to 4: the clients' keyrings come back from checkpoints/clients.pt (their own storage)
    and the model equals 4 uninterrupted rounds run with the same run key."""
    from tests.engine.golden import pinned_run_key

    ov = ['protocols=["keyed_hashing"]', "training.rounds=4", "output.checkpoint_every=2", "evaluation.every=2"]
    with pinned_run_key():
        whole = Experiment(small_plan(*ov), run_dir=tmp_path / "whole")
        whole.run(progress=False)
    with pinned_run_key():
        Experiment(small_plan(*ov, "training.rounds=2"), run_dir=tmp_path / "split").run(progress=False)
    resumed = Experiment(small_plan(*ov), run_dir=tmp_path / "split")
    assert resumed.resume() and resumed.round == 2
    kh = resumed.stack.by_name()["keyed_hashing"]
    assert len(kh._clients) == len(resumed.fed.clients) and all(r.run_key for r in kh._clients.values())
    resumed.run(progress=False)
    assert (resumed.label_perm == whole.label_perm).all()
    for n, t in whole.theta.items():
        assert torch.equal(resumed.theta[n], t), n


# CKKS modulus chains on either side of each limit TenSEAL (SEAL 4) enforces: the total bits for the degree at
# 128-bit security, 2-60 bits a prime, the scale below the data primes (all but the last) less one bit, enough
# primes ≡ 1 mod 2N of each size, a special prime, a degree with a secure modulus. `validate` used to accept the
# refused ones (e.g. [40, 60] at scale 40, or [61, 40, 60]) and the run then failed in TenSEAL with a traceback.
CKKS_CHAINS = [
    (4096, [49, 60], 40, True), (4096, [50, 60], 40, False),
    (8192, [60, 40, 40, 40, 38], 40, True), (8192, [60, 40, 40, 40, 39], 40, False),
    (8192, [60, 40, 60], 40, True), (8192, [61, 40, 60], 40, False),
    (8192, [42, 60], 40, True), (8192, [41, 60], 40, False),
    (8192, [60, 60], 58, True), (8192, [60, 60], 59, False),
    (8192, [60, 18, 18], 40, True), (8192, [60, 18, 18, 18], 40, False),
    (16384, [60, 18], 40, True), (16384, [60, 19], 40, False),
    (8192, [60, 40], 40, True), (8192, [60], 40, False),
    (65536, [60, 60], 40, False),
]  # fmt: skip


def _tenseal_sums(n: int, bits: list[int], scale: int) -> bool:
    """Whether TenSEAL builds the context and the layer's operations work: encrypt under the public context,
    add, decrypt with the secret key (values within the chain's headroom: |sum| < 2^(data bits − scale − 1))."""
    try:
        ctx = make_context(n, bits, scale)
        pub = ts.context_from(public_bytes(ctx))
        v = np.linspace(-0.25, 0.25, 16)
        total = ts.ckks_vector(pub, v) + ts.ckks_vector(pub, v)
        out = np.asarray(ts.ckks_vector_from(ctx, total.serialize()).decrypt())
    except (ValueError, RuntimeError):
        return False
    assert np.max(np.abs(out - 2 * v)) < 1e-3
    return True


@pytest.mark.parametrize(("n", "bits", "scale", "ok"), CKKS_CHAINS, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CKKS_CHAINS])
def test_ckks_config_accepts_exactly_the_modulus_chains_tenseal_builds_and_sums_with(n, bits, scale, ok):
    from pydantic import ValidationError

    from protocols.config_sections import CKKSConfig

    try:
        CKKSConfig(poly_modulus_degree=n, coeff_mod_bit_sizes=bits, global_scale_bits=scale, decryption_noise=1e-3)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted is ok
    assert _tenseal_sums(n, bits, scale) is ok

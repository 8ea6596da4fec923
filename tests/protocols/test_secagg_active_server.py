"""Secure aggregation against a server that deviates (issue 43, finding 3): the double-request (equivocation) attack,
forged key advertisements, and the graph order keyed by the whole secret.

The attack: with 2t − (k + 1) colluding clients (2 of 10 at t = 6, 8 of 40 at t = 24) the server tells half the
honest clients that target u survived (they return shares of its self-mask seed b_u) and the other half that u
dropped (they return shares of its mask key s_u); with the colluders' own shares it has t of each, hence x_u. The
server here is a test driver around the real :class:`SecAggClient` objects and an honest :class:`SecAggServer`'s
routing; x_u is checked against the client's actual encoded input."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.crypto import KeyPair, SigningKey, add_masks, open_sealed, secret_permutation, shamir_combine
from protocols.secagg import protocol
from protocols.secagg.protocol import SecAggClient, SecAggServer, _pair_info, neighbour_graph, secure_sum, threshold_for
from protocols.secagg.signing import ForgedMessage, consistency_quorum, survivors_message
from tests.conftest import small_plan

BITS = 64


def _round(n: int, *, consistency: bool, seed: int = 0):
    """An honest run of stages 0–2 on the complete graph of ``n`` (t = ⌈0.6·n⌉), signing keys from a dealer."""
    keys = {u: SigningKey() for u in range(n)}
    directory = {u: k.public for u, k in keys.items()}
    return (*_session(n, keys, directory, consistency=consistency, seed=seed), keys)


def _equivocate(n: int, colluders: int, *, consistency: bool):
    """The malicious server's double request against client 0. Returns (x_0 as the server recovers it or None,
    the honest clients that refused, the round's encoded inputs)."""
    clients, server, enc, t, keys = _round(n, consistency=consistency)
    target = 0
    corrupt = list(range(n - colluders, n))
    honest = [u for u in range(n) if u not in corrupt]
    half = t - colluders  # honest answers of each kind the server needs
    view_a, view_b = honest[:half], honest[half : 2 * half]  # the target itself is in view A
    assert target in view_a and len(view_b) == half
    u3_a, u3_b = set(range(n)), set(range(n)) - {target}  # "u survived" / "u dropped"
    sigs_a: dict[int, bytes] = {}
    sigs_b: dict[int, bytes] = {}
    if consistency:
        for u in view_a:
            sigs_a[u] = clients[u].sign_survivors(u3_a)
        for u in view_b:
            sigs_b[u] = clients[u].sign_survivors(u3_b)
        for c in corrupt:  # the colluders sign whatever the server wants, with their own keys
            sigs_a[c] = keys[c].sign(survivors_message(7, u3_a, clients[c].session))
            sigs_b[c] = keys[c].sign(survivors_message(7, u3_b, clients[c].session))
    b_shares, s_shares, refused = [], [], []
    for views, u3, dropped, sigs in ((view_a, u3_a, set(), sigs_a), (view_b, u3_b, {target}, sigs_b)):
        for v in views:
            try:
                reply = clients[v].unmask(u3, dropped, sigs)
            except ForgedMessage:
                refused.append(v)
                continue
            kind, share = reply[target]
            (b_shares if kind == "b" else s_shares).append(share)
    for c in corrupt:  # the colluders hand over both of their shares of the target's secrets
        b_share, s_share = clients[c].held_shares[target]
        b_shares.append(b_share)
        s_shares.append(s_share)
    if len(b_shares) < t or len(s_shares) < t:
        return None, refused, enc, (b_shares, s_shares)
    b_seed = shamir_combine(b_shares[:t])
    s_key = KeyPair.from_private_bytes(shamir_combine(s_shares[:t]))
    y = next(m for kind, u, m in server.transcript if kind == "masked_input" and u == target)
    strip = [(b_seed, -1)]
    for v in clients[target].neighbours:  # x_0 = y_0 − PRG(b_0) − Σ ±PRG(s_0v), s_0v from s_0 and v's public key
        s_uv = s_key.agree(server.public_keys[v]["s_pk"], info=_pair_info(target, v, 7) + b" mask")
        strip.append((s_uv, -1 if target < v else 1))
    x = add_masks(np.empty_like(y), strip, base=y, bits=BITS)
    return x, refused, enc, (b_shares, s_shares)


@pytest.mark.parametrize("n, colluders", [(10, 2), (40, 8)])
def test_without_the_consistency_check_the_double_request_recovers_one_input(n, colluders):
    """The control: 2t − n colluders and two dropout sets give the server x_0 exactly."""
    assert colluders == 2 * threshold_for(n, 0.6) - n
    x, refused, enc, _ = _equivocate(n, colluders, consistency=False)
    assert refused == [] and x is not None
    assert np.array_equal(x, enc[0])


@pytest.mark.parametrize("n, colluders", [(10, 2), (40, 8)])
def test_with_the_consistency_check_the_honest_clients_refuse_and_nothing_is_recovered(n, colluders):
    x, refused, enc, (b_shares, s_shares) = _equivocate(n, colluders, consistency=True)
    t = threshold_for(n, 0.6)
    assert x is None
    assert sorted(refused) == list(range(2 * (t - colluders)))  # every honest client asked refused
    assert len(b_shares) == len(s_shares) == colluders < t  # only the colluders' own shares
    with pytest.raises(ValueError):
        shamir_combine(b_shares)  # too few shares do not determine the seed


def test_a_quorum_of_t_signatures_would_not_stop_it(monkeypatch):
    """Why the quorum is ⌈(|G| + t)/2⌉ and not t: with t, the 2t − n colluders complete both views' quorums."""
    assert consistency_quorum(10, 6) == 8
    monkeypatch.setattr(protocol, "consistency_quorum", lambda group, t: t)
    x, refused, enc, _ = _equivocate(10, 2, consistency=True)
    assert refused == [] and np.array_equal(x, enc[0])


def test_an_honest_client_signs_one_survivor_set_and_unmasks_only_for_it():
    clients, server, _, t, keys = _round(10, consistency=True)
    everyone = set(range(10))
    sig = clients[3].sign_survivors(everyone)
    assert clients[3].sign_survivors(everyone) == sig  # the same set again: the same answer
    with pytest.raises(ForgedMessage, match="second survivor set"):
        clients[3].sign_survivors(everyone - {0})
    sigs = {u: clients[u].sign_survivors(everyone) for u in range(10)}
    with pytest.raises(ForgedMessage, match="did not sign"):
        clients[3].unmask(everyone - {0}, {0}, sigs)
    with pytest.raises(ForgedMessage, match="does not fit"):
        clients[3].unmask(everyone, {0}, sigs)
    # 9's key, others' names
    forged = {**sigs, **{u: keys[9].sign(survivors_message(7, everyone, clients[u].session)) for u in range(3)}}
    with pytest.raises(ForgedMessage, match="fewer than the quorum"):
        clients[3].unmask(everyone, set(), forged)
    assert set(clients[3].unmask(everyone, set(), sigs)) == everyone  # the honest request: one share per client
    with pytest.raises(ForgedMessage, match="second time"):
        clients[3].unmask(everyone, set(), sigs)


def _advertised(n: int = 6, *, signing: bool = True):
    cohort = list(range(n))
    graph = neighbour_graph(cohort, None, 0)
    keys = {u: SigningKey() for u in cohort}
    directory = {u: k.public for u, k in keys.items()} if signing else None
    clients = {u: SecAggClient(u, 1, graph[u], 4, signer=keys[u] if signing else None, directory=directory)
               for u in cohort}  # fmt: skip
    return clients, {u: c.advertise() for u, c in clients.items()}, keys


def test_a_server_that_swaps_a_neighbours_keys_reads_its_shares_without_signatures():
    """The control for the signed advertisements: unauthenticated, the server puts its own key in place of client
    1's and opens the shares client 0 seals to "client 1", with no colluder at all."""
    clients, ads, _ = _advertised(signing=False)
    mitm = KeyPair()
    ads[1] = {**ads[1], "c_pk": mitm.public}
    sealed = clients[0].share_keys(ads)
    key = mitm.agree(clients[0].c_key.public, info=_pair_info(0, 1, 1) + b" share channel")
    plain = open_sealed(key, sealed[1], aad=_pair_info(0, 1, 1))
    assert plain[:4] == (0).to_bytes(4, "little")  # client 0's share, in the server's hands


@pytest.mark.parametrize("forge", ["swap c_pk", "swap s_pk", "unsigned", "other round", "signed by another",
                                   "not in directory", "not a neighbour"])  # fmt: skip
def test_a_forged_or_unsigned_advertisement_is_refused(forge):
    clients, ads, keys = _advertised()
    ad = dict(ads[1])
    if forge == "swap c_pk":
        ad["c_pk"] = KeyPair().public
    elif forge == "swap s_pk":
        ad["s_pk"] = KeyPair().public
    elif forge == "unsigned":
        ad = {"c_pk": ad["c_pk"], "s_pk": ad["s_pk"]}
    elif forge == "other round":
        ad = SecAggClient(1, 2, clients[1].neighbours, 4, signer=keys[1]).advertise()
    elif forge == "signed by another":
        ad = SecAggClient(1, 1, clients[1].neighbours, 4, signer=keys[2]).advertise()
    elif forge == "not in directory":
        del clients[0].directory[1]
    elif forge == "not a neighbour":
        ad = SecAggClient(1, 1, [2, 3, 4, 5], 4, signer=keys[1]).advertise()
    with pytest.raises(ForgedMessage, match="refused"):
        clients[0].share_keys({**ads, 1: ad})
    assert 1 not in clients[0].peers_c  # nothing was sealed to the forged keys
    clients2, ads2, _ = _advertised()
    assert set(clients2[0].share_keys(ads2)) == {1, 2, 3, 4, 5}  # the genuine advertisements pass


def test_the_whole_protocol_with_the_check_is_exact_and_aborts_below_the_quorum():
    rng = np.random.default_rng(3)
    enc = {u: rng.integers(0, 2**63, size=4, dtype=np.uint64) for u in range(10)}
    total, u3, server = secure_sum(enc, threshold=6, drop={"input": {9}, "consistency": {8}})
    assert u3 == set(range(9)) and set(server.signatures) == set(range(8))
    assert total.tolist() == [sum(int(enc[u][i]) for u in u3) % 2**64 for i in range(4)]
    with pytest.raises(protocol.SecAggAbort, match="quorum 8"):  # 7 of 10 signers < ⌈(10 + 6)/2⌉
        secure_sum(enc, threshold=6, drop={"input": {9}, "consistency": {8, 7}})
    total, _, _ = secure_sum(enc, threshold=6, drop={"input": {9}, "consistency": {8, 7}}, consistency_check=False)
    assert total.tolist() == [sum(int(enc[u][i]) for u in range(9)) % 2**64 for i in range(4)]


def test_the_graph_order_is_keyed_by_all_256_bits():
    """A secret key's last byte (far past the 53 bits the order used to take) changes the order; the order is a
    uniform permutation (chi-square over the 24 orders of 4 items, independent of the implementation)."""
    key = bytes(range(32))
    flipped = key[:31] + bytes([key[31] ^ 1])
    cohort = list(range(200))
    assert neighbour_graph(cohort, 8, seed=key) != neighbour_graph(cohort, 8, seed=flipped)
    assert secret_permutation(cohort, key) == secret_permutation(cohort, key)  # reproducible from the key
    counts: dict[tuple, int] = {}
    for i in range(4800):
        k = i.to_bytes(4, "little") + bytes(28)
        p = tuple(secret_permutation([0, 1, 2, 3], k))
        counts[p] = counts.get(p, 0) + 1
    assert len(counts) == 24
    chi2 = sum((c - 200) ** 2 / 200 for c in counts.values())
    assert chi2 < 49.7  # the 0.999 quantile of chi-square with 23 degrees of freedom


def test_the_layer_draws_each_rounds_order_from_256_secret_bits(tmp_path):
    from secure_fed.engine import Experiment

    exp = Experiment(small_plan("protocols=[secure_aggregation]"), run_dir=tmp_path)
    layer = exp.stack.by_name()["secure_aggregation"]
    seeds = [layer.graph_seed(r) for r in range(3)]
    assert all(isinstance(s, bytes) and len(s) == 32 for s in seeds) and len(set(seeds)) == 3


# ---------------------------------------------------------------- the layer: key set-up, resume, key files


def _layer_run(tmp_path, *extra):
    from secure_fed.engine import Experiment

    exp = Experiment(small_plan("protocols=[secure_aggregation]", "training.rounds=1", *extra), run_dir=tmp_path)
    return exp, exp.run(progress=False)


def test_the_layer_signs_checks_and_keeps_the_signing_keys_on_the_client_side(tmp_path):
    exp, result = _layer_run(tmp_path, "output.log_messages=true")
    assert result.summary["status"] == "completed" and result.summary["rounds_aborted"] == 0
    layer = exp.stack.by_name()["secure_aggregation"]
    stages = {m["message"].get("secagg") for m in exp.messages if m["direction"] == "down"}
    assert {"advertise", "share", "consistency", "unmask"} <= stages
    ups = [m["message"] for m in exp.messages if m["direction"] == "up"]
    assert any("sig" in m and "nbrs" in m for m in ups) and any("secagg_signature" in m for m in ups)
    # the private halves: in the clients' state only, never in the server's state, its secrets or a message
    private = [k.private_bytes() for k in layer._signers.values()]
    assert len(private) == len(exp.fed.clients) and layer.directory == {c: k.public for c, k in layer._signers.items()}
    server_side = repr(exp.stack.state_dict()) + repr(exp.stack.secret_state_dict()) + repr(exp.messages)
    assert not [p for p in private if p.hex() in server_side or repr(p) in server_side]
    for key in private:  # in the run's files: only in the clients' own storage
        holders = {str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file()
                   and (key in (blob := f.read_bytes()) or key.decode("latin-1").encode("utf-8") in blob)}  # fmt: skip
        assert holders == {"private/checkpoints/clients.pt"}, holders


def test_client_state_resumes_exactly_mid_round():
    """client_state_dict → load_client_state_dict: the same signing keys, pinned directories and round secrets, and
    the restored clients still refuse a second survivor set."""
    from protocols.secagg.layer import SecureAggregation

    clients, _, _, _, _ = _round(10, consistency=True)
    clients[2].sign_survivors(set(range(10)))
    lay = SecureAggregation.__new__(SecureAggregation)
    lay._signers = {u: c.signer for u, c in clients.items()}
    lay._pinned = {u: c.directory for u, c in clients.items()}
    lay._round_clients = dict(clients)
    lay._advertised = {u: {7: bytes(32)} for u in clients}
    state = lay.client_state_dict()
    back = SecureAggregation.__new__(SecureAggregation)
    back.load_client_state_dict(state)
    assert back.client_state_dict() == state
    c2 = back._round_clients[2]
    assert c2.signer.public == clients[2].signer.public and c2.directory == clients[2].directory
    assert c2.peer_groups == clients[2].peer_groups and c2.signed_u3 == list(range(10)) and c2.consistency
    with pytest.raises(ForgedMessage, match="second survivor set"):
        c2.sign_survivors(set(range(9)))


def test_an_operators_keys_folder_is_used_and_a_key_it_does_not_list_is_refused(tmp_path):
    from protocols.secagg.signing import write_keys_dir
    from secure_fed.errors import ConfigError

    keys = tmp_path / "keys"
    directory = write_keys_dir(keys, list(range(20)))  # small_config: 20 clients
    exp, result = _layer_run(tmp_path / "run", "secure_aggregation.key_source=file", f"secure_aggregation.keys_dir={keys}")
    assert result.summary["status"] == "completed"
    assert exp.stack.by_name()["secure_aggregation"].directory == directory
    (keys / "client-3.ed25519").write_bytes(SigningKey().private_bytes())  # a key the directory does not list
    with pytest.raises(ConfigError, match=r"clients \[3\]"):
        _layer_run(tmp_path / "run2", "secure_aggregation.key_source=file", f"secure_aggregation.keys_dir={keys}")


def test_a_keys_folder_without_key_source_file_is_one_error_line(tmp_path):
    from tests.config.test_bad_input import assert_one_error_line, cli
    from tests.conftest import SMALL

    cfg = tmp_path / "c.yaml"
    cfg.write_text("protocols: [secure_aggregation]\n")
    sets = [a for s in SMALL for a in ("--set", s)]
    code, _, err = cli("validate", str(cfg), *sets, "--set", "secure_aggregation.key_source=file")
    assert_one_error_line(code, err, "keys_dir")


# ---------------------------------------------------------------- review H1–H3: a server that deviates after set-up


def _data(cid: int):
    from types import SimpleNamespace

    return SimpleNamespace(client_id=cid)  # the client functions read only the client's id


def _set_up_layer(tmp_path, *extra):
    """A layer after its key set-up (every client registered and pinned), before any round."""
    from secure_fed.engine import Experiment

    exp = Experiment(small_plan("protocols=[secure_aggregation]", "training.rounds=1", *extra), run_dir=tmp_path)
    exp.setup()
    return exp.stack.by_name()["secure_aggregation"]


def test_h1_a_server_cannot_re_pin_a_substituted_directory_after_set_up(tmp_path):
    """The attack: after an honest set-up the server re-registers client 0 and re-pins a directory with its own keys
    for every neighbour (client 0's own key kept). It would then forge the neighbours' adverts and open client 0's
    sealed shares with no colluder. Pinning is write-once: both steps leave client 0's state as it was."""
    layer = _set_up_layer(tmp_path)
    pinned, own = dict(layer._pinned[0]), layer._signers[0].public
    assert pinned == layer.directory and pinned[0] == own
    again = layer._client_keys({"secagg_keys": "register"}, _data(0))  # a second register draws no new key
    assert again["sign_pk"] == own and layer._signers[0].public == own
    mitm = {c: SigningKey() for c in pinned}
    forged = {c: (own if c == 0 else mitm[c].public) for c in pinned}
    with pytest.raises(ForgedMessage, match="already pinned"):
        layer._client_keys({"secagg_keys": "pin", "directory": forged}, _data(0))
    assert layer._pinned[0] == pinned  # unchanged
    assert layer._client_keys({"secagg_keys": "pin", "directory": dict(pinned)}, _data(0)) == {"pinned": len(pinned)}
    # end to end: an advert signed with the server's key for neighbour 1 is refused by client 0
    client = SecAggClient(0, 3, [1, 2], 2, signer=layer._signers[0], directory=layer._pinned[0])
    fake = SecAggClient(1, 3, [0, 2], 2, signer=mitm[1]).advertise()
    genuine2 = SecAggClient(2, 3, [0, 1], 2, signer=layer._signers[2]).advertise()
    with pytest.raises(ForgedMessage, match="signature"):
        client.share_keys({0: client.advertise(), 1: fake, 2: genuine2})


def test_h1_with_key_source_file_a_client_never_takes_the_servers_directory(tmp_path):
    from protocols.secagg.signing import write_keys_dir

    keys = tmp_path / "keys"
    directory = write_keys_dir(keys, list(range(20)))
    layer = _set_up_layer(tmp_path / "run", "secure_aggregation.key_source=file", f"secure_aggregation.keys_dir={keys}")
    forged = {**directory, 1: SigningKey().public}
    with pytest.raises(ForgedMessage, match="already pinned"):
        layer._client_keys({"secagg_keys": "pin", "directory": forged}, _data(0))
    assert layer._pinned[0] == directory


def _session(n: int, keys: dict, directory: dict, *, consistency: bool = True, seed: int = 0):
    """One run ("session") of round 7's stages 0–2 by fresh SecAggClient objects holding the same long-term keys."""
    rng = np.random.default_rng(seed)
    cohort = list(range(n))
    graph = neighbour_graph(cohort, None, 0)
    t = threshold_for(n, 0.6)
    clients = {u: SecAggClient(u, 7, graph[u], t, signer=keys[u], directory=directory, consistency=consistency)
               for u in cohort}  # fmt: skip
    server = SecAggServer(round_idx=7, graph=graph, threshold=t, bits=BITS)
    pks = server.collect_keys({u: c.advertise() for u, c in clients.items()})
    inbox = server.route_shares({u: c.share_keys(pks) for u, c in clients.items()})
    for u, c in clients.items():
        c.receive_shares(inbox[u])
    enc = {u: rng.integers(0, 2**63, size=5, dtype=np.uint64) for u in cohort}
    for u, c in clients.items():
        server.add_masked(u, c.masked_input(enc[u], cohort, BITS))
    return clients, server, enc, t


def test_h2_survivor_signatures_from_earlier_runs_of_the_round_do_not_count():
    """The attack: the server runs round 7 once and has everyone sign A = everyone, again and has everyone sign
    B = everyone but client 0, then a third time tells half the honest clients A and half B, each with the
    replayed signatures of the other clients (and 2 colluders' both ways). Each client signs one set in each run,
    yet without a session binding the replayed signatures complete both quorums and x_0 comes out."""
    n, colluders, target = 10, 2, 0
    keys = {u: SigningKey() for u in range(n)}
    directory = {u: k.public for u, k in keys.items()}
    u3_a, u3_b = set(range(n)), set(range(n)) - {target}
    run1, *_ = _session(n, keys, directory)
    old_a = {u: c.sign_survivors(u3_a) for u, c in run1.items()}
    run2, *_ = _session(n, keys, directory)
    old_b = {u: c.sign_survivors(u3_b) for u, c in run2.items() if u != target}
    clients, server, enc, t = _session(n, keys, directory, seed=1)
    corrupt = list(range(n - colluders, n))
    honest = [u for u in range(n) if u not in corrupt]
    half = t - colluders
    view_a, view_b = honest[:half], honest[half : 2 * half]
    sigs_a = {**old_a, **{u: clients[u].sign_survivors(u3_a) for u in view_a}}
    sigs_b = {**old_b, **{u: clients[u].sign_survivors(u3_b) for u in view_b}}
    b_shares, s_shares, refused = [], [], []
    for views, u3, dropped, sigs in ((view_a, u3_a, set(), sigs_a), (view_b, u3_b, {target}, sigs_b)):
        for v in views:
            try:
                kind, share = clients[v].unmask(u3, dropped, sigs)[target]
            except ForgedMessage:
                refused.append(v)
                continue
            (b_shares if kind == "b" else s_shares).append(share)
    for c in corrupt:
        b_shares.append(clients[c].held_shares[target][0])
        s_shares.append(clients[c].held_shares[target][1])
    assert len(b_shares) < t or len(s_shares) < t, "the server holds t shares of both of client 0's secrets"
    assert refused  # the honest clients refused the replayed signatures
    assert len({run1[0].session, run2[0].session, clients[0].session}) == 3  # each run: its own session


def test_h2_a_client_refuses_a_second_advertise_of_a_round_with_another_payload(tmp_path):
    """A persistent record of the rounds each client advertised in: a second run of a round is refused (two runs'
    sums over different survivor sets would differ by one input), except the client's own held session."""
    from protocols.secagg.graph_bounds import graph_for

    layer = _set_up_layer(tmp_path, "secure_aggregation.neighbors=4")
    choice_n = layer.env.num_clients
    assert layer.settings.training.cohort_size(choice_n) == choice_n
    ch = graph_for(choice_n, layer.settings.section, population=layer.env.num_clients)
    k = ch.neighbors if ch.neighbors is not None else choice_n - 1
    nbrs = [v for v in range(choice_n) if v != 0][:k]
    msg = {"secagg": "advertise", "secagg_round": 5, "secagg_neighbours": nbrs, "secagg_threshold": ch.threshold,
           "secagg_cohort": choice_n}  # fmt: skip
    first = layer.client_stage(msg, _data(0))
    assert layer.client_stage(msg, _data(0)) == first  # the same round again: the client's own session, resumed
    other = [v for v in range(choice_n) if v != 0][-k:]
    assert other != nbrs and k == 4
    with pytest.raises(PermissionError, match="again"):
        layer.client_stage({**msg, "secagg_neighbours": other}, _data(0))
    state = layer.client_state_dict()  # the record survives a restore of the client's storage
    from protocols.secagg.layer import SecureAggregation

    back = SecureAggregation.__new__(SecureAggregation)
    back.settings, back.env = layer.settings, layer.env
    back.load_client_state_dict(state)
    del back._round_clients[0]  # even without the round's secrets
    with pytest.raises(PermissionError, match="again"):
        back.client_stage({**msg, "secagg_neighbours": other}, _data(0))
    with pytest.raises(PermissionError, match="again"):  # the same request, but the session is gone: no second run
        back.client_stage(msg, _data(0))
    assert back.client_stage({**msg, "secagg_round": 6}, _data(0))["c_pk"] != first["c_pk"]  # the next round: fresh


def test_h3_a_server_that_isolates_a_target_with_one_colluder_is_refused(tmp_path):
    """The attack: the server tells client 0 that its only neighbour is colluder 19 (t = ⌈0.6·2⌉ = 2, quorum 2):
    0 and 19 sign, 19 releases nothing more than it holds, and the "sum" x_0 + x_19 gives x_0. The client computes
    the round's k and t from the config and the cohort's size and refuses any other neighbourhood."""
    layer = _set_up_layer(tmp_path)
    n = layer.env.num_clients
    msg = {"secagg": "advertise", "secagg_round": 2, "secagg_neighbours": [n - 1], "secagg_threshold": 2, "secagg_cohort": 2}
    with pytest.raises(PermissionError, match="neighbours"):
        layer.client_stage(msg, _data(0))
    assert 0 not in layer._round_clients
    # the peer's side: a neighbour's signed advert with another k or t than the round's is refused too
    keys, directory = {u: SigningKey() for u in range(4)}, None
    directory = {u: k.public for u, k in keys.items()}
    c0 = SecAggClient(0, 2, [1, 2, 3], 3, signer=keys[0], directory=directory)
    small = SecAggClient(1, 2, [0], 2, signer=keys[1]).advertise()
    ads = {u: SecAggClient(u, 2, [v for v in range(4) if v != u], 3, signer=keys[u]).advertise() for u in (2, 3)}
    with pytest.raises(ForgedMessage, match="refused"):
        c0.share_keys({0: c0.advertise(), 1: small, **ads})


def test_m4_the_layer_builds_its_clients_with_the_configs_consistency_check(tmp_path, monkeypatch):
    from protocols.secagg import layer as layer_mod

    seen = []

    class Recording(SecAggClient):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen.append(self.consistency)

    monkeypatch.setattr(layer_mod, "SecAggClient", Recording)
    exp, result = _layer_run(tmp_path)
    assert result.summary["status"] == "completed" and seen and all(seen)
    seen.clear()
    exp, result = _layer_run(tmp_path / "off", "secure_aggregation.consistency_check=false")
    assert seen and not any(seen)


@pytest.mark.parametrize("n, gamma, k, private", [(20, 0.2, 4, False), (20, 0.05, 4, True), (100_000, 0.05, None, False)])
def test_h3_the_guarantee_against_a_graph_choosing_server_is_stated(n, gamma, k, private):
    """⌊γN⌋ colluders all in one neighbourhood: the describe line says private only when ⌊γN⌋ < t (independently:
    t = ⌈0.6·(k + 1)⌉ for the ring of k, or the auto graph's own t)."""
    from protocols.config_sections import SecureAggregationConfig
    from protocols.layer_specs import _describe_secure_aggregation
    from protocols.secagg.graph_bounds import graph_choice_private, graph_for
    from secure_fed.config import build_plan
    from tests.conftest import small_config

    nb = "auto" if k is None else str(k)
    plan = build_plan(small_config("protocols=[secure_aggregation]", f"secure_aggregation.neighbors={nb}",
                                   f"secure_aggregation.corrupt_fraction={gamma}"))  # fmt: skip
    t = graph_for(plan.training.cohort_size(n), plan.part(SecureAggregationConfig), population=n).threshold
    if k is not None:
        assert t == -(-3 * (k + 1) // 5)
    assert (int(gamma * n) < t) is private is graph_choice_private(t, corrupt_fraction=gamma, population=n)
    line = _describe_secure_aggregation(plan, n)[0]
    assert ("picks the graph: private" in line) is private and ("picks the graph: NOT private" in line) is not private
    assert f"⌊γN⌋ = {int(gamma * n)} colluders" in line


def test_h3_under_poisson_sampling_a_stated_cohort_below_the_public_floor_is_refused(tmp_path):
    """Under Poisson sampling the server states the cohort's size, from which each client derives k and t: claiming
    n = 2 would give the target one neighbour (a colluder) and t = 2. Clients refuse a stated n below the public floor,
    the least n whose graph needs more colluders than the ⌊γN⌋ the config declares (here N = 8 labels, γ = 0.25:
    2 colluders, so n = 2 or 3 (t = 2) is refused and n = 4 (t = 3) accepted)."""
    from protocols.secagg.graph_bounds import graph_for, poisson_cohort_floor

    layer = _set_up_layer(tmp_path, "training.sampling=poisson", "training.client_fraction=0.5",
                          "secure_aggregation.corrupt_fraction=0.25")  # fmt: skip
    n_fed, s = layer.env.num_clients, layer.settings.section
    floor = poisson_cohort_floor(n_fed, s)
    assert floor == 4  # independently: the complete graph of n has t = ⌈0.6·n⌉, and ⌊0.25·8⌋ = 2 < t from n = 4 on
    for n in (2, 3):
        t = graph_for(n, s, population=n_fed).threshold
        msg = {"secagg": "advertise", "secagg_round": 2, "secagg_neighbours": list(range(1, n)), "secagg_threshold": t,
               "secagg_cohort": n}  # fmt: skip
        with pytest.raises(PermissionError, match="below the public floor 4"):
            layer.client_stage(msg, _data(0))
        assert 0 not in layer._round_clients
    t = graph_for(4, s, population=n_fed).threshold
    msg = {"secagg": "advertise", "secagg_round": 3, "secagg_neighbours": [1, 2, 3], "secagg_threshold": t, "secagg_cohort": 4}
    assert "sig" in layer.client_stage(msg, _data(0)) or 0 in layer._round_clients

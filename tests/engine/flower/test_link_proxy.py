"""The link-shaping proxy on its own (an echo server behind it, no Flower): bytes pass unchanged, each chunk is
delayed by ``delay ± jitter`` (seeded), a lost chunk arrives a retransmission timeout later, a reset cuts the
connection; and the PSS helper reads a live process's memory. A few seconds."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from secure_fed.engine.flower.link_proxy import LinkProxy, LinkShape
from secure_fed.engine.flower.node_memory import MemorySampler, node_pss_kib, pss_kib
from secure_fed.errors import SecureFedError
from tests.config.test_bad_input import cli


@pytest.fixture
def echo():
    """A TCP echo server on 127.0.0.1; yields its address."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    def _echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    srv.close()


def _round_trips(address: str, n: int) -> tuple[list[float], list[bytes]]:
    host, port = address.split(":")
    times, got = [], []
    with socket.create_connection((host, int(port)), timeout=10) as s:
        for k in range(n):
            msg = f"ping {k} ".encode() * 10
            t = time.monotonic()
            s.sendall(msg)
            buf = b""
            while len(buf) < len(msg):
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            times.append(time.monotonic() - t)
            got.append(buf)
    return times, got


def test_delay_and_jitter_per_chunk_both_ways(echo):
    with LinkProxy(echo, LinkShape(delay_ms=40, jitter_ms=10, seed=3)) as proxy:
        times, got = _round_trips(proxy.address, 20)
    assert got == [f"ping {k} ".encode() * 10 for k in range(20)]  # unchanged, in order
    drawn = proxy.stats.delays_ms
    assert len(drawn) == 40 and all(30 <= d <= 50 for d in drawn) and max(drawn) - min(drawn) > 5  # jitter drawn
    assert all(t >= 0.060 for t in times)  # two shaped crossings per round trip, each ≥ 30 ms
    assert sum(times) / len(times) == pytest.approx(0.080, abs=0.040)  # 2 × 40 ms on average (a loaded machine)
    with LinkProxy(echo, LinkShape(delay_ms=40, jitter_ms=10, seed=3)) as again:
        _round_trips(again.address, 20)
    assert again.stats.delays_ms == drawn  # seeded: the same draws
    with LinkProxy(echo, LinkShape()) as plain:
        fast, _ = _round_trips(plain.address, 20)
    assert sum(fast) / len(fast) < 0.030


def test_loss_delays_by_the_retransmission_timeout_and_reset_cuts(echo):
    with LinkProxy(echo, LinkShape(loss=0.5, rto_ms=150, seed=1)) as proxy:
        times, got = _round_trips(proxy.address, 20)
    assert got == [f"ping {k} ".encode() * 10 for k in range(20)]  # a loss delays, never drops bytes
    assert proxy.stats.lost > 5
    assert sum(t >= 0.150 for t in times) >= proxy.stats.lost // 2  # a lost chunk costs the RTO
    with LinkProxy(echo, LinkShape(reset=0.3, seed=2)) as cut:
        with pytest.raises((ConnectionError, OSError)):
            _round_trips(cut.address, 50)
    assert cut.stats.resets == 1


def test_a_bad_link_shape_is_refused():
    for kw in ({"delay_ms": 10, "jitter_ms": 20}, {"loss": 1.0}, {"reset": -0.1}, {"rto_ms": 0}):
        with pytest.raises(SecureFedError):
            LinkShape(**kw)


def test_flower_local_refuses_a_bad_link_before_starting_anything(tmp_path):
    code, out, err = cli("flower", "local", "--nodes", "2", "--out", str(tmp_path / "run"), "--link-delay", "10",
                         "--link-jitter", "20")  # fmt: skip
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "jitter" in err, err
    assert not any(tmp_path.iterdir())


def test_pss_of_live_processes():
    mine = pss_kib(os.getpid())
    assert mine is not None and mine > 1000  # this Python process holds more than 1 MiB
    assert pss_kib(2**22 + 12345) is None  # no such process
    assert node_pss_kib({0: [os.getpid()], 1: []}) == {0: pytest.approx(mine, rel=0.2), 1: 0}
    with MemorySampler(lambda: {0: [os.getpid()]}, every_s=0.05) as m:
        time.sleep(0.3)
    s = m.summary()
    assert s["samples"] >= 3 and s["peak_max_mib"] >= s["mean_mib"] > 1

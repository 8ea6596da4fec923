"""Shaped links in user space: a TCP proxy in front of the SuperLink's Fleet port that delays, jitters and loses.

This machine's kernel has no ``netem`` queueing discipline (``tc qdisc add ... netem`` fails with "Specified qdisc
kind is unknown" even though network namespaces can be made), so the links between the SuperNodes and the
SuperLink are shaped here instead: every SuperNode dials the proxy (``LocalDeployment(fleet_address=...)``), which
forwards each connection to the SuperLink byte for byte (TLS passes through untouched: the proxy sees only
ciphertext) and, per chunk read from a socket, in each direction:

* **delay and jitter**: the chunk is released ``delay ± jitter`` ms after it arrived (uniform), never before the
  chunk before it (TCP keeps order);
* **loss** (``loss``, a probability per chunk): a lost TCP segment is sent again after a retransmission timeout,
  so the chunk (and everything behind it) arrives ``rto_ms`` later — what packet loss does to a TCP stream;
* **resets** (``reset``, a probability per chunk): the connection is cut (both sockets closed, the chunk never
  delivered): the request or reply it carried is lost, and Flower's HTTP client must retry.

The draws are seeded: connection ``k`` (in the order the proxy accepts them) draws from ``Random(f"{seed}/{k}")``.
The proxy runs an asyncio loop in a thread of the process that starts it; :attr:`LinkProxy.stats` counts what it
did.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field

from secure_fed.errors import SecureFedError


@dataclass(frozen=True)
class LinkShape:
    """How a link behaves: ``delay_ms ± jitter_ms`` per chunk, ``loss`` (retransmitted after ``rto_ms``) and
    ``reset`` (the connection cut) as probabilities per chunk, ``seed`` for the draws."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    reset: float = 0.0
    rto_ms: float = 200.0
    seed: int = 0

    def __post_init__(self):
        if not (self.delay_ms >= 0 and 0 <= self.jitter_ms <= self.delay_ms):
            raise SecureFedError(f"link delay {self.delay_ms} ms ± {self.jitter_ms} ms: need 0 ≤ jitter ≤ delay")
        for name in ("loss", "reset"):
            if not 0 <= getattr(self, name) < 1:
                raise SecureFedError(f"link {name} {getattr(self, name)}: a probability in [0, 1)")
        if not self.rto_ms > 0:
            raise SecureFedError(f"link rto {self.rto_ms} ms: must be positive")


@dataclass
class LinkStats:
    connections: int = 0
    chunks: int = 0
    bytes: int = 0
    lost: int = 0  #: chunks delayed by a retransmission timeout
    resets: int = 0  #: connections cut
    delays_ms: list[float] = field(default_factory=list)  #: the delay drawn for each chunk (without loss)


class LinkProxy:
    """A shaping TCP proxy from ``127.0.0.1:port`` to ``target`` (``host:port``); a context manager."""

    def __init__(self, target: str, shape: LinkShape, *, port: int = 0):
        host, _, tport = target.rpartition(":")
        self.target = (host, int(tport))
        self.shape, self.port = shape, port
        self.stats = LinkStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ----------------------------------------------------------------- shaping
    async def _pipe(self, reader, writer, rng: random.Random, peer_writer) -> None:
        s, st = self.shape, self.stats
        release = 0.0  # when the previous chunk of this direction left
        try:
            while chunk := await reader.read(65536):
                arrived = time.monotonic()
                if s.reset and rng.random() < s.reset:
                    st.resets += 1
                    break
                delay = (s.delay_ms + (rng.uniform(-s.jitter_ms, s.jitter_ms) if s.jitter_ms else 0.0)) / 1000
                st.delays_ms.append(delay * 1000)
                if s.loss and rng.random() < s.loss:
                    st.lost += 1
                    delay += s.rto_ms / 1000
                release = max(release, arrived + delay)
                if (wait := release - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()
                st.chunks += 1
                st.bytes += len(chunk)
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (writer, peer_writer):  # one side gone (or cut): the connection ends both ways
                try:
                    w.close()
                except Exception:  # noqa: BLE001 - closing an already broken transport
                    pass

    async def _handle(self, client_reader, client_writer) -> None:
        k = self.stats.connections
        self.stats.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:  # the SuperLink is down (e.g. killed): the node sees a refused connection, as without the proxy
            client_writer.close()
            return
        up, down = random.Random(f"{self.shape.seed}/{k}/up"), random.Random(f"{self.shape.seed}/{k}/down")
        await asyncio.gather(self._pipe(client_reader, up_writer, up, client_writer),
                             self._pipe(up_reader, client_writer, down, up_writer))  # fmt: skip

    # ----------------------------------------------------------------- life cycle
    def _serve(self) -> None:
        self._loop = loop = asyncio.new_event_loop()
        self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        self._server.close()
        loop.run_until_complete(self._server.wait_closed())
        loop.close()

    def start(self) -> LinkProxy:
        self._thread = threading.Thread(target=self._serve, name="link-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise SecureFedError("the link proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> LinkProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["LinkProxy", "LinkShape", "LinkStats"]

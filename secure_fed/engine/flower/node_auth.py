"""SuperNode authentication as Flower 1.42 does it: a key pair per node, its public key registered with the SuperLink.

A SuperLink started with ``--enable-supernode-auth`` (it requires TLS) accepts only SuperNodes whose public key an
operator registered through its Control API beforehand (``flwr supernode register KEY.pub CONNECTION``); a node
signs every Fleet request with its private key (``flower-supernode --auth-supernode-private-key KEY``). A node with
an unregistered key is refused at activation (Flower's ``ApiError 2004``, the node exits with code 305), a node
without a key at registration (``ApiError 2001``: self-registration is disabled).

* :func:`write_node_key` writes one node's key pair (NIST P-384 ECDSA, OpenSSH format as Flower reads it; the
  private key with mode 0600);
* :func:`register_nodes` registers public keys with a SuperLink in one ``flwr``-CLI process (the same Control API
  request as ``flwr supernode register``) and returns the node id the SuperLink gave each key: a node keeps its id
  across restarts, since the id belongs to its key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from secure_fed.errors import SecureFedError

#: the SuperLink's log line when a node with an unregistered key tries to join (Flower 1.42)
REFUSED_UNREGISTERED = b"No SuperNode found with the given public key"
#: ... and when a node without a key tries to register itself
REFUSED_WITHOUT_KEY = b"[code: 2001] SuperNode authentication is enabled"


def write_node_key(folder: str | Path) -> tuple[Path, Path]:
    """A fresh key pair in ``folder``: ``node.key`` (private, 0600) and ``node.pub``; returns their paths. An
    existing pair is kept (a restarted node keeps its identity)."""
    folder = Path(folder)
    private, public = folder / "node.key", folder / "node.pub"
    if private.is_file() and public.is_file():
        return private, public
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP384R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return private, public


_REGISTER = """
import json, sys
from flwr.cli.flower_config import read_superlink_connection
from flwr.cli.supernode.register import try_load_public_key
from flwr.cli.utils import init_http_client_from_connection
from flwr.proto.control_pb2 import RegisterNodeRequest
from pathlib import Path

connection, keys = sys.argv[1], sys.argv[2:]
client = init_http_client_from_connection(read_superlink_connection(connection))
try:
    ids = [int(client.RegisterNode(request=RegisterNodeRequest(public_key=try_load_public_key(Path(k)))).node_id)
           for k in keys]
finally:
    client.close()
print(json.dumps(ids))
"""


def register_nodes(public_keys: list[Path], *, connection: str, env: dict[str, str], timeout_s: float = 120.0) -> list[int]:
    """Register ``public_keys`` with the SuperLink of the ``flwr`` connection ``connection`` (``env`` holds its
    ``FLWR_HOME``); returns the node id of each key, in order."""
    p = subprocess.run([sys.executable, "-c", _REGISTER, connection, *map(str, public_keys)], env=env, capture_output=True,
                       timeout=timeout_s)  # fmt: skip
    lines = p.stdout.decode(errors="replace").strip().splitlines()
    if p.returncode != 0 or not lines:
        raise SecureFedError(f"registering {len(public_keys)} SuperNode keys failed: {p.stderr.decode(errors='replace')[-500:]}")
    ids = json.loads(lines[-1])
    if len(ids) != len(public_keys) or not all(ids):
        raise SecureFedError(f"the SuperLink gave node ids {ids} for {len(public_keys)} keys")
    return [int(i) for i in ids]


_END_SESSION = """
import sys
from pathlib import Path
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.proto.fleet_pb2 import DeactivateNodeRequest
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
from flwr.supernode.fleet_http_client import FleetHttpClient
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

address, ca, key_file, node_id = sys.argv[1:5]
key = load_ssh_private_key(Path(key_file).read_bytes(), None)
interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperNode"), NodeAuthHttpInterceptor(key, key.public_key())]
with FleetHttpClient.from_server_address(address, False, Path(ca).read_bytes(), interceptors=interceptors) as client:
    client.DeactivateNode(DeactivateNodeRequest(node_id=int(node_id)))
"""


def end_stale_session(private_key: Path, node_id: int, *, address: str, ca: Path, env: dict[str, str],
                      timeout_s: float = 60.0) -> bool:  # fmt: skip
    """As the node (signed with its own key): end the session a killed SuperNode left at the SuperLink, with the
    ``DeactivateNode`` request a SuperNode sends when it shuts down, so that the node can join again at once (the
    SuperLink refuses to activate a node it holds for active, which a killed node stays until its heartbeat
    lapses: twice Flower's 30 s interval). Returns whether the SuperLink took the request."""
    p = subprocess.run([sys.executable, "-c", _END_SESSION, address, str(ca), str(private_key), str(node_id)], env=env,
                       capture_output=True, timeout=timeout_s)  # fmt: skip
    return p.returncode == 0


__all__ = ["REFUSED_UNREGISTERED", "REFUSED_WITHOUT_KEY", "end_stale_session", "register_nodes", "write_node_key"]

"""Keys that name a client's instances by their content, for per-instance randomness under DP-SGD.

DP-SGD's per-sample terms may draw randomness of their own (C-Tran's label mask). If those draws were taken in
batch order from one stream, removing one instance would hand every later instance another instance's draw, and
an adversary who could recompute the stream would see every later sample's gradient change. Keyed by content
instead (:meth:`protocols.randomness.SecretStream.keyed_uniform` over these keys), an instance's draws are a function
of the client's secret and the instance alone: the neighbouring data set changes exactly one term of the sum.

Identical instances get distinct keys (the content hash of the k-th copy is hashed again with k), so their draws
stay independent, as Poisson sampling's analysis assumes of distinct records.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def instance_keys(x: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """(n,) uint64: a 64-bit BLAKE2b of each row of ``x`` (dense features) with its row of ``targets``, the k-th
    repeat of the same content hashed again with k."""
    xs = x.detach().cpu().contiguous().numpy()
    ys = targets.detach().cpu().to(torch.uint8).contiguous().numpy()
    out = np.empty(len(xs), dtype=np.uint64)
    seen: dict[bytes, int] = {}
    for i in range(len(xs)):
        h = hashlib.blake2b(xs[i].tobytes(), digest_size=16)
        h.update(ys[i].tobytes())
        d = h.digest()
        k = seen.get(d, 0)
        seen[d] = k + 1
        if k:
            d = hashlib.blake2b(d + k.to_bytes(8, "little"), digest_size=16).digest()
        out[i] = int.from_bytes(d[:8], "little")
    return out


__all__ = ["instance_keys"]

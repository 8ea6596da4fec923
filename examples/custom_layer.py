"""A third-party protocol layer in a run: the example clipping layer (``examples/plugins/clipping_layer``) under DP.

``protocols: [clipping, dp]`` (innermost first): each client scales its update to L2 norm ≤ ``clipping.max_norm``
before dp clips it to ``privacy.client.clip_norm`` and the server adds the noise. A user callback
(:class:`~secure_fed.engine.callbacks.Callback`, passed to ``secure_fed.run``) measures every update as it crosses
the wire, so the script prints the largest norm the server received next to ``max_norm``. The clipping layer gives
no privacy by itself: the ε printed is dp's.

The layer is found through its entry points, so install it first (once):

    pip install -e examples/plugins/clipping_layer
    python examples/custom_layer.py --max-norm 0.1 --out runs/clipping-example
    python examples/custom_layer.py --small --out /tmp/clipping-example      # 2 rounds of a smaller problem
"""

from __future__ import annotations

import argparse
import math
import sys

import secure_fed
from secure_fed import Callback

SMALL = {
    "dataset": {"synthetic": {"num_train": 400, "num_test": 200, "num_features": 16, "num_labels": 8, "num_groups": 2}},
    "model": {"embedding_dim": 16, "hidden_dims": [32]},
}


class WireNorms(Callback):
    """The L2 norm of each plaintext client update the server receives (Δθ and its row deltas, as one vector)."""

    name = "wire_norms"

    def __init__(self):
        self.norms: list[float] = []

    def on_uplink(self, round_idx, cid, wire) -> None:
        from secure_fed.plugin_api import dense_delta

        if not isinstance(wire.get("theta_delta"), dict):
            return  # masked or encrypted (a secure-sum layer): the server cannot measure it
        parts = [dense_delta(t) for t in wire["theta_delta"].values()]
        parts += [wire["rows_delta"]] if "rows_delta" in wire else []
        self.norms.append(math.sqrt(sum(float(t.double().pow(2).sum()) for t in parts)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-norm", type=float, default=0.1, help="clipping.max_norm (below dp's clip_norm 1.0)")
    parser.add_argument("--epsilon", type=float, default=8.0, help="target ε of dp's client unit")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="2 rounds of a smaller problem (seconds)")
    parser.add_argument("--out", default="runs/clipping-example", help="the run directory (must not hold a run)")
    args = parser.parse_args()

    from secure_fed.plugin_specs import layer_specs

    if "clipping" not in layer_specs():
        print("error: the clipping layer is not installed: pip install -e examples/plugins/clipping_layer", file=sys.stderr)
        return 2
    config = {
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 2 if args.small else args.rounds},
        "evaluation": {"every": 2 if args.small else 5},
        "output": {"progress": False},
        "protocols": ["clipping", "dp"],
        "clipping": {"max_norm": args.max_norm},
        "privacy": {"client": {"clip_norm": 1.0, "target_epsilon": args.epsilon}},
        **(SMALL if args.small else {}),
    }
    norms = WireNorms()
    result = secure_fed.run(config, callbacks=[norms], run_dir=args.out)
    print(f"status: {result.status}, protocols: {result.summary['protocols']}, run directory: {result.run_dir}")
    print(f"metrics: P@1 {result.metrics['P@1']:.2f}, mAP {result.metrics['mAP']:.2f}")
    print(f"updates received: {len(norms.norms)}, largest norm {max(norms.norms):.4f} (clipping.max_norm {args.max_norm:g})")
    privacy = result.privacy
    print(f"privacy: ε = {float(privacy['epsilon']):.3f} at δ = {privacy['delta']:g} ({privacy['unit']} unit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which functions outside the config package receive the config object during a run (issue 54's acceptance: 0).

Traces (``sys.setprofile``) every Python call made while two runs execute through the Python API: the embedded
default at 2 rounds, and a DP + secure aggregation run (``protocols=[dp,secure_aggregation]``,
``privacy.client={target_epsilon: 4, clip_norm: 1}``). A call counts when one of the called function's arguments
(positional, keyword-only, ``*args`` and ``**kwargs`` entries included) is a config object
(:class:`secure_fed.config.schema.CoreConfig`, the base of every ``ExperimentConfig``) and the function is defined
outside ``secure_fed/config/`` (library code outside the checkout that ``secure_fed`` is imported from is not
counted). Prints each receiver as ``path:function(argument)`` with its call count, then the totals, overall and for
``secure_fed/`` alone.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/config_receivers.py [--out DIR]

Exit status 0 when no function receives the config, 1 otherwise (so a CI step can hold it at 0).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

RUNS = {
    "embedded default": ["training.rounds=2"],
    "dp + secure_aggregation": [
        "training.rounds=2",
        "protocols=[dp,secure_aggregation]",
        "privacy.client={target_epsilon: 4, clip_norm: 1}",
    ],
}


def _arguments(frame) -> list[tuple[str, object]]:
    """The called function's arguments as ``(name, value)``: named ones, then ``*args`` and ``**kwargs`` entries."""
    code, loc = frame.f_code, frame.f_locals
    n = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:n])
    out = [(name, loc.get(name)) for name in names]
    flags = code.co_flags
    i = n
    if flags & 0x04:  # CO_VARARGS
        star = code.co_varnames[i]
        out += [(f"*{star}[{k}]", v) for k, v in enumerate(loc.get(star) or ())]
        i += 1
    if flags & 0x08:  # CO_VARKEYWORDS
        kw = code.co_varnames[i]
        out += [(f"**{kw}[{k}]", v) for k, v in (loc.get(kw) or {}).items()]
    return out


def trace(runs: dict[str, list[str]], out_dir: Path) -> collections.Counter:
    """Run each config through :func:`secure_fed.run` under the profiler; the receivers and their call counts."""
    import secure_fed
    import secure_fed.config
    from secure_fed.config.schema import CoreConfig

    config_dir = str(Path(secure_fed.config.__file__).resolve().parent) + os.sep
    root = Path(secure_fed.__file__).resolve().parents[1]  # the checkout whose secure_fed runs (protocols/ beside it)
    repo = str(root) + os.sep
    hits: collections.Counter = collections.Counter()

    def profile(frame, event, arg) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(repo) or filename.startswith(config_dir):
            return
        for name, value in _arguments(frame):
            if isinstance(value, CoreConfig):
                hits[f"{os.path.relpath(filename, root)}:{frame.f_code.co_qualname}({name})"] += 1
                return

    for label, overrides in runs.items():
        sys.setprofile(profile)
        try:
            result = secure_fed.run(None, overrides=overrides, run_dir=out_dir / label.replace(" ", "_").replace("+", "and"))
        finally:
            sys.setprofile(None)
        print(f"{label}: {result.status}, {result.summary['rounds_completed']} rounds")
    return hits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="where the two runs write (default: a temporary folder)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="config-receivers-"))
    hits = trace(RUNS, out)
    for key, count in sorted(hits.items()):
        print(f"{count:4d}  {key}")
    core = [k for k in hits if k.startswith("secure_fed" + os.sep)]
    print(f"functions receiving the config: {len(hits)} (secure_fed/: {len(core)}, elsewhere: {len(hits) - len(core)})")
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())

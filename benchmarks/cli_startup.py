"""How long ``secure-fed validate`` and ``secure-fed list`` take, and whether they import torch or an attack.

    python benchmarks/cli_startup.py [--repeat 5] [--json FILE]

Each command runs in a fresh interpreter ``--repeat`` times; the median wall time is printed beside the
time of a bare ``python -c pass`` and of ``import torch`` measured in the same run, and the ratio
command / import-torch. Target (issue: engine redesign): ≤ 1.5 s each on the project's 2-core machine; a config
error from ``run`` (a missing file, an unknown key) ≤ 2 s, its error line before torch is imported (issue 48).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = (
    "import sys, runpy; sys.argv = {argv!r}; "
    "from secure_fed.cli import main\n"
    "import contextlib, io\n"
    "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()): code = main(sys.argv[1:])\n"
    "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith('threat_models.attacks.'))\n"
    "print('HEAVY', ','.join(heavy))"
)


def timed(code: str, repeat: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t0)
        out = r.stdout
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bare, _ = timed("pass", args.repeat)
    torch_t, _ = timed("import torch", args.repeat)
    rows = {"python -c pass": bare, "import torch": torch_t}
    heavy = {}
    for name, argv in (("validate (default config)", ["x", "validate", "secure_fed/config/default.yaml"]),
                       ("list", ["x", "list"]),
                       ("run nonexistent.yaml", ["x", "run", "nonexistent.yaml"]),
                       ("run --set training.nope=1", ["x", "run", "--set", "training.nope=1"])):  # fmt: skip
        t, out = timed(PROBE.format(argv=argv), args.repeat)
        rows[name] = t
        heavy[name] = out.split("HEAVY", 1)[1].strip() or "none"
    print(f"{'command':<28} {'median s':>9} {'/ import torch':>15}  heavy modules imported")
    for name, t in rows.items():
        extra = f"  {heavy[name]}" if name in heavy else ""
        print(f"{name:<28} {t:>9.3f} {t / torch_t:>15.2f}{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": rows, "heavy_imports": heavy}, indent=1))


if __name__ == "__main__":
    main()

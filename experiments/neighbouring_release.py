"""Run a config on Bibtex and on Bibtex without its instance with the most labels; compare what they release.

    python experiments/neighbouring_release.py --data-root ../shared/datasets \\
        [--config experiments/configs/bibtex_fedalc_dp.yaml] [--set KEY=VALUE ...]

Bibtex's largest label count (28) belongs to one instance. The script writes Bibtex without that instance's line
into a temporary data root, runs ``secure-fed run CONFIG --set training.rounds=1`` on both data roots, and compares
the privacy blocks of the two ``summary.json`` files (and every metrics line's ``privacy``): a release that is a
function of config and public facts is identical. Exit 0 when identical, 1 (with the differing keys) otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def without_top_instance(root: Path, out: Path) -> int:
    """Copy ``root``'s Bibtex to ``out`` without the training line with the most labels; returns its label count."""
    from secure_fed.data import load_registered

    ds = load_registered("bibtex", str(root))
    counts = ds.train.labels.getnnz(axis=1)
    top = int(counts.argmax())
    src, dst = root / "mulan" / "bibtex", out / "mulan" / "bibtex"
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "bibtex-train.arff":
            shutil.copy(f, dst / f.name)
    lines = (src / "bibtex-train.arff").read_text().splitlines(keepends=True)
    start = next(i for i, x in enumerate(lines) if x.strip().lower() == "@data") + 1
    data = [i for i in range(start, len(lines)) if lines[i].strip() and not lines[i].startswith("%")]
    line = lines[data[top]]
    num_features = ds.train.features.shape[1]
    entries = [e.split()[0] for e in line.strip().strip("{}").split(",") if e.strip()]
    assert sum(int(e) >= num_features for e in entries) == counts[top], "the ARFF line is not the reader's row"
    (dst / "bibtex-train.arff").write_text("".join(lines[: data[top]] + lines[data[top] + 1 :]))
    return int(counts[top])


def released_privacy(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    lines = [json.loads(x).get("privacy") for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {"summary.privacy": summary["privacy"], "metrics.privacy": lines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--config", default=str(REPO / "experiments" / "configs" / "bibtex_fedalc_dp.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    root = Path(args.data_root).resolve()
    with tempfile.TemporaryDirectory(prefix="secure-fed-neighbour-") as tmp:
        tmp = Path(tmp)
        k = without_top_instance(root, tmp / "minus")
        print(f"Bibtex's instance with the most labels has {k}; the neighbouring data set leaves it out")
        released = {}
        for name, data in (("bibtex", root), ("bibtex-minus-one", tmp / "minus")):
            cmd = ["secure-fed", "run", args.config, "--set", "training.rounds=1", "--set", "output.progress=false",
                   *[x for o in args.overrides for x in ("--set", o)],
                   "--data-root", str(data), "--out", str(tmp / name)]  # fmt: skip
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            released[name] = released_privacy(tmp / name)
        a, b = released["bibtex"], released["bibtex-minus-one"]
        print(json.dumps(a["summary.privacy"], indent=1, ensure_ascii=False)[:2000])
        if a == b:
            print("identical privacy blocks (summary.json and every metrics line)")
            return 0
        print("DIFFERENT privacy blocks:", json.dumps({"bibtex": a, "minus": b}, ensure_ascii=False)[:4000])
        return 1


if __name__ == "__main__":
    sys.exit(main())

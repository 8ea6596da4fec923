"""Load every Mulan data set found under a folder, as a user's downloaded files: one row each, with the notes.

    python benchmarks/mulan_sets.py ROOT [--json FILE]

ROOT holds one folder per data set, as the Mulan repository ships them (``ROOT/NAME/NAME.xml`` with
``NAME-train.arff`` + ``NAME-test.arff``, or a single ``NAME.arff``; Corel-style ``NAME-test.arff`` alone is read
as one file). Each set goes through ``load_from_paths`` exactly as ``dataset.format: arff`` would; a single file
gets the seeded 70/30 split. A set that fails prints its one-line error instead of a row, and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from secure_fed.data.registry import load_from_paths
from secure_fed.errors import DataError


def find_sets(root: Path) -> list[dict]:
    """(name, train, test or None, labels) for every label XML under ``root``."""
    sets = []
    for xml in sorted(root.glob("*/*.xml")):
        stem, folder = xml.stem, xml.parent
        train, test = folder / f"{stem}-train.arff", folder / f"{stem}-test.arff"
        if train.is_file() and test.is_file():
            sets.append({"name": stem, "train": train, "test": test, "labels": xml})
        elif (folder / f"{stem}.arff").is_file():
            sets.append({"name": stem, "train": folder / f"{stem}.arff", "test": None, "labels": xml})
        elif test.is_file():
            sets.append({"name": stem, "train": test, "test": None, "labels": xml})
    return sets


class _Notes(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sets = find_sets(args.root)
    if not sets:
        print(f"error: no NAME/NAME.xml with its ARFF files under {args.root}", file=sys.stderr)
        return 2
    notes = _Notes()
    logging.getLogger("secure_fed").addHandler(notes)
    rows, failed = [], 0
    print(f"{'set':<16} {'files':<6} {'train':>7} {'test':>6} {'features':>8} {'labels':>6} {'card.':>6} {'load s':>7}  notes")
    for s in sets:
        notes.lines.clear()
        t0 = time.perf_counter()
        try:
            ds = load_from_paths(format="arff", train=s["train"], test=s["test"], labels=s["labels"], name=s["name"])
        except Exception as exc:  # noqa: BLE001 - a reader bug is a failed row too; the other sets still run
            failed += 1
            what = exc if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            print(f"{s['name']:<16} error: {what}")
            continue
        secs = time.perf_counter() - t0
        n_tr, n_te = ds.train.num_instances, ds.test.num_instances
        card = ds.train.labels.nnz / max(n_tr, 1)
        row = {
            "set": s["name"], "files": "2" if s["test"] else "1", "train": n_tr, "test": n_te,
            "features": ds.train.features.shape[1], "labels": len(ds.label_names), "cardinality": round(card, 2),
            "load_s": round(secs, 2), "notes": [n.split(": ", 2)[-1] for n in notes.lines],
        }  # fmt: skip
        rows.append(row)
        short = "; ".join(n[:70] for n in row["notes"])
        print(
            f"{row['set']:<16} {row['files']:<6} {n_tr:>7} {n_te:>6} {row['features']:>8} {row['labels']:>6} "
            f"{card:>6.2f} {secs:>7.2f}  {short}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Mulan ARFF reader.

Mulan stores a multi-label dataset as an ARFF file whose label attributes are
named in a separate XML file. Rows are either dense (``v1,v2,...``) or sparse
(``{index value,...}``; absent attributes are 0). Every attribute named in the
XML is a binary label; every other attribute is a feature. We never rely on the
labels' position.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.errors import DataError

_ATTR_RE = re.compile(r"^@attribute\s+('(?:[^'\\]|\\.)*'|\"[^\"]*\"|\S+)\s+(.+)$", re.IGNORECASE)


def read_label_names(xml_path: str | Path) -> list[str]:
    """Label names from a Mulan XML label list (nested ``<label>`` elements allowed)."""
    path = Path(xml_path)
    if not path.is_file():
        raise DataError(f"label list not found: {path}")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise DataError(f"{path}: not valid XML ({exc})") from None
    names = [el.attrib["name"] for el in root.iter() if el.tag.split("}")[-1] == "label"]
    if not names:
        raise DataError(f"{path}: no <label name=...> elements")
    return names


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "'\"":
        name = name[1:-1]
    return name.replace("\\'", "'")


def _parse_header(lines, path: Path) -> tuple[list[str], list[str], int]:
    """Return attribute names, their raw types, and the line number of @data."""
    names: list[str] = []
    types: list[str] = []
    for lineno, raw in enumerate(lines):
        line = raw.strip()
        if not line or line.startswith("%"):
            continue
        low = line.lower()
        if low.startswith("@attribute"):
            m = _ATTR_RE.match(line)
            if not m:
                raise DataError(f"{path}:{lineno + 1}: cannot parse attribute line: {line[:80]}")
            names.append(_unquote(m.group(1)))
            types.append(m.group(2).strip())
        elif low.startswith("@data"):
            return names, types, lineno
    raise DataError(f"{path}: no @data section")


def read_arff(arff_path: str | Path, label_names: list[str]) -> MultiLabelSplit:
    """Read one Mulan ARFF file.

    Args:
        arff_path: the ``.arff`` file.
        label_names: names of the label attributes (from :func:`read_label_names`);
            the label columns of the result follow this order.

    Returns:
        A :class:`MultiLabelSplit` with CSR float32 features and CSR int8 labels.
    """
    path = Path(arff_path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    names, types, data_line = _parse_header(lines, path)
    index_of = {n: i for i, n in enumerate(names)}
    missing = [n for n in label_names if n not in index_of]
    if missing:
        raise DataError(f"{path}: label attributes from the XML are missing in the ARFF: {missing[:5]}")
    label_cols = np.array([index_of[n] for n in label_names], dtype=np.int64)
    is_label = np.zeros(len(names), dtype=bool)
    is_label[label_cols] = True
    feature_cols = np.flatnonzero(~is_label)
    # attribute index -> (is_label, column in its matrix)
    col_map = np.empty(len(names), dtype=np.int64)
    col_map[feature_cols] = np.arange(len(feature_cols))
    col_map[label_cols] = np.arange(len(label_cols))
    nominal_feature = [i for i in feature_cols if types[i].startswith("{") and not _is_binary_nominal(types[i])]
    if nominal_feature:
        raise DataError(f"{path}: non-numeric feature attribute '{names[nominal_feature[0]]}' is not supported")

    f_rows: list[int] = []
    f_cols: list[int] = []
    f_vals: list[float] = []
    l_rows: list[int] = []
    l_cols: list[int] = []
    n = 0
    for lineno in range(data_line + 1, len(lines)):
        line = lines[lineno].strip()
        if not line or line.startswith("%"):
            continue
        try:
            if line.startswith("{"):
                body = line[1 : line.rindex("}")].strip()
                pairs = [p.split(None, 1) for p in body.split(",")] if body else []
                entries = ((int(p[0]), p[1].strip()) for p in pairs)
            else:
                entries = enumerate(v.strip() for v in line.split(","))
            for attr, sval in entries:
                if sval in ("0", "?", ""):
                    continue
                val = float(sval.strip("'\""))
                if val == 0.0:
                    continue
                if is_label[attr]:
                    if val != 1.0:
                        raise ValueError(f"label '{names[attr]}' has value {sval}")
                    l_rows.append(n)
                    l_cols.append(col_map[attr])
                else:
                    f_rows.append(n)
                    f_cols.append(col_map[attr])
                    f_vals.append(val)
        except (ValueError, IndexError) as exc:
            raise DataError(f"{path}:{lineno + 1}: malformed data row ({exc})") from None
        n += 1
    features = sp.csr_matrix((np.asarray(f_vals, dtype=np.float32), (f_rows, f_cols)), shape=(n, len(feature_cols)))
    labels = sp.csr_matrix((np.ones(len(l_rows), dtype=np.int8), (l_rows, l_cols)), shape=(n, len(label_cols)))
    features.sum_duplicates()
    labels.sum_duplicates()
    return MultiLabelSplit(features=features, labels=labels)


def _is_binary_nominal(t: str) -> bool:
    vals = {v.strip().strip("'\"") for v in t.strip("{} ").split(",")}
    return vals <= {"0", "1"}

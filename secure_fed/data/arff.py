"""Mulan ARFF reader.

Mulan stores a multi-label dataset as an ARFF file whose label attributes are
named in a separate XML file. Rows are either dense (``v1,v2,...``) or sparse
(``{index value,...}``; absent attributes are 0). Every attribute named in the
XML is a binary label; every other attribute is a feature. We never rely on the
labels' position.

Names and values follow the ARFF quoting rules: a name or value may be quoted with single or
double quotes, and inside quotes a backslash escapes the next character (``'TAG_m\\'usica'`` is the
name ``TAG_m'usica``). Feature attributes may be numeric (``numeric``, ``real``, ``integer``),
nominal (``{a, b, c}``: one 0/1 column per category, in the header's order; a nominal ``{0, 1}``
stays one numeric column; a sparse row that omits a nominal attribute holds its first category, as
in Weka) or ``string``/``date`` (skipped, with a one-line note). Attributes named in ``drop``
(``dataset.drop_attributes``) are left out; a nominal attribute that takes a different value on
every row (genbase's ``protein``: an identifier, one column per instance once one-hot) gets a
one-line note saying so.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.errors import DataError

_ATTR_RE = re.compile(r"^@attribute\s+('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+)\s+(.+)$", re.IGNORECASE)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}
log = logging.getLogger(__name__)


def read_label_names(xml_path: str | Path) -> list[str]:
    """Label names from a Mulan XML label list (nested ``<label>`` elements allowed)."""
    path = Path(xml_path)
    if not path.is_file():
        raise DataError(f"label list not found: {path}")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise DataError(f"{path}: not valid XML ({exc})") from None
    labels = [el for el in root.iter() if el.tag.split("}")[-1] == "label"]
    if any("name" not in el.attrib for el in labels):
        raise DataError(f"{path}: a <label> element without a name attribute")
    names = [el.attrib["name"] for el in labels]
    if not names:
        raise DataError(f"{path}: no <label name=...> elements")
    return names


def _unquote(token: str) -> str:
    """A name or value as ARFF writes it: quoted with ' or " (backslash escapes inside), or bare."""
    token = token.strip()
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "'\"":
        body, out, i = token[1:-1], [], 0
        while i < len(body):
            ch = body[i]
            if ch == "\\" and i + 1 < len(body):
                i += 1
                out.append(_ESCAPES.get(body[i], body[i]))
            else:
                out.append(ch)
            i += 1
        return "".join(out)
    return token


def split_values(line: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside quotes (a quoted value may hold the separator and escaped quotes)."""
    if "'" not in line and '"' not in line:
        return line.split(sep)
    out, cur, quote, i = [], [], None, 0
    while i < len(line):
        ch = line[i]
        if quote is not None:
            cur.append(ch)
            if ch == "\\" and i + 1 < len(line):
                cur.append(line[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    if quote is not None:
        raise ValueError("unterminated quote")
    out.append("".join(cur))
    return out


def _kind(raw_type: str) -> str:
    t = raw_type.strip()
    if t.startswith("{"):
        return "binary" if _is_binary_nominal(t) else "nominal"
    low = t.lower()
    if low in ("numeric", "real", "integer"):
        return "numeric"
    if low == "string" or low.startswith("date"):
        return "skip"
    raise ValueError(f"unknown attribute type {t[:40]!r}")


def _categories(raw_type: str) -> list[str]:
    return [_unquote(v) for v in split_values(raw_type.strip()[1 : raw_type.strip().rindex("}")])]


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


def read_arff(arff_path: str | Path, label_names: list[str], *, drop: Sequence[str] = ()) -> MultiLabelSplit:
    """Read one Mulan ARFF file.

    Args:
        arff_path: the ``.arff`` file.
        label_names: names of the label attributes (from :func:`read_label_names`);
            the label columns of the result follow this order.
        drop: feature attributes to leave out (``dataset.drop_attributes``), e.g. an identifier; each must be a
            feature attribute of the file.

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
    dropped = set(drop)
    for name in drop:
        if name not in index_of:
            raise DataError(f"dataset.drop_attributes: {name!r} is not an attribute of {path}")
        if is_label[index_of[name]]:
            raise DataError(f"dataset.drop_attributes: {name!r} is a label (in the XML), not a feature, in {path}")
    # every attribute's role: a label column, a numeric feature column, a nominal feature (one column per category,
    # from base), or skipped (string, date)
    col_map = np.full(len(names), -1, dtype=np.int64)
    col_map[label_cols] = np.arange(len(label_cols))
    nominal: dict[int, dict[str, int]] = {}
    skipped: list[str] = []
    width = 0
    for i in np.flatnonzero(~is_label):
        if names[i] in dropped:
            continue
        try:
            kind = _kind(types[i])
        except ValueError as exc:
            raise DataError(f"{path}: attribute '{names[i]}': {exc}") from None
        if kind == "skip":
            skipped.append(names[i])
            continue
        col_map[i] = width
        if kind == "nominal":
            cats = _categories(types[i])
            nominal[int(i)] = {c: j for j, c in enumerate(cats)}
            width += len(cats)
        else:
            width += 1
    if skipped:
        log.warning("note: %s: %d string/date attribute(s) skipped (%s)", path, len(skipped), ", ".join(skipped[:3]))

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
                pairs = [p.strip().split(None, 1) for p in split_values(body)] if body else []
                entries = [(int(p[0]), p[1].strip()) for p in pairs]
                if bad := [a for a, _ in entries if not 0 <= a < len(names)]:
                    raise ValueError(f"attribute index {bad[0]} outside 0..{len(names) - 1}")
                if nominal:
                    # a sparse row omits zeros, and a nominal attribute's 0 is its first category (Weka's rule)
                    listed = {attr for attr, _ in entries}
                    for attr in nominal.keys() - listed:
                        f_rows.append(n)
                        f_cols.append(col_map[attr])
                        f_vals.append(1.0)
            else:
                values = split_values(line)
                if len(values) != len(names):
                    raise ValueError(f"{len(values)} values for {len(names)} attributes")
                entries = enumerate(v.strip() for v in values)
            for attr, sval in entries:
                if col_map[attr] < 0 or sval in ("?", ""):
                    continue
                if attr in nominal:
                    cat = _unquote(sval)
                    if cat not in nominal[attr]:
                        raise ValueError(f"'{names[attr]}' has no category {cat!r}")
                    f_rows.append(n)
                    f_cols.append(col_map[attr] + nominal[attr][cat])
                    f_vals.append(1.0)
                    continue
                if sval == "0":
                    continue
                val = float(_unquote(sval) if sval[0] in "'\"" else sval)
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
    features = sp.csr_matrix((np.asarray(f_vals, dtype=np.float32), (f_rows, f_cols)), shape=(n, width))
    labels = sp.csr_matrix((np.ones(len(l_rows), dtype=np.int8), (l_rows, l_cols)), shape=(n, len(label_cols)))
    features.sum_duplicates()
    labels.sum_duplicates()
    if dropped:
        log.warning("note: %s: %d attribute(s) left out (dataset.drop_attributes)", path, len(dropped))
    _note_identifiers(path, features, names, nominal, col_map)
    return MultiLabelSplit(features=features, labels=labels)


def _note_identifiers(
    path: Path, features: sp.csr_matrix, names: list[str], nominal: dict[int, dict[str, int]], col_map: np.ndarray
) -> None:
    """One note per nominal attribute whose value differs on every row (at least 20 rows): an identifier, which
    one-hot encoding turns into one column per instance."""
    n = features.shape[0]
    if n < 20 or not nominal:
        return
    per_column = np.bincount(features.indices, minlength=features.shape[1])
    for attr, cats in nominal.items():
        seg = per_column[col_map[attr] : col_map[attr] + len(cats)]
        if int((seg == 1).sum()) == n:
            log.warning(
                "note: %s: nominal attribute %r takes a different value on each of the %d rows (an identifier?); "
                "dataset.drop_attributes: [%s] leaves it out",
                path, names[attr], n, names[attr],
            )  # fmt: skip


def _is_binary_nominal(t: str) -> bool:
    """``{0, 1}`` (or ``{0}``): one numeric column. Declared in another order (``{1, 0}``) its first category, the
    value a sparse row's omission means, is "1", so it is one-hot like any other nominal attribute."""
    return _categories(t) in (["0", "1"], ["0"])

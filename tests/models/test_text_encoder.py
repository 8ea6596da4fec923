"""FedLGT's universal label embeddings: the offline default encoder (loaded once per module), prompts built from
readable label names, states in the order [positive, negative], the .npz cache, and one-line config errors."""

from __future__ import annotations

import hashlib
import importlib.util

import numpy as np
import pytest

from secure_fed.errors import ConfigError
from secure_fed.models import text_encoder as te

TEMPLATE = "The photo contains [CLASS]."


@pytest.fixture(scope="module")
def minilm():
    """The real default encoder, loaded once for the whole module."""
    return te.load_text_encoder("all-MiniLM-L6-v2")


class FakeEncoder:
    """A deterministic stand-in: each text maps to a fixed pseudo-random vector; counts encode calls."""

    def __init__(self, name="fake", dim=8):
        self.name, self.dim, self.calls = name, dim, 0

    def encode(self, texts):
        self.calls += 1
        rows = [
            np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).standard_normal(self.dim) for t in texts
        ]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- the real encoder -------------------------------------------------------------------------------------------------


def test_default_encoder_dim_determinism_and_semantics(minilm):
    assert minilm.name == "all-MiniLM-L6-v2" and minilm.dim == 384
    texts = ["The photo contains dog.", "The photo contains puppy.", "The photo contains airplane."]
    a, b = minilm.encode(texts), minilm.encode(texts)
    assert a.dtype == np.float32 and a.shape == (3, 384)
    np.testing.assert_array_equal(a, b)
    dog, puppy, airplane = a
    assert _cos(dog, puppy) > _cos(dog, airplane)
    assert minilm.encode([]).shape == (0, 384)


def test_ule_rows_equal_direct_encodings(minilm):
    names = ["dog", "TAG_algorithms", "Beach"]
    labels, states = te.universal_label_embeddings(names, template=TEMPLATE, encoder_spec="all-MiniLM-L6-v2", encoder=minilm)
    assert labels.shape == (3, 384) and states.shape == (2, 384)
    assert labels.dtype == np.float32 and states.dtype == np.float32
    expected = ["The photo contains dog.", "The photo contains TAG algorithms.", "The photo contains Beach."]
    for i, text in enumerate(expected):
        np.testing.assert_allclose(labels[i], minilm.encode([text])[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(states[0], minilm.encode(["positive"])[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(states[1], minilm.encode(["negative"])[0], rtol=0, atol=1e-5)
    assert not np.allclose(states[0], states[1])


def test_unreadable_sentence_transformers_folder(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    spec = f"sentence-transformers:{tmp_path}"
    with pytest.raises(ConfigError) as e:
        te.load_text_encoder(spec)
    msg = str(e.value)
    assert "\n" not in msg and "model.text_encoder" in msg and str(tmp_path) in msg


# --- prompts --------------------------------------------------------------------------------------------------------


def test_prompts_readable_names():
    assert te.prompts(["Beach", "Class1", "TAG_algorithms", "traffic-light", "pottedPlant"], TEMPLATE) == [
        "The photo contains Beach.",
        "The photo contains Class1.",
        "The photo contains TAG algorithms.",
        "The photo contains traffic light.",
        "The photo contains potted Plant.",
    ]


def test_template_without_placeholder():
    with pytest.raises(ValueError, match="A photo of"):
        te.prompts(["dog"], "A photo of {}.")
    with pytest.raises(ValueError, match=r"\[CLASS\]"):
        te.universal_label_embeddings(["dog"], template="no slot", encoder_spec="fake", encoder=FakeEncoder())


# --- cache ----------------------------------------------------------------------------------------------------------


def _no_loader(spec):
    raise AssertionError(f"the encoder was loaded ({spec}) despite a cache hit")


def test_cache_hit_loads_no_encoder(tmp_path, monkeypatch):
    names = ["cat", "dog"]
    fake = FakeEncoder()
    labels, states = te.universal_label_embeddings(
        names, template=TEMPLATE, encoder_spec="fake", cache_dir=tmp_path, encoder=fake
    )
    files = list(tmp_path.iterdir())
    key = hashlib.sha256(b'["fake", "The photo contains [CLASS].", ["cat", "dog"]]').hexdigest()[:16]
    assert [f.name for f in files] == [f"ule-{key}.npz"]
    assert fake.calls == 2

    monkeypatch.setattr(te, "load_text_encoder", _no_loader)
    labels2, states2 = te.universal_label_embeddings(names, template=TEMPLATE, encoder_spec="fake", cache_dir=tmp_path)
    np.testing.assert_array_equal(labels, labels2)
    np.testing.assert_array_equal(states, states2)
    assert labels2.dtype == np.float32 and states2.shape == (2, 8)


def test_cache_key_depends_on_template_and_names(tmp_path):
    fake = FakeEncoder()
    te.universal_label_embeddings(["cat", "dog"], template=TEMPLATE, encoder_spec="fake", cache_dir=tmp_path, encoder=fake)
    te.universal_label_embeddings(["cat", "dog"], template="A [CLASS].", encoder_spec="fake", cache_dir=tmp_path, encoder=fake)
    te.universal_label_embeddings(["dog", "cat"], template=TEMPLATE, encoder_spec="fake", cache_dir=tmp_path, encoder=fake)
    other = FakeEncoder(name="fake2")
    te.universal_label_embeddings(["cat", "dog"], template=TEMPLATE, encoder_spec="fake2", cache_dir=tmp_path, encoder=other)
    names = sorted(f.name for f in tmp_path.iterdir())
    assert len(names) == 4 and all(n.startswith("ule-") and n.endswith(".npz") for n in names)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_shape"])
def test_corrupt_cache_is_recomputed(tmp_path, damage):
    fake = FakeEncoder()
    labels, states = te.universal_label_embeddings(
        ["a", "b", "c"], template=TEMPLATE, encoder_spec="fake", cache_dir=tmp_path, encoder=fake
    )
    (path,) = tmp_path.iterdir()
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"not an npz")
    else:
        np.savez(path, labels=np.zeros((2, 8), np.float32), states=np.zeros((2, 8), np.float32))
    calls = fake.calls
    labels2, states2 = te.universal_label_embeddings(
        ["a", "b", "c"], template=TEMPLATE, encoder_spec="fake", cache_dir=tmp_path, encoder=fake
    )
    assert fake.calls > calls
    np.testing.assert_array_equal(labels, labels2)
    np.testing.assert_array_equal(states, states2)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # rewritten in place, no temp file left
    with np.load(path) as f:
        np.testing.assert_array_equal(f["labels"], labels)


def test_encoder_must_match_spec():
    with pytest.raises(ValueError, match="does not match"):
        te.universal_label_embeddings(["a"], template=TEMPLATE, encoder_spec="all-MiniLM-L6-v2", encoder=FakeEncoder())


# --- errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("bert-base-uncased", "bert-base-uncased"),
        ("sentence-transformers:/nonexistent/minilm", "/nonexistent/minilm"),
        ("sentence-transformers:", "sentence-transformers:PATH"),
        ("open_clip:ViT-B-32:/nonexistent/clip.pt", "/nonexistent/clip.pt"),
        ("open_clip:/nonexistent/clip.pt", "open_clip:ARCH:PATH"),
    ],
)
def test_bad_spec_is_one_line_config_error(spec, needle):
    with pytest.raises(ConfigError) as e:
        te.load_text_encoder(spec)
    msg = str(e.value)
    assert "\n" not in msg and "model.text_encoder" in msg and needle in msg


def test_bad_spec_raises_through_ule(tmp_path):
    with pytest.raises(ConfigError, match="model.text_encoder"):
        te.universal_label_embeddings(["a"], template=TEMPLATE, encoder_spec="nope", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(importlib.util.find_spec("open_clip") is not None, reason="open_clip is installed")
def test_open_clip_missing_package_says_how_to_install(tmp_path):
    ckpt = tmp_path / "clip.pt"
    ckpt.write_bytes(b"\0")
    with pytest.raises(ConfigError) as e:
        te.load_text_encoder(f"open_clip:ViT-B-32:{ckpt}")
    msg = str(e.value)
    assert "\n" not in msg and "model.text_encoder" in msg and "pip install open_clip_torch" in msg

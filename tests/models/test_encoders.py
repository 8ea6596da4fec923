import torch
from torch.nn import functional as F

from secure_fed.models import MLPEncoder, SparseTextEncoder, mean_pairwise_cosine, spread_init
from secure_fed.models.preprocess import Preprocessor


def test_sparse_text_network_is_the_papers():
    enc = SparseTextEncoder(1836)
    linears = [m for m in enc.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(1836, 512), (512, 1024), (1024, 1024), (1024, 512)]
    relus = [m for m in enc.body if isinstance(m, torch.nn.ReLU)]
    assert len(relus) == 2  # after the first two layers only
    assert enc(torch.zeros(3, 1836)).shape == (3, 512)


def test_mean_pairwise_cosine_extremes():
    W = torch.ones(5, 8)
    assert mean_pairwise_cosine(W) == pytest_approx(1.0)
    assert abs(mean_pairwise_cosine(torch.eye(6))) < 1e-7
    # the closed form equals the brute-force mean over i != j
    V = torch.randn(7, 4)
    Vn = F.normalize(V, dim=-1)
    S = Vn @ Vn.T
    brute = (S.sum() - S.diagonal().sum()) / (7 * 6)
    assert mean_pairwise_cosine(V) == pytest_approx(float(brute))


def pytest_approx(x):
    import pytest

    return pytest.approx(x, abs=1e-5)


def test_spread_init_is_nearly_orthogonal():
    W = spread_init(159, 512, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(W.norm(dim=1), torch.ones(159))
    assert abs(mean_pairwise_cosine(W)) < 0.01


def test_init_does_not_collapse_sparse_inputs(bibtex):
    """With Kaiming init and 1/sqrt(nnz) scaling, instance embeddings are not all alike."""
    prep = Preprocessor.fit("rsqrt_nnz", bibtex.train.features)
    x = torch.from_numpy(prep.transform(bibtex.train.features[:300]))
    torch.manual_seed(0)
    z = SparseTextEncoder(1836)(x)
    assert mean_pairwise_cosine(z) < 0.9


def test_mlp_encoder_shapes():
    assert MLPEncoder(10, hidden_dims=(32, 16), out_dim=8)(torch.zeros(4, 10)).shape == (4, 8)


def test_mean_pairwise_cosine_in_chunks_equals_the_pairwise_mean(monkeypatch):
    """An XC-sized W is normalised a chunk of rows at a time; the figure is the mean over all pairs i ≠ j,
    computed here from the dense cosine matrix."""
    import torch
    from torch.nn import functional as F

    from secure_fed.models import encoders

    torch.manual_seed(0)
    W = torch.randn(300, 16) + 0.3
    Wn = F.normalize(W.double(), dim=-1)
    cos = Wn @ Wn.T
    brute = float((cos.sum() - cos.diagonal().sum()) / (300 * 299))
    monkeypatch.setattr(encoders, "_COSINE_CHUNK", 16 * 7)
    assert abs(mean_pairwise_cosine(W) - brute) <= 1e-6 * abs(brute)


def test_orthogonal_init_makes_a_linear_sparse_text_encoder_a_scaled_projection():
    """encoder_init orthogonal: the composed map (embedding, then one linear layer) has orthonormal rows times gain²,
    so every singular value is 2 (gain √2 twice) and distances within its row space are kept; Kaiming's Gaussian
    layers spread the singular values (the independent computation: torch.linalg.svdvals of the product)."""
    from secure_fed.models.encoders import orthogonal_init

    torch.manual_seed(0)
    enc = SparseTextEncoder(300, embed_dim=64, hidden_dims=(), out_dim=32)
    kaiming = torch.linalg.svdvals(enc.body[0].weight @ enc.embed.weight)
    orthogonal_init(enc)
    A = enc.body[0].weight @ enc.embed.weight  # (32, 300): x ↦ A x
    s = torch.linalg.svdvals(A)
    assert torch.allclose(s, torch.full_like(s, 2.0), atol=1e-4)
    assert kaiming.max() / kaiming.min() > 2  # what the orthogonal init removes
    x = torch.randn(5, 300)
    in_space = x @ A.T @ A / 4  # x's projection onto A's row space
    assert torch.allclose(torch.cdist(enc(x), enc(x)), 2 * torch.cdist(in_space, in_space), atol=1e-4)
    assert all(m.bias is None or not m.bias.any() for m in enc.modules() if isinstance(m, torch.nn.Linear))

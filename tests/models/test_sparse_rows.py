"""Sparse input rows: the CSR batch type and the first layer that reads it, checked against dense computations
(the dense matrix built by scipy, torch's dense linear layer and autograd on it)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from secure_fed.algorithms.losses import bce_loss, positive_hinge_loss
from secure_fed.algorithms.per_sample import clipped_sum_linear
from secure_fed.models.encoders import SparseTextEncoder
from secure_fed.models.families import CosineEmbedding, LinearHead, LinearHeadModel
from secure_fed.models.sparse_rows import SparseInputLinear, SparseRows, column_major, set_fused_sgd


def _csr(n=40, d=300, density=0.03, seed=0, empty_row=3):
    m = sp.random(n, d, density=density, format="lil", random_state=seed, dtype=np.float64)
    m[empty_row] = 0  # a row without features (embedding_bag's empty bag must give 0, as the product does)
    m = m.tocsr()
    m.data += 0.1
    return m


def test_row_selection_matches_scipy_rows():
    m = _csr()
    x = SparseRows.from_csr(m, dtype=torch.float64)
    for idx in ([5, 3, 39, 0, 5], [3], []):
        np.testing.assert_array_equal(x[torch.tensor(idx, dtype=torch.int64)].to_dense().numpy(), m[idx].toarray())
    np.testing.assert_array_equal(x[7:19].to_dense().numpy(), m[7:19].toarray())
    np.testing.assert_array_equal(x[np.array([-1])].to_dense().numpy(), m[[39]].toarray())
    assert len(x) == 40 and x.shape == (40, 300) and x.nnz == m.nnz
    with pytest.raises(IndexError):
        x[torch.tensor([40])]


def test_products_for_the_linear_fast_path_match_dense():
    m = _csr()
    x, dense = SparseRows.from_csr(m, dtype=torch.float64), torch.from_numpy(m.toarray())
    torch.testing.assert_close(x.row_sq_norms(), dense.pow(2).sum(1))
    g = torch.randn(40, 7, dtype=torch.float64)
    torch.testing.assert_close(x.t_matmul(g), g.T @ dense)


@pytest.mark.parametrize("layout", ["row_major", "column_major"])
def test_first_layer_output_and_gradient_equal_the_dense_linear_layer(layout):
    torch.manual_seed(0)
    m = _csr(d=20000, density=0.0005)
    x, dense = SparseRows.from_csr(m, dtype=torch.float64), torch.from_numpy(m.toarray())
    lin = SparseInputLinear(20000, 16, bias=True).double()
    if layout == "column_major":
        w = lin.weight.detach().clone()
        column_major(lin)
        assert lin.weight.stride() == (1, 16) and torch.equal(lin.weight, w)  # same values, transposed storage
    out = lin(x)
    torch.testing.assert_close(out, dense @ lin.weight.T + lin.bias, rtol=1e-12, atol=1e-12)
    (out.sin().sum()).backward()
    got = lin.weight.grad
    lin.weight.grad = None
    torch.nn.functional.linear(dense, lin.weight, lin.bias).sin().sum().backward()
    torch.testing.assert_close(got, lin.weight.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["row_major", "column_major"])
def test_fused_sgd_step_is_the_sgd_step_on_the_touched_columns(layout):
    """With ``fused_sgd_lr`` the backward itself moves the weight by −lr·gradient (the dense layer's gradient,
    computed independently) and leaves no .grad; columns no row touches keep their values."""
    torch.manual_seed(0)
    m = _csr(d=20000, density=0.0005)
    x, dense = SparseRows.from_csr(m, dtype=torch.float64), torch.from_numpy(m.toarray())
    lin = SparseInputLinear(20000, 16, bias=False).double()
    if layout == "column_major":
        column_major(lin)
    w0 = lin.weight.detach().clone()
    ref = w0.clone().requires_grad_(True)
    torch.nn.functional.linear(dense, ref).sin().sum().backward()
    set_fused_sgd(lin, 0.25)
    lin(x).sin().sum().backward()
    assert lin.weight.grad is None
    torch.testing.assert_close(lin.weight.detach(), w0 - 0.25 * ref.grad, rtol=1e-12, atol=1e-12)
    untouched = np.setdiff1d(np.arange(20000), m.indices)
    assert torch.equal(lin.weight.detach()[:, untouched], w0[:, untouched])
    stepped = lin.weight.detach().clone()
    with torch.no_grad():  # no step outside training
        lin(x)
    out = lin(x)  # a forward alone steps nothing either
    assert torch.equal(lin.weight.detach(), stepped) and out.requires_grad
    set_fused_sgd(lin, None)
    lin(x).sum().backward()
    assert lin.weight.grad is not None


@pytest.mark.parametrize("layout", ["row_major", "column_major"])
def test_sgd_steps_on_sparse_rows_equal_steps_on_dense_rows(layout):
    """The text network trained by plain SGD (the first layer's step fused into its backward) from the same weights
    on the same batches, once on sparse rows and once on the dense matrix: the same weights after every step (fp64)."""
    m = _csr(n=64, d=30000, density=0.0004, empty_row=10)
    xs, xd = SparseRows.from_csr(m, dtype=torch.float64), torch.from_numpy(m.toarray())
    torch.manual_seed(1)
    a = SparseTextEncoder(30000, embed_dim=16, hidden_dims=(32,), out_dim=8).double()
    b = SparseTextEncoder(30000, embed_dim=16, hidden_dims=(32,), out_dim=8).double()
    b.load_state_dict(a.state_dict())
    if layout == "column_major":
        column_major(a)
    set_fused_sgd(a, 0.3)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.3), torch.optim.SGD(b.parameters(), lr=0.3)
    rows, target = torch.randn(5, 8, dtype=torch.float64), torch.rand(64, 5) < 0.3
    fam = CosineEmbedding()
    for step in range(4):
        idx = torch.arange(step * 16, step * 16 + 16)
        for model, opt, x in ((a, opt_a, xs), (b, opt_b, xd)):
            opt.zero_grad(set_to_none=True)
            positive_hinge_loss(fam.score(model(x[idx]), rows), target[idx]).backward()
            opt.step()
        assert a.embed.weight.grad is None  # stepped in the backward pass
        for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-11, atol=1e-12, msg=n)
    fresh = SparseTextEncoder(30000, embed_dim=16, hidden_dims=(32,), out_dim=8).double()
    assert not torch.equal(a.embed.weight, fresh.embed.weight)


@pytest.mark.parametrize("family", ["embedding", "linear_head"])
def test_dp_sgd_fast_path_on_sparse_rows_equals_it_on_dense_rows(family):
    """DP-SGD's clipped per-sample sum (ghost norms) on sparse rows equals the same on the dense rows, which its
    own test checks against materialised per-sample gradients; clipping active (fp32: the fast path scores in fp32)."""
    m = _csr(n=12, d=500, density=0.02, empty_row=4)
    xs, xd = SparseRows.from_csr(m, dtype=torch.float32), torch.from_numpy(m.toarray()).float()
    torch.manual_seed(2)
    enc = SparseTextEncoder(500, embed_dim=8, hidden_dims=(16,), out_dim=6)
    if family == "embedding":
        model, fam, loss_fn = enc, CosineEmbedding(), positive_hinge_loss
        rows, y = torch.randn(2, 6, dtype=torch.float32, requires_grad=True), torch.rand(12, 2) < 0.6
    else:
        model, fam, loss_fn = LinearHeadModel(enc, 6, 3), LinearHead(), bce_loss
        rows, y = None, torch.rand(12, 3) < 0.4
    seen = []

    def factors(norms):
        seen.append(norms.clone())
        return (0.05 / (norms + 1e-12)).clamp(max=1.0)

    got, la = clipped_sum_linear(family=fam, model=model, rows=rows, x=xs, targets=y, loss_fn=loss_fn, factors=factors)
    want, lb = clipped_sum_linear(family=fam, model=model, rows=rows, x=xd, targets=y, loss_fn=loss_fn, factors=factors)
    torch.testing.assert_close(seen[0], seen[1], rtol=1e-5, atol=1e-6)
    assert (seen[0] > 0.05).sum() >= 8
    assert set(got) == set(want)
    for n in got:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6, msg=n)
    torch.testing.assert_close(la, lb)


def test_dp_sgd_refuses_a_model_with_the_fused_sgd_step_on():
    """The fused step would move the weight by a non-private gradient inside DP-SGD's backward: refused."""
    from secure_fed.algorithms.per_sample import clipped_sum_linear

    enc = SparseTextEncoder(50, embed_dim=4, hidden_dims=(8,), out_dim=3)
    set_fused_sgd(enc, 0.1)
    x = SparseRows.from_csr(_csr(n=4, d=50, density=0.2))
    with pytest.raises(RuntimeError, match="fused"):
        clipped_sum_linear(family=CosineEmbedding(), model=enc, rows=torch.randn(1, 3), x=x,
                           targets=torch.ones(4, 1, dtype=torch.bool), loss_fn=positive_hinge_loss,
                           factors=lambda n: torch.ones_like(n))  # fmt: skip

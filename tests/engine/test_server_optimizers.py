import pytest
import torch

from secure_fed.engine import ServerOptimizer


def test_fedavg_with_lr_one_is_plain_averaging():
    p = {"a": torch.zeros(3)}
    ServerOptimizer(name="fedavg", lr=1.0).step(p, {"a": torch.tensor([1.0, 2.0, 3.0])})
    assert p["a"].tolist() == [1.0, 2.0, 3.0]


def test_fedadam_equals_torch_adam_on_negative_pseudo_gradient():
    torch.manual_seed(0)
    x0 = torch.randn(5)
    ours = {"x": x0.clone()}
    ref = torch.nn.Parameter(x0.clone())
    adam = torch.optim.Adam([ref], lr=0.01, betas=(0.9, 0.99), eps=1e-6)
    opt = ServerOptimizer(name="fedadam", lr=0.01, beta1=0.9, beta2=0.99, tau=1e-6)
    for _ in range(5):
        delta = torch.randn(5)
        opt.step(ours, {"x": delta})
        ref.grad = -delta
        adam.step()
    assert torch.allclose(ours["x"], ref.detach(), atol=1e-6)


def test_fedyogi_and_fedadagrad_follow_reddi_et_al():
    d = torch.tensor([0.5, -2.0])
    p = {"x": torch.zeros(2)}
    ServerOptimizer(name="fedadagrad", lr=0.1, tau=1e-3).step(p, {"x": d})
    assert torch.allclose(p["x"], 0.1 * d / (d.abs() + 1e-3))
    p = {"x": torch.zeros(2)}
    opt = ServerOptimizer(name="fedyogi", lr=0.1, beta1=0.0, beta2=0.5, tau=1e-3, bias_correction=False)
    opt.step(p, {"x": d})
    v = 0 - 0.5 * d**2 * torch.sign(0 - d**2)  # v ← v − (1−β₂)Δ² sign(v − Δ²)
    assert torch.allclose(p["x"], 0.1 * d / (v.sqrt() + 1e-3))


def test_fedavgm_accumulates_momentum():
    p = {"x": torch.zeros(1)}
    opt = ServerOptimizer(name="fedavgm", lr=1.0, momentum=0.5)
    opt.step(p, {"x": torch.ones(1)})
    opt.step(p, {"x": torch.ones(1)})
    assert p["x"].item() == pytest.approx(1.0 + 1.5)


def test_masked_rows_and_their_state_are_untouched():
    W = {"W": torch.zeros(3, 2)}
    opt = ServerOptimizer(name="fedadam", lr=0.1)
    mask = torch.tensor([True, False, True])
    opt.step(W, {"W": torch.ones(3, 2)}, masks={"W": mask})
    assert torch.all(W["W"][1] == 0) and torch.all(W["W"][0] > 0)
    assert torch.all(opt.state["W"]["m"][1] == 0) and opt.state["W"]["t"].tolist() == [1, 0, 1]
    # a row seen for the first time gets a first (bias-corrected) Adam step, like row 0 did
    opt.step(W, {"W": torch.ones(3, 2)}, masks={"W": torch.tensor([False, True, False])})
    assert torch.allclose(W["W"][1], torch.full((2,), 0.1), atol=1e-5)


def test_state_dict_round_trip():
    p = {"x": torch.zeros(2)}
    opt = ServerOptimizer(name="fedadam", lr=0.1)
    opt.step(p, {"x": torch.ones(2)})
    opt2 = ServerOptimizer(name="fedadam", lr=0.1)
    opt2.load_state_dict(opt.state_dict())
    q = {"x": p["x"].clone()}
    opt.step(p, {"x": torch.ones(2)})
    opt2.step(q, {"x": torch.ones(2)})
    assert torch.equal(p["x"], q["x"])


def test_load_state_dict_moves_moments_to_the_parameters_device():
    opt = ServerOptimizer(name="fedadam", lr=0.1)
    opt.step({"x": torch.zeros(2)}, {"x": torch.ones(2)})
    opt2 = ServerOptimizer(name="fedadam", lr=0.1)
    opt2.load_state_dict(opt.state_dict(), torch.device("meta"))
    assert all(t.device.type == "meta" for t in opt2.state["x"].values())


def test_averaged_keys_take_the_clients_mean_under_an_adaptive_optimiser():
    """Non-trainable θ entries (batch-norm statistics) step by Δ exactly and keep no optimiser state; the others
    still follow FedAdam (each coordinate of its first bias-corrected step moves by ≈ η)."""
    opt = ServerOptimizer(name="fedadam", lr=0.01, averaged={"bn.running_var"})
    p = {"bn.running_var": torch.ones(3), "w": torch.zeros(3)}
    d = torch.tensor([0.5, -0.25, 2.0])
    for _ in range(2):
        opt.step(p, {"bn.running_var": d, "w": d})
    assert torch.allclose(p["bn.running_var"], 1 + 2 * d)
    assert torch.allclose(p["w"], 0.02 * torch.sign(d), atol=1e-5)
    assert "bn.running_var" not in opt.state and "w" in opt.state


@pytest.mark.parametrize("layout", ["row_major", "column_major"])
@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam", "fedadagrad", "fedyogi"])
def test_chunked_steps_equal_whole_tensor_steps_bit_for_bit(name, layout, monkeypatch):
    """Large parameters step in pieces (bounded temporaries); the result is the whole-tensor step's, exactly. A
    column-major parameter (the sparse first layer's table) steps in pieces too, whatever layout its deltas have."""
    from secure_fed.engine import server_optimizers

    torch.manual_seed(0)
    p0, deltas = torch.randn(37, 11), [torch.randn(37, 11) for _ in range(3)]
    if layout == "column_major":
        p0 = p0.t().contiguous().t()
    pieces = []
    real = server_optimizers.ServerOptimizer._chunked
    monkeypatch.setattr(server_optimizers.ServerOptimizer, "_chunked",
                        staticmethod(lambda fn, p, *o: pieces.append(p.numel()) or real(fn, p, *o)))  # fmt: skip
    out = {}
    for chunk in (10**9, 50):
        monkeypatch.setattr(server_optimizers, "CHUNK_ELEMENTS", chunk)
        opt, p = ServerOptimizer(name=name, lr=0.1), {"w": p0.clone()}
        for d in deltas:
            opt.step(p, {"w": d})
        out[chunk] = (p["w"], opt.state_dict())
    assert torch.equal(out[10**9][0], out[50][0])
    assert out[50][0].stride() == p0.stride()  # the step kept the parameter's layout
    for k, st in out[10**9][1]["state"].get("w", {}).items():
        assert torch.equal(st, out[50][1]["state"]["w"][k]), k

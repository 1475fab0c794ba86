"""The few-row CPU linear product equals F.linear, and installing it changes no weight."""
import pytest
import torch

from actors import cpu_linear
from actors.cpu_linear import MAX_ROWS, SmallRowsLinear, install, small_rows_linear


@pytest.mark.parametrize("rows", [1, 2, 3, MAX_ROWS, MAX_ROWS + 1, 40])
def test_small_rows_linear_equals_f_linear_for_any_row_count(rows):
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(96, 48), torch.randn(96), torch.randn(1, rows, 48)
    expected = torch.nn.functional.linear(x, weight, bias)
    got = small_rows_linear(x, weight, bias)
    assert got.shape == expected.shape == (1, rows, 96)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous()


def test_gradients_flow_through_the_small_rows_product():
    weight = torch.randn(8, 4, requires_grad=True)
    small_rows_linear(torch.randn(2, 4), weight).sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))


def test_install_swaps_every_linear_layer_and_keeps_its_weights_and_outputs(monkeypatch):
    monkeypatch.setenv(cpu_linear.ENV, "on")
    plain = model()
    patched = model()
    patched.load_state_dict(plain.state_dict())
    x = torch.randn(3, 16)
    assert install(patched) == 2
    assert all(type(m) is SmallRowsLinear for m in patched if isinstance(m, torch.nn.Linear))
    assert patched.state_dict().keys() == plain.state_dict().keys()
    torch.testing.assert_close(patched(x), plain(x), rtol=1e-5, atol=1e-5)


def test_install_can_be_turned_off_and_never_touches_other_dtypes(monkeypatch):
    monkeypatch.setenv(cpu_linear.ENV, "off")
    assert install(model()) == 0
    monkeypatch.setenv(cpu_linear.ENV, "on")
    half = model().to(torch.bfloat16)
    assert install(half) == 0
    assert all(type(m) is torch.nn.Linear for m in half if isinstance(m, torch.nn.Linear))


needs_packed = pytest.mark.skipif(not cpu_linear.packed_available(), reason="this torch has no oneDNN")


@needs_packed
@pytest.mark.parametrize("rows", [cpu_linear.PACKED_MIN_ROWS, 8, 40])
def test_the_prepacked_product_equals_f_linear_for_verification_and_prefill_sized_inputs(rows):
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(96, 48), torch.randn(96), torch.randn(1, rows, 48)
    got = cpu_linear.packed_linear(x, cpu_linear.pack_weight(weight), bias)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@needs_packed
def test_a_packed_layer_follows_its_weight_after_an_update_and_survives_a_deep_copy(monkeypatch):
    import copy

    monkeypatch.setenv(cpu_linear.ENV, "on")
    layers = model()
    install(layers)
    assert all(m.packed is not None for m in layers if isinstance(m, SmallRowsLinear))
    x = torch.randn(4, 16)
    with torch.inference_mode():
        before = layers(x)
    with torch.no_grad():
        layers[0].weight.mul_(-1.0)  # in place, as an optimizer step: the packed copy must be remade
    with torch.inference_mode():
        after, copied = layers(x), copy.deepcopy(layers)(x)
    expected = layers[2](torch.relu(torch.nn.functional.linear(x, layers[0].weight, layers[0].bias)))
    torch.testing.assert_close(after, expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(copied, after, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, after)


@needs_packed
def test_with_autograd_on_a_packed_layer_still_trains(monkeypatch):
    monkeypatch.setenv(cpu_linear.ENV, "on")
    layers = model()
    install(layers)
    layers(torch.randn(4, 16)).sum().backward()
    assert layers[0].weight.grad is not None and layers[0].weight.grad.abs().sum() > 0

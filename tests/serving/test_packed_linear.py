"""The engine's oneDNN linears compute what ``F.linear`` computes, whatever batch a row is in, and always with
the weight the layer holds now."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.packed_linear import PackedLinear, pack_linears


def packed_model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 500, bias=False))
    assert pack_linears(model) == 2
    return model


def test_it_computes_what_f_linear_does_and_a_rows_result_does_not_depend_on_its_batch() -> None:
    model = packed_model()
    first = model[0]
    assert isinstance(first, PackedLinear)
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for shape in [(1, 64), (5, 64), (33, 64), (3, 7, 64)]:
            x = torch.randn(shape, generator=g)
            torch.testing.assert_close(
                model(x), F.linear(F.linear(x, first.weight, first.bias), model[1].weight)
            )
        rows = torch.randn((32, 64), generator=g)
        batched = model(rows)
        for i in (0, 7, 31):
            assert torch.equal(model(rows[i : i + 1])[0], batched[i])


def test_a_swapped_or_rewritten_weight_is_never_served_from_a_stale_pack() -> None:
    layer = packed_model()[0]
    assert isinstance(layer, PackedLinear)
    x = torch.randn((4, 64))
    own = layer.weight.data
    others = [own + 0.5 * i for i in (1, 2, 3)]
    with torch.inference_mode():
        base = layer(x)
        own_pack = layer.packs[layer.own][2]
        for other in others:  # a folded adapter's weight, as FoldedAdapter swaps it in for a forward
            layer.weight.data = other
            torch.testing.assert_close(layer(x), F.linear(x, other, layer.bias))
        assert len(layer.packs) == 2
        layer.weight.data = own
        assert torch.equal(layer(x), base)
        assert layer.packs[layer.own][2] is own_pack  # the layer's own pack stayed while others came and went
    with torch.no_grad():
        layer.weight.mul_(2)  # written in place: its version moves on, its pack is made again
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_a_forward_that_needs_gradients_goes_through_autograd() -> None:
    model = packed_model()
    x = torch.randn((4, 64), requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None and model[0].weight.grad is not None
    want = torch.autograd.grad(
        F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight).sum(), x
    )
    torch.testing.assert_close(x.grad, want[0])


def test_a_bf16_model_is_packed_only_where_onednn_runs_bf16_and_computes_f_linear_either_way() -> None:
    """oneDNN's bf16 linear needs AVX512 (bw, vl, dq) or AVX-NE-CONVERT; on a CPU without them the engine's
    bf16 layers stay torch's own and still serve."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 500, bias=False)).bfloat16()
    expected = 2 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 0
    assert pack_linears(model) == expected
    x = torch.randn((5, 64)).bfloat16()
    with torch.inference_mode():
        got = model(x).float()
    first, second = model[0], model[1]
    want = F.linear(F.linear(x.float(), first.weight.float(), first.bias.float()), second.weight.float())
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)

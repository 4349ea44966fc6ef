"""What a fine-tuning step saves under CPU autocast (issue #19 item 2, the measurement the estimate's AMP
fine-tuning model must follow; planner/estimate/finetune.py still refuses AMP fine-tuning). Measured with
torch.autograd.graph.saved_tensors_hooks on a Linear and on peft's LoRA Linear (peft/tuners/lora/layer.py
Linear.forward), fp32 master weights, autocast bf16 and fp16:
  - a frozen Linear whose input needs grad saves its weight's low-precision copy (out*in*e_amp): autocast's
    cached_cast caches only fp32 leaves that require grad, so the copy is a fresh tensor, held by the graph
    (without autocast it saves the parameter itself: no extra bytes);
  - a trainable Linear saves the low-precision copy of its input (b*s*in*e_amp), not the fp32 input;
  - LoRA: lora_A saves its own low-precision copy of x (peft casts x to the adapter's fp32 dtype, then
    autocast casts it down again; not shared with the base layer's), lora_B its low-precision weight copy
    and lora_A's output in e_amp (b*s*r*e_amp, not fp32); with x needing grad, the base and lora_A weight
    copies too; with lora_dropout > 0 and x needing grad, the dropout's fp32 mask (b*s*in*4).
"""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


def _saved(fn, dtype):
    out = []

    def pack(t):
        out.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=dtype):
            fn()
    return sorted(out, key=str)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_frozen_linear_saves_its_weight_cast_trainable_its_input_cast(dtype):
    lin = nn.Linear(16, 8)
    x = torch.randn(2, 16, requires_grad=True)
    lin.requires_grad_(False)
    assert _saved(lambda: lin(x), dtype) == [((16, 8), dtype)]  # the weight's copy, transposed
    lin.requires_grad_(True)
    assert _saved(lambda: lin(x.detach()), dtype) == [((2, 16), dtype)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_peft_lora_saves_low_precision_copies(dtype, p):
    peft = pytest.importorskip("peft")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(16, 8)

        def forward(self, x):
            return self.q(x)

    m = peft.get_peft_model(M(), peft.LoraConfig(r=4, target_modules=["q"], lora_dropout=p))
    x = torch.randn(2, 16, requires_grad=True)
    frozen_x = [((2, 16), dtype), ((2, 4), dtype), ((4, 8), dtype)]  # x cast, lora_A output, lora_B weight cast
    assert _saved(lambda: m(x.detach()), dtype) == sorted(frozen_x, key=str)
    rg_x = frozen_x + [((16, 8), dtype), ((16, 4), dtype)] + ([((2, 16), torch.float32)] if p else [])
    assert _saved(lambda: m(x), dtype) == sorted(rg_x, key=str)

"""One description of a decoder block's saved tensors (issue #19): the block walk (planner/arch/saved.py,
RMSDecoder.saved) answers every mask of what needs grad, and full training's block_terms is its "everything
trains" case. Estimates only (no torch); the walk's figures are held to measurements by tests/test_recorded.py."""
import dataclasses

import pytest

from planner.arch import families
from planner.arch.decoder import RMSDecoder
from planner.arch.terms import Widths
from planner.estimate.training import autocast_weight_bytes
from planner.spec import TrainSpec

WALKED = sorted(name for name, fam in families().items() if isinstance(fam, RMSDecoder))


def _cases(fam):
    for label, cfg, b, s in fam.grid_configs():
        for attention in fam.attention_kinds(cfg):
            yield label, dataclasses.replace(cfg, attention=attention), b, s


def test_every_decoder_family_walks_its_block():
    # the dense RMSNorm decoders, Phi-3's fused projections and the sparse MoE blocks
    assert {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "mixtral", "qwen2_moe",
            "qwen3_moe"} <= set(WALKED)


@pytest.mark.parametrize("arch", WALKED)
@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-amp", "fp16-amp"])
def test_full_training_is_the_walk_with_everything_training(arch, precision):
    """block_terms = the walk with every tensor training; under autocast the walk's own weight copies (what a
    fine-tuning step saves when a block's input needs grad) are, byte for byte, the block's share of full
    training's autocast cache term (autocast_weight_bytes): the same bytes counted in one place."""
    fam = families()[arch]
    for label, cfg, b, s in _cases(fam):
        spec = TrainSpec(batch_size=b, seq_len=s, precision=precision)
        w = Widths.of(spec)
        names = {t.name for t in fam.inventory(cfg) if t.kind == "param"}
        full = sum(t.bytes for t in fam.block_terms(cfg, spec, w))
        every, rg_out, rope = fam.saved(cfg, spec, w, 0, True, names, {})
        assert rg_out and rope, label
        assert sum(t.bytes for t in fam.saved(cfg, spec, w, 0, True, None, {})[0]) == sum(t.bytes for t in every)
        cache = autocast_weight_bytes(cfg, spec, blocks_only=True) // cfg.num_hidden_layers
        assert sum(t.bytes for t in every) - full == cache, (label, precision)
        assert (cache > 0) == w.amp, label


@pytest.mark.parametrize("arch", WALKED)
def test_a_frozen_block_before_anything_that_trains_saves_nothing(arch):
    """Autograd records nothing before the first tensor that needs grad: block 0, its input not needing grad and
    none of its tensors training (the last block trains), saves nothing and hands on an output that needs none."""
    fam = families()[arch]
    for label, cfg, b, s in _cases(fam):
        for precision in ("fp32", "bf16-amp"):
            spec = TrainSpec(batch_size=b, seq_len=s, precision=precision)
            last = {t.name for t in fam.inventory(cfg) if t.kind == "param" and t.block == cfg.num_hidden_layers - 1}
            terms, rg_out, rope = fam.saved(cfg, spec, Widths.of(spec), 0, False, last, {})
            assert (terms, rg_out, rope) == ([], False, False), label

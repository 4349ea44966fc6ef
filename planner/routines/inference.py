"""The real generation the planner measures (runs in a child process, or on fake tensors).

What users run: transformers' `model.generate(input_ids, attention_mask=..., max_new_tokens=N, min_new_tokens=N,
do_sample=False)` on the model built from its config in the run's dtype, `eval()`, under
`torch.inference_mode()`; the cache is chosen the way transformers chooses it (`cache_implementation="static"`
for a StaticCache; nothing for generate's default DynamicCache). The book's GPT-2 runs its own
`generate_text_simple` (LLMs-from-scratch ch04: the whole context recomputed for every token, no cache).

Phases: "prefill" is the model's first forward (the whole prompt) and the first token's selection;
"decode" starts at the second forward (one token at a time). A forward pre-hook on the model marks them.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..arch import family_of
from ..config import ModelConfig
from ..infer_spec import InferSpec
from . import build_model


# generate()'s arguments per --cache (planner/infer_spec.py CACHES; transformers 5.23 generation/utils.py
# _prepare_cache_for_generation): dynamic and sliding pass nothing (DynamicCache(config) gives a layer with a
# sliding window a DynamicSlidingWindowLayer); quantized names transformers' own fp8 backend (QuantizedCache's
# default backend, quanto, needs optimum-quanto); offloaded is DynamicCache(offloading=True).
CACHE_KWARGS = {"static": {"cache_implementation": "static"},
                "quantized": {"cache_implementation": "quantized", "cache_config": {"backend": "fp8"}},
                "offloaded": {"cache_implementation": "offloaded"}}


def generate_text_simple(model, idx, max_new_tokens, context_size):
    """LLMs-from-scratch ch04 (gpt_generate / previous_chapters.py), as the book writes it: greedy, no cache."""
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]
        with torch.no_grad():
            logits = model(idx_cond)
        logits = logits[:, -1, :]
        probas = torch.softmax(logits, dim=-1)
        idx_next = torch.argmax(probas, dim=-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


class GenerationRun:
    """Model and one fixed batch of prompts; `run()` performs one generate() call."""

    def __init__(self, cfg: ModelConfig, ispec: InferSpec, seed: int = 0):
        torch.manual_seed(seed)
        self.cfg, self.spec = cfg, ispec
        self.device = torch.device(ispec.device)
        self.family = family_of(cfg)
        if ispec.quantize_weights != "none":  # bitsandbytes, as from_pretrained quantizes (routines/infer_quant.py)
            from .infer_quant import load_quantized_for_inference

            self.model = load_quantized_for_inference(cfg, ispec, self.device)
        else:
            self.model = build_model(cfg, self.device, ispec.param_dtype)
        self.model.eval()
        self.input_ids = torch.randint(0, cfg.vocab_size, (ispec.batch_size, ispec.prompt_len), device=self.device)
        self.book = self.family.source == "book"
        self.attention_mask = None if self.book else torch.ones_like(self.input_ids)
        self.current_phase = "setup"
        self.output = None

    def run(self, on_phase: Callable[[str], None] = lambda phase: None) -> torch.Tensor:
        calls = [0]

        def mark(*_):
            phase = "prefill" if calls[0] == 0 else "decode"
            calls[0] += 1
            if phase != self.current_phase:
                self.current_phase = phase
                on_phase(phase)

        hook = self.model.register_forward_pre_hook(mark)
        try:
            with torch.inference_mode():
                if self.book:
                    out = generate_text_simple(self.model, self.input_ids, self.spec.new_tokens,
                                               self.cfg.context_length)
                else:
                    kwargs = CACHE_KWARGS.get(self.spec.cache, {})
                    out = self.model.generate(self.input_ids, attention_mask=self.attention_mask,
                                              max_new_tokens=self.spec.new_tokens, min_new_tokens=self.spec.new_tokens,
                                              do_sample=False, **kwargs)
        finally:
            hook.remove()
        self.current_phase = "done"
        on_phase("done")
        n = out.shape[1]
        del out
        return n

    def persistent_tensors(self) -> list[torch.Tensor]:
        """What lives before generate(): weights, buffers and the prompt batch (and its mask)."""
        out = list(self.model.parameters()) + list(self.model.buffers()) + [self.input_ids]
        if self.spec.quantize_weights != "none":  # bitsandbytes' quantization statistics (not parameters)
            from .infer_quant import quant_state_tensors

            out += quant_state_tensors(self.model)
        return out + ([self.attention_mask] if self.attention_mask is not None else [])

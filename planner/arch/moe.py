"""Sparse Mixture-of-Experts decoders (no torch): a Llama-shaped block whose MLP is a router and E experts
(Mixtral, Qwen2-MoE, Qwen3-MoE in transformers 5.23; family files mixtral.py, qwen2_moe.py, qwen3_moe.py).

The sparse block as transformers runs it (models/mixtral/modeling_mixtral.py MixtralSparseMoeBlock and
MixtralTopKRouter; integrations/moe.py grouped_mm_experts_forward, the default experts implementation), with
N = b*s tokens, E experts, k experts per token, f the expert width:
  router   logits = linear(x, W_gate) (N, E); probs = softmax(logits.float()); top-k values and indices;
           Mixtral/Qwen3 renormalise the top-k values (values /= values.sum(-1, keepdim=True)).
  dispatch expert_ids (N*k,) sorted (perm), x[perm // k] gathered (N*k, h), histc -> offsets (E,) int32.
  experts  grouped_mm(x_g, gate_up^T) (N*k, 2f); act(gate) * up; grouped_mm(., down^T) (N*k, h), in the
           parameters' dtype (moe.py `_grouped_mm` casts the input to the weight's dtype; not autocast).
  combine  times the sorted routing weights (fp32), un-permuted (inv_perm), summed over k.
Every size is a function of N*k, whatever the routing: which expert gets how many tokens changes only where
rows sit inside the (N*k, .) tensors, never their sizes (the grouped GEMM's offsets hold the split). Nothing
here depends on the routing.

Saved for backward (saved_tensors_hooks inventory of one block, deduplicated by storage, fp32 / bf16 /
bf16-AMP, tiny Mixtral b2 s16 h32 f48 E4 k2; measured sum = the terms below to the byte):
  router input N*h*e_m (the norm output; under AMP autocast's bf16 copy), softmax output 4*N*E,
  top-k indices 8*N*k, renormalisation: the fp32 sum 4*N and the top-k values 4*N*k (Mixtral/Qwen3),
  sort permutation and gather index 2*8*N*k, offsets 4*E, gathered tokens N*k*h*e_x, gate_up output
  2*N*k*f*e_x, activation output and product 2*N*k*f*e_x, sorted routing weights 4*N*k, down output
  N*k*h*e_x, inverse permutation 8*N*k; e_x = the parameters' dtype (fp32 under AMP). The gathered tokens
  and the product are the grouped GEMMs' inputs, saved for the experts' weight grads only: frozen experts
  (LoRA) save neither (MoEDecoder.saved_mlp).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..validation import ConfigError, _check_positive
from . import parts
from .base import linear
from .decoder import RMSDecoder
from .terms import TensorSpec, Term


def check_moe(cfg, widths: tuple[str, ...] = ()) -> None:
    """Experts and top-k positive, top-k at most the experts."""
    _check_positive(cfg, ("num_experts", "num_experts_per_tok") + widths)
    refuse_dense_layers({"decoder_sparse_step": getattr(cfg, "decoder_sparse_step", 1)})
    if cfg.num_experts_per_tok > cfg.num_experts:
        raise ConfigError(f"num_experts_per_tok {cfg.num_experts_per_tok} exceeds the {cfg.num_experts} experts")


def refuse_dense_layers(data: dict) -> None:
    """Qwen's decoder_sparse_step / mlp_only_layers make some blocks dense; every published config makes all
    blocks sparse (step 1, no mlp_only_layers), the only case modelled."""
    if data.get("decoder_sparse_step", 1) != 1 or data.get("mlp_only_layers"):
        raise ConfigError("decoder_sparse_step != 1 or mlp_only_layers (dense blocks among the sparse ones) is not "
                          "modelled yet (the published configs make every block sparse)")


class MoEDecoder(RMSDecoder):
    """An RMSDecoder whose MLP is a sparse MoE block. The config has num_experts, num_experts_per_tok and
    expert_size (the experts' width); shared_expert_size (Qwen2-MoE) is 0 when there is none."""

    # --offload-activations with --grad-accum > 1, every:K / selective or --offload-optimizer: the sparse block's
    # own backward points in a later micro-batch and under checkpointing (offload_backward_points below), measured on
    # Mixtral, Qwen2-MoE and Qwen3-MoE's four grid shapes (tests/test_offload_mix.py)
    offload_combinations: ClassVar[bool] = True

    router_name: ClassVar[str] = "mlp.gate"
    router_first: ClassVar[bool] = True       # registration order (named_parameters): Qwen3-MoE's experts come first
    renormalise_topk: ClassVar[bool] = True   # Mixtral always; Qwen: config norm_topk_prob
    fp32_routing_weights: ClassVar[bool] = True  # Mixtral keeps the top-k weights fp32; Qwen casts them back to
    # the router logits' dtype (router_top_value.to(router_logits.dtype))
    # fine-tuning walked (saved_mlp) and measured (bench finetune / finetune-amp's MoE rows, tests/test_finetune.py):
    # frozen layers and LoRA on the Linears peft can wrap (attention, Qwen2-MoE's shared expert; lora_module)
    lora_supported: ClassVar[bool] = True
    subset_supported: ClassVar[bool] = True
    qlora_supported: ClassVar[bool] = False  # QLoRA (bitsandbytes on the Linears only) not measured on MoE
    # no dense MLP: Qwen2-MoE's adapted shared expert (shared_expert_intermediate_size wide, not intermediate_size)
    # runs before the routed experts, whose recompute point (recompute_experts_point) is the block's top (measured:
    # qwen2_moe V1000 h64 b2 s32 and V97 h96 b2 s32 LoRA r4 all-linear bf16 checkpointing chunked-ce, +6.8% and
    # +11.8% before from the dense points on intermediate_size)
    dense_mlp_recompute: ClassVar[bool] = False
    def renormalises(self, c) -> bool:
        return self.renormalise_topk

    def lora_module(self, module: str) -> bool:
        """The router is no nn.Linear (MixtralTopKRouter / Qwen2MoeTopKRouter / Qwen3MoeTopKRouter hold a bare
        (E, h) nn.Parameter read by F.linear, transformers 5.23), so peft's LoRA cannot wrap it: all-linear
        (peft/tuners/tuners_utils.py _maybe_include_all_linear_layers: nn.Linear / Conv1D modules) leaves it out,
        and naming it is refused. The experts are 3-D parameters of one module, no Linears either (not in the
        matmul inventory `linears` reads)."""
        return not module.endswith("." + self.router_name)

    def shared_expert_size(self, c) -> int:
        """The width of Qwen2-MoE's shared expert (a dense gated MLP beside the routed ones); 0: none."""
        return 0

    def gated_mlp_width(self, c) -> int:
        """The only dense gated MLP of a sparse block is Qwen2-MoE's shared expert (config intermediate_size is the
        width of dense blocks, which no modelled config has: refuse_dense_layers) (the fuzz check, issue #34: qwen2_moe
        V92 h24 f160 shared 97 b2 s33 bf16 checkpointing LoRA on the shared expert, +8.4% before)."""
        return self.shared_expert_size(c)

    def shape(self, c) -> parts.Shape:
        # The backward's high points see the MLP per token: k experts of width f each.
        sh = super().shape(c)
        return dataclasses.replace(sh, f=c.num_experts_per_tok * c.expert_size)

    expert_width_key: ClassVar[str] = "moe_intermediate_size"  # the config key of each expert's width

    def check_run(self, cfg, spec) -> None:
        super().check_run(cfg, spec)
        # The experts run by torch's grouped GEMM (transformers 5.23 integrations/moe.py grouped_mm_experts_forward),
        # which takes each operand's row stride in whole 16-byte units (aten/src/ATen/native/GroupedMMUtils.h,
        # torch/_meta_registrations.py _meta_grouped_mm_common: "strides should be multiple of 16 bytes"): the
        # experts' input width (hidden_size) and their own width, in the experts' parameter dtype (grouped_mm is on
        # no autocast list). Measured on the CPU: Mixtral h48 f50 fp32 and h36 f48 bf16 raise it, h36 fp32 and
        # h40 f56 bf16 run (the fuzz check, issue #34).
        e = 2 if spec.param_dtype == "bfloat16" else 4
        bad = [f"{key} {n}" for key, n in (("hidden_size", cfg.hidden_size), (self.expert_width_key, cfg.expert_size))
               if n * e % 16]
        if bad:
            raise ConfigError(f"{', '.join(bad)}: torch's grouped GEMM, which runs the experts, needs them in "
                              f"multiples of {16 // e} in {spec.param_dtype} (16-byte strides)")

    # ---- generate() ----------------------------------------------------------------------------------
    def infer_forward_points(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> dict[str, int]:
        """The dense decoder's points (planner/arch/decoder.py: context, attention, norm, RoPE) with its MLP point
        replaced by the sparse block's, one forward of s queries (the prompt's, or a decode step's: s = 1) under
        inference_mode, N = b*s tokens (transformers 5.23 MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock /
        Qwen3MoeSparseMoeBlock, their TopKRouter, integrations/moe.py grouped_mm_experts_forward). Alive
        throughout, above the dense MLP point's residual and norm output (and eager's mask and attention weights):
          the router's logits, kept by the block as `_` (N*E*e), the top-k weights (N*k*e_rw: Mixtral's fp32
          values; Qwen's cast back to the logits' dtype) and indices (int64);
          Qwen2-MoE: the shared expert's output (N*h*e), made before the router (shared expert: its own gated MLP
          point, act(gate), up and their product, 3*N*fs*e, or the product and its down output);
          in the experts' forward: the sorted ids and the permutation (int64), the gathered tokens (N*k*h*e),
          the sorted weights (N*k*e_rw), histc's float input (4*N*k; int32 on CUDA, as wide), its counts and
          the int32 offsets (4*E each).
        The experts' points: `gate` at act(gate) * up beside the gate_up output (N*k*(2f + 2f)*e); `down` the
        product and the down output; `un-permute` at weighted_out[inv_perm]: the down output, the weighted
        product and its permuted copy (N*k*h*e_w: Mixtral's fp32 weights promote a bf16/fp16 product) and
        inv_perm; `sum` the sum over k (N*h*e_w) beside the down output and the permuted product, and its cast
        back to the hidden dtype (N*h*e) where e_w is wider. Router: the logits, softmax's fp32 output (Mixtral's
        .float() copy of low-precision logits beside it), then the top-k values and indices with the renormalising
        sum (4*N) or Qwen's cast (N*k*e). Qwen2-MoE's end: sigmoid(shared_expert_gate(x)) (N*e) times the shared
        output beside the routed output and the shared output (3*N*h*e). Every size is a function of N*k,
        whatever the routing. Measured with simulate infer against measure infer (tests/test_inference_moe.py)."""
        pts = super().infer_forward_points(c, ispec, e, s, kv_len, masked)
        x = self.shape(c)
        b = ispec.batch_size
        # the dense point's MLP tensors: act(gate), up and the product on the shape's width (k*f)
        base = pts.pop("mlp") - 3 * b * s * x.f * e
        N, h, E, k, f = b * s, c.hidden_size, c.num_experts, c.num_experts_per_tok, c.expert_size
        e_rw = 4 if self.fp32_routing_weights else e
        e_w = max(e, e_rw)
        fs = self.shared_expert_size(c)
        shared = N * h * e if fs else 0
        if fs:
            pts["mlp shared expert"] = base + max(3 * N * fs * e, N * fs * e + N * h * e)
        routed = base + shared
        qwen_cast = N * k * e if (not self.fp32_routing_weights and e < 4) else 0
        pts["mlp router"] = routed + N * E * e + 4 * N * E + max(
            4 * N * E if (self.fp32_routing_weights and e < 4) else 0,
            12 * N * k + max(4 * N if self.renormalises(c) else 0, qwen_cast))
        held = (routed + N * E * e + N * k * e_rw + 8 * N * k   # the router's outputs
                + 16 * N * k + N * k * h * e + N * k * e_rw + 4 * N * k + 8 * E)  # the dispatch
        pts["mlp experts gate"] = held + 4 * N * k * f * e
        pts["mlp experts down"] = held + N * k * f * e + N * k * h * e
        pts["mlp experts un-permute"] = held + N * k * h * (e + 2 * e_w) + 8 * N * k
        pts["mlp experts sum"] = (held + N * k * h * (e + e_w) + 8 * N * k + N * h * e_w
                                  + (N * h * e if e_w != e else 0))
        if fs:
            pts["mlp shared expert gate"] = base + 3 * N * h * e + N * e
        return pts

    # ---- inventory ------------------------------------------------------------------------------------
    def moe_specs(self, c, i: int) -> list[TensorSpec]:
        p, h, E, f = f"model.layers.{i}.mlp", c.hidden_size, c.num_experts, c.expert_size
        router = linear(f"model.layers.{i}.{self.router_name}", h, E, False, i, "mlp.in")
        # 3-D nn.Parameters: grouped_mm is on no autocast list (no low-precision copies)
        experts = [TensorSpec(f"{p}.experts.gate_up_proj", (E, 2 * f, h), "param", block=i, role="mlp.in"),
                   TensorSpec(f"{p}.experts.down_proj", (E, h, f), "param", block=i, role="mlp.out")]
        specs = router + experts if self.router_first else experts + router
        fs = self.shared_expert_size(c)
        if fs:  # Qwen2MoeSparseMoeBlock: shared_expert (Qwen2MoeMLP) and shared_expert_gate (h -> 1)
            specs += (linear(f"{p}.shared_expert.gate_proj", h, fs, False, i, "mlp.in")
                      + linear(f"{p}.shared_expert.up_proj", h, fs, False, i, "mlp.in")
                      + linear(f"{p}.shared_expert.down_proj", fs, h, False, i, "mlp.out")
                      + linear(f"{p}.shared_expert_gate", h, 1, False, i, "mlp.in"))
        return specs

    def inventory(self, c) -> list[TensorSpec]:
        out: list[TensorSpec] = []
        for t in super().inventory(c):
            if t.block is not None and ".mlp." in t.name:
                if t.name.endswith("mlp.down_proj.weight"):  # the dense MLP's last tensor: the sparse block here
                    out += self.moe_specs(c, t.block)
                continue
            out.append(t)
        return out

    # the routed output is scaled by the routing weights after the down GEMM (a mul that saves both operands), so
    # a checkpointed block's recompute replays the whole block (planner/arch/base.py)
    def recompute_replays_last(self, c) -> bool:
        return True

    def compute_block_ops(self, c, spec, block: int) -> list:
        """The routed experts' two grouped GEMMs (grouped_mm_experts_forward): each of the b*s tokens through k
        experts, gate_up (h -> 2f) and down (f -> h); the router and Qwen2-MoE's shared expert are inventory linears."""
        from .terms import MatOp

        nk, h, f = spec.batch_size * spec.seq_len * c.num_experts_per_tok, c.hidden_size, c.expert_size
        p = f"model.layers.{block}.mlp.experts"
        return [MatOp("experts gate_up (grouped)", "mlp.in", nk, h, 2 * f, (f"{p}.gate_up_proj",)),
                MatOp("experts down (grouped)", "mlp.out", nk, f, h, (f"{p}.down_proj",))]

    def selective_mlp_ops(self, c, spec, w) -> list:
        """The sparse block as the selective policy sees it (measured op order, transformers 5.23): Qwen2-MoE's
        shared expert (gate, up, down: aten.mm) first, then the router (mm), the experts' two _grouped_mm (not
        in torchtitan's list: recomputed), then Qwen2-MoE's shared_expert_gate (mm, one output)."""
        from .decoder import linear_op

        n, h, E, k, f = spec.batch_size * spec.seq_len, c.hidden_size, c.num_experts, c.num_experts_per_tok, c.expert_size
        fs = self.shared_expert_size(c)
        ops = ([linear_op("shared_expert.gate_proj", n, h, fs, False, w), linear_op("shared_expert.up_proj", n, h, fs, False, w),
                linear_op("shared_expert.down_proj", n, fs, h, False, w)] if fs else [])
        ops.append(linear_op("router", n, h, E, False, w))
        e_x = 4 if w.amp else w.e_m  # the experts run in the parameters' dtype
        ops += [("experts gate_up (grouped)", "grouped_mm", n * k * 2 * f * e_x, 2 * n * k * h * 2 * f),
                ("experts down (grouped)", "grouped_mm", n * k * h * e_x, 2 * n * k * f * h)]
        if fs:
            ops.append(linear_op("shared_expert_gate", n, h, 1, False, w))
        return ops

    # --offload-activations with fine-tuning: the walk's host view (saved_mlp) is exact (tests/test_offload_finetune.py)
    # and the grid's small shapes were too, but at full size the device figure's backward is not: qwen1.5-moe-a2.7b
    # LoRA q,v b1 s512 bf16-AMP +1.85% (+2.53% checkpointed) against the simulation, at the experts' backward point
    # (the fine-tuning sweep's own is +1.17% there without offloading); refused in one line until it is
    offload_finetune: ClassVar[bool] = False

    # ---- saved tensors --------------------------------------------------------------------------------
    def saved_mlp(self, wk, rg_in: bool) -> bool:
        """The sparse block in the block walk (planner/arch/saved.py BlockWalk; its saved tensors: the module
        docstring), by what needs grad: the router and Qwen2-MoE's shared expert and shared_expert_gate are
        Linears reading the block's normed input (one saved input, or under autocast one e_m copy per Linear
        whose weight trains); the shared expert is a gated MLP (BlockWalk.gated_mlp, its down_proj the mlp.out
        Linear); sigmoid(shared_expert_gate(x)) * shared_expert(x) saves the sigmoid output and the shared
        expert's output. The routed part (softmax, top-k, dispatch, the experts' grouped GEMMs, the combine)
        saves its set once anything in it needs grad (its input, the router or the experts), but the grouped
        GEMMs' inputs (the gathered tokens, the product) only when the experts train. Measured with every
        tensor training (full training, the last blocks of --train-layers) and with the router and the experts
        frozen under an input that needs grad (LoRA: the router and experts are no nn.Linear, moe.py lora_module);
        a training router beside frozen experts (no mode of the planner makes one) is not measured."""
        c, w = wk.cfg, wk.w
        N, h, E, k, f = wk.b * wk.s, c.hidden_size, c.num_experts, c.num_experts_per_tok, c.expert_size
        e_x = 4 if w.amp else w.e_m  # the experts run in the parameters' dtype
        ins = wk.linear_group("mlp.in", rg_in, h, "n2")
        out_rg = False
        fs = self.shared_expert_size(c)
        if fs:
            prod_rg = wk.gated_mlp(ins.get("gate_proj", False), ins.get("up_proj", False), fs)
            shared_rg = any(wk.linear_group("mlp.out", prod_rg, fs, "shared_prod").values())
            gate_rg = ins.get("shared_expert_gate", False)
            if shared_rg or gate_rg:
                wk.terms.append(Term("shared_expert_gate sigmoid output and shared expert output (its product's "
                                     "operands)", "b*s*e_m + b*s*h*e_m", N * w.e_m + N * h * w.e_m, True, "mlp"))
                # per saved variable: the sigmoid's output (by the sigmoid, and by the product for the shared
                # output's grad) and the shared output (for the gate's grad)
                n_sig = int(gate_rg) + int(shared_rg)
                wk.host.append(Term("host: shared_expert_gate sigmoid output (sigmoid, product), shared expert "
                                    "output", "n*b*s*e_m + b*s*h*e_m", n_sig * N * w.e_m + (N * h * w.e_m if gate_rg else 0),
                                    True, "mlp"))
                out_rg = True
        experts_tr = any(wk.trains(t.name) for t in wk.inv if ".experts." in t.name)
        routed_rg = rg_in or ins.get(self.router_name.rsplit(".", 1)[1], False) or experts_tr
        if not routed_rg:
            return out_rg
        e_rw = 4 if self.fp32_routing_weights else w.e_m
        wk.terms += [Term("router softmax output (fp32)", "4*b*s*E", 4 * N * E, True, "mlp"),
                     Term("top-k indices (int64)", "8*b*s*k", 8 * N * k, True, "mlp")]
        if self.renormalises(c):
            wk.terms.append(Term("top-k renormalisation: fp32 sum and values", "4*b*s + 4*b*s*k", 4 * N + 4 * N * k,
                                 True, "mlp"))
        wk.terms += [Term("dispatch: sort permutation, gather index, inverse permutation (int64)", "24*b*s*k",
                          24 * N * k, True, "mlp"),
                     Term("grouped GEMM offsets (int32)", "4*E", 4 * E, True, "mlp"),
                     Term("experts' down output (the routing weights' grad)", "b*s*k*h*e_x", N * k * h * e_x, True,
                          "mlp"),
                     Term("experts' gate_up output, activation output", "3*b*s*k*f*e_x", 3 * N * k * f * e_x, True,
                          "mlp"),
                     Term("sorted routing weights" + (" (fp32)" if self.fp32_routing_weights else ""),
                          "4*b*s*k" if self.fp32_routing_weights else "b*s*k*e_m", N * k * e_rw, True, "mlp")]
        # per saved variable (save_on_cpu's host copies: planner/arch/decoder.py offload_copies / offload_walk; measured:
        # a saved_tensors_hooks inventory of transformers 5.23's Mixtral, Qwen2-MoE and Qwen3-MoE under torch 2.13,
        # fp32, bf16 and bf16-AMP, full training and LoRA / last:1; the sum equals the pack hook's bytes): the router's
        # input and weight (its Linear above), its fp32 softmax output, the top-k indices (int64), the renormalisation's
        # fp32 sum and values (Mixtral, Qwen with norm_topk_prob), the sort permutation, the gather index and the
        # inverse permutation (int64); each grouped GEMM its int32 offsets, its (E, ., .) weight (e_x: the
        # parameters' dtype, fp32 under AMP) when its input needs grad (the tokens: the block's input) and its input
        # (the gathered tokens, N*k*h*e_x; the product, N*k*f*e_x) when the experts train; SiLU its input, the
        # product both operands; the combine the routing weights (e_rw) and the down output (N*k*h*e_x)
        wk.host += [Term("host: router softmax (fp32), top-k indices (int64), dispatch permutations (int64)",
                         "4*N*E + 8*N*k + 24*N*k", 4 * N * E + 32 * N * k, True, "mlp")]
        if self.renormalises(c):
            wk.host.append(Term("host: top-k renormalisation: fp32 sum and values", "4*N + 4*N*k", 4 * N + 4 * N * k,
                                True, "mlp"))
        wk.host += [Term("host: experts: grouped GEMM offsets (int32) x2"
                         + (", weights (their inputs need grad)" if rg_in else ""),
                         "8*E + rg*3*E*f*h*e_x", 8 * E + (3 * E * f * h * e_x if rg_in else 0), True, "mlp"),
                    Term("host: experts: SiLU input, the product's operands, down output, routing weights",
                         "3*N*k*f*e_x + N*k*h*e_x + N*k*e_rw", 3 * N * k * f * e_x + N * k * h * e_x + N * k * e_rw,
                         True, "mlp")]
        if experts_tr:
            wk.host.append(Term("host: experts: gathered tokens and product (the grouped GEMMs' inputs)",
                                "N*k*(h + f)*e_x", N * k * (h + f) * e_x, True, "mlp"))
        if experts_tr:  # each grouped GEMM saves its input for its (E, ., .) weight's grad only (torch's
            # _grouped_mm derivative, as mm's: frozen experts under LoRA save neither; measured, Qwen2-MoE V1000
            # h64 b2 s64 LoRA on attention: 2*b*s*k*(h + f)*e_x less over the two blocks, to the byte)
            wk.terms.append(Term("experts' gathered tokens and product (the grouped GEMMs' inputs, for the "
                                 "experts' weight grads)", "b*s*k*(h + f)*e_x", N * k * (h + f) * e_x, True, "mlp"))
        return True

    # ---- --offload-activations (planner/estimate/offload_act.py) ------------------------------------------
    def offload_alive(self, c, spec, w) -> tuple[int, int, int]:
        """--offload-activations' device terms alive but not saved: the RMS decoder's KV cache and checkpoint-held
        RoPE (planner/arch/decoder.py offload_alive), and the sparse block's forward high point: transformers'
        grouped_mm_experts_forward's locals (integrations/moe.py):
          routing   the router logits the block keeps as `_` (N*E*e_m), the top-k weights (N*k*e_rw) and indices
                    (int64), the sorted expert ids and the permutation (int64), the sorted weights (N*k*e_rw),
                    histc's float input (4*N*k), tokens_per_expert and the int32 offsets (8*E), the gathered tokens
                    (N*k*h*e_x)
          gate      the gate_up output (N*k*2f*e_x), SiLU's output and the product (N*k*f*e_x each)
          combine   the down output, the weighted product and its un-permuted copy (N*k*h*e_w each) and the inverse
                    permutation (8*N*k), the product gone
        Qwen2-MoE's shared expert runs first (a gated MLP: 3*N*fs*e_m at its product) and its output (N*h*e_m) is
        alive through the experts (measured on the op timelines of Mixtral V1000 h64 E4 k2 b2 s64 fp32: 11,296 B of
        routing locals, then 4*N*k*f*4 at the product)."""
        cache, rope, _ = super().offload_alive(c, spec, w)
        N, h, E, k, f = (spec.batch_size * spec.seq_len, c.hidden_size, c.num_experts, c.num_experts_per_tok,
                         c.expert_size)
        e_x = 4 if w.amp else w.e_m
        e_rw = 4 if self.fp32_routing_weights else w.e_m
        e_w = max(e_x, e_rw)
        routing = N * E * w.e_m + N * k * (e_rw + 8) + 2 * 8 * N * k + N * k * e_rw + 4 * N * k + 8 * E + N * k * h * e_x
        fs = self.shared_expert_size(c)
        shared = N * h * w.e_m if fs else 0
        # beside them in the last block: the model's inputs_embeds (a local of the model's forward), the block's
        # input (its caller's), the residual and the normed x (b*s*h*e_r each; one fewer with one block), RoPE's cos
        # and sin and the position_ids (2*s*d*e_r + 8*s; under checkpointing counted as held by the checkpoint); the
        # lm_head's autocast copy (V*h*e_m) is not made yet (measured: Mixtral V1000 h64 b2 s64 and V97 h32 b2
        # s256, fp32, bf16 and bf16-AMP)
        s = spec.seq_len
        held = (4 if c.num_hidden_layers > 1 else 3) * N * h * w.e_r
        held += 0 if spec.checkpointing else 2 * s * c.head_dim * w.e_r + 8 * s
        held -= c.vocab_size * h * w.e_m if w.amp else 0
        point = held + max(3 * N * fs * w.e_m,
                           shared + routing + max(4 * N * k * f * e_x, 3 * N * k * h * e_w + 8 * N * k))
        return cache, rope, point

    def ckpt_forward_point(self, c, spec, w, held: int) -> int:
        """Under full checkpointing a checkpointed block's forward saves nothing on the device (its saved tensors go
        to the checkpoint's holders), as under --offload-activations: the sparse block's forward high point is
        offload_alive's (its routing, gate and combine locals beside the residual and the normed x), with the
        model's inputs_embeds and the last block's input among the checkpointed inputs in `held` (offload_alive
        counts them in its 4*N*h*e_r; 3 with one block). Measured on the forward's op timeline (qwen3_moe V1000
        h64 b2 s32 last:1 bf16 checkpointing chunked-ce, the last block's un-permute `weighted_out[inv_perm]`:
        107,296 B above the persistent set, to the byte; 54,560 B under before)."""
        _, _, point = self.offload_alive(c, spec, w)
        bsh = spec.batch_size * spec.seq_len * c.hidden_size
        return held + point - min(c.num_hidden_layers, 2) * bsh * w.e_r

    def offload_backward_points(self, c, spec, w, points: dict[str, int], grads_exist: bool = False) -> dict[str, int]:
        """--offload-activations without checkpointing (planner/estimate/offload_act.py): the attention side's
        points are the RMS decoder's (the generic sweep with empty saved sets); the sparse block's are its own,
        with nothing saved on the device (every saved tensor a host copy): the grads made before the block (G),
        the residual stream's grad (b*s*h*e_r), the 0-d loss grad and grad_output (2*e_ce), and (measured on the op
        timeline of Mixtral V1000 h64 E4 k2 b2 s64 fp32, each point to the byte):
          combine:     the sum over k's grad expanded (N*k, h), the un-permutation's new_zeros and index_put
                       (3*N*k*h*e_w; e_w the weighted product's dtype)
          down:        the down grouped GEMM's input grad (N*k*f*e_x) and weight grad, the combine's grads alive
                       (the down output's, N*k*h*e_w, and the routing weights', N*k*e_rw)
          experts_act: the product's backward and SiLU's: the product's, the activation's and up's grads
                       (3*N*k*f*e_x) beside the down weight's grad and the routing weights'
          cat:         SplitBackward's cat of the gate and up grads (N*k*2f*e_x) while both are alive
          experts:     the gate_up grouped GEMM's weight grad (E*2f*h) and input grad (N*k*h*e_x) beside the cat
        Checkpointed: the generic sweep's points (the recomputed block on the device) and the down grouped GEMM's
        backward, which block_points leaves out (below experts_act in a first micro-batch of the grid's shapes):
        its input grad (N*k*f*e_x) and weight grad (E*h*f) made while the recomputed product (its saved input) and
        the grad of its output (N*k*h*e_x, MulBackward's) are alive, the combine's saved tensors freed, where
        experts_act has the product's two grads (2*N*k*f*e_x) instead and the down weight's grad added to .grad:
        down = experts_act + N*k*(h - f)*e_x + E*h*f*(e_p - made) (measured on the op timeline of Mixtral V1000
        h64 E4 k2 b2 s64 fp32 accum 2, the later micro-batch's last block: 65,536 B above experts_act, the step's
        backward peak).
        grads_exist (a later micro-batch of --grad-accum; every .grad there, counted by the caller): a new grad is
        added in place to its .grad and freed, so G holds no grads made but a tied head's (the embedding's V*h*e_p,
        held by the engine until the embedding's backward: planner/estimate/training.py tied_pending), and each
        grouped GEMM's weight grad is a transient of its own point only (measured on the op timelines of Mixtral
        V1000 h64 b2 s64 and V2000 h48 b2 s48 tied, fp32 and bf16-AMP, accum 2)."""
        moe = self.moe_specs(c, 0)
        down_n = sum(t.numel for t in moe if t.name.endswith("experts.down_proj"))
        gate_up_n = sum(t.numel for t in moe if t.name.endswith("experts.gate_up_proj"))
        N, h, k, f, L = (spec.batch_size * spec.seq_len, c.hidden_size, c.num_experts_per_tok, c.expert_size,
                         c.num_hidden_layers)
        e_p = 2 if spec.precision == "bf16" else 4
        made = 0 if grads_exist else e_p  # bytes per parameter of a grad made earlier and still kept apart
        e_x = 4 if w.amp else w.e_m
        if spec.checkpointing:
            return {**points, **{k_[:-len("experts_act")] + "down": v + N * k * (h - f) * e_x + down_n * (e_p - made)
                                 for k_, v in points.items() if k_.endswith(" experts_act")}}
        inv = [t for t in self.inventory(c) if t.kind == "param" and t.trainable]
        head = sum(t.numel for t in inv if t.role in ("head", "norm.final"))
        embed = sum(t.numel for t in inv if t.role == "embed")
        if self.tied(c):
            head += embed
        block = sum(t.numel for t in inv if t.block == 0)
        e_rw = 4 if self.fp32_routing_weights else w.e_m
        e_w = max(e_x, e_rw)
        # Qwen2-MoE: the shared branch's gate runs its backward first (block_points' `shared`): its weight grad (made
        # and kept apart in a first micro-batch), the grad of the shared expert's output (N*h*e_m) and the gate's
        # input grad (N*h*e_r) alive through the routed experts' backward (measured on the op timelines of Qwen2-MoE
        # V97 h96 b4 s8 and V97 h32 b2 s256, fp32 and bf16-AMP, one micro-batch and accum 2: the backward phase
        # -131,200 B before, the long row's, now to the byte)
        gate_n = sum(t.numel for t in moe if t.name.endswith("shared_expert_gate.weight"))
        shared = gate_n * made + N * h * (w.e_m + w.e_r) if self.shared_expert_size(c) else 0
        out = {k_: v for k_, v in points.items() if not k_.endswith(("experts_act", "combine", "experts"))}
        for where, g0 in (("last block", head), ("first block", head + (L - 1) * block)):
            held = (embed * e_p if self.tied(c) else 0) if grads_exist else g0 * e_p
            G = held + N * h * w.e_r + 2 * w.e_ce + shared
            pts = {"combine": G + 3 * N * k * h * e_w,
                   "down": G + N * k * h * e_w + N * k * e_rw + N * k * f * e_x + down_n * e_p,
                   "experts_act": G + down_n * made + N * k * e_rw + 3 * N * k * f * e_x,
                   "cat": G + down_n * made + N * k * e_rw + 4 * N * k * f * e_x,
                   "experts": G + down_n * made + gate_up_n * e_p + N * k * e_rw + 2 * N * k * f * e_x
                   + N * k * h * e_x}
            out.update({f"{where} {k_}": v for k_, v in pts.items()})
        # Qwen3-MoE's q/k norms (decoder.py; a later micro-batch's hold no new grad: Qwen3-MoE V97 h32 a4 kv2 b2 s256
        # accum 2, the backward +0.62% before)
        return {**out, **self.offload_qk_norm_points(c, spec, w, points, grads_exist)}

    # ---- backward high points -------------------------------------------------------------------------
    def block_points(self, c, spec, w, x) -> dict[str, int]:
        """The attention side's points are Llama's (decoder.RMSDecoder.block_points: norm, attention, attn_in,
        input_norm, rope, recompute; they see the block after its MLP's backward, with autocast copies of the
        router and shared expert only: the experts are not cast). The MLP side is the sparse block's own:
        experts: the gate_up grouped GEMM's backward (the live-bytes timeline, tiny Mixtral/Qwen-MoE, every
             precision): its weight grad (E, 2f, h) then its input grad (N*k, h) are made while alive are the
             down projection's grad, the grad of the gate_up output (SplitBackward's cat, (N*k, 2f)), the
             gathered tokens it saved, the router's saved tensors, the MoE output's grad (the residual's,
             b*s*h*e_r) and the grad of the top-k weights (N*k); the combine's and the experts' other saved
             tensors are freed. Qwen2-MoE's shared-expert gate has run its backward before (its nodes are
             later): its product's saved tensors are freed, the shared expert output's grad (b*s*h*e_m) and
             the gate's input grad are alive."""
        moe = self.moe_specs(c, 0)
        cast = sum(t.numel for t in moe if t.autocast)  # the router's and shared expert's weights
        # In a later micro-batch (grads exist: x.pending is the largest MLP weight's transient grad, here the
        # experts' gate_up) each new weight grad is added in place and freed at once: none is pending after
        # the MLP, and at the product's backward the down projection's transient is gone.
        pts = super().block_points(c, spec, w, dataclasses.replace(x, casts_mlp=2 * cast if w.amp else 0, pending=0))
        for name in ("ffn", "mlp_in", "mlp_cast", "mlp_done"):
            pts.pop(name, None)
        N, h, k, f = spec.batch_size * spec.seq_len, c.hidden_size, c.num_experts_per_tok, c.expert_size
        e_x = 4 if w.amp else w.e_m
        e_rw = 4 if self.fp32_routing_weights else w.e_m
        experts_n = sum(t.numel for t in moe if ".experts." in t.name)
        # frozen experts (a frozen block under last:N, LoRA: the block's saved set has no grouped GEMM inputs,
        # saved_mlp) make no weight grads and saved no product act(gate) * up (measured on the op timeline: mixtral
        # V1000 h64 b2 s32 last:1 bf16 checkpointing chunked-ce, block 0's gate_up backward 122,872 B over before)
        experts_tr = not x.block_terms or any(t.name.startswith("experts' gathered tokens") for t in x.block_terms)
        g_x = x.g if experts_tr else 0
        prod = N * k * f * e_x if experts_tr else 0
        freed = 3 * N * k * f * e_x + prod + N * k * h * e_x + N * k * e_rw + 8 * N * k
        fs = self.shared_expert_size(c)
        shared = shared_freed = 0
        if fs:
            gate_n = sum(t.numel for t in moe if t.name.endswith("shared_expert_gate.weight"))
            shared_freed = N * w.e_m + N * h * w.e_m + (N * h * w.e_m if w.amp else 0)
            freed += shared_freed
            # alive from the shared branch once its gate's backward has run: the gate's weight grad, the grad of
            # the shared expert's output (e_m) and the gate's input grad, cast back to the block input's dtype
            # (e_r: fp32 under AMP, where autocast's cast backward makes it; tiny Qwen2-MoE bf16-AMP ckpt
            # timeline: a (b*s, h) fp32 _to_copy in the backward before the combine's)
            shared = gate_n * x.g + N * h * w.e_m + N * h * w.e_r
        down_n = sum(t.numel for t in moe if t.name.endswith("experts.down_proj"))
        # the product's backward (act(gate) * up): the down projection's grad made, its input (the product)
        # and the combine's saved tensors freed; the product's grad and the two new grads alive
        pts["experts_act"] = (x.current - (prod + N * k * h * e_x + N * k * e_rw + 8 * N * k)
                              + down_n * g_x + shared + x.bsh * w.e_r + N * k * e_rw + 3 * N * k * f * e_x
                              - (freed - 3 * N * k * f * e_x - prod - N * k * h * e_x - N * k * e_rw - 8 * N * k))
        # the combine's backward: the sum over k's grad made contiguous for the view's backward (N*k, h), then
        # the un-permutation's (weighted_out[inv_perm]: new_zeros + index_put, (N*k, h)), with every saved
        # tensor of the block alive; under checkpointing the recompute (stopped early, once inv_perm is saved)
        # still holds the weighted product (N*k, h) it made
        # (these (N*k, h) tensors are the weighted product's: proj_out * routing weights, promoted to fp32 when
        # Mixtral's fp32 weights meet bf16/fp16 expert outputs (pure low precision); e_w below)
        e_w = max(e_x, e_rw)
        pts["combine"] = (x.current + x.bsh * w.e_r + 2 * N * k * h * e_w + shared - shared_freed
                          + (N * k * h * e_w if spec.checkpointing else 0))
        pts["experts"] = (x.current + x.pending - freed + experts_n * g_x + shared + x.bsh * w.e_r
                          + 2 * N * k * f * e_x + N * k * h * e_x + N * k * e_rw)
        if spec.checkpointing and spec.checkpoint_policy == "full":
            pts["recompute experts"] = self.recompute_experts_point(c, spec, w, x)
        return pts

    def recompute_experts_point(self, c, spec, w, x) -> int:
        """Under full checkpointing: the block's recompute at the routed experts' last saved tensor, the inverse
        permutation (`inv_perm[perm] = torch.arange(...)`, transformers' integrations/moe.py
        grouped_mm_experts_forward), where torch's non-reentrant checkpoint stops it. Beside the block's whole
        recomputed saved set (x.current) and the block output's grad, the recompute's locals are alive (read off
        the op timeline, planner.measure.events: qwen3_moe V1000 h64 b2 s32 last:1 bf16 checkpointing chunked-ce,
        block 0, the step's backward peak, 478,728 B above the persistent set to the byte):
          the decoder layer's `residual` after attention (b*s*h*e_r; the post-attention norm's saved fp32 input
            when the residual is fp32) and the MLP's input, the norm's output (b*s*h*e_r; unless the router or
            an adapter saved it: a Linear's input (weights train), a LoRA input x);
          the router: its logits kept as `_` (N*E*e_m) and the routing weights it returns (N*k*e_rw: Mixtral's
            fp32 top-k values, renormalised in place, the saved copy being a clone; Qwen's cast back to the
            logits' dtype, `router_top_value.to(router_logits.dtype)`, or the values themselves in fp32);
          the dispatch: the sorted expert ids (int64), histc's float input (4*N*k; int32 on CUDA, as wide) and
            its E counts (fp32), the gathered tokens (N*k*h*e_x; saved when the experts train), the weighted
            product (N*k*h*e_w) and the arange (int64);
          Mixtral / Qwen3-MoE (no shared expert): the recompute was started by the combine's IndexBackward
            unpacking inv_perm, after the sum over k's backward made its grad contiguous (N*k*h*e_w); Qwen2-MoE's
            is started earlier by the shared expert gate's product (its grad is the block output's), and runs on
            past inv_perm (below).
        Where the experts train (full training, the last blocks of --train-layers) their inputs are saved and
        the point is below the combine's; with frozen experts (a frozen block under last:N, LoRA) it is the
        block's high point."""
        N, h, E, k, f = (spec.batch_size * spec.seq_len, c.hidden_size, c.num_experts, c.num_experts_per_tok,
                         c.expert_size)
        e_x = 4 if w.amp else w.e_m
        e_rw = 4 if self.fp32_routing_weights else w.e_m
        e_w = max(e_x, e_rw)
        terms = x.block_terms
        xg_saved = any(t.name.startswith("experts' gathered tokens") for t in terms)
        in_saved = any(t.where == "mlp" and t.part == "" and (t.name.startswith("block mlp.in input")
                                                              or t.name.endswith("LoRA input x")) for t in terms)
        residual_saved = w.e_r == 4 and any(t.part == "norm.mlp" and "fp32 input" in t.name for t in terms)
        locals_ = ((0 if residual_saved else x.bsh * w.e_r) + (0 if in_saved else x.bsh * w.e_r)
                   + N * E * w.e_m + N * k * e_rw
                   + 8 * N * k + 4 * N * k + 4 * E + (0 if xg_saved else N * k * h * e_x) + N * k * h * e_w + 8 * N * k)
        # one op earlier, the down grouped GEMM's output made beside the product act(gate) * up (a local unless
        # the experts train), before the weighted product, inv_perm and the arange exist (measured: mixtral V1000
        # h64 f160 b2 s32 last:1 bf16 checkpointing chunked-ce, block 0's recompute: 6,144 B above the arange)
        down_mm = -N * k * h * e_w - 16 * N * k + (0 if xg_saved else N * k * f * e_x)
        if not self.shared_expert_size(c):
            return x.current + x.bsh * w.e_r + N * k * h * e_w + locals_ + max(0, down_mm)
        # Qwen2-MoE: the recompute runs on past inv_perm to the shared expert gate's product, so its high point is
        # the un-permuted copy `weighted_out[inv_perm]` (N*k*h*e_w) beside the weighted product, the arange gone;
        # what the shared_expert_gate saves (its Linear's tensors, the sigmoid output) is not remade yet
        # (measured: qwen2_moe V1000 h64 b2 s32 last:1 bf16 checkpointing chunked-ce, block 0's index, to the byte)
        later = (sum(t.bytes for t in terms if t.name.startswith("shared_expert_gate ")
                     and not t.name.startswith("shared_expert_gate sigmoid output"))
                 + (N * w.e_m if any(t.name.startswith("shared_expert_gate sigmoid output") for t in terms) else 0))
        return x.current - later + x.bsh * w.e_r + locals_ + max(N * k * h * e_w - 8 * N * k, down_mm)

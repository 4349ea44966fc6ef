"""What one architecture file provides, and the defaults most Hugging Face decoders share (no torch).

A family is a subclass of `Family` in `planner/arch/<family>.py` with a module-level `FAMILY` instance;
`planner.arch` discovers them. It holds, for its configs:
  - the config class, the keys a published config.json must have, validation and presets;
  - the parameter/buffer inventory with roles (block index, role, trainable): the estimator sums roles,
    never parameter names;
  - the forward's saved-tensor terms and the backward's high points, each a named formula;
  - how to build the real model, enable checkpointing and compute the loss (torch is imported only
    inside those methods, which run in the measuring child).

Roles used by the estimator (TensorSpec.role):
  embed, pos_embed        token / position embeddings (before the blocks)
  norm.attn, norm.mlp     a block's norm before attention / before the MLP (their parameters)
  norm.other              other block norms (Gemma 2's post-norms, Qwen 3's q/k norms)
  attn.in                 projections that read the block's normed input (q, k, v or fused qkv)
  attn.out                the attention output projection
  mlp.in                  projections that read the MLP's input (gate, up or fused gate_up, fc)
  mlp.out                 the MLP's down projection
  norm.final, head        the final norm and the output projection (after the blocks)
  buffer                  any buffer
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

from ..validation import ConfigError
from .terms import TensorSpec

def linear(name: str, n_in: int, n_out: int, bias: bool, block: int | None, role: str,
           conv1d: bool = False) -> list[TensorSpec]:
    """An nn.Linear (weight (out, in)) or transformers' Conv1D (weight (in, out)); autocast casts both
    (linear / addmm are on the lower-precision list)."""
    shape = (n_in, n_out) if conv1d else (n_out, n_in)
    specs = [TensorSpec(f"{name}.weight", shape, "param", autocast=True, block=block, role=role, conv1d=conv1d)]
    if bias:
        specs.append(TensorSpec(f"{name}.bias", (n_out,), "param", autocast=True, block=block, role=role,
                                is_bias=True))
    return specs


class Family:
    """One architecture. Subclasses set the class attributes and implement the abstract methods."""

    arch: ClassVar[str]                      # the "arch" key config_to_dict writes and config_from_dict reads
    model_types: ClassVar[tuple[str, ...]] = ()  # Hugging Face `model_type` values this family reads
    config_cls: ClassVar[type]
    required: ClassVar[tuple[str, ...]] = ()  # keys a config must carry (the rest have transformers' defaults)
    source: ClassVar[str] = "transformers"   # "transformers": the model measured is transformers' own
    # How `estimate` answers for this family (issue #20): "formula" (its terms), or "fitted simulation" (planner/
    # fitted.py: a fit of simulations of transformers' own model, for a model_type no family file reads: arch/auto.py)
    basis: ClassVar[str] = "formula"
    default_loss: ClassVar[str] = "labels"   # what "--loss default" means for this family
    description: ClassVar[str] = ""
    # Fine-tuning (planner/finetune.py): peft's default LoRA targets for the model type
    # (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), and whether the
    # estimator models LoRA / a trainable subset for this family.
    lora_default_targets: ClassVar[tuple[str, ...]] = ()
    # transformers' config class's `attribute_map` (configuration_<model>.py: a standard name -> the model's own
    # key; PretrainedConfig.__setattr__ / __getattribute__ redirect one to the other, so a config.json may carry
    # either spelling, and transformers 5 writes the target): each family file copies its class's table (never
    # imported here; tests/test_config_aliases.py holds the copies to transformers' own). from_dict reads a key
    # under either name.
    hf_attribute_map: ClassVar[dict[str, str]] = {}
    lora_supported: ClassVar[bool] = False
    subset_supported: ClassVar[bool] = False
    qlora_supported: ClassVar[bool] = True  # with lora_supported, a transformers decoder: QLoRA measured on it
    # under checkpointing with LoRA on the MLP, the recompute's adapter points of a dense gated MLP of width
    # intermediate_size, the block's last module (planner/estimate/finetune.py recompute_points)
    dense_mlp_recompute: ClassVar[bool] = True
    tp_supported: ClassVar[bool] = False  # torchtitan's TP plan applies (planner/measure/tensor_parallel.py), measured
    # A family whose block is not the transformers decoder's (planner/arch/saved.py walks that one) walks its
    # own fine-tuning step: finetune_check / finetune_step below (the book's GPT-2).
    own_finetune_step: ClassVar[bool] = False
    # --offload-activations with --grad-accum > 1, every:K / selective checkpointing or --offload-optimizer beside it
    # (planner/estimate/offload_act.py): measured on the RMSNorm decoders, transformers' GPT-2 and the MoE families
    # (tests/test_offload_mix.py), which set it; a family with its own backward points (offload_backward_points)
    # takes grads_exist=True for a later micro-batch once it sets it
    offload_combinations: ClassVar[bool] = False

    def lora_module(self, module: str) -> bool:
        """Whether peft's LoRA can wrap this matmul weight's module (planner/finetune.py: what --lora-targets and
        all-linear may name): an nn.Linear or Conv1D, which every inventory `linear` is unless the family says
        otherwise (a MoE router is a bare parameter read by F.linear: planner/arch/moe.py)."""
        return True

    def finetune_check(self, cfg, spec) -> None:
        """own_finetune_step: raise ConfigError for a fine-tuning run this family's walk does not model."""

    def finetune_step(self, cfg, spec, w, train, trains: set, adapted: dict) -> dict:
        """own_finetune_step: the family's terms of a fine-tuning step, for planner/estimate/finetune.py
        estimate_own_step (which builds the phases, planner/estimate/step.py). train: (name, numel, bytes) of
        every trainable tensor; trains: their names; adapted: module name -> its LoRA adapter. Returns
        {"terms": saved Terms (forward and loss), "ce_saved": the loss's saved bytes, "forward_points" and
        "backward_points": named high points above the persistent base, "loss_bytes": the 0-d loss's bytes
        alive at the loss and through the backward}."""
        raise NotImplementedError

    # ---- configs -------------------------------------------------------------------------------------
    def presets(self) -> dict[str, Any]:
        return {}

    def from_dict(self, data: dict) -> Any:
        """Build the config from a JSON object; unknown keys are ignored (published files carry many)."""
        fields = {f.name for f in dataclasses.fields(self.config_cls) if f.init}
        data = self.read_aliases(data, fields)
        missing = [k for k in self.required if k not in data]
        if missing:
            raise ConfigError(f"{self.arch} config is missing key(s): {', '.join(missing)}")
        data = self.normalise(dict(data))
        if "torch_dtype" not in data and "dtype" in data:  # newer HF config.json files name it "dtype"
            data["torch_dtype"] = data["dtype"]
        kwargs = {k: v for k, v in data.items() if k in fields}
        try:
            return self.config_cls(**kwargs)
        except TypeError as exc:  # e.g. a list where a number belongs
            raise ConfigError(f"invalid {self.arch} config: {exc}") from None

    def read_aliases(self, data: dict, fields: set[str]) -> dict:
        """The config's fields under transformers' aliases (hf_attribute_map, either direction, as from_config
        reads them): a field missing from `data` takes its alias's value; the field's own spelling wins."""
        data = dict(data)
        for standard, own in self.hf_attribute_map.items():
            for ours, theirs in ((standard, own), (own, standard)):
                if ours in fields and ours not in data and theirs in data:
                    data[ours] = data[theirs]
        return data

    def normalise(self, data: dict) -> dict:
        """Map a published config.json's legacy spellings onto the config's fields (override per family)."""
        return data

    def check_fused_loss(self, cfg, spec) -> None:
        """Refuse a fused loss (chunked-ce, cce: planner/losses.py) this family's run cannot take. With
        fine-tuning (frozen layers, LoRA, QLoRA) the loss takes the frozen or trainable head weight as it is."""

    def check_run(self, cfg, spec) -> None:
        """Refuse a run this family cannot estimate or transformers cannot run (ConfigError, one line)."""

    def logit_softcap(self, cfg) -> float | None:
        """The final logits' soft cap (cap * tanh(logits / cap)) a fused loss applies per chunk / block (None: none)."""
        return None

    # ---- inference (planner/estimate/inference.py) -----------------------------------------------------
    def infer_caches(self, cfg) -> tuple[str, ...]:
        """The caches generate() can run this model with, the default first (planner/infer_spec.py CACHES)."""
        return ("dynamic", "static")

    def check_infer(self, cfg, ispec) -> None:
        """Refuse an inference run this family cannot estimate or run (ConfigError, one line)."""

    def infer_estimate(self, cfg, ispec) -> dict | None:
        """A family whose generation is not transformers' generate() (the book's generate_text_simple) gives its
        own estimate record here; None: planner/estimate/inference.py models generate() from the hooks below."""
        return None

    def infer_input_bytes(self, cfg, ispec) -> int:
        """The prompt batch generate() is given: input_ids and attention_mask, int64 (b, p) each."""
        return 2 * 8 * ispec.batch_size * ispec.prompt_len

    def kv_bytes_per_token(self, cfg, e: int) -> int:
        """One token's keys and values over all layers, for one sequence (bytes)."""
        raise NotImplementedError(f"{self.arch}: no inference model yet")

    def infer_kv_decode_bytes(self, cfg, ispec, e: int) -> int:
        """The KV cache after the last decode step: every layer at p + n - 1 tokens (the last token never enters
        the model); a family with sliding layers keeps fewer (planner/arch/infer_windows.py)."""
        return ispec.batch_size * self.kv_bytes_per_token(cfg, e) * (ispec.total_len - 1)

    def infer_prefill_points(self, cfg, ispec, e: int) -> dict[str, int]:
        """The prefill forward's high points: name -> live bytes above the weights, the prompt and the KV
        cache of every layer (the last layer's high points are the largest: the cache is then complete)."""
        raise NotImplementedError(f"{self.arch}: no inference model yet")

    def infer_decode_points(self, cfg, ispec, e: int) -> dict[str, int]:
        """The last decode forward's high points above the weights, the prompt and the cache at p + n - 1."""
        return {}

    def infer_prefill_unwritten_kv(self, cfg, ispec, e: int) -> dict[str, int]:
        """Prefill points (infer_prefill_points' names) that come before the last layer's cache update: the
        bytes of that layer's K/V not yet written there (subtracted from the cache at that point)."""
        return {}

    def infer_logits_terms(self, cfg, ispec, e: int) -> list:
        """What the token selection holds beside the cache (Term objects)."""
        return []

    # bos_token_id and eos_token_id the transformers config class sets by default (LlamaConfig: 1 and 2;
    # Qwen2Config / Qwen3Config: None); a family whose config sets pad_token_id adds one (infer_token_tensors)
    infer_bos_eos: ClassVar[int] = 2
    infer_has_eos: ClassVar[bool] = True  # an EOS id: generate adds MinLength / MinNewTokens logits processors

    def infer_token_tensors(self, cfg) -> int:
        """The special-token tensors generate holds through the call (generation/utils.py
        _prepare_special_tokens: one int64 0-d tensor per bos / eos / pad token id set; pad falls back to a view
        of eos). Measured: 2 for llama / mistral / gpt2-hf, 3 for gemma / gemma2 / phi3, 0 for qwen2 / qwen3."""
        return self.infer_bos_eos + (getattr(cfg, "pad_token_id", None) is not None)

    def infer_cache_state_bytes(self, cfg, ispec, phase: str) -> int:
        """The cache's small bookkeeping tensors beside K and V (cache_utils.py), alive in `phase`."""
        return 0

    def infer_static_mask_bytes(self, cfg, ispec) -> int:
        """Bytes per (sequence, cached position) of the additive masks an eager model builds in a StaticCache's
        decode step (one float mask in the weights' dtype per mask kind, planner/arch/decoder.py mask_count)."""
        from .terms import DTYPE_BYTES

        return DTYPE_BYTES[ispec.param_dtype] * (self.infer_mask_count(cfg, ispec) if hasattr(self, "infer_mask_count") else 1)

    def infer_static_windows(self, cfg, ispec) -> bool:
        """A StaticCache whose sliding layers keep their window (planner/arch/infer_windows.py static_window_options)."""
        return False

    def infer_decode_ids_bytes(self, cfg, ispec) -> int:
        """generate's grown input_ids and attention_mask at the last step (int64 (b, p + n - 1) and (b, p + n))."""
        return 8 * ispec.batch_size * (2 * ispec.total_len - 1)

    def to_dict(self, cfg) -> dict:
        out = {"arch": self.arch}
        out.update({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init})
        return out

    def grid_configs(self) -> list[tuple[str, Any, int, int]]:
        """(label, config, batch, seq) of tiny configs of this family for the accuracy grid
        (bench/main.py): grouped and plain heads, tied and untied heads, the family's own options,
        one shape whose backward peaks inside a block (few tokens, a small vocabulary) and one whose
        attention's s^2 tensors decide it (a long sequence)."""
        return []

    def attention_kinds(self, cfg) -> tuple[str, ...]:
        """The attention kernels this family runs (transformers refuses some: Gemma 2's softcapping)."""
        return ("eager", "sdpa")

    def tiny(self, cfg) -> Any:
        """A tiny config of the same family and options (warms up library code before a measurement)."""
        raise NotImplementedError

    def with_layers(self, cfg, n: int) -> Any:
        """The same model with n blocks (a proxy for timing)."""
        raise NotImplementedError

    # ---- accounting ----------------------------------------------------------------------------------
    def inventory(self, cfg) -> list[TensorSpec]:
        raise NotImplementedError

    def count_note(self, cfg) -> str:
        """A line beside the parameter count when it differs from what users know the model by ("" if not)."""
        return ""

    def tied(self, cfg) -> bool:
        """True when the output head shares the token embedding's weight."""
        return bool(getattr(cfg, "tie_word_embeddings", False))

    # ---- estimate ------------------------------------------------------------------------------------
    def block_terms(self, cfg, spec, w) -> list:
        """Tensors one block saves for backward in full training (Term objects, per_layer=True); a transformers
        decoder's is its block walk with everything training (planner/arch/decoder.py RMSDecoder.saved)."""
        raise NotImplementedError

    def outside_terms(self, cfg, spec, w) -> list:
        """Tensors saved outside the blocks (embeddings, final norm, head input), and what a checkpointed
        forward keeps alive besides the block inputs."""
        raise NotImplementedError

    def after_head_bytes(self, cfg, spec, w) -> int:
        """Saved bytes (in outside_terms) made after the output head's forward, between the logits and the loss:
        under the labels loss the measured forward phase ends at the head's forward hook (Family.loss), so they are
        not in the forward's end (they are in the loss phase). Default: none."""
        return 0

    def forward_terms(self, cfg, spec, w) -> list:
        """Tensors alive at the end of the forward (and through a loss computed inside the model) that
        backward does not need: they add to the forward and loss phases only (where="forward")."""
        return []

    def stash_extra(self, cfg, spec, w) -> int:
        """Bytes a recomputed block holds on top of its saved set (its stashed input when that is not
        one of the saved tensors)."""
        return 0

    def ckpt_forward_point(self, cfg, spec, w, held: int) -> int:
        """Under full checkpointing, fine-tuning without autocast: the forward's high point inside the last
        block (nothing saved there: every tensor a local), given `held`, what the forward keeps outside the
        blocks (the checkpointed inputs, RoPE's cos / sin, position_ids); 0: not modelled (the family's other
        points decide)."""
        return 0

    def first_block_released(self, cfg, spec, w) -> int:
        """Bytes kept through the forward (counted in the sweep's embed / kept terms) that are gone by the first
        block's backward (none here)."""
        return 0

    def block_points(self, cfg, spec, w, ctx) -> dict[str, int]:
        """The backward's high points inside one block: name -> live bytes on top of what the sweep
        holds outside the block (ctx: planner.estimate.training.SweepContext)."""
        raise NotImplementedError

    # ---- compute (planner/estimate/compute.py: FLOPs as FlopCounterMode counts them) --------------------------
    # Non-reentrant checkpoint stops the recompute once the block's last saved tensor is packed again, before the
    # op that saves it runs (torch/utils/checkpoint.py _StopRecomputationError): False, a block whose MLP output
    # projection is the last op that saves anything (a decoder's, then the residual add) never replays that matmul;
    # True: an op after it saves (Gemma 2's post-feedforward norm, MoE's routing-weight product), the whole block
    # replays.
    def recompute_replays_last(self, cfg) -> bool:
        return False

    # transformers' activation_checkpointing_enable (and peft) call enable_input_require_grads with fine-tuning
    # under checkpointing: every block's input needs grad (planner/estimate/finetune.py)
    input_grads_with_checkpointing: ClassVar[bool] = True
    # generate() decodes with a KV cache (one token a step); False: each step runs the whole sequence again (the
    # book's generate_text_simple), the logits of every position included
    infer_kv_cache: ClassVar[bool] = True

    def attention_dims(self, cfg) -> tuple[int, int]:
        """(query heads, head width) of the attention's s x s matmuls."""
        d = getattr(cfg, "head_dim", None) or cfg.hidden // cfg.heads
        return cfg.heads, d

    def attention_fused(self, cfg, spec) -> bool:
        """True when one fused SDPA kernel runs (its backward recomputes the scores: 5 s x s matmuls, torch's
        sdpa_backward_flop_count); False: eager's bmm pair (or CUDA's math kernel, the same composite)."""
        return cfg.attention == "sdpa"

    def attention_input(self, short: str) -> str:
        """Which attention input a projection makes (q, k, v; qkv: a fused projection), by its module's short name."""
        return {"q_proj": "q", "k_proj": "k", "v_proj": "v"}.get(short, "qkv")

    def compute_block_ops(self, cfg, spec, block: int) -> list:
        """A block's matmuls beside its inventory linears (planner/estimate/compute.py MatOp), in FLOPs: none here
        (MoE's routed experts: planner/arch/moe.py)."""
        return []

    def selective_ops(self, cfg, spec, w) -> list | None:
        """One block's matmul and attention ops in forward order, as torchtitan's selective-checkpointing policy
        sees them: (label, kind, output bytes, FLOPs), kind "mm" (aten.mm: a Linear without bias on a 3-D
        input), "addmm" (a Linear with a bias), "bmm" (eager attention), "grouped_mm" (MoE experts) or "sdpa"
        (a fused attention kernel); planner/checkpointing.py selective_saved applies the policy. None: not
        modelled for this family."""
        return None

    def selective_unconsumed(self, cfg, spec, w) -> int:
        """Selective checkpointing: bytes of a block's policy-cached outputs its recompute never replays, alive
        through the block's backward (until its checkpoint frame is freed). Non-reentrant checkpoint stops the
        recompute once the last saved tensor is recovered (torch/utils/checkpoint.py _StopRecomputationError), and an
        op's inputs are saved before it runs (VariableType), so the block's last op is not replayed when nothing after
        it saves: its cached output (create_selective_checkpoint_contexts' storage) is never consumed. Default: the
        last listed op's output when the policy keeps it (the decoders' down_proj, b*s*h*e_m; measured under
        --offload-activations: Llama / Qwen 3 tiny fp32 and pure bf16, block 0's backward b*s*h*e_m above full's)."""
        from ..checkpointing import saved_ops

        ops = self.selective_ops(cfg, spec, w)
        kept = saved_ops(ops) if ops else []
        return ops[-1][2] if kept and kept[-1] is ops[-1] else 0

    def offload_copies(self, cfg, spec, w) -> list | None:
        """--offload-activations (planner/estimate/offload_act.py): every tensor autograd saves in one forward and
        loss, as Terms of the bytes torch.autograd.graph.save_on_cpu's pack hook copies to the host: one copy per
        saved variable (a tensor two nodes save is copied twice; a matmul's weight counts), the view's own numel.
        None: not modelled for this family; whether it is None depends on the config and the device alone
        (planner/estimate/training.py memoises it so)."""
        return None

    def head_point(self, cfg, spec, w, ctx) -> int:
        """Live bytes at the backward's high point after the loss and before the blocks (0: none)."""
        return 0

    def loss_upcast(self, cfg, spec) -> bool:
        """True when the loss runs on an fp32 copy of the logits whatever their dtype."""
        return resolved_loss(self, spec) == "labels"

    # ---- the real model (torch, in the child only) ---------------------------------------------------
    def build(self, cfg, device, dtype: str):
        raise NotImplementedError

    def enable_checkpointing(self, model) -> None:
        raise NotImplementedError

    def restore_buffers(self, model, cfg, device) -> None:
        """Recompute the non-persistent buffers (not in a checkpoint) of a model built on meta and then
        materialised with to_empty. Default: it has none."""

    def loss(self, model, inputs, targets, loss_kind: str, on_phase):
        raise NotImplementedError


def resolved_loss(family: Family, spec) -> str:
    loss = getattr(spec, "loss", "default")
    return family.default_loss if loss == "default" else loss


class HFCausalLM(Family):
    """A decoder from transformers built with AutoModelForCausalLM.from_config (never downloaded)."""

    model_type: ClassVar[str]  # transformers' config class to build (AutoConfig.for_model)

    def hf_kwargs(self, cfg) -> dict:
        """The config as transformers' config class takes it (a deep copy: transformers edits the
        rope dicts it is given in place)."""
        data = copy.deepcopy(self.to_dict(cfg))
        data.pop("arch")
        data.pop("attention", None)
        return data

    def build(self, cfg, device, dtype: str):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # from_config's notices are not the user's business here
        hf_cfg = AutoConfig.for_model(self.model_type, **self.hf_kwargs(cfg))
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=cfg.attention, dtype=torch_dtype)
        return model

    def restore_buffers(self, model, cfg, device) -> None:
        """RoPE's inv_freq and original_inv_freq: the rotary module is rebuilt on the device from the
        model's own config (its __init__ computes them) and its buffers taken over."""
        import torch

        rotary = model.model.rotary_emb
        with torch.device(device):
            fresh = type(rotary)(config=model.config)
        for name, buf in fresh.named_buffers(recurse=False):
            setattr(rotary, name, buf)

    def enable_checkpointing(self, model) -> None:
        # transformers 5.23: gradient_checkpointing_enable is a deprecated alias of this method (same effect).
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    def loss(self, model, inputs, targets, loss_kind: str, on_phase):
        """labels: as transformers' users train (ForCausalLMLoss: fp32 logits, shifted labels);
        cross-entropy: the book's loss over the returned logits (the output object dies at once)."""
        import torch.nn.functional as F

        from ..losses import is_fused

        if is_fused(loss_kind):  # as a user plugs a fused loss in: the base model's last hidden state and
            # the head weight (planner/models/losses.py); the head's own forward never runs
            from ..models.losses import fused_loss

            # (a peft model: its wrapped causal LM, whose linears carry the adapters; peft's get_base_model)
            lm = model.get_base_model() if hasattr(model, "get_base_model") else model
            hidden = getattr(lm, lm.base_model_prefix)(input_ids=inputs).last_hidden_state
            on_phase("loss")
            return fused_loss(hidden, lm.get_output_embeddings().weight, targets, loss_kind,
                              getattr(lm.config, "final_logit_softcapping", None))
        if loss_kind == "labels":
            # The loss runs inside the model's forward: the output head's forward hook marks where it starts.
            # DDP wraps the model (`.module`); FSDP2 changes the model's class in place.
            head = getattr(model, "module", model).get_output_embeddings()
            hook = head.register_forward_hook(lambda *_: on_phase("loss"))
            try:
                return model(input_ids=inputs, labels=targets).loss
            finally:
                hook.remove()
        logits = model(input_ids=inputs).logits
        on_phase("loss")
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

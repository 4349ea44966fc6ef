"""Record the simulated event lists the allocator replay is checked with (tests/test_allocator_h200.py) for every
H200 row with max_memory_reserved: the realistic rows (realistic.jsonl.gz) and the largest-batch runs
(fit-largest-batch.json: llama-3.2-1b s2048 bf16 at b20 and b21).

No GPU here: the step is simulated on the CPU (fake tensors) as the CUDA run would allocate it: the optimizer as
torch picks it on CUDA (foreach: optimizer.py _default_to_fused_or_foreach), CUDA autocast's fp32 list emulated for
AMP rows (tests/cuda_amp_emulation.py, itself checked to the byte against the H200's live tensors). The whole run is
logged (planner.measure.alloc_run.simulate_run: the build, step 1, step 2). Each line: {"label", "ops": [op names],
"run": [["a", uid, nbytes, op index, phase, ndim] | ["f", uid] | ["p", phase] | ["m", "step K"]]}.

    PYTHONPATH=. python tests/record_alloc_events.py [LABEL-SUBSTRING ...]   (minutes: every row is simulated)
"""
from __future__ import annotations

import contextlib
import gzip
import json
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "cuda" / "2026-11-27-h200"
OUT = DATA / "alloc-events.jsonl.gz"


def rows() -> list[tuple[str, dict, dict]]:
    """(label, config, spec) of every recorded row with max_memory_reserved."""
    out = []
    with gzip.open(DATA / "realistic.jsonl.gz", "rt") as fh:
        real = [json.loads(line) for line in fh]
    out += [(r["label"], r["config"], r["spec"]) for r in real if "peak_reserved_bytes" in r.get("measured", {})]
    base = next(r for r in real if r["label"] == "llama-3.2-1b sdpa b2 s2048 bf16 adamw")
    for run in json.loads((DATA / "fit-largest-batch.json").read_text()):
        if isinstance(run["batch"], int):  # the expandable_segments run is the b21 spec replayed with that option
            out.append((largest_label(run["batch"]), base["config"], {**base["spec"], "batch_size": run["batch"]}))
    return out


def largest_label(batch: int) -> str:
    return f"llama-3.2-1b sdpa b{batch} s2048 bf16 adamw (fit-largest-batch)"


def encode(label: str, run: list) -> dict:
    ops = sorted({e[3] for e in run if e[0] == "a"})
    index = {op: i for i, op in enumerate(ops)}
    enc = [["a", e[1], e[2], index[e[3]], e[4], e[5]] if e[0] == "a" else list(e) for e in run]
    return {"label": label, "ops": ops, "run": enc}


def decode(rec: dict) -> list:
    ops = rec["ops"]
    return [("a", e[1], e[2], ops[e[3]], e[4], e[5]) if e[0] == "a" else tuple(e) for e in rec["run"]]


def math_sdpa_on_cuda(config: dict, run) -> bool:
    """CUDA runs SDPA's math kernel for fp32 with grouped-query heads (transformers passes enable_gqa; measured on the
    H200: tests/data/cuda/2026-11-27-h200/notes.md, planner/arch/parts.py sdpa_math); the CPU would pick its flash
    kernel, so the recording asks for the math kernel there too."""
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    return (config.get("attention") == "sdpa" and run.precision == "fp32" and heads is not None and kv is not None
            and kv < heads)


def record(label: str, config: dict, spec: dict) -> dict:
    from planner.config import config_from_dict
    from planner.measure.alloc_run import simulate_run
    from planner.spec import TrainSpec

    run = TrainSpec(**{**spec, "device": "cpu", "optimizer_impl": "foreach"})
    ctx = contextlib.ExitStack()
    if run.precision.endswith("-amp"):
        from tests.cuda_amp_emulation import cuda_autocast_lists

        ctx.enter_context(cuda_autocast_lists())
    if math_sdpa_on_cuda(config, run):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx.enter_context(sdpa_kernel(SDPBackend.MATH))
    with ctx:
        events = simulate_run(config_from_dict(config), run)
    return encode(label, events)


def main(only: list[str]) -> None:
    done = {}
    if OUT.exists():
        with gzip.open(OUT, "rt") as fh:
            done = {json.loads(line)["label"]: line for line in fh}
    for label, config, spec in rows():
        if only and not any(o in label for o in only):
            continue
        done[label] = json.dumps(record(label, config, spec), separators=(",", ":")) + "\n"
        print(label, file=sys.stderr)
    with gzip.open(OUT, "wt") as fh:
        fh.writelines(done[k] for k in sorted(done))


if __name__ == "__main__":
    main(sys.argv[1:])

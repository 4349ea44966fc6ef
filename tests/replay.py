"""A stand-in for planner.jobs.Job that replays a child's recorded JSON lines, for page logic tests that
need no real child. Recordings live in tests/data/recorded/ (each file's command is in RECORDED below).
"""
import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "recorded"
# How each recording was made (config: the tiny GPT-2 of tests/test_app.py's TINY):
RECORDED = {
    "measure_train_tiny.jsonl": "python -m planner measure train --config tiny.json --batch-size 2 --seq-len 32 "
                                "--device cpu --json --progress",
    "measure_load_all_tiny_fp16.jsonl": "python -m planner measure load --config tiny.json --method all --device cpu "
                                        "--dtype float16 --json --progress",
    "simulate_train_tiny.jsonl": "python -m planner simulate train --config tiny.json --batch-size 2 --seq-len 32 "
                                 "--device cpu --json --progress",
    # the written files' absolute paths were replaced by their names (tests point them at files of their own)
    "simulate_train_tiny_export.jsonl": "python -m planner simulate train --config tiny.json --batch-size 2 --seq-len 32 "
                                        "--device cpu --json --progress --memory-snapshot step.pickle --trace step.json",
    "measure_train_tiny_accum4.jsonl": "python -m planner measure train --config tiny.json --batch-size 2 --seq-len 64 "
                                       "--grad-accum 4 --device cpu --json --progress",
    "measure_load_all_tiny_fp32.jsonl": "python -m planner measure load --config tiny.json --method all --device cpu "
                                        "--dtype float32 --json --progress",
    # tiny_llama.json: TINY_LLAMA of tests/test_app_finetune.py
    "measure_train_tiny_llama_lora4.jsonl": "python -m planner measure train --config tiny_llama.json --batch-size 2 "
                                            "--seq-len 32 --device cpu --lora-r 4 --lora-targets "
                                            "q_proj,k_proj,v_proj,o_proj --json --progress",
    # llama-3.2-1b.json: planner.config.config_to_dict(PRESETS["llama-3.2-1b"]), the config the page passes
    "simulate_infer_llama32_1b.jsonl": "python -m planner simulate infer --batch-size 1 --prompt-len 64 --new-tokens 4 "
                                       "--precision bf16 --cache dynamic --device cpu --attention sdpa --json --progress "
                                       "--config llama-3.2-1b.json",
    "simulate_infer_llama32_1b_nf4.jsonl": "python -m planner simulate infer --batch-size 1 --prompt-len 32 "
                                           "--new-tokens 2 --precision bf16 --cache dynamic --device cpu "
                                           "--quantize-weights nf4 --attention sdpa --json --progress "
                                           "--config llama-3.2-1b.json",
    # fit files the children write (olmo2.json: config_to_dict of tests/data/configs/olmo2-tiny.json, the config
    # the page passes; tiny_lm.py: TINY_LM of tests/test_app_module.py)
    "fit_olmo2_tiny_b4_s512.json": "python -m planner estimate train --batch-size 4 --seq-len 512 --precision fp32 "
                                   "--optimizer adamw --grad-accum 1 --optimizer-impl default --device cpu --loss "
                                   "default --attention sdpa --json --progress --config olmo2.json "
                                   "(the file it keeps in the data folder's fitted/)",
    "whatif_tiny_lm_fp32.json": "python -m planner simulate whatif --module tiny_lm.py:make_model --batch-size 2 "
                                "--precision fp32 --optimizer adamw --optimizer-impl default --grad-accum 1 --json "
                                "--progress --seq-len 16 --out whatif_tiny_lm_fp32.json",
    "measure_train_tiny_fsdp2.jsonl": "python -m planner measure train --config tiny.json --batch-size 2 --seq-len 32 "
                                      "--device cpu --world-size 2 --parallel fsdp --json --progress",
}


def recorded(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


class ReplayJob:
    """Running (showing the last of `events`' progress lines) until cancel(), or ended with `final`
    (done | failed | timeout | cancelled), its result the last non-progress line, as Job reports them."""

    def __init__(self, events: list[dict], final: str | None = None, stderr: str = ""):
        self.events, self.final, self._stderr = events, final, stderr

    def state(self) -> str:
        return self.final or "running"

    def progress(self) -> tuple[float, str]:
        prog = [e for e in self.events if e.get("event") == "progress"]
        return (prog[-1]["fraction"], prog[-1]["stage"]) if prog else (0.0, "starting (importing torch)")

    def cancel(self) -> None:
        if not self.final:
            self.final = "cancelled"

    def result(self) -> dict | None:
        out = [e for e in self.events if e.get("event") != "progress"]
        return out[-1] if out else None

    def stderr(self) -> str:
        return self._stderr

"""The GPU catalog (issue #35; no torch): memory and the published peak rates a roofline divides by.

One row per GPU, named in lower case with dashes (`h200`, `rtx-4090`, ...), each with its source: the vendor's
datasheet or whitepaper. Rates are the dense peaks (a datasheet's "with sparsity" figures, 2:4 structured
sparsity, are twice these and are not used): FP32 the non-tensor (CUDA core) rate, which is what a PyTorch fp32
matmul gets by default (torch.backends.cuda.matmul.allow_tf32 is False); BF16 / FP16 the tensor-core rate with
FP32 accumulate (what cuBLAS uses for PyTorch's half-precision matmuls; GeForce parts publish a rate twice as high
with FP16 accumulate, which is not used here). `None`: the GPU has no such tensor path (the T4, Turing, has no
BF16 tensor cores; a BF16 matmul there runs at no more than its FP32 rate: roofline.peak_flops falls back).

Memory: a datasheet's "GB" of GPU memory is the binary unit (GDDR / HBM parts come in 2^30-byte multiples: an
RTX 4090's 24 GB are 24 GiB, 25,757,220,864 B, as nvidia-smi and torch.cuda.mem_get_info report them), so
memory_bytes = GB x 2^30, except the H200's, whose "141 GB" is neither unit: its total is the one this project
measured, torch.cuda.mem_get_info's 150,109,880,320 B = 139.8 GiB (tests/data/cuda/2026-11-27-h200/probe.json).
What a process can allocate is less than the total (the CUDA context, the allocator's reserve): the plan search
subtracts those.
Bandwidths are in bytes per second, decimal (a datasheet's TB/s = 1e12 B/s). pcie_bytes_per_s is one direction
(a host-to-device copy): half the bidirectional figure a datasheet quotes (PCIe Gen3 / Gen4 / Gen5 x16: 32 / 64 /
128 GB/s both ways). nvlink_bytes_per_s is the datasheet's total per GPU, both directions (0: none).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .validation import ConfigError

GIB = 2 ** 30
TERA = 10 ** 12
GIGA = 10 ** 9


@dataclass(frozen=True)
class GPU:
    name: str
    label: str
    memory_bytes: int
    fp32_flops: float            # dense, non-tensor FP32 (FLOP/s)
    bf16_flops: float | None     # dense tensor-core BF16, FP32 accumulate (FLOP/s); None: no BF16 tensor path
    fp16_flops: float            # dense tensor-core FP16, FP32 accumulate (FLOP/s)
    hbm_bytes_per_s: float       # device memory bandwidth (HBM or GDDR)
    pcie_bytes_per_s: float      # host link, one direction
    nvlink_bytes_per_s: float    # GPU-to-GPU NVLink, total both directions per GPU (0: none)
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


_H100_DATASHEET = ("NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100, "
                   "resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet)")
_GA102_WHITEPAPER = ("NVIDIA Ampere GA102 GPU architecture whitepaper v2 (nvidia.com/content/PDF/"
                     "nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf), appendix tables")

GPUS: dict[str, GPU] = {g.name: g for g in (
    # H200 SXM: 141 GB HBM3e, 4.8 TB/s; FP32 67 TFLOPS; BF16 / FP16 Tensor Core 1,979 TFLOPS with sparsity
    # (989.5 dense); NVLink 900 GB/s; PCIe Gen5 128 GB/s
    GPU("h200", "NVIDIA H200 SXM 141 GB", 150_109_880_320, 67 * TERA, 989.5 * TERA, 989.5 * TERA, 4.8 * TERA,
        64 * GIGA, 900 * GIGA,
        "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200, specifications: H200 SXM)"),
    # H100 SXM: 80 GB HBM3, 3.35 TB/s; FP32 67; BF16 / FP16 1,979 with sparsity (989.5 dense); NVLink 900 GB/s;
    # PCIe Gen5 128 GB/s
    GPU("h100-sxm", "NVIDIA H100 SXM 80 GB", 80 * GIB, 67 * TERA, 989.5 * TERA, 989.5 * TERA, 3.35 * TERA,
        64 * GIGA, 900 * GIGA, _H100_DATASHEET + ", H100 SXM column"),
    # H100 PCIe: 80 GB HBM2e, 2 TB/s; FP32 51; BF16 / FP16 1,513 with sparsity (756.5 dense); NVLink bridge 600
    # GB/s; PCIe Gen5 128 GB/s
    GPU("h100-pcie", "NVIDIA H100 PCIe 80 GB", 80 * GIB, 51 * TERA, 756.5 * TERA, 756.5 * TERA, 2.0 * TERA,
        64 * GIGA, 600 * GIGA, _H100_DATASHEET + ", H100 PCIe column"),
    # A100 40 GB SXM: HBM2 1,555 GB/s; FP32 19.5; BF16 / FP16 312 dense (624 sparse); NVLink 600 GB/s; PCIe Gen4
    # 64 GB/s
    GPU("a100-40gb", "NVIDIA A100 SXM 40 GB", 40 * GIB, 19.5 * TERA, 312 * TERA, 312 * TERA, 1555 * GIGA,
        32 * GIGA, 600 * GIGA,
        "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 40GB SXM column"),
    # A100 80 GB SXM: HBM2e 2,039 GB/s (the PCIe card: 1,935 GB/s); rates as the 40 GB part
    GPU("a100-80gb", "NVIDIA A100 SXM 80 GB", 80 * GIB, 19.5 * TERA, 312 * TERA, 312 * TERA, 2039 * GIGA,
        32 * GIGA, 600 * GIGA,
        "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 80GB SXM column"),
    # L40S: 48 GB GDDR6, 864 GB/s; FP32 91.6; BF16 / FP16 Tensor 733 with sparsity (362.05 dense); PCIe Gen4 x16
    # 64 GB/s bidirectional; no NVLink
    GPU("l40s", "NVIDIA L40S 48 GB", 48 * GIB, 91.6 * TERA, 362.05 * TERA, 362.05 * TERA, 864 * GIGA,
        32 * GIGA, 0,
        "NVIDIA L40S GPU datasheet (resources.nvidia.com/en-us-l40s/l40s-datasheet-28413)"),
    # RTX A6000: 48 GB GDDR6, 768 GB/s; FP32 38.7; BF16 / FP16 Tensor with FP32 accumulate 154.8 dense (309.7
    # sparse); NVLink bridge 112.5 GB/s; PCIe Gen4 64 GB/s
    GPU("a6000", "NVIDIA RTX A6000 48 GB", 48 * GIB, 38.7 * TERA, 154.8 * TERA, 154.8 * TERA, 768 * GIGA,
        32 * GIGA, 112.5 * GIGA,
        "NVIDIA RTX A6000 datasheet (nvidia.com/content/dam/en-zz/Solutions/design-visualization/"
        "quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web.pdf); "
        "tensor rates: " + _GA102_WHITEPAPER),
    # RTX 4090: 24 GB GDDR6X, 1,008 GB/s; FP32 82.6; FP16 / BF16 Tensor with FP32 accumulate 165.2 dense (330.3
    # sparse; 330.3 dense with FP16 accumulate); PCIe Gen4 64 GB/s; no NVLink
    GPU("rtx-4090", "NVIDIA GeForce RTX 4090 24 GB", 24 * GIB, 82.6 * TERA, 165.2 * TERA, 165.2 * TERA,
        1008 * GIGA, 32 * GIGA, 0,
        "NVIDIA Ada GPU architecture whitepaper v2.1 (images.nvidia.com/aem-dam/Solutions/geforce/ada/"
        "nvidia-ada-gpu-architecture.pdf), Table 2: GeForce RTX 4090"),
    # RTX 3090: 24 GB GDDR6X, 936 GB/s; FP32 35.6; FP16 / BF16 Tensor with FP32 accumulate 71 dense (142 sparse);
    # NVLink bridge 112.5 GB/s; PCIe Gen4 64 GB/s
    GPU("rtx-3090", "NVIDIA GeForce RTX 3090 24 GB", 24 * GIB, 35.6 * TERA, 71 * TERA, 71 * TERA, 936 * GIGA,
        32 * GIGA, 112.5 * GIGA, _GA102_WHITEPAPER + ", GeForce RTX 3090"),
    # L4: 24 GB GDDR6, 300 GB/s; FP32 30.3; BF16 / FP16 Tensor 242 with sparsity (121 dense); PCIe Gen4 x16 64
    # GB/s; no NVLink
    GPU("l4", "NVIDIA L4 24 GB", 24 * GIB, 30.3 * TERA, 121 * TERA, 121 * TERA, 300 * GIGA, 32 * GIGA, 0,
        "NVIDIA L4 Tensor Core GPU datasheet (resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet)"),
    # A10G (AWS G5): 24 GB GDDR6, 600 GB/s; FP32 31.2; FP16 / BF16 Tensor 70 dense; PCIe Gen4 64 GB/s. NVIDIA
    # publishes no datasheet for this AWS-only part (the A10's, 125 dense, is another chip configuration): the
    # rates are those AWS quotes, as gathered in Baseten's A10 vs A10G comparison
    GPU("a10g", "NVIDIA A10G 24 GB (AWS G5)", 24 * GIB, 31.2 * TERA, 70 * TERA, 70 * TERA, 600 * GIGA,
        32 * GIGA, 0,
        "AWS EC2 G5 instance page (aws.amazon.com/ec2/instance-types/g5: A10G, 24 GB); rates: Baseten, 'NVIDIA A10 "
        "vs A10G for ML model inference' (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference), spec table"),
    # T4: 16 GB GDDR6, 320 GB/s; FP32 8.1; FP16 mixed-precision Tensor 65; no BF16 tensor cores (Turing); PCIe
    # Gen3 x16 32 GB/s
    GPU("t4", "NVIDIA T4 16 GB", 16 * GIB, 8.1 * TERA, None, 65 * TERA, 320 * GIGA, 16 * GIGA, 0,
        "NVIDIA T4 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
        "t4-tensor-core-datasheet-951643.pdf)"),
)}


def gpu(name: str) -> GPU:
    """The catalog's row for a name (case-insensitive; `--gpu NAME`); ConfigError listing the known names."""
    key = str(name).strip().lower()
    if key not in GPUS:
        raise ConfigError(f"unknown GPU {name!r}; choose one of: {', '.join(GPUS)}")
    return GPUS[key]


def peak_flops(g: GPU, dtype: str) -> float:
    """The dense peak for matmuls in `dtype` (float32, bfloat16, float16): BF16 on a GPU without BF16 tensor cores
    runs no faster than its FP32 rate (cuBLAS has no BF16 tensor path on Turing)."""
    if dtype == "float32":
        return g.fp32_flops
    if dtype == "bfloat16":
        return g.bf16_flops if g.bf16_flops is not None else g.fp32_flops
    if dtype == "float16":
        return g.fp16_flops
    raise ConfigError(f"no peak rate for dtype {dtype!r}")

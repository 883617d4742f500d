"""`make demo`: a small random DeepSeek-V3-architecture model generated through mlakit, checked
token for token against transformers' greedy generation of the same prompts."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console

from mlakit.config import ServingConfig
from mlakit.model.generate import build_runner
from mlakit.model.runner import Request

DEMO_DIR = Path(".cache") / "mlakit-demo-deepseek-v3"
DEMO_SEED = 0
DEMO_PROMPTS = ([11, 402, 7, 99, 250], list(range(30, 71)), [5], [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311])
DEMO_NEW_TOKENS = 16
CACHE_BUDGET_BYTES = 64 << 20


def demo_hf_config() -> dict:
    """The demo model: 4 layers, 16 heads, DeepSeek-V3 latent widths, MoE from layer 1."""
    return dict(
        vocab_size=512, hidden_size=256, intermediate_size=384, moe_intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=16, q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=32,
        qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, num_mtp_layers=0, max_position_embeddings=1024,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
    )


def ensure_demo_checkpoint(directory: Path = DEMO_DIR) -> None:
    """Creates the seeded random checkpoint (safetensors) once."""
    if (directory / "config.json").is_file():
        return
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(DEMO_SEED)
    hf = DeepseekV3ForCausalLM(DeepseekV3Config(**demo_hf_config(), dtype=torch.float32))
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
        for layer in hf.model.layers[1:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(0.1 * torch.randn_like(bias))
    hf.save_pretrained(directory)


def transformers_greedy(directory: Path, prompts: tuple[list[int], ...], max_new_tokens: int) -> list[list[int]]:
    """transformers' own greedy generation (float32, CPU) of each prompt, the reference."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return [
            hf.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]


def run_model_demo(device: str, console: Console) -> int:
    """Returns the exit code: 0 when every generated token matches transformers."""
    ensure_demo_checkpoint()
    config = ServingConfig(device=device, max_batch_size=len(DEMO_PROMPTS), max_context_len=256)
    runner = build_runner(DEMO_DIR, config, CACHE_BUDGET_BYTES, console, mixed_steps=True)
    requests = [Request(list(p), DEMO_NEW_TOKENS, arrival_step=2 * i) for i, p in enumerate(DEMO_PROMPTS)]
    began = time.perf_counter()
    outputs = runner.generate(requests)
    seconds = time.perf_counter() - began
    stats = runner.stats
    console.print(
        f"generated {sum(map(len, outputs))} tokens for {len(requests)} prompts (lengths {[len(p) for p in DEMO_PROMPTS]}, "
        f"joining the running decodes at steps 0/2/4/6) in {seconds:.2f} s: {stats.prefill_steps} steps with a prefill "
        f"(mixed with decodes) and {stats.decode_steps} decode steps, "
        f"{stats.decode_tokens / max(stats.decode_seconds, 1e-9):.0f} decode tokens/s"
    )
    matched = total = 0
    for prompt, ours, reference in zip(DEMO_PROMPTS, outputs, transformers_greedy(DEMO_DIR, DEMO_PROMPTS, DEMO_NEW_TOKENS)):
        total += len(reference)
        matched += sum(a == b for a, b in zip(ours, reference))
        if ours != reference:
            console.print(f"  prompt of {len(prompt)} tokens: mlakit {ours} vs transformers {reference}")
    console.print(f"verdict: {matched}/{total} tokens identical to transformers")
    return 0 if matched == total and len(outputs) == len(DEMO_PROMPTS) else 1

"""`mlakit bench generation`: a larger random DeepSeek-V3 model generated through mlakit on a GPU,
compared token for token with transformers (float32, teacher-forced), with decode tokens/s."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mlakit.cache import PagedLatentCache
from mlakit.demo.verdict import gap_bound, teacher_forced_verdict
from mlakit.model.loader import load_model
from mlakit.model.runner import Request, Runner


def large_model_config(layers: int, heads: int) -> dict:
    """DeepSeek-V3 latent dims (512 + 64, nope 128, v 128), a small hidden size, MoE after layer 0."""
    return dict(
        vocab_size=2048, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=384, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, num_mtp_layers=0, max_position_embeddings=4096,
    )


def run_generation_check(
    layers: int, heads: int, new_tokens: int, prompt_lengths: list[int], model_dtype: torch.dtype, backend: str,
    log: Callable[[str], None],
) -> dict:
    """Generates greedily with mlakit (bf16 cache, `backend` decode) and with transformers (fp32)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    device = torch.device("cuda")
    torch.manual_seed(0)
    hf = DeepseekV3ForCausalLM(DeepseekV3Config(**large_model_config(layers, heads), dtype=torch.float32))
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.02) if param.dim() > 1 else param.copy_(1 + 0.1 * torch.randn_like(param))
    prompts = [torch.randint(0, 2048, (n,)).tolist() for n in prompt_lengths]
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        model = load_model(Path(directory), dtype=model_dtype, device=device)
    hf = hf.to(device).eval()
    cache = PagedLatentCache(2048, 64, 512, 64, dtype="bf16", device=device, num_layers=layers)
    runner = Runner(model, cache, decode_backend=backend)
    began = time.perf_counter()
    ours = runner.generate([Request(p, new_tokens) for p in prompts])
    seconds = time.perf_counter() - began
    verdict = teacher_forced_verdict(hf, prompts, ours, gap_bound("bf16"))
    rows = []
    for index, (prompt, output) in enumerate(zip(prompts, ours)):
        flips = [d for d in verdict.divergences if d.prompt == index]
        rows.append({"prompt_len": len(prompt), "new_tokens": len(output), "matched": len(output) - len(flips),
                     "divergences": [dataclasses.asdict(d) for d in flips]})
        log(json.dumps(rows[-1]))
    stats = runner.stats
    result = {
        "layers": layers, "heads": heads, "model_dtype": str(model_dtype), "backend": backend, "new_tokens": new_tokens,
        "prompts": rows, "verdict": {"passed": verdict.passed, "largest_gap": verdict.largest_gap, "bound": verdict.bound},
        "seconds": seconds,
        "decode_tokens_per_s": stats.decode_tokens / max(stats.decode_seconds, 1e-9),
        "device": torch.cuda.get_device_name(device),
    }
    log(f"decode {result['decode_tokens_per_s']:.0f} tokens/s ({stats.decode_steps} steps); {verdict.summary()}")
    return result

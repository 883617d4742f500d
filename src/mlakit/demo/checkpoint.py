"""The demo's seeded random DeepSeek-V3-architecture checkpoint, written once with transformers."""

from __future__ import annotations

from pathlib import Path

import torch

DEMO_DIR = Path(".cache") / "mlakit-demo-deepseek-v3"
DEMO_SEED = 0


def demo_hf_config() -> dict:
    """The demo model: 4 layers, 16 heads, DeepSeek-V3 latent widths, MoE from layer 1.

    >>> demo_hf_config()["kv_lora_rank"], demo_hf_config()["num_attention_heads"]
    (512, 16)
    """
    return dict(
        vocab_size=512, hidden_size=256, intermediate_size=384, moe_intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=16, q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=32,
        qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, num_mtp_layers=0, max_position_embeddings=1024,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
    )


def ensure_demo_checkpoint(directory: Path = DEMO_DIR) -> Path:
    """Creates the seeded random checkpoint (safetensors) in `directory` once; returns `directory`."""
    if (directory / "config.json").is_file():
        return directory
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
    return directory

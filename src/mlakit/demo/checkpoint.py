"""The demo's seeded random DeepSeek-V3-architecture checkpoint, written once with transformers and
checked against its stamp on every reuse."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

DEMO_DIR = Path(".cache") / "mlakit-demo-deepseek-v3"
DEMO_SEED = 0
STAMP_NAME = "mlakit-demo-stamp.json"


def demo_hf_config() -> dict:
    """The demo model: 4 layers, 16 heads, DeepSeek-V3 latent widths, MoE from layer 1.

    >>> demo_hf_config()["kv_lora_rank"], demo_hf_config()["num_attention_heads"]
    (512, 16)
    """
    return dict(
        vocab_size=512, hidden_size=256, intermediate_size=384, moe_intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=16, q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, num_mtp_layers=0, max_position_embeddings=1024,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
    )


def ensure_demo_checkpoint(directory: Path = DEMO_DIR, say: Callable[[str], None] = print) -> Path:
    """Creates the seeded random checkpoint (safetensors) in `directory` once; returns `directory`.

    A stamp written after the save (`STAMP_NAME`: the demo config and each file's size and
    SHA-256) is checked on reuse; a checkpoint that fails it (a truncated or edited file, a
    missing stamp, an older demo config) is rebuilt, and `say` gets one line saying why.
    """
    problem = _stamp_problem(directory)
    if problem is None:
        return directory
    if (directory / "config.json").exists():
        say(f"demo checkpoint {directory} is damaged ({problem}); rebuilding it")
        for stale in [*directory.glob("*.safetensors"), *directory.glob("*.json")]:
            stale.unlink()
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
    (directory / STAMP_NAME).write_text(json.dumps(_stamp(directory), indent=1))
    return directory


def _stamp(directory: Path) -> dict:
    """The demo config and every checkpoint file's size and SHA-256."""
    files = sorted(path for path in directory.iterdir() if path.is_file() and path.name != STAMP_NAME)
    return {
        "config": demo_hf_config(),
        "files": {path.name: [path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()] for path in files},
    }


def _stamp_problem(directory: Path) -> str | None:
    """Why the checkpoint in `directory` cannot be reused, or None when its stamp matches it."""
    stamp_path = directory / STAMP_NAME
    if not stamp_path.is_file():
        return f"no {STAMP_NAME}" if directory.exists() else "not built yet"
    try:
        stamp = json.loads(stamp_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{STAMP_NAME} is not valid JSON"
    actual = _stamp(directory)
    if stamp.get("config") != actual["config"]:
        return "built from another demo config"
    for name, size_and_hash in (stamp.get("files") or {}).items():
        if actual["files"].get(name) != size_and_hash:
            got = actual["files"].get(name)
            return f"{name}: expected {size_and_hash[0]} bytes with the stamped SHA-256, got {'no file' if got is None else f'{got[0]} bytes'}"
    if set(actual["files"]) != set(stamp.get("files") or {}):
        return f"files {sorted(set(actual['files']) ^ set(stamp.get('files') or {}))} differ from the stamp"
    return None

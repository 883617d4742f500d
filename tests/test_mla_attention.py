"""MLAAttention against transformers' DeepseekV3/V2 attention on random inputs (float32)."""

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

from mlakit import PagedLatentCache
from mlakit.model.mla_attention import MLAAttention, MLALayerConfig
from mlakit.serving.step import AttentionStep
from paged_inputs import relative_error

YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
        "mscale": 0.9, "mscale_all_dim": 0.7, "rope_theta": 10000.0}


def hf_layer(arch: str, heads: int, q_lora_rank, rope_parameters=None, rope_interleave=True):
    common = dict(
        hidden_size=60, num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=q_lora_rank,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    if rope_parameters is not None:
        common["rope_parameters"] = rope_parameters
    if arch == "v3":
        config = DeepseekV3Config(**common, rope_interleave=rope_interleave)
        layer, rotary = DeepseekV3Attention(config, 0), DeepseekV3RotaryEmbedding(config)
    else:
        config = DeepseekV2Config(**common)
        layer, rotary = DeepseekV2Attention(config, 0), DeepseekV2RotaryEmbedding(config)
    gen = torch.Generator().manual_seed(heads)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3 + (1.0 if param.dim() == 1 else 0.0))
    return config, layer.eval(), rotary


def hf_forward(layer, rotary, x):
    positions = torch.arange(x.shape[0])[None]
    with torch.no_grad():
        out, _ = layer(x[None], position_embeddings=rotary(x[None], positions), attention_mask=None)
    return out[0]


def ours(config):
    layer = MLAAttention(MLALayerConfig.from_hf_config(config.to_dict()))
    return layer


CONFIGS = [
    ("v3", 5, 24, None, True),
    ("v3", 4, None, YARN, True),
    ("v3", 3, 24, YARN, False),
    ("v2", 5, None, None, True),
    ("v2", 2, 24, YARN, True),
]


@pytest.mark.parametrize("arch, heads, q_lora_rank, rope, interleave", CONFIGS)
@pytest.mark.parametrize("prefill_form", ["mha", "latent"])
def test_prefill_then_decode_matches_transformers(arch, heads, q_lora_rank, rope, interleave, prefill_form):
    config, hf, rotary = hf_layer(arch, heads, q_lora_rank, rope, interleave)
    layer = ours(config)
    layer.load_state_dict(hf.state_dict())
    total, prompt = 23, 19
    x = torch.randn(total, config.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_forward(hf, rotary, x)

    cache = PagedLatentCache(16, 4, 32, 8, dtype="fp32")  # float32 storage keeps the comparison exact
    outputs = []
    steps = [(0, prompt)] + [(t, t + 1) for t in range(prompt, total)]
    for first, last in steps:
        slots = cache.reserve(0, last - first)
        step = AttentionStep((last - first,), (last,), cache.block_table([0]), slots, page_size=4, prefill_form=prefill_form)
        with torch.no_grad():
            outputs.append(layer(x[first:last], torch.arange(first, last), step, cache.layer(0)))
    got = torch.cat(outputs)
    assert relative_error(got, expected) < 1e-5


def test_latent_and_mha_forms_agree_on_a_ragged_extend_batch():
    config, hf, _ = hf_layer("v3", 5, 24, YARN)
    layer = ours(config)
    layer.load_state_dict(hf.state_dict())
    cache = PagedLatentCache(32, 4, 32, 8, dtype="fp32")
    gen = torch.Generator().manual_seed(3)
    prefix = {0: 9, 1: 0, 2: 30}
    for seq_id, n in prefix.items():
        if n:
            slots = cache.reserve(seq_id, n)
            cache.write_slots(slots, torch.randn(n, 40, generator=gen))
    new = (4, 7, 1)
    slots = torch.cat([cache.reserve(seq_id, n) for seq_id, n in zip(prefix, new)])
    lens = tuple(prefix[s] + n for s, n in zip(prefix, new))
    table = cache.block_table([0, 1, 2])

    def step(form: str, chunk: int = 8192) -> AttentionStep:
        return AttentionStep(new, lens, table, slots, page_size=4, prefill_form=form, prefix_chunk_tokens=chunk)

    x = torch.randn(sum(new), config.hidden_size, generator=gen)
    positions = torch.cat([torch.arange(prefix[s], prefix[s] + n) for s, n in zip(prefix, new)])
    with torch.no_grad():
        latent = layer(x, positions, step("latent"), cache.layer(0))
        mha = layer(x, positions, step("mha", chunk=8), cache.layer(0))
        mha_one_chunk = layer(x, positions, step("mha", chunk=1024), cache.layer(0))
    assert relative_error(mha, latent) < 1e-5
    assert relative_error(mha_one_chunk, latent) < 1e-5

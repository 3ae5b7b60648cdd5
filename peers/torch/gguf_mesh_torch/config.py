"""Hyper-parameters of a llama, qwen2 or qwen3 model from its GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import MeshError

ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    rms_eps: float
    rope_neox: bool  # qwen2/qwen3 rotate halves; llama rotates adjacent pairs
    n_rot: int
    rope_base: float
    rope_freq_scale: float  # 1 / linear scaling factor


def config_from_metadata(md: dict, n_vocab_from_embd: int | None = None) -> ModelConfig:
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise MeshError("UNSUPPORTED_ARCHITECTURE", f"architecture '{arch}' is not one of {', '.join(ARCHITECTURES)}")
    if md.get(f"{arch}.expert_count"):
        raise MeshError("UNSUPPORTED_ARCHITECTURE", f"{arch} with experts (mixture of experts) is not supported")

    def need(key: str):
        v = md.get(f"{arch}.{key}")
        if v is None:
            raise MeshError("GGUF_MISSING_METADATA", f"metadata key '{arch}.{key}' is missing")
        return v

    n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    n_head_kv = int(md.get(f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(md.get(f"{arch}.attention.key_length", n_embd // n_head))
    scaling = md.get(f"{arch}.rope.scaling.type", "none")
    factor = float(md.get(f"{arch}.rope.scaling.factor", 0) or 0)
    if scaling not in ("none", "linear") and not (scaling == "yarn" and factor in (0.0, 1.0)):
        raise MeshError("UNSUPPORTED_ROPE_SCALING", f"RoPE scaling '{scaling}' is neither none nor linear")
    freq_scale = 1.0 / factor if scaling == "linear" and factor > 0 else 1.0
    tokens = md.get("tokenizer.ggml.tokens")
    n_vocab = md.get(f"{arch}.vocab_size") or n_vocab_from_embd or (len(tokens) if tokens else None)
    if not n_vocab:
        raise MeshError("GGUF_MISSING_METADATA", f"metadata key '{arch}.vocab_size' is missing and the vocabulary size is unknown")
    return ModelConfig(
        arch=arch,
        n_layer=int(need("block_count")),
        n_embd=n_embd,
        n_ff=int(need("feed_forward_length")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_vocab=int(n_vocab),
        rms_eps=float(md.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_neox=arch != "llama",
        n_rot=int(md.get(f"{arch}.rope.dimension_count", head_dim)),
        rope_base=float(md.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_freq_scale=freq_scale,
    )

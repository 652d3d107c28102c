"""Shapes of published MoE layers (DeepSeek-V3, Llama 4 Scout, Qwen3-30B-A3B), one block each, to estimate full size."""

from __future__ import annotations

from ..models import ModelConfig

# Shapes of published MoE layers, one block each, from their public configs. Attention is the toolkit's: DeepSeek-V3's
# MLA is multi-head attention of width D here; Llama 4 and Qwen3 have their grouped-query heads (Llama 4's weightless
# QK L2-norm is left out, Qwen3's RMSNorm QK norm is in). Sequence lengths are their pre-training lengths.
LAYER_SHAPES: dict[str, ModelConfig] = {
    "deepseek_v3_layer": ModelConfig(
        n_layers=1,
        dim=7168,
        n_heads=128,
        ffn_hidden=18432,
        vocab_size=129280,
        seq_len=4096,
        batch=1,
        dtype="bfloat16",
        n_experts=256,
        top_k=8,
        moe_hidden=2048,
        n_shared_experts=1,
        score_func="sigmoid",
        route_norm=True,
        route_scale=2.5,
        experts_impl="grouped_mm",
    ),
    "llama4_scout_layer": ModelConfig(
        n_layers=1,
        dim=5120,
        n_heads=40,
        n_kv_heads=8,
        ffn_hidden=16384,
        vocab_size=202048,
        seq_len=8192,
        batch=1,
        dtype="bfloat16",
        n_experts=16,
        top_k=1,
        moe_hidden=8192,
        n_shared_experts=1,
        score_func="sigmoid",
        experts_impl="grouped_mm",
    ),
    "qwen3_30b_a3b_layer": ModelConfig(
        n_layers=1,
        dim=2048,
        n_heads=32,
        n_kv_heads=4,
        attention_head_dim=128,
        qk_norm=True,
        ffn_hidden=6144,
        vocab_size=151936,
        seq_len=4096,
        batch=1,
        dtype="bfloat16",
        n_experts=128,
        top_k=8,
        moe_hidden=768,
        n_shared_experts=0,
        score_func="softmax",
        route_norm=True,
        experts_impl="grouped_mm",
    ),
}

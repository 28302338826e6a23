"""llm_math：参数量逐个参数等于公开的总数；MoE 激活参数；每 token FLOPs、KV 字节。"""
import pytest

from llm_math import (GPT_OSS_120B, GPT_OSS_20B, LLAMA31_405B, LLAMA31_70B, LLAMA31_8B, ModelConfig,
                      decode_step, expected_touched_experts, prefill_time)
from hw_specs import H100


@pytest.mark.parametrize("model,total", [(LLAMA31_8B, 8_030_261_248), (LLAMA31_70B, 70_553_706_496),
                                         (LLAMA31_405B, 405_853_388_800), (GPT_OSS_120B, 116_829_156_672)])
def test_parameter_totals_exact(model, total):
    assert model.params() == total


def test_gpt_oss_20b_total_and_active():
    assert round(GPT_OSS_20B.params() / 1e9, 2) == 20.91
    assert round(GPT_OSS_20B.active_params() / 1e9, 2) == 3.61


def test_gpt_oss_120b_active_matches_model_card():
    assert round(GPT_OSS_120B.active_params() / 1e9, 2) == 5.13


def test_matmul_params_dense():
    m = LLAMA31_8B
    per_layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert m.matmul_params() == 32 * per_layer + 128256 * 4096


def test_kv_bytes_per_token_llama70b():
    # 2 (K, V) × 80 层 × 8 个 KV 头 × 128 × 2 字节 = 327,680 字节
    assert LLAMA31_70B.kv_bytes_per_token() == 327_680
    assert LLAMA31_70B.kv_bytes(4096) == 4096 * 327_680


def test_sliding_window_caps_half_the_layers():
    m = GPT_OSS_120B
    assert m.kv_bytes(100) == 100 * m.kv_bytes_per_token()
    assert m.kv_bytes(10_000) == 2 * (18 * 128 + 18 * 10_000) * 8 * 64 * 2


def test_flops_per_token_counts_attention():
    m = LLAMA31_70B
    assert m.flops_per_token(0) == 2 * m.matmul_params()
    assert m.flops_per_token(1000) - m.flops_per_token(0) == 4 * 64 * 128 * 80 * 1000


def test_touched_experts_formula_limits():
    assert expected_touched_experts(128, 4, 0) == 0
    assert expected_touched_experts(128, 4, 1) == pytest.approx(4)
    assert expected_touched_experts(128, 4, 10_000) == pytest.approx(128)


def test_decode_step_is_memory_bound_at_batch_1():
    r = decode_step(LLAMA31_8B, H100, 1, 1000)
    assert r["bound"] == "memory"
    assert r["w_bytes"] == 2 * LLAMA31_8B.active_params()


def test_prefill_is_compute_bound():
    t = prefill_time(LLAMA31_8B, H100, 4096)
    assert t > 2 * LLAMA31_8B.matmul_params() * 4096 / H100.peak_flops("bf16") * 0.999


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="整数倍"):
        ModelConfig("x", 10, 8, 1, 6, 4, 2, 8)
    with pytest.raises(ValueError, match="不能为负"):
        LLAMA31_8B.kv_bytes(-1)
    with pytest.raises(ValueError, match="批大小"):
        decode_step(LLAMA31_8B, H100, 0, 10)

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
    """Llama-3.1-8B 在 H100 上 prefill 4096 个 token：受算力限制，时间正好是 FLOPs / 989.4 TFLOP/s。
    闭式只用 config.json 的整数：每层 q/o 4096², k/v 4096·1024，SwiGLU 3·4096·14336；lm_head 128256·4096 只算最后
    一个位置；因果注意力 4·头数·head_dim·层数·n(n+1)/2。以前只断言了一个下界（lm_head 算错也能过）。"""
    n, d, layers, vocab = 4096, 4096, 32, 128256
    body = layers * (2 * d * d + 2 * d * 1024 + 3 * d * 14336)
    flops = 2 * body * n + 2 * vocab * d + 4 * 32 * 128 * layers * n * (n + 1) // 2
    w_bytes = 2 * (body + vocab * d + (2 * layers + 1) * d)      # 读的权重：矩阵、lm_head、norm（不含查表的词嵌入）
    assert flops / 989.4e12 > w_bytes / 3.35e12                   # 受算力限制
    assert prefill_time(LLAMA31_8B, H100, n) == pytest.approx(flops / 989.4e12, rel=1e-12)


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="整数倍"):
        ModelConfig("x", 10, 8, 1, 6, 4, 2, 8)
    with pytest.raises(ValueError, match="不能为负"):
        LLAMA31_8B.kv_bytes(-1)
    with pytest.raises(ValueError, match="批大小"):
        decode_step(LLAMA31_8B, H100, 0, 10)


# ---------------------------------------------------------------------------
# 两套账互相核对：llm_math 的 roofline 公式（第 1、5 讲用）和 transformer_lab 的逐算子公式（第 2 讲用）
# ---------------------------------------------------------------------------
from llm_math import (GPT_OSS_120B as _OSS, active_weight_bytes, compute_bound_batch, critical_context,  # noqa: E402
                      max_batch, prefill_step, weight_bytes)
from hw_specs import gang  # noqa: E402
from ledger_lab import MATMUL_OPS, analytic_ops, sum_rows  # noqa: E402


@pytest.mark.parametrize("model", [LLAMA31_8B, LLAMA31_70B], ids=lambda m: m.name)
@pytest.mark.parametrize("B,ctx,n_tok", [(1, 1, 1), (8, 4096, 1), (64, 777, 1), (4, 512, 5)])
def test_decode_step_equals_the_op_by_op_ledger(model, B, ctx, n_tok):
    """decode_step 的 FLOPs / 权重字节 / KV 字节 == analytic_ops 的 useful / w / kv（context 个位置含新位置自己）。"""
    r = decode_step(model, H100, B, ctx, n_tokens=n_tok)
    rows = analytic_ops(model, B, 1, ctx - 1, last_only=True)
    if n_tok == 1:
        assert r["flops"] == sum_rows(rows, "useful")
    else:  # n_tokens > 1：decode_step 忽略新位置之间的注意力，每个新位置都按看 context 个位置算
        assert r["flops"] == n_tok * sum_rows(rows, "useful")
    w_ledger = sum(x["w"] for x in rows if x["op"] != "embed")     # 词嵌入是查表，不算进每步读的权重
    assert r["w_bytes"] == w_ledger == 2 * model.active_params()
    assert r["kv_bytes"] == sum_rows(rows, "kv")


@pytest.mark.parametrize("n", [1, 100, 2048])
def test_prefill_step_equals_the_op_by_op_ledger(n):
    m = LLAMA31_8B
    r = prefill_step(m, H100, n)
    rows = analytic_ops(m, 1, n, 0, last_only=True)
    assert r["flops"] == sum_rows(rows, "useful")
    full = prefill_step(m, H100, n, last_only=False)
    assert full["flops"] == sum_rows(analytic_ops(m, 1, n, 0, last_only=False), "useful")
    assert r["w_bytes"] == sum_rows(rows, "w", MATMUL_OPS) + sum(x["w"] for x in rows if x["op"].endswith("norm"))


def test_prefill_closed_form_with_sliding_window():
    """gpt-oss：一半的层只看最近 128 个位置。闭式：Σ_i min(i, 128) 对滑动窗口层，Σ_i i 对其余层。"""
    n, m = 1000, _OSS
    pairs = 18 * (128 * 129 // 2 + (n - 128) * 128) + 18 * n * (n + 1) // 2
    head = m.vocab * m.d_model
    want = 2 * (m.matmul_params() - head) * n + 2 * head + 4 * 64 * 64 * pairs
    assert prefill_step(m, H100, n)["flops"] == want


def test_weight_bytes_formats_and_gpt_oss_checkpoint():
    assert weight_bytes(LLAMA31_8B) == 2 * LLAMA31_8B.params() == weight_bytes(LLAMA31_8B, 16.0)
    assert round(weight_bytes(_OSS, "bf16", expert_fmt="mxfp4") / 2 ** 30, 1) == 60.8   # 模型卡：60.8 GiB
    assert active_weight_bytes(LLAMA31_70B) == 2 * LLAMA31_70B.active_params()
    # INT4-g128：块里的矩阵 4.125 位，词嵌入和 lm_head 仍是 BF16
    m = LLAMA31_8B
    blocks = m.n_layers * (m.attn_params() + 3 * 4096 * 14336)
    assert weight_bytes(m, "int4-g128") == pytest.approx(blocks * 4.125 / 8 + (m.params() - blocks) * 2)
    with pytest.raises(ValueError, match="位数必须为正"):
        weight_bytes(m, 0.0)


def test_compute_bound_batch_and_critical_context_agree_with_decode_step():
    import math
    for model, chip, ctx in ((LLAMA31_8B, H100, 128), (LLAMA31_70B, gang(H100, 8), 512), (LLAMA31_8B, H100, 1)):
        b = compute_bound_batch(model, chip, ctx)
        assert decode_step(model, chip, math.ceil(b), ctx)["bound"] == "compute"
        assert decode_step(model, chip, math.floor(b), ctx)["bound"] == "memory"
    L = critical_context(LLAMA31_8B, H100)
    assert compute_bound_batch(LLAMA31_8B, H100, math.ceil(L) - 1) < math.inf
    assert compute_bound_batch(LLAMA31_8B, H100, math.ceil(L)) == math.inf
    assert round(L) == 393 and round(critical_context(LLAMA31_70B, gang(H100, 8))) == 1476
    with pytest.raises(ValueError, match="MoE"):
        compute_bound_batch(_OSS, H100, 100)


def test_max_batch_counts_weights_and_kv_of_every_model_on_the_chip():
    room = H100.mem_bytes - 2 * LLAMA31_8B.params()
    assert max_batch(LLAMA31_8B, H100, 8192) == int(room // LLAMA31_8B.kv_bytes(8192))
    both = max_batch(LLAMA31_70B, gang(H100, 8), 2048, others=(LLAMA31_8B,))
    room2 = 8 * 80e9 - 2 * LLAMA31_70B.params() - 2 * LLAMA31_8B.params()
    assert both == int(room2 // (LLAMA31_70B.kv_bytes(2048) + LLAMA31_8B.kv_bytes(2048)))
    assert max_batch(LLAMA31_405B, H100, 10) == 0


def test_weight_format_bits_agree_with_numfmt():
    """llm_math 的格式表（第 1 讲）和 numfmt 的位数（第 3 讲预备）是同一个约定：逐格相等。"""
    from llm_math import bits_per_param
    from numfmt import bits_per_value
    for n in (64, 192, 2880, 4096, 14336):
        assert bits_per_param("bf16", n) == bits_per_value("bf16")
        assert bits_per_param("fp8", n) == bits_per_value("fp8", n_in=n)
        assert bits_per_param("int8", n) == bits_per_value("int8", n_in=n)
        assert bits_per_param("int4-g128", n) == pytest.approx(bits_per_value("int4", n_in=n, group=128), rel=1e-15)
        if n % 128 == 0:
            assert bits_per_param("int4-g128-zp", n) == bits_per_value("int4-zp", group=128) == 4 + 20 / 128
        assert bits_per_param("mxfp4", n) == bits_per_value("mxfp4")


def test_decode_step_with_formats_matches_weight_bytes_rules():
    """decode_step 给了格式时：批 1 读 active_weight_bytes；批很大时 MoE 读到全部专家 = weight_bytes − 输入词嵌入。"""
    m = _OSS
    r1 = decode_step(m, H100, 1, 100, expert_fmt="mxfp4")
    assert r1["w_bytes"] == pytest.approx(active_weight_bytes(m, "bf16", "mxfp4"))
    rbig = decode_step(m, H100, 100_000, 100, expert_fmt="mxfp4")
    assert rbig["w_bytes"] == pytest.approx(weight_bytes(m, "bf16", "mxfp4") - 2 * m.embed_params(), rel=1e-9)
    assert decode_step(LLAMA31_8B, H100, 4, 100, w_fmt="bf16")["w_bytes"] == decode_step(LLAMA31_8B, H100, 4, 100)["w_bytes"]
    # 默认（w_bits）的口径不变：批很大时读全部参数（除输入词嵌入）
    assert decode_step(m, H100, 100_000, 100)["w_bytes"] == pytest.approx(2 * (m.params() - m.embed_params()), rel=1e-9)


def test_parts_add_up_to_the_totals():
    for m in (LLAMA31_8B, _OSS):
        head = m.vocab * m.d_model
        parts = (m.embed_params() + m.n_layers * (m.attn_params() + m.router_params()
                 + max(m.n_experts, 1) * m.expert_params()) + m.norm_params() + head)
        assert parts == m.params()
    assert LLAMA31_8B.norm_params() == 65 * 4096


# ---- mixed_step：分块 prefill 的混合步（第 1 讲 04 演示 4、第 5 讲 02 同一个式子）----

def _mixed_8b_by_hand(batch, context, c, p):
    """Llama-3.1-8B（config.json 的整数）在 H100 SXM5（989.4 TFLOP/s、3.35 TB/s）上的混合步，不调 llm_math。"""
    V, d, L, H, KVH, DH, FF = 128256, 4096, 32, 32, 8, 128, 14336
    matmul = L * (2 * d * H * DH + 2 * d * KVH * DH + 3 * d * FF) + V * d
    w = 2 * (8_030_261_248 - V * d)                    # 每步读的权重：不含输入词嵌入
    kv_tok = 2 * L * KVH * DH * 2
    flops = batch * (2 * matmul + 4 * H * DH * L * context)
    if c:
        flops += 2 * (matmul - V * d) * c + 2 * V * d + 4 * H * DH * L * (c * p + c * (c + 1) // 2)
    nbytes = w + batch * kv_tok * context + (kv_tok * p if c else 0)
    return max(flops / 989.4e12, nbytes / 3.35e12)


@pytest.mark.parametrize("batch,context,c,p", [(64, 4224, 1024, 0), (64, 4224, 1024, 3072), (32, 2048, 512, 512),
                                               (0, 0, 4096, 0), (8, 100, 0, 0)])
def test_mixed_step_matches_closed_form(batch, context, c, p):
    from llm_math import mixed_step
    assert mixed_step(LLAMA31_8B, H100, batch, context, c, p)["time"] == pytest.approx(
        _mixed_8b_by_hand(batch, context, c, p), rel=1e-12)


def test_mixed_step_reduces_to_decode_step_and_prefill_step():
    """不带 prefill 时就是 decode_step；不带 decode、一整段时就是 prefill_step；分块的 FLOPs 之和 = 整段 + 多算的 lm_head。"""
    from llm_math import mixed_step
    m = LLAMA31_8B
    assert mixed_step(m, H100, 16, 1000, 0)["time"] == pytest.approx(decode_step(m, H100, 16, 1000)["time"], rel=1e-12)
    whole = prefill_step(m, H100, 4096)
    assert mixed_step(m, H100, 0, 0, 4096)["flops"] == whole["flops"]
    parts = sum(mixed_step(m, H100, 0, 0, 1024, i * 1024)["flops"] for i in range(4))
    assert parts == whole["flops"] + 3 * 2 * m.vocab * m.d_model


def test_mixed_step_equals_iteration_lab_iteration_time():
    """第 1 讲和第 5 讲的混合步是同一个式子：llm_math.mixed_step == iteration_lab.iteration_time（批里上下文相同时）。"""
    import os
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "lecture05"))
    from llm_math import mixed_step
    from iteration_lab import iteration_time
    for batch, ctx, c, p in ((32, 2048, 512, 0), (32, 2048, 512, 3584), (64, 4224, 1024, 2048), (1, 10, 0, 0)):
        assert mixed_step(LLAMA31_8B, H100, batch, ctx, c, p)["time"] == pytest.approx(
            iteration_time(LLAMA31_8B, H100, batch, batch * ctx, c, p), rel=1e-12)


def test_mixed_step_rejects_bad_arguments():
    from llm_math import mixed_step
    with pytest.raises(ValueError, match="稠密"):
        mixed_step(GPT_OSS_20B, H100, 4, 100, 10)
    with pytest.raises(ValueError, match="至少"):
        mixed_step(LLAMA31_8B, H100, 0, 100, 0)
    with pytest.raises(ValueError, match="不能为负"):
        mixed_step(LLAMA31_8B, H100, 4, 100, -1)


def test_smollm2_config_counts_the_file_exactly():
    """SmolLM2-135M：134,515,008 = 词嵌入（共享，算一次）+ 30 层 × (q/k/v/o + 三个 FFN 矩阵 + 两个 norm) + 最后的 norm。"""
    from llm_math import SMOLLM2_135M as m
    d, V, L, ff = 576, 49152, 30, 1536
    q, kv = 9 * 64, 3 * 64
    by_hand = V * d + L * (d * q + 2 * d * kv + q * d + 3 * d * ff + 2 * d) + d
    assert by_hand == 134_515_008 == m.params()
    assert m.tied and m.matmul_params() == by_hand - L * 2 * d - d      # lm_head 乘一次（就是词嵌入），norm 不算


def test_smollm2_config_equals_the_gguf_files_tensors():
    """和真文件的张量个数、形状对上（文件在本机时）。"""
    from conftest import smollm2_path
    from gguf_lab import read_gguf
    from llm_math import SMOLLM2_135M as m
    g = read_gguf(smollm2_path())
    assert g.n_parameters == m.params()
    assert g.tensors["blk.0.attn_k.weight"].shape == (m.n_kv_heads * m.head_dim, m.d_model)
    assert g.tensors["blk.0.ffn_gate.weight"].shape == (m.d_ff, m.d_model)
    assert g.metadata["llama.block_count"] == m.n_layers and "output.weight" not in g.tensors


def test_lecture01_02_cites_smollm2_exactly():
    from conftest import load_script
    r = load_script("lecture01/02_model_arithmetic.py").demo1_parameters()
    assert r["match"]["SmolLM2-135M"] and r["params"]["SmolLM2-135M"] == 134_515_008
    assert r["emb_share_smollm2"] == pytest.approx(49152 * 576 / 134_515_008)

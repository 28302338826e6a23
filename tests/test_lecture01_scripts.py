"""
第 1 讲的四个脚本（01_roofline、02_model_arithmetic、03_prefill_vs_decode、04_disaggregation）和它们在 llm_math 末尾
加的补充函数：每个观察里引用的数，用独立的闭式或公开的数据重新算一遍再比。
"""
import math
import re

import pytest

from conftest import load_script, unwrap
from hw_specs import A100, B200, H100, H100_PCIE, H200
from llm_math import (ALL_MODELS, GPT_OSS_120B, GPT_OSS_20B, LLAMA31_405B, LLAMA31_70B, LLAMA31_8B,
                      bits_per_param, decode_step, linear_shapes, matmul_intensity, prefill_step, weight_bytes)

GIB = 2 ** 30

# ---- Llama-3.1-8B 和 H100 SXM5 的闭式，只用公开的数（Llama-3.1-8B 的 config.json、H100 SXM5 数据手册），不调 llm_math ----
P_H100, BW_H100 = 989.4e12, 3.35e12
V8, D8, L8, H8, KVH8, DH8, FF8 = 128256, 4096, 32, 32, 8, 128, 14336
TOTAL_8B = 8_030_261_248
MATMUL_8B = L8 * (2 * D8 * H8 * DH8 + 2 * D8 * KVH8 * DH8 + 3 * D8 * FF8) + V8 * D8
W_STEP_8B = 2 * (TOTAL_8B - V8 * D8)              # decode / prefill 每步读的权重：不含输入词嵌入（查表）
KV_TOK_8B = 2 * L8 * KVH8 * DH8 * 2               # 每个位置的 K 和 V，所有层，BF16


def prefill_flops_8b(n):
    """2·(matmul − V·d)·n + 2·V·d（lm_head 只算最后一个位置）+ 4·头数·head_dim·层数·n(n+1)/2。"""
    return 2 * (MATMUL_8B - V8 * D8) * n + 2 * V8 * D8 + 4 * H8 * DH8 * L8 * n * (n + 1) // 2


def prefill_time_8b(n):
    return max(prefill_flops_8b(n) / P_H100, W_STEP_8B / BW_H100)


def decode_time_8b_memory_bound(batch, context):
    """受带宽限制时 decode 一步 = (权重 + batch 个序列的 KV) / 带宽。"""
    return (W_STEP_8B + batch * KV_TOK_8B * context) / BW_H100


@pytest.fixture(scope="module")
def s01():
    return load_script("lecture01/01_roofline.py")


@pytest.fixture(scope="module")
def s02():
    return load_script("lecture01/02_model_arithmetic.py")


@pytest.fixture(scope="module")
def s03():
    return load_script("lecture01/03_prefill_vs_decode.py")


@pytest.fixture(scope="module")
def s04():
    return load_script("lecture01/04_disaggregation.py")


# ---------------------------------------------------------------------------
# llm_math 的补充
# ---------------------------------------------------------------------------
def test_bits_per_param_include_scales():
    assert bits_per_param("bf16") == 16
    assert bits_per_param("fp8", 4096) == 8 + 32 / 4096
    assert bits_per_param("int4-g128") == 4.125
    assert bits_per_param("mxfp4") == 4.25
    assert bits_per_param("int8", 4096) == 8 + 16 / 4096
    # 2880 不是 128 的整数倍：一行 23 组，最后一组不满
    assert bits_per_param("int4-g128", 2880) == pytest.approx(4 + 16 * 23 / 2880)
    assert bits_per_param("mxfp4", 2880) == 4.25


def test_bits_per_param_errors():
    with pytest.raises(ValueError, match="row_len"):
        bits_per_param("int8")
    with pytest.raises(ValueError, match="可选"):
        bits_per_param("int3")


@pytest.mark.parametrize("m", ALL_MODELS, ids=[m.name for m in ALL_MODELS])
def test_bf16_weight_bytes_is_two_bytes_per_parameter(m):
    assert weight_bytes(m, "bf16") == 2 * m.params()


@pytest.mark.parametrize("m", ALL_MODELS, ids=[m.name for m in ALL_MODELS])
def test_linear_shapes_are_matmul_params_minus_head_and_router(m):
    n = sum(c * o * i for _, o, i, c in linear_shapes(m))
    router = m.n_layers * m.d_model * m.n_experts if m.is_moe else 0
    expert_scale = m.n_experts / m.top_k if m.is_moe else 1
    attn = m.n_layers * (2 * m.d_model * m.n_heads * m.head_dim + 2 * m.d_model * m.n_kv_heads * m.head_dim)
    ffn = (m.matmul_params() - m.vocab * m.d_model - router - attn) * expert_scale
    assert n == attn + ffn


def test_gpt_oss_120b_checkpoint_is_60_8_gib():
    """gpt-oss-120b 的模型卡（arXiv 2508.10925）：专家权重 MXFP4（4.25 位）、其余 BF16 → 60.8 GiB。"""
    m = GPT_OSS_120B
    experts = m.n_layers * m.n_experts * 3 * m.d_model * m.d_ff
    closed = experts * 4.25 / 8 + (m.params() - experts) * 2
    got = weight_bytes(m, "bf16", expert_fmt="mxfp4")
    assert got == pytest.approx(closed, rel=1e-12)
    assert round(got / GIB, 1) == 60.8


def test_matmul_intensity_is_batch_for_thin_matrices():
    assert matmul_intensity(1, 4096, 14336) == pytest.approx(1.0, abs=1e-3)
    assert matmul_intensity(16, 8192, 28672) == pytest.approx(16, rel=0.01)
    assert matmul_intensity(2, 3, 4, bytes_per_el=1) == 2 * 2 * 3 * 4 / (6 + 12 + 8)
    with pytest.raises(ValueError):
        matmul_intensity(0, 1, 1)


@pytest.mark.parametrize("n", [1, 100, 128, 4096])
def test_prefill_step_8b_matches_closed_form(n):
    """lm_head 只算最后一个位置；注意力第 i 个位置看 i 个位置；时间 = max(F / 算力, 读权重 / 带宽)。"""
    r = prefill_step(LLAMA31_8B, H100, n)
    assert r["flops"] == pytest.approx(prefill_flops_8b(n), rel=1e-12)
    assert r["time"] == pytest.approx(prefill_time_8b(n), rel=1e-12)
    # lm_head 每个位置都算时多 2·V·d·(n − 1)
    full = prefill_step(LLAMA31_8B, H100, n, last_only=False)["flops"]
    assert full - r["flops"] == 2 * V8 * D8 * (n - 1)


# ---------------------------------------------------------------------------
# 01_roofline
# ---------------------------------------------------------------------------
def test_01_ridge_points(s01, capsys):
    r = s01.demo1_chips()
    assert r["ridge"]["H100"] == pytest.approx(989.4 / 3.35, rel=1e-9)
    assert r["ridge"]["A100"] == pytest.approx(312 / 2.039, rel=1e-9)
    assert r["ridge"]["H200"] == pytest.approx(989.4 / 4.8, rel=1e-9)
    assert r["ridge"]["Corsair"] == pytest.approx(16)
    assert r["ridge"]["Corsair LPDDR"] == pytest.approx(6000)
    assert r["gen_flops"] == pytest.approx(989.4 / 312) and r["gen_bw"] == pytest.approx(3.35 / 2.039)
    assert (r["lowest_gpu"], r["highest_gpu"]) == ("A100 80GB SXM", "H100 PCIe")
    assert r["h100_fp8_ridge"] == pytest.approx(2 * r["ridge"]["H100"], rel=1e-3)
    assert round(r["corsair_bw_ratio"]) == 45
    out = capsys.readouterr().out
    assert f"H100 SXM5 的拐点是 {round(989.4 / 3.35)} FLOP/字节" in out
    # 回归：LPDDR5X 层的带宽 0.4 TB/s 是假设值（没有公开出处）：观察只留差一倍也成立的结论
    lo, hi = 2400e12 / 0.8e12, 2400e12 / 0.2e12
    assert r["corsair_lpddr_ridge_range"] == pytest.approx((lo, hi)) and (lo, hi) == (3000, 12000)
    assert lo > 1513 / 2.0                                     # 最小的也高过表里每块 GPU 的拐点（最高 756）
    flat = unwrap(out)
    assert "假设值" in flat and "3000–12000" in flat and "几乎什么都受带宽限制" not in flat


def test_01_ridge_points_do_not_climb_after_h100(s01, capsys):
    """观察 2 以前说"越新的芯片越难喂饱"；同一张表里 H200、B200 的拐点都比 H100 低。数据手册的数直接算。"""
    r = s01.demo1_chips()
    bf16 = {"A100": 312 / 2.039, "H100": 989.4 / 3.35, "H200": 989.4 / 4.8, "B200": 2250 / 8.0}
    low = {"A100": 624 / 2.039, "H100": 1978.9 / 3.35, "H200": 1978.9 / 4.8, "B200": 4500 / 8.0}
    for key in bf16:
        assert r["ridge"][key] == pytest.approx(bf16[key], rel=1e-9)
        assert r["low_ridge"][key] == pytest.approx(low[key], rel=1e-9)
    assert bf16["A100"] < bf16["H100"] and bf16["H200"] < bf16["B200"] < bf16["H100"]
    assert low["H200"] < low["B200"] < low["H100"]
    assert r["b200_fp4_ridge"] == pytest.approx(9000 / 8.0) and r["b200_fp4_ridge"] > low["H100"]
    out = re.sub(r"\n +", "", capsys.readouterr().out)          # 观察在 100 列处折行：先接回一行
    assert "越新的芯片越难喂饱" not in out and "= 1125）" in out
    # 回归：以前说"这四代里只有 B200 的 FP4 比 H100 SXM5 的 FP8 高"——H100 和 H200 同是 Hopper（三代），
    # 而 H100 PCIe 的 FP8 拐点 1513 / 2.0 = 756 比拿来比的 591 还高
    pcie_fp8 = 1513.0 / 2.0
    assert r["low_ridge"]["H100 PCIe"] == pytest.approx(pcie_fp8, rel=1e-9) and pcie_fp8 > max(low.values())
    assert r["highest_low_gpu"] == "H100 PCIe" and r["b200_fp4_ridge"] > pcie_fp8
    assert "这四代" not in out and "三代 GPU" in out and "最高的是H100PCIe的FP8，756" in out.replace(" ", "")  # 折行处的空格不算
    assert "拐点比这一列都高的只有B200的FP4" in out.replace(" ", "")          # 折行处的空格不算
    # 观察 2 的其他数：H200 相对 H100 的带宽、B200 相对 H100 的带宽和算力
    assert r["h200_bw"] == pytest.approx(4.8 / 3.35, rel=1e-12)
    assert "（带宽 ×1.43）" in out and "×2.39 vs ×2.27" in out


def test_01_time_vs_intensity(s01, capsys):
    r = s01.demo2_time_vs_intensity()
    assert r["t_h100_i1"] == pytest.approx(1e9 / 3.35e12)
    assert r["flat_below_ridge"]
    assert r["util_h100_i1"] == pytest.approx(3.35 / 989.4)
    assert r["h200_speedup_low"] == pytest.approx(4.8 / 3.35) and r["h200_speedup_high"] == pytest.approx(1.0)
    assert r["b200_speedup_low"] == pytest.approx(8 / 3.35) and r["b200_speedup_high"] == pytest.approx(2250 / 989.4)
    assert r["times"][(4096, "H100")] == pytest.approx(4096e9 / 989.4e12)
    assert r["corsair_full_intensity"] == 2400 / 150        # Corsair 的拐点 16 正好在强度表里


def test_01_matmul_crossover_closed_form(s01, capsys):
    r = s01.demo3_llm_ops()
    k, n = 4096, 14336
    for chip, key in ((H100, "H100"), (A100, "A100"), (H200, "H200")):
        ridge = chip.ridge_point("bf16")
        # 2Bkn / (2(Bk + kn + Bn)) ≥ ridge  ⟺  B ≥ ridge·kn / (kn − ridge(k + n))
        assert r["crossover"][key] == math.ceil(ridge * k * n / (k * n - ridge * (k + n)))
    assert r["attn_intensity"] == pytest.approx(4.0) and r["group"] == 4
    # 观察 2 对比的 decode 整步的 ⌈B*⌉（H100、上下文 0）：B·2·matmul / P ≥ 2·(总参数 − 词嵌入) / BW
    assert r["b_step_h100"] == math.ceil(W_STEP_8B * P_H100 / (BW_H100 * 2 * MATMUL_8B)) == 296
    assert r["b_step_h100"] < r["crossover"]["H100"]


def test_01_roofline_plot_marks(s01, capsys):
    """演示 4 的竖线：Llama-3.1-8B 一整步的强度（闭式），和它们在 H100 上用到的峰值比例。"""
    r = s01.demo4_roofline_plot()
    f_tok = 2 * MATMUL_8B + 4 * H8 * DH8 * L8 * 4096
    for b in (1, 64):
        want = b * f_tok / (W_STEP_8B + b * KV_TOK_8B * 4096)
        assert r["intensity"][f"decode 批 {b}"] == pytest.approx(want, rel=1e-12)
        assert r["util"][(f"decode 批 {b}", "H100")] == pytest.approx(want / (P_H100 / BW_H100), rel=1e-12)
    assert r["intensity"]["prefill 4096"] == pytest.approx(prefill_flops_8b(4096) / W_STEP_8B, rel=1e-12)
    assert all(r["util"][("prefill 4096", c)] == 1.0 for c in ("A100", "H100", "B200"))
    assert r["intensity"]["decode 批 64"] < 312 / 2.039          # 批 64 仍在每块芯片的斜线段上（A100 的拐点最低）
    ys = s01.roofline_curve(H100, [1.0, 295.0, 1e4])
    assert ys == [3.35e12, 295.0 * 3.35e12, 989.4e12]


# ---------------------------------------------------------------------------
# 02_model_arithmetic
# ---------------------------------------------------------------------------
def test_02_parameters_match_published(s02, capsys):
    r = s02.demo1_parameters()
    assert all(r["match"].values()) and len(r["match"]) == 6          # 五个大模型 + SmolLM2-135M
    assert r["params"][LLAMA31_405B.name] == 405_853_388_800
    assert round(r["active"][GPT_OSS_120B.name] / 1e9, 2) == 5.13
    assert round(r["active"][GPT_OSS_20B.name] / 1e9, 2) == 3.61
    assert r["emb_share_8b"] == pytest.approx(2 * 128256 * 4096 / 8_030_261_248)
    out = capsys.readouterr().out
    assert "116,829,156,672" in out and "8,030,261,248" in out


def test_02_bytes(s02, capsys):
    r = s02.demo2_bytes_per_format()
    assert round(r["ckpt_120b_gib"], 1) == 60.8
    assert r["naive_120b_gib"] == pytest.approx(116_829_156_672 * 4.25 / 8 / GIB)
    m = LLAMA31_8B
    lin = sum(c * o * i for _, o, i, c in linear_shapes(m))
    closed = lin * 4.125 / 8 + (m.params() - lin) * 2       # 4096 和 14336 都是 128 的整数倍
    assert r["ratio_int4_8b"] == pytest.approx(2 * m.params() / closed)
    assert r["ratio_int4_405b"] < 16 / 4.125 and r["ratio_int4_8b"] < r["ratio_int4_405b"]
    assert r["bytes"][(LLAMA31_405B.name, "bf16")] == pytest.approx(811.7e9, rel=1e-3)
    # FP8 = E4M3 值 1 字节 + 每个输出通道一个 FP32 scale（4 字节）；INT8 同样但 scale 是 FP16（2 字节）。
    # Llama-3.1-405B（config.json）：126 层，d 16384，128 / 8 头 × 128，d_ff 53248
    L, d, kv, ff = 126, 16384, 8 * 128, 53248
    lin = L * (2 * d * d + 2 * kv * d + 3 * d * ff)
    out_channels = L * (d + kv + kv + d + ff + ff + d)          # q k v o gate up down 的输出维
    rest = 405_853_388_800 - lin
    fp8 = lin + 4 * out_channels + 2 * rest
    int8 = lin + 2 * out_channels + 2 * rest
    assert r["bytes"][(LLAMA31_405B.name, "fp8")] == pytest.approx(fp8, rel=1e-12)
    assert r["bytes"][(LLAMA31_405B.name, "int8")] == pytest.approx(int8, rel=1e-12)
    assert r["fp8_over_int8_405b"] == pytest.approx(fp8 / int8, rel=1e-12)
    assert math.ceil(fp8 / 80e9) == 6                          # 演示 4 的"FP8 只要 6 块"
    # 回归：INT4-g128 是对称、不带零点的 4.125 位；AWQ / GPTQ 的 checkpoint 每组还有 4 位零点：4 + 20/128 位
    from conftest import script_stdout
    out = script_stdout("lecture01/02_model_arithmetic.py")
    assert bits_per_param("int4-g128-zp") == 4 + (16 + 4) / 128 == 4.15625
    assert "4.125 位（对称、不带零点；AWQ / GPTQ 的 checkpoint 每组再存一个 4 位零点，是 4.156 位）" in out


def test_02_gpt_oss_shares_by_hand(s02, capsys):
    """演示 1 观察 2 的 4.4%、98.2%，演示 2 观察 2、3 的 114.66B / 2.17B、1.9% / 6.6%、gpt-oss-20b 的 12.82 GiB：
    只用 config.json 的整数手算（专家：gate_up 2880→5760 和 down 2880→2880 的矩阵加偏置）。"""
    r1 = s02.demo1_parameters()
    r2 = s02.demo2_bytes_per_format()
    total, d, f = 116_829_156_672, 2880, 2880
    exp_mat = 36 * 128 * 3 * d * f                              # 专家的矩阵
    exp_all = exp_mat + 36 * 128 * (2 * f + d)                  # 加上专家的偏置
    assert r1["expert_share_120b"] == pytest.approx(exp_all / total, rel=1e-12)
    assert round(100 * exp_all / total, 1) == 98.2
    assert round(100 * r1["active_ratio_120b"], 1) == 4.4
    assert r2["expert_matrix_params_120b"] == exp_mat and round(exp_mat / 1e9, 2) == 114.66
    ck = exp_mat * 4.25 / 8 + (total - exp_mat) * 2
    assert r2["ckpt_120b_gib"] == pytest.approx(ck / GIB, rel=1e-12)
    assert (round(100 * (total - exp_mat) / total, 1), round(100 * 2 * (total - exp_mat) / ck, 1)) == (1.9, 6.6)
    out = capsys.readouterr().out
    assert "只占 1.9% 的" in out and "checkpoint 的 6.6%" in out
    total20, exp20 = 20_914_757_184, 24 * 32 * 3 * d * f
    assert r2["ckpt_20b_gib"] == pytest.approx((exp20 * 4.25 / 8 + (total20 - exp20) * 2) / GIB, rel=1e-12)
    assert round(r2["ckpt_20b_gib"], 2) == 12.82


def test_02_flops_and_kv(s02, capsys):
    r = s02.demo3_flops_and_kv()
    assert r[LLAMA31_70B.name]["kv_tok"] == 327_680
    assert r[LLAMA31_405B.name]["kv_long"] == 2 * 126 * 8 * 128 * 2 * 131072
    assert r[GPT_OSS_120B.name]["flops0"] < r[LLAMA31_8B.name]["flops0"]
    assert r[LLAMA31_70B.name]["ratio"] == pytest.approx(1.0, abs=1e-4)
    # 滑动窗口：18 层存 128 个、18 层存全部
    assert r[GPT_OSS_120B.name]["kv_long"] == 2 * (18 * 128 + 18 * 131072) * 8 * 64 * 2


def test_02_gpu_counts(s02, capsys):
    r = s02.demo4_gpus_needed()
    assert r[(LLAMA31_405B.name, "bf16")][0] == math.ceil(2 * 405_853_388_800 / 80e9) == 11
    assert r[(LLAMA31_405B.name, "fp8")] == (6, 8)
    assert r[(LLAMA31_70B.name, "bf16")] == (2, 4)
    assert r[(GPT_OSS_120B.name, "native")] == (1, 1)
    assert r[(GPT_OSS_120B.name, "bf16")][0] == 3


# ---------------------------------------------------------------------------
# 03_prefill_vs_decode
# ---------------------------------------------------------------------------
def test_03_decode_vs_batch(s03, capsys):
    r = s03.demo1_decode_vs_batch()
    kv = KV_TOK_8B * 4096
    assert r["t_b1"] == pytest.approx(decode_time_8b_memory_bound(1, 4096))
    assert r["t_b64"] == pytest.approx(decode_time_8b_memory_bound(64, 4096))
    assert set(r["bounds"].values()) == {"memory"}
    assert r["max_batch"] == (80e9 - 2 * TOTAL_8B) // kv == 119
    # 读 KV 比读权重多的最小批：在 B 时成立，B − 1 时不成立
    b = r["kv_over_w_batch"]
    at, below = decode_step(LLAMA31_8B, H100, b, 4096), decode_step(LLAMA31_8B, H100, b - 1, 4096)
    assert at["kv_bytes"] > at["w_bytes"] and not below["kv_bytes"] > below["w_bytes"]
    assert b == math.floor(W_STEP_8B / kv) + 1 == 28
    # 为什么批再大也受带宽限制：每个序列读 KV 的时间 > 它的计算时间；吞吐的上限 = 带宽 / 每个序列的 KV
    f_tok = 2 * MATMUL_8B + 4 * H8 * DH8 * L8 * 4096
    assert r["kv_time_per_seq"] == pytest.approx(kv / BW_H100) and r["compute_per_seq"] == pytest.approx(f_tok / P_H100)
    assert kv / BW_H100 > f_tok / P_H100
    assert r["throughput_cap"] == pytest.approx(BW_H100 / kv) and round(BW_H100 / kv) == 6240


def test_03_compute_bound_batch(s03, capsys):
    r = s03.demo2_compute_bound_batch()
    P, BW = P_H100, BW_H100
    for m in (LLAMA31_8B, LLAMA31_70B):
        f0, w = m.flops_per_token(0), 2 * m.active_params()
        assert r["crossover"][(m.name, 0)] == math.ceil(w * P / (BW * f0))
        # 每个印出的最小批：那个批受算力限制，少一个就受带宽限制
        for (name, ctx), b in r["crossover"].items():
            if name == m.name and b is not None:
                assert decode_step(m, H100, b, ctx)["bound"] == "compute"
                assert decode_step(m, H100, b - 1, ctx)["bound"] == "memory"
        # 上下文 c 时，每个序列的 FLOPs / 算力要大于它的 KV 字节 / 带宽，否则批多大都不行
        a = 4 * m.n_heads * m.head_dim * m.n_layers
        k = 2 * m.n_layers * m.n_kv_heads * m.head_dim * 2
        c_star = f0 / (P * k / BW - a)
        L = r["longest_compute_ctx"][m.name]
        assert L == math.ceil(c_star) - 1
        huge = 1 << 40
        assert decode_step(m, H100, huge, L)["bound"] == "compute"
        assert decode_step(m, H100, huge, L + 1)["bound"] == "memory"
        b = r["batch_at_longest"][m.name]
        assert decode_step(m, H100, b, L)["bound"] == "compute"
        assert decode_step(m, H100, b - 1, L)["bound"] == "memory"
    assert (r["longest_compute_ctx"][LLAMA31_8B.name], r["longest_compute_ctx"][LLAMA31_70B.name]) == (393, 1476)
    assert r["crossover"][(LLAMA31_8B.name, 4096)] is None
    assert r["max_batch_at_longest_8b"] < r["batch_at_longest"][LLAMA31_8B.name]
    # 观察 2 的"一块 H100 的显存只放得下 1,241 个"：(80 GB − BF16 权重) // (上下文 393 的 KV)
    assert r["max_batch_at_longest_8b"] == (80e9 - 2 * TOTAL_8B) // (KV_TOK_8B * 393) == 1241


def test_03_prefill(s03, capsys):
    r = s03.demo3_prefill_vs_length()
    n = r["n_cross"]
    # 受算力限制的最短提示：F(n)/P ≥ W/BW，n − 1 时不成立
    assert prefill_flops_8b(n) / P_H100 >= W_STEP_8B / BW_H100 > prefill_flops_8b(n - 1) / P_H100
    assert r["t_4096"] == pytest.approx(prefill_time_8b(4096), rel=1e-12)
    # 为什么 316 > 拐点 295：不算注意力时 2(M − V·d)·n + 2·V·d ≥ 拐点 × W  ⟺  n ≥ (拐点·W/2 − V·d) / (M − V·d)
    n_mm = (P_H100 / BW_H100 * W_STEP_8B / 2 - V8 * D8) / (MATMUL_8B - V8 * D8)
    assert r["n_cross_no_attn"] == pytest.approx(n_mm, rel=1e-12)
    assert r["body_share"] == pytest.approx((MATMUL_8B - V8 * D8) / (W_STEP_8B / 2), rel=1e-12)
    assert P_H100 / BW_H100 < r["n_cross"] <= math.ceil(n_mm)
    assert r["bounds"][16] == "memory" and r["bounds"][4096] == "compute"
    assert r["ratio_decode_prefill_per_token"] == pytest.approx(
        decode_time_8b_memory_bound(1, 4096) / (prefill_time_8b(4096) / 4096))
    n = 65536
    assert r["attn_share_64k"] == pytest.approx(4 * H8 * DH8 * L8 * n * (n + 1) / 2 / prefill_flops_8b(n))


def test_03_ttft_tpot(s03, capsys):
    r = s03.demo4_ttft_tpot()
    assert r["ttft"] == pytest.approx(prefill_flops_8b(2048) / P_H100, rel=1e-12) and r["ttft_bound"] == "compute"
    # 受带宽限制时一步的时间随上下文线性增长：平均 = 平均上下文（2048 + 1..255 的平均 = 2048 + 128）处的一步
    mean_ctx = 2048 + 128
    assert r["tpot_b1"] == pytest.approx(decode_time_8b_memory_bound(1, mean_ctx), rel=1e-9)
    assert r["tpot_b64"] == pytest.approx(decode_time_8b_memory_bound(64, mean_ctx), rel=1e-9)
    assert r["thr_b64"] == pytest.approx(64 / decode_time_8b_memory_bound(64, mean_ctx), rel=1e-9)
    assert r["prefill_share_b1"] < 0.05


# ---------------------------------------------------------------------------
# 04_disaggregation
# ---------------------------------------------------------------------------
def test_04_intensity_vs_ridge(s04, capsys):
    r = s04.demo1_intensity_vs_ridge()
    ridges = [c.ridge_point("bf16") for c in (A100, H100_PCIE, H100, H200, B200)]
    assert r["i_prefill"] > 10 * max(ridges) and r["min_ratio_prefill"] > 10
    # 观察 1 的强度和"至少 11.1 倍"：Llama-3.1-70B（config.json）的 prefill 4096 闭式，对最高的拐点（H100 PCIe）
    n, V, d, L, ff = 4096, 128256, 8192, 80, 28672
    body = L * (2 * d * d + 2 * d * 1024 + 3 * d * ff)
    flops = 2 * body * n + 2 * V * d + 4 * 64 * 128 * L * n * (n + 1) // 2
    i_pre = flops / (2 * (70_553_706_496 - V * d))
    assert r["i_prefill"] == pytest.approx(i_pre, rel=1e-12)
    assert r["min_ratio_prefill"] == pytest.approx(i_pre / (756.5 / 2.0), rel=1e-12)
    assert round(r["min_ratio_prefill"], 1) == 11.1
    assert r["i_decode256"] < min(ridges)
    assert r["group"] == 8
    m = LLAMA31_70B
    kv = 4096 * 327_680
    f = m.flops_per_token(4096)
    assert r["i_decode64"] == pytest.approx(64 * f / (2 * m.active_params() + 64 * kv))
    # 观察 2 的极限：B → ∞ 时强度 → 每个序列的 FLOPs ÷ 它的 KV 字节；闭式用 config.json 的整数
    body = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 128256 * 8192
    lim = (2 * body + 4 * 64 * 128 * 80 * 4096) / kv
    assert r["i_decode_limit"] == pytest.approx(lim, rel=1e-12)
    assert r["i_decode256"] < lim < min(ridges)


def test_04_comparative_advantage_is_ridge_ratio(s04, capsys):
    r = s04.demo2_comparative_advantage()
    for key, chip in (("A100", A100), ("H100 PCIe", H100_PCIE), ("H200", H200), ("B200", B200)):
        assert r[key]["adv"] == pytest.approx(H100.ridge_point("bf16") / chip.ridge_point("bf16"), rel=1e-9)
    assert r["H200"]["sp_pre"] == pytest.approx(1.0) and r["H200"]["sp_dec"] == pytest.approx(4.8 / 3.35)
    assert r["best_adv"] == "A100"
    # 观察 3："不如 B200、H200 SXM、H100 PCIe，只比 H100 SXM5 高"：受带宽限制时每瓦 ∝ 带宽 / 功耗（同一个批和上下文）
    ratio = {"A100": 2.039 / 400, "H100 PCIe": 2.0 / 350, "H100": 3.35 / 700, "H200": 4.8 / 700, "B200": 8.0 / 1000}
    above = sorted((k for k in ratio if ratio[k] > ratio["A100"]), key=lambda k: -ratio[k])
    assert r["decode_per_w_above_a100"] == above == ["B200", "H200", "H100 PCIe"]
    assert r["decode_per_w_below_a100"] == ["H100 SXM5"]
    assert r["best_prefill_per_w"] == "B200" and r["best_decode_per_w"] == "B200"
    # decode 优势最大的 A100，decode 每瓦并不好：受带宽限制时 token/s/W = B / ((W + B·KV) / 带宽) / 功耗
    chips = {"A100": A100, "H100": H100, "H200": H200, "B200": B200}
    per_w = {k: 64 / (decode_time_8b_memory_bound(64, 4096 + 128) * BW_H100 / c.mem_bw) / c.power_w
             for k, c in chips.items()}
    assert r["per_w"]["A100"][1] == pytest.approx(per_w["A100"], rel=1e-9)
    assert per_w["A100"] < per_w["H200"] < per_w["B200"] and per_w["A100"] > per_w["H100"]
    pre_w = {k: 4096 / (prefill_flops_8b(4096) / chips[k].peak_flops("bf16")) / chips[k].power_w for k in ("A100", "H100")}
    assert r["a100_vs_h100_per_w"][0] == pytest.approx(pre_w["A100"] / pre_w["H100"], rel=1e-9)
    assert r["a100_vs_h100_per_w"][1] == pytest.approx(per_w["A100"] / per_w["H100"], rel=1e-9)
    assert "所以要看的不是绝对谁快" not in capsys.readouterr().out


def test_04_kv_transfer(s04, capsys):
    r = s04.demo3_kv_transfer()
    kv = KV_TOK_8B * 4096
    assert r["kv_bytes"] == kv and r["t_ib"] == pytest.approx(kv / 50e9)
    for key, bw in (("NVLink 4", 450e9), ("PCIe Gen5 x16", 64e9), ("InfiniBand NDR", 50e9), ("100 GbE 以太网", 12.5e9)):
        assert r["ratio"][key] == pytest.approx((kv / bw + 1e-3) / prefill_time_8b(4096))
    assert r["ratio"]["100 GbE 以太网"] > r["ratio"]["InfiniBand NDR"] > r["ratio"]["NVLink 4"]


def test_04_ledger(s04, capsys):
    r = s04.demo4_ledger()
    co, hh, h2, a1 = r["colocated"], r["H100→H100"], r["H100→H200"], r["H100→A100"]
    assert co["thr_per_gpu"] == pytest.approx(hh["thr_per_gpu"], rel=1e-12)
    assert co["tpot"] > 2 * hh["tpot"]
    assert h2["thr_per_gpu"] > co["thr_per_gpu"] and h2["tpot"] < hh["tpot"]
    assert a1["thr_per_kw"] > co["thr_per_kw"] and a1["thr_per_gpu"] < co["thr_per_gpu"]
    t_pre = prefill_time_8b(4096)
    t_dec = decode_time_8b_memory_bound(64, 4096 + 128)        # 批里平均上下文 4096 + 256/2
    assert hh["tpot"] == pytest.approx(t_dec)
    assert hh["ttft"] == pytest.approx(t_pre + 4096 * 131072 / 50e9 + 1e-3)
    assert co["ttft"] == pytest.approx(t_pre + t_dec / 2)
    # 一块 decode 卡每秒完成 64 / (256 · t_dec) 个请求，每个请求要 t_pre 的 prefill 卡时间
    assert hh["n_prefill"] == pytest.approx(64 * t_pre / (256 * t_dec))


def test_04_chunked_prefill_beats_every_disaggregated_row(s04, capsys):
    """
    回归：演示 4 只比了"prefill 单独占一步"的同机，说"分开本身不产生吞吐"之外还让人以为分开吞吐更高。
    分块 prefill（每步顺带一个 4096 提示的 1024 个 token）时一步 = max(FLOPs 和 / 算力, 字节和 / 带宽)，
    闭式用 config.json 的整数和 H100 的数据手册，不调 llm_math。
    """
    r = s04.demo4_ledger()
    out = re.sub(r"\n +", "", capsys.readouterr().out)          # 观察折行处接回去
    ck, co = r["chunked"], r["colocated"]
    steps = []
    for i in range(4):
        p, c, ctx = 1024 * i, 1024, 4096 + 128
        flops = 64 * (2 * MATMUL_8B + 4 * H8 * DH8 * L8 * ctx) + prefill_flops_8b(c) \
            + 4 * H8 * DH8 * L8 * c * p
        nbytes = W_STEP_8B + 64 * KV_TOK_8B * ctx + KV_TOK_8B * p
        assert flops / P_H100 > nbytes / BW_H100                  # 每一步都受算力限制
        steps.append(flops / P_H100)
    t_mix = sum(steps) / 4
    assert ck["tpot"] == pytest.approx(t_mix, rel=1e-12) and ck["worst"] == pytest.approx(steps[-1], rel=1e-12)
    assert ck["all_compute_bound"]
    assert ck["thr_per_gpu"] == pytest.approx(64 / t_mix, rel=1e-12)
    assert round(ck["thr_per_gpu"]) == 3838 and f"{t_mix * 1e3:.1f}" == "16.7"
    assert ck["thr_per_kw"] == pytest.approx(64 / t_mix / 0.7, rel=1e-12)
    assert ck["ttft"] == pytest.approx(t_mix / 2 + sum(steps), rel=1e-12)
    # 分块同机高于每一种分开跑（每块卡、每 kW）；旧的结论只对不分块的同机成立
    for key in ("H100→H100", "H100→H200", "H100→A100"):
        assert ck["thr_per_gpu"] > r[key]["thr_per_gpu"] and ck["thr_per_kw"] > r[key]["thr_per_kw"]
    assert r["best_disagg"] == "H100→H200" and round(r["best_disagg_thr"]) == 2455
    assert round(r["best_disagg_kw"]) == 3507
    assert ck["thr_per_gpu"] / r["H100→H100"]["thr_per_gpu"] == pytest.approx(
        (64 / t_mix) / (64 / (decode_time_8b_memory_bound(64, 4096 + 128) + prefill_time_8b(4096) / 4)), rel=1e-12)
    assert "3838 token/s" in out and "1.84×" in out and "分开本身不产生吞吐" not in out
    assert "比同机多" not in out and "比不分块的同机多 17%" in out


def test_04_demo1_idle_resource_sentence_is_scoped(s04, capsys):
    """回归：演示 1 说"同一块芯片同时服务两种工作，总有一种资源闲着"——分块 prefill 时不是这样。"""
    s04.demo1_intensity_vs_ridge()
    out = capsys.readouterr().out
    assert "总有一种资源闲着" in out and "一步只做一种工作时" in out
    assert "同一块芯片同时服务两种工作，总有一种资源闲着" not in out

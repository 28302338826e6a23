"""
第 2 讲的四个编号脚本：每个演示返回它的观察引用的数；这里用独立的闭式公式和公开数字（Llama 3.1 的 config.json、
H100 数据手册、各模型的 config.json）核对它们，并检查观察里说的"相等 / 一致 / 受什么限制"确实成立。
"""
import contextlib
import io
import math
import re

import pytest

from conftest import load_script
from llm_math import LLAMA31_8B, LLAMA31_70B, LLAMA31_405B
import transformer_lab
from transformer_lab import LEC2_CFG
from ledger_lab import analytic_ops, sum_rows

S1, S2, S3, S4 = ("lecture02/01_numpy_transformer.py", "lecture02/02_op_ledger.py",
                  "lecture02/03_arithmetic_intensity.py", "lecture02/04_kv_cache.py")


def _run(rel, *demos):
    """加载脚本、依次运行几个演示（吞掉打印），返回 (模块, {演示名: 返回的 dict}, 打印的文字)。"""
    mod = load_script(rel)
    buf = io.StringIO()
    out = {}
    with contextlib.redirect_stdout(buf):
        for d in demos:
            out[d] = getattr(mod, d)()
    return mod, out, buf.getvalue()


@pytest.fixture(scope="module")
def s1():
    return _run(S1, "demo1_one_forward_pass", "demo2_cache_equals_recompute")


@pytest.fixture(scope="module")
def s2():
    return _run(S2, "demo1_prefill_ledger", "demo2_decode_ledger", "demo3_where_it_goes")


@pytest.fixture(scope="module")
def s3():
    return _run(S3, "demo1_two_intensities", "demo2_time_split", "demo3_step_intensity_limit")


@pytest.fixture(scope="module")
def s4():
    return _run(S4, "demo1_cache_size", "demo2_mha_gqa_mqa", "demo3_cache_vs_recompute")


# 小模型的结构（01、02、04 共用）；闭式公式里直接用这些数，不经过 llm_math
V, D, L, H, HKV, HD, FF = 256, 64, 4, 8, 2, 8, 192
M_TINY = L * (D * H * HD + 2 * D * HKV * HD + H * HD * D + 3 * D * FF) + V * D   # 矩阵乘的权重个数（含 lm_head）


def test_scripts_use_the_lab_config_and_tokens(s1, s2, s4):
    # 01、02、04 用 transformer_lab 里的 LEC2_CFG 和 random_tokens（不各自再定义一份）；下面的闭式公式用的尺寸就是它的
    assert (LEC2_CFG.vocab, LEC2_CFG.d_model, LEC2_CFG.n_layers, LEC2_CFG.n_heads, LEC2_CFG.n_kv_heads,
            LEC2_CFG.head_dim, LEC2_CFG.d_ff) == (V, D, L, H, HKV, HD, FF)
    for mod, _, _ in (s1, s2, s4):
        assert mod.CFG is LEC2_CFG
        assert mod.random_tokens is transformer_lab.random_tokens


# ---------------------------------------------------------------------------
# 01：逐个算子的前向、缓存 == 重算
# ---------------------------------------------------------------------------
def test_01_by_hand_forward_equals_lab_model_and_counts_params(s1):
    r = s1[1]["demo1_one_forward_pass"]
    assert r["dtype"] == "float64"
    assert r["delta_by_hand"] < 1e-13                 # 观察说"最大差 < 1e-13"
    n_params = V * D + L * (D * H * HD + 2 * D * HKV * HD + H * HD * D + 3 * D * FF + 2 * D) + D + D * V
    assert r["n_params"] == r["n_params_formula"] == n_params == 221760
    assert r["n_layer_steps"] == 16 and r["n_layer_matmuls"] == 7


def test_01_stage_shapes(s1):
    sh = s1[1]["demo1_one_forward_pass"]["shapes"]
    B, n = 2, 16
    assert sh["q_proj"] == f"[{B}, {n}, {H}, {HD}]"
    assert sh["k_proj"] == sh["v_proj"] == f"[{B}, {n}, {HKV}, {HD}]"
    assert sh["attn_scores"] == sh["attn_softmax"] == f"[{B}, {H}, {n}, {n}]"
    assert sh["mlp_gate"] == sh["mlp_act"] == f"[{B}, {n}, {FF}]"
    assert sh["lm_head"] == f"[{B}, {n}, {V}]"


def test_01_cached_decode_equals_full_recompute(s1):
    r = s1[1]["demo2_cache_equals_recompute"]
    assert r["dtype"] == "float64"
    assert r["tokens_agree"] is True
    assert r["bound"] == 1e-13 and r["max_delta"] < r["bound"]      # 观察说"每一步都 < 1e-13"
    assert r["rel_bound_eps"] == pytest.approx(1e-13 / r["max_logit"] / 2.220446049250313e-16, rel=1e-12)
    assert r["top2_gap"] > 1e3 * r["bound"]                         # "比舍入差的界大得多"
    assert r["n_compared"] == 2 * 32 * V


def test_01_prints_bounds_not_rounding_residuals(s1):
    # 舍入差的具体数字随 BLAS 变：打印出来的只能是界（1e-13）和机器精度 ε 本身（2.2e-16），不能有 1e-15 量级的实测值
    text = s1[2]
    assert "< 1e-13" in text
    small = set(re.findall(r"\d(?:\.\d+)?e-\d+", text))
    assert small <= {"1e-13", "2.2e-16"}, small


# ---------------------------------------------------------------------------
# 02：账本 == 公式，以及比例
# ---------------------------------------------------------------------------
def test_02_ledger_equals_analytic_in_every_cell(s2):
    for d in ("demo1_prefill_ledger", "demo2_decode_ledger"):
        r = s2[1][d]
        assert r["cells"] == 19 * 4 and r["same"] == r["cells"]
    # 账本是按数组形状记的账，不是测量：页面上不把它叫"实测"，并说出相等不能说明的事
    assert "76 个数，账本 == 公式的有 76 个：全部相等" in s2[2]
    page = re.sub(r"\n +", "", s2[2])                          # 观察在 100 列处折行：先接回一行
    assert "实测" not in page and "不是测量" in page and "ELEMENTWISE_FLOPS" in page


def test_02_prefill_and_decode_totals_match_closed_forms(s2):
    B, n = 2, 32
    pre, dec = s2[1]["demo1_prefill_ledger"], s2[1]["demo2_decode_ledger"]
    assert pre["scores_useful_ratio"] == (n + 1) / (2 * n)
    useful_pre = 2 * B * n * M_TINY + 4 * L * H * HD * B * n * (n + 1) // 2
    useful_dec = 2 * B * M_TINY + 4 * L * H * HD * B * (n + 1)
    assert pre["totals"]["useful"] == useful_pre
    assert dec["useful_ratio"] == pytest.approx(useful_dec / useful_pre, rel=1e-12)
    assert dec["w_pre"] == dec["w_dec"] == pre["w_matmul"] == 2 * M_TINY
    assert pre["totals"]["w"] - pre["w_matmul"] == B * n * D * 2 + (2 * L + 1) * D * 2   # 查表的行 + norm 的权重
    k = B * HKV * (n + 1) * HD * 2 * L
    assert dec["k_bytes"] == dec["v_bytes"] == k == 8448
    assert dec["kv_total"] == 2 * k == 16896
    assert "K 8,448 + V 8,448 = 16,896" in re.sub(r"\n +", " ", s2[2])   # 观察按 100 列折过行
    assert "读权重矩阵 410 kB" in s2[2]


def test_02_where_flops_and_bytes_go_for_llama70b(s2):
    out = s2[1]["demo3_where_it_goes"]
    P = LLAMA31_70B.matmul_params()
    keys = list(k for k in out if k != "ridge")
    pre, dec, dec64 = out[keys[2]], out[keys[3]], out[keys[4]]
    assert out["ridge"] == pytest.approx(989.4 / 3.35, rel=1e-12)
    assert pre["intensity"] > out["ridge"] > dec64["intensity"]
    assert 1.0 < dec["intensity"] < 1.05                       # 每个权重一次乘加，加一点注意力
    kv64 = 64 * 2 * 80 * 8 * 128 * 2 * 8192
    share = dec64["shares"]["注意力核心"][2]
    assert share == pytest.approx(kv64 / (kv64 + 2 * P), abs=2e-3) and share > 0.5
    assert pre["shares"]["权重矩阵乘"][1] > 0.95


# ---------------------------------------------------------------------------
# 03：两种强度、时间分配、整步的上限
# ---------------------------------------------------------------------------
def test_03_projection_intensity_is_batch_and_attention_is_group(s3):
    r = s3[1]["demo1_two_intensities"]
    for B, v in r["by_batch"].items():
        assert v["proj_intensity"] == B          # stanford-cs336 的写法：assert intensity == B
        assert v["attn_intensity"] == 8
    for name, (g, vals) in r["attn_by_model"].items():
        assert all(x == g for x in vals)
    assert {k: v[0] for k, v in r["attn_by_model"].items()} == {
        LLAMA31_8B.name: 4, LLAMA31_70B.name: 8, LLAMA31_405B.name: 16}


def test_03_ridge_point_and_seed05_figures(s3):
    r = s3[1]["demo1_two_intensities"]
    assert r["ridge"] == pytest.approx(295.34, abs=0.01)
    assert r["first_compute_bound_batch"] == 296 == math.ceil(r["ridge"])
    b = r["by_batch"][1024]
    assert abs(b["proj_compute"] - 0.144) < 0.5e-3       # 第 5 讲 05："计算 144 ms"
    assert abs(b["proj_memory"] - 0.0415) < 0.5e-3       # "读权重 41 ms"（41.5）
    assert r["ridges"]["A100 80GB SXM"] == pytest.approx(312 / 2.039, rel=1e-9)


def test_03_time_split_grows_with_batch_and_context(s3):
    r = s3[1]["demo2_time_split"]
    P = LLAMA31_70B.matmul_params()
    assert r["kv_per_token"] == 2 * 80 * 8 * 128 * 2 == 327680
    assert r["crossover_tokens"] == pytest.approx(2 * P / 327680, rel=1e-12)
    assert 4.2e5 < r["crossover_tokens"] < 4.3e5
    cases = r["by_case"]
    assert r["all_proj_memory_bound"] and r["n_distinct_t_proj"] == 1
    assert "表里都是 41.5 ms" in s3[2]
    for (B, ctx), v in cases.items():
        assert v["t_attn"] == pytest.approx(B * ctx * 327680 / 3.35e12, rel=1e-12)
        assert v["t_proj"] == pytest.approx(2 * P / 3.35e12, rel=1e-12)
        # 读 KV 比读权重久 ⇔ B × 上下文 超过分界线
        assert (v["share"] > 0.5) == (B * ctx > r["crossover_tokens"])
    assert cases[(1, 1024)]["share"] < 0.01 and cases[(128, 131072)]["share"] > 0.95


def test_03_step_intensity_limit(s3):
    r = s3[1]["demo3_step_intensity_limit"]
    P = LLAMA31_70B.matmul_params()
    ridge = 989.4e12 / 3.35e12
    assert r["s_star"] == pytest.approx(2 * P / (4 * 80 * 8 * 128 * (ridge - 8)), rel=1e-12)
    assert 1400 < r["s_star"] < 1550
    # 约定（同第 1 讲 03、第 5 讲 01）：能超过拐点的最长整数上下文 = ⌈L*⌉ − 1
    assert r["s_max"] == math.ceil(r["s_star"]) - 1 == 1476

    def limit(S):  # B → ∞ 的强度上限，独立的闭式
        return (2 * P + 4 * 64 * 128 * 80 * S) / (4 * 80 * 8 * 128 * S)
    assert limit(r["s_max"]) > ridge > limit(r["s_max"] + 1)
    mod = s3[0]
    for S, above in ((r["s_max"], True), (r["s_max"] + 1, False)):   # 脚本自己的账（analytic_ops）也在同一处过拐点
        p = mod.decode_parts(LLAMA31_70B, 1, S)
        assert ((p["proj_flops"] + p["attn_flops"]) / p["attn_bytes"] > ridge) == above
    assert "上下文 ≤ 1,476 个位置" in s3[2] and "≥ 1,477 时" in s3[2]
    lims = []
    for ctx, v in r["by_ctx"].items():
        assert v["limit"] == pytest.approx(v["closed"], rel=1e-12)
        assert (v["limit"] > ridge) == (ctx < r["s_star"])
        vals = [v["by_batch"][B] for B in sorted(v["by_batch"])]
        assert vals == sorted(vals) and vals[-1] < v["limit"]
        lims.append(v["limit"])
    assert lims == sorted(lims, reverse=True)
    assert 8 < r["by_ctx"][131072]["limit"] < 12


# ---------------------------------------------------------------------------
# 04：KV cache 的大小、MHA/GQA/MQA、缓存 vs 重算
# ---------------------------------------------------------------------------
def test_04_kv_cache_sizes(s4):
    r = s4[1]["demo1_cache_size"]
    per = {k: v["per_token"] for k, v in r["models"].items()}
    assert per == {LLAMA31_8B.name: 131072, LLAMA31_70B.name: 327680, LLAMA31_405B.name: 516096}
    r70 = r["models"][LLAMA31_70B.name]
    assert r70["weights"] == 2 * 70_553_706_496                 # Llama-3.1-70B 按 config.json 数的参数总数 × 2 字节
    assert r70["per_seq"][131072] == 131072 * 327680
    assert r70["break_even_ctx"] == pytest.approx(2 * 70_553_706_496 / 327680)
    assert r["ledger_kv_8192"] == r["kv_70b_8192"] == 8192 * 327680
    assert r["grid_70b"][(32, 32768)] == 32 * 32768 * 327680


def test_04_mha_gqa_mqa(s4):
    r = s4[1]["demo2_mha_gqa_mqa"]
    mha, gqa, mqa = (r[k] for k in r if k != "crossover_ctx")
    assert (mha["n_kv_heads"], gqa["n_kv_heads"], mqa["n_kv_heads"]) == (64, 8, 1)
    assert gqa["params"] == 70_553_706_496
    assert mha["params"] - gqa["params"] == 80 * 2 * 8192 * (64 - 8) * 128
    assert gqa["params"] - mqa["params"] == 80 * 2 * 8192 * (8 - 1) * 128
    assert mha["kv_total"] == 8 * gqa["kv_total"] == 64 * mqa["kv_total"] == 64 * 32 * 8192 * 2 * 80 * 128 * 2
    for v in (mha, gqa, mqa):
        assert v["attn_intensity"] == v["group"] == 64 // v["n_kv_heads"]
        assert v["t_attn"] == pytest.approx(v["kv_total"] / 3.35e12, rel=1e-12)
    assert mha["t_attn"] > mha["t_proj"]
    # 图的观察：批 32 时 KV 总量 = BF16 权重的上下文 = 2·参数 / (32 · 2·层·KV 头·hd·2 字节)
    for k, kv_heads in zip(r["crossover_ctx"], (64, 8, 1)):
        assert r["crossover_ctx"][k] == pytest.approx(2 * 70_553_706_496 / (32 * 2 * 80 * kv_heads * 128 * 2), rel=1e-12)


def _ledger_sum(cfg, steps, last_only=False):
    """analytic_ops 按步骤 [(n_new, n_past), …] 加起来的 useful（last_only=False：lm_head 每个位置都算）。"""
    return sum(sum_rows(analytic_ops(cfg, 1, n, past, last_only=last_only), "useful") for n, past in steps)


def test_04_cache_vs_recompute_closed_form(s4):
    mod, out, _ = s4
    r = out["demo3_cache_vs_recompute"]
    p = mod.N_PROMPT
    assert r["tokens_agree"] is True
    for n, v in r["by_n"].items():
        assert v["closed_ok"]
        assert v["cached"]["useful"] == _ledger_sum(mod.CFG, [(p, 0)] + [(1, p + i) for i in range(n - 1)])
        assert v["recompute"]["useful"] == _ledger_sum(mod.CFG, [(p + i, 0) for i in range(n)])
        assert v["recompute"]["w"] == v["cached"]["w"] == n * 2 * M_TINY
        assert v["recompute"]["kv"] == v["cached"]["kv"]
    # 大模型的闭式公式也和逐步加起来的 analytic_ops 一致（小例子），两种 lm_head 口径都对
    for m in (LLAMA31_8B, LLAMA31_70B):
        for last_only in (False, True):
            cached, recompute = mod.closed_form_useful(m, 5, 3, last_only)
            assert cached == _ledger_sum(m, [(5, 0), (1, 5), (1, 6)], last_only)
            assert recompute == _ledger_sum(m, [(5, 0), (6, 0), (7, 0)], last_only)


def test_04_llama70b_recompute_is_compute_bound_and_far_costlier(s4):
    mod, out, _ = s4
    big = out["demo3_cache_vs_recompute"]["llama70b"]
    P, hd_v = LLAMA31_70B.matmul_params(), 128256 * 8192        # lm_head 的权重个数
    a1 = 4 * 64 * 128 * 80                                      # 每个 (query, key) 对的注意力 FLOPs（所有头、所有层）
    for n, v in big.items():
        ctx = 2048 + n - 1
        # 一个口径：每次前向只在最后一个位置算 lm_head。最后一步重算 = ctx 个位置的 prefill，带缓存 = 1 个位置看 ctx 个
        re_step = 2 * (P - hd_v) * ctx + 2 * hd_v + a1 * ctx * (ctx + 1) // 2
        assert v["recompute_step_flops"] == re_step
        assert v["cached_step_flops"] == 2 * P + a1 * ctx
        # 闭式总量之差 = 最后一步（同一个口径）
        assert v["recompute"] - mod.closed_form_useful(LLAMA31_70B, 2048, n - 1, True)[1] == re_step
        assert v["cached"] - mod.closed_form_useful(LLAMA31_70B, 2048, n - 1, True)[0] == 2 * P + a1 * ctx
        assert v["t_recompute_step"] == pytest.approx(re_step / 989.4e12, rel=1e-12)     # 受算力限制
        # 大约 n·(p + n/2) / (p + n) 倍
        approx = n * (2048 + n / 2) / (2048 + n - 1)
        assert v["recompute"] / v["cached"] == pytest.approx(approx, rel=0.1)
        assert v["cached_bound"] == "memory" and v["recompute_bound"] == "compute"
        assert v["t_recompute_step"] > 5 * v["t_cached_step"]
        assert v["kv"] == (2048 + n - 1) * 327680


def test_02_demo3_shares_by_hand(s2):
    # 演示 3 观察 1、2、4 引用的占比：不经过 analytic_ops / Counter / ELEMENTWISE_FLOPS，按定义逐项写出来
    out = s2[1]["demo3_where_it_goes"]
    keys = [k for k in out if k != "ridge"]
    tiny_pre, big_pre, big_dec = out[keys[0]], out[keys[2]], out[keys[3]]
    mm, at, other = "权重矩阵乘", "注意力核心", "其余"

    def other_flops(t, d, Lr, h, hkv, hd, ff):   # norm 4 次、RoPE 3 次、激活 5 次、残差 1 次（每个元素）
        return Lr * (2 * 4 * t * d + 3 * t * (h + hkv) * hd + 5 * t * ff + 2 * t * d) + 4 * t * d

    # 小模型 prefill：B = 2、n = 32，lm_head 每个位置都算；打分、加权和按整个 n × n 矩形执行，softmax 每个元素 5 次
    B, n = 2, 32
    t = B * n
    f_other = other_flops(t, D, L, H, HKV, HD, FF)
    f_attn = L * (2 * 2 * B * H * n * n * HD + 5 * B * H * n * n)
    f_all = 2 * t * M_TINY + f_attn + f_other
    assert tiny_pre["shares"][other][0] == pytest.approx(f_other / f_all, rel=1e-12)
    assert f"{100 * f_other / f_all:.1f}%" == "1.7%"
    assert tiny_pre["lm_head_w_share"] == pytest.approx(V * D / M_TINY, rel=1e-12)            # 8.0%

    # 70B prefill：B = 1、2048 个 token，lm_head 只算最后一个位置
    P, hv = LLAMA31_70B.matmul_params(), 128256 * 8192
    d70, L70, H70, K70, hd70, ff70, n70 = 8192, 80, 64, 8, 128, 28672, 2048
    mm_f = 2 * (P - hv) * n70 + 2 * hv
    at_useful = 4 * H70 * hd70 * L70 * n70 * (n70 + 1) // 2
    at_exec = L70 * (2 * 2 * H70 * n70 * n70 * hd70 + 5 * H70 * n70 * n70)
    o70 = other_flops(n70, d70, L70, H70, K70, hd70, ff70)
    assert big_pre["shares"][mm][1] == pytest.approx(mm_f / (mm_f + at_useful), rel=1e-12)      # 98.1%
    assert big_pre["shares"][at][1] == pytest.approx(at_useful / (mm_f + at_useful), rel=1e-12)  # 1.9%
    assert big_pre["shares"][other][0] == pytest.approx(o70 / (mm_f + at_exec + o70), rel=1e-12)  # 0.01%
    assert big_pre["lm_head_w_share"] == pytest.approx(hv / P, rel=1e-12)                     # 1.5%

    # 70B decode，B = 1、上下文 2048：读的字节 = 权重矩阵 + KV + 一行词嵌入 + norm 的权重
    kv = 2048 * 2 * 80 * 8 * 128 * 2
    rest = d70 * 2 + (2 * L70 + 1) * d70 * 2
    assert big_dec["shares"][mm][2] == pytest.approx(2 * P / (2 * P + kv + rest), rel=1e-12)   # 99.5%


def test_03_chip_ridges_from_datasheet_numbers(s3):
    # 演示 1 观察 4：拐点 = BF16 稠密峰值 ÷ 带宽（数据手册的数，手写在这里）
    rid = s3[1]["demo1_two_intensities"]["ridges"]
    want = {"H100 SXM5": 989.4 / 3.35, "H100 PCIe": 756.5 / 2.0, "H200 SXM": 989.4 / 4.8,
            "A100 80GB SXM": 312 / 2.039, "B200": 2250 / 8.0}
    assert rid == pytest.approx(want, rel=1e-12)
    assert min(rid, key=rid.get) == "A100 80GB SXM" and max(rid, key=rid.get) == "H100 PCIe"   # "从 … 到 …"


def test_03_step_intensity_cells_and_memory_caveat(s3):
    r = s3[1]["demo3_step_intensity_limit"]
    P, ridge = LLAMA31_70B.matmul_params(), 989.4 / 3.35
    for ctx, v in r["by_ctx"].items():   # 每格：B·(2P + 4·H·hd·L·ctx) / (2P + B·KV/序列)
        for B, x in v["by_batch"].items():
            F = 2 * P + 4 * 64 * 128 * 80 * ctx
            assert x == pytest.approx(B * F / (2 * P + B * 327680 * ctx), rel=1e-12)
    assert f"{r['by_ctx'][4096]['by_batch'][1024]:.0f}" == "101"        # 观察 3
    # 观察 2 的附注：上下文 1024 时过拐点的最小批，逐个 B 试（不用脚本的闭式）
    ctx = r["ctx_ok"]
    assert ctx == 1024

    def above(B):
        return B * (2 * P + 4 * 64 * 128 * 80 * ctx) / (2 * P + B * 327680 * ctx) > ridge
    b = next(B for B in range(1, 5000) if above(B))
    assert r["b_min"] == b == 964
    assert r["kv_at_b_min"] == 964 * 1024 * 327680 and r["kv_at_b_min"] > 4 * 80e9
    # 回归：第 1 讲 03 的表在同一个问题上写 965（读的权重含 norm：2 × 激活参数），这里是 964——两本账的 B*
    # 分在整数 964 两边，观察要说出来。闭式：B* = 拐点·W / (F − 拐点·K)，W 分别是 2P 和 2·(P + norm 参数)
    F, K = 2 * P + 4 * 64 * 128 * 80 * ctx, 327680 * ctx
    norms = 80 * 2 * 8192 + 8192                                 # 每层两个 RMSNorm + 最后一个（config.json）
    b02, b01 = ridge * 2 * P / (F - ridge * K), ridge * 2 * (P + norms) / (F - ridge * K)
    assert r["b_star"] == pytest.approx(b02, rel=1e-12) and r["b_star_lecture01"] == pytest.approx(b01, rel=1e-12)
    assert math.floor(b02) + 1 == 964 and math.ceil(b01) == 965


def test_04_observation_figures_by_hand(s4):
    mod, out, _ = s4
    # 演示 3 观察 2：位置数和因果 (query, key) 对数，逐步加起来（不用脚本的 tri / tet）
    p, n = 32, 64
    r = out["demo3_cache_vs_recompute"]
    assert r["positions"] == (p + n - 1, sum(p + i for i in range(n))) == (95, 4064)
    pairs_re = sum(sum(range(1, p + i + 1)) for i in range(n))
    assert r["attn_pairs"] == (sum(range(1, 96)), pairs_re) == (4560, 141984)
    useful = r["by_n"][n]
    assert useful["recompute"]["useful"] / useful["cached"]["useful"] < 4064 / 95     # "FLOPs 之比小一些"
    # 演示 1 观察 1、4；演示 2 观察 3
    d1 = out["demo1_cache_size"]
    assert f"{100 * 131072 * 327680 / 80e9:.0f}" == "54"
    assert f"{405_853_388_800 / 8_030_261_248:.0f}" == "51"            # config.json 数出来的参数（Llama-3.1-405B / 8B）
    assert LLAMA31_405B.params() == 405_853_388_800 and LLAMA31_8B.params() == 8_030_261_248
    assert d1["models"][LLAMA31_405B.name]["per_token"] / d1["models"][LLAMA31_8B.name]["per_token"] == 126 / 32
    mha = out["demo2_mha_gqa_mqa"]["MHA（假想）"]
    t_proj = 2 * (70_553_706_496 - 128256 * 8192 - 161 * 8192 + 80 * 2 * 8192 * (64 - 8) * 128) / 3.35e12   # 去掉词嵌入和 norm
    assert mha["t_proj"] == pytest.approx(t_proj, rel=1e-12)
    assert f"{mha['t_attn'] / t_proj:.1f}" == "4.4"

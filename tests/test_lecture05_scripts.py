"""
第 5 讲 01–04：每个演示返回它的观察引用的数；这里用独立的闭式 / 公开数字核对，并核对观察里说的大小关系。
"""
import math
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, load_script, script_demo_text, script_results, unwrap

sys.path.insert(0, os.path.join(ROOT, "lecture05"))

from hw_specs import CORSAIR, H100  # noqa: E402
from llm_math import GPT_OSS_120B, LLAMA31_70B, LLAMA31_8B, prefill_time  # noqa: E402


S01, S02 = "lecture05/01_batching_tradeoff.py", "lecture05/02_prefill_decode_disagg.py"


@pytest.fixture(scope="module")
def s01():
    return load_script("lecture05/01_batching_tradeoff.py")


@pytest.fixture(scope="module")
def s02():
    return load_script("lecture05/02_prefill_decode_disagg.py")


@pytest.fixture(scope="module")
def s03():
    return load_script("lecture05/03_kv_transfer.py")


@pytest.fixture(scope="module")
def s04():
    return load_script("lecture05/04_sram_accelerators.py")


# ---- 01 ----
def test_01_batch_sweep(s01, capsys):
    r = s01.demo1_batch_sweep()
    capsys.readouterr()
    # B = 1、上下文 2048：读 BF16 权重（不含输入词嵌入）+ 一个序列的 KV，带宽受限
    w = 2 * LLAMA31_8B.active_params()
    assert r["tpot_8b_b1"] == pytest.approx((w + 131072 * 2048) / 3.35e12, rel=1e-12)
    assert r["bmax_8b"] == 238
    assert r["bmax_70b"] == int((640e9 - 2 * 70_553_706_496) // (327680 * 2048))
    assert r["thr_ratio_64"] > 20 and r["tpot_ratio_64"] < 3          # "吞吐涨了几十倍，TPOT 只涨一两倍"
    assert r["thr_8b_bmax"] / r["thr_8b_b1"] > 5 * (r["tpot_8b_bmax"] / r["tpot_8b_b1"])   # "远小于"
    assert r["kv_over_w_8b_bmax"] > 1 and r["all_memory_bound"]


def test_01_compute_bound_batch(s01, capsys):
    r = s01.demo2_compute_bound()
    capsys.readouterr()
    assert r["b0_8b"] == pytest.approx(989.4 / 3.35, rel=2e-3) and r["ridge"] == pytest.approx(989.4 / 3.35)
    # 临界上下文的独立闭式：2·matmul/P = L·(kv/BW − attn/P)
    P, BW = 989.4e12, 3.35e12
    lc = (2 * 7_504_658_432 / P) / (131072 / BW - 4 * 32 * 128 * 32 / P)
    assert r["lc_8b"] == pytest.approx(lc, rel=1e-9) and 256 < lc < 512       # 表里 256 能、512 永远到不了
    assert 1024 < r["lc_70b"] < 2048
    # 能 compute-bound 的最长整数上下文 ⌈L*⌉ − 1：那里分母 f/P − k/BW 还是正的，再加 1 就 ≤ 0
    def denom(L, h, kv_pos, matmul, layers, P, BW):
        return (2 * matmul + 4 * h * 128 * layers * L) / P - kv_pos * L / BW
    L8 = r["lmax_8b"]
    assert denom(L8, 32, 131072, 7_504_658_432, 32, P, BW) > 0 >= denom(L8 + 1, 32, 131072, 7_504_658_432, 32, P, BW)
    L70 = r["lmax_70b"]
    m70 = 80 * (2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 8192 * 28672) + 128256 * 8192   # 块里的矩阵 + lm_head
    assert denom(L70, 64, 327680, m70, 80, 8 * P, 8 * BW) > 0 >= denom(L70 + 1, 64, 327680, m70, 80, 8 * P, 8 * BW)
    # 表里的 ⌈B*⌉：最小的 compute-bound 整数批（独立闭式 B* = (W/BW) / (f/P − k/BW)）
    w8 = 2 * (8_030_261_248 - 128256 * 4096)                                  # 每步读的权重：不含输入词嵌入
    b128 = (w8 / BW) / denom(128, 32, 131072, 7_504_658_432, 32, P, BW)
    assert r["b128_8b"] == pytest.approx(b128, rel=1e-9) and r["nb128_8b"] == math.ceil(b128) == 438
    assert r["nb1024_70b"] == math.ceil(r["b1024_70b"]) == 965               # 观察 2 原来用 .0f 印成了 964
    assert r["b128_8b"] > r["b0_8b"] and r["nb1024_70b"] <= r["bm1024_70b"]


def test_01_continuous_batching(s01, capsys):
    r = script_results(S01)["d3"]         # 演示 3 返回的数：脚本自己那次运行存下的（console.save_results）
    assert r["gain_128"] > 1.1 and r["gain_32"] > r["gain_128"]
    assert r["active_cont_128"] > r["active_static_128"]
    assert r["tpot_cont_128"] > r["tpot_static_128"]
    assert r["tokens"] == int(s01.uniform_ints(s01.OUT_LO, s01.OUT_HI, s01.N_REQ, s01.OUT_SEED).sum())
    # prefill：512 个 1024-token 的提示，一次一个，compute-bound（lm_head 只算最后一个位置）
    head, n = 128256 * 4096, 1024
    flops = 2 * (7_504_658_432 - head) * n + 2 * head + 4 * 32 * 128 * 32 * n * (n + 1) // 2
    assert r["t_prefill"] == pytest.approx(512 * flops / 989.4e12, rel=1e-12)
    # 两边加上同样的 prefill 时间，倍数变小（观察 4："1.26 降到 1.20"）
    assert 1 < r["gain_pre_128"] < r["gain_128"] and 1 < r["gain_pre_32"] < r["gain_32"]
    assert round(r["gain_128"], 2) == 1.26 and round(r["gain_pre_128"], 2) == 1.20


# ---- 02 ----
def test_02_interference(s02, capsys):
    r = s02.demo1_interference()
    capsys.readouterr()
    assert r[4096]["t_pre"] == pytest.approx(prefill_time(LLAMA31_8B, H100, 4096), rel=1e-12)
    assert r[4096]["stall_steps"] > 5
    for n in (512, 1024, 2048, 4096):
        assert r[n]["worst_mixed"] < r[n]["t_pre"] + r["t_dec"]
        assert 0 < r[n]["extra_chunked"] < r[n]["t_pre"]


def test_02_chunked_prefill_closed_form(s02, capsys):
    """
    演示 1 观察 3 的"最慢的一步 1.25 倍、只多占 10.0 ms、约 84%"：8B、批 32、上下文 2048，4096 个提示 token
    分 8 块，每个混合步的 roofline 闭式 max(FLOPs / P, 字节 / BW) 逐块写出来（不调第 5 讲的实验模块）。
    """
    r = s02.demo1_interference()
    out = unwrap(capsys.readouterr().out)
    assert "两者完美重叠（假设）" in out and "所以 84% 是这个模型给的上限" in out
    P, BW = 989.4e12, 3.35e12
    matmul, head, attn, kv_pos = 7_504_658_432, 128256 * 4096, 4 * 32 * 128 * 32, 131072
    w = 2 * (8_030_261_248 - head)                                     # 每步读的 BF16 权重（不含输入词嵌入）
    dec_f, dec_b = 2 * matmul * 32 + attn * 32 * 2048, w + kv_pos * 32 * 2048
    t_dec = max(dec_f / P, dec_b / BW)
    steps = []
    for i in range(8):                                                  # 第 i 块：提示的第 512i+1 .. 512(i+1) 个 token
        pairs = sum(range(512 * i + 1, 512 * (i + 1) + 1))
        f = dec_f + 2 * (matmul - head) * 512 + 2 * head + attn * pairs
        b = dec_b + kv_pos * 512 * i                                    # 读前面几块已经算好的 KV
        steps.append(max(f / P, b / BW))
    p = r[4096]
    assert r["t_dec"] == pytest.approx(t_dec, rel=1e-12)
    assert p["worst_mixed"] == pytest.approx(max(steps), rel=1e-12) and round(max(steps) / t_dec, 2) == 1.25
    extra = sum(steps) - 8 * t_dec
    assert p["extra_chunked"] == pytest.approx(extra, rel=1e-9) and round(extra * 1e3, 1) == 10.0
    assert round((1 - extra / p["t_pre"]) * 100) == 84
    # issue 19 第 16 条：84% 是 roofline 取 max、完美重叠的账；纯 decode 只用 0.520 ms 算力，最后一块的混合步受算力限制
    assert r["dec_compute"] == pytest.approx(dec_f / P, rel=1e-12) and round(dec_f / P * 1e3, 2) == 0.52
    pairs = sum(range(512 * 7 + 1, 4096 + 1))
    f_last = dec_f + 2 * (matmul - head) * 512 + 2 * head + attn * pairs
    b_last = dec_b + kv_pos * 512 * 7
    assert r["worst_compute"] == pytest.approx(f_last / P, rel=1e-12) and round(f_last / P * 1e3, 2) == 8.79
    assert r["worst_bytes"] == pytest.approx(b_last / BW, rel=1e-12) and round(b_last / BW * 1e3, 2) == 7.18
    assert all(s > t_dec for s in steps) and f_last / P > b_last / BW              # 每个混合步都比纯 decode 慢


def test_02_simulation_claims(s02, capsys):
    r = script_results(S02)["d2"]         # 演示 2 返回的数：脚本自己那次运行存下的（console.save_results）
    hi, lo = s02.RATES[-1], s02.RATES[0]
    c, k, d = r[(hi, "colo")], r[(hi, "chunk")], r[(hi, "disagg")]
    assert c["ttft_mean"] < k["ttft_mean"] and c["ttft_mean"] < d["ttft_mean"]          # 同机 prefill 优先：TTFT 最短
    assert c["gap_p99"] > r["t_long"] and c["gap_p99"] > 3 * d["gap_p99"]             # 长 prefill 让 decode 卡住
    assert r[(hi, "colo")]["tpot_mean"] > r[(lo, "colo")]["tpot_mean"]
    assert d["tpot_mean"] < c["tpot_mean"]                                            # "比 prefill 优先的同机更低"
    assert d["ttft_mean"] > r[(lo, "disagg")]["ttft_mean"]                            # 负载越高排得越长
    assert k["gap_p99"] < d["gap_p99"]
    # 平均提示长度独立地算：[512, 4096) 里的 400 个均匀整数，u 来自 default_rng(1)
    mean_prompt = int(np.mean(512 + np.floor(np.random.default_rng(1).random(400) * (4096 - 512))))
    assert 2000 < mean_prompt < 2600
    assert r["kv_mean"] == pytest.approx(131072 * mean_prompt / 50e9, rel=1e-12)     # 8B 每个位置 128 KiB，NDR 单向 50 GB/s
    assert d["first_gap_is_max"] > 0.9 and d["first_gap_mean"] > r["kv_mean"]


# ---- 03 ----
def test_03_kv_bytes(s03, capsys):
    r = s03.demo1_kv_bytes()
    capsys.readouterr()
    assert r["kv_70b_32k"] == 2 * 80 * 8 * 128 * 2 * 32768
    # gpt-oss：18 层全长 + 18 层只存 128 个位置
    assert r["kv_oss_32k"] == 2 * 8 * 64 * 2 * (18 * 32768 + 18 * 128)
    assert r["window_ratio_32k"] == pytest.approx((32768 + 128) / (2 * 32768))
    assert r["window_ratio_2k"] > r["window_ratio_32k"]


def test_03_transfer_vs_prefill(s03, capsys):
    r = s03.demo2_transfer_vs_prefill()
    capsys.readouterr()
    kv = LLAMA31_70B.kv_bytes(2048)
    assert r["ib_70_2k"] == pytest.approx(kv / 50e9)
    assert r["ib_ratio_70_2k"] == pytest.approx(kv / 50e9 / r["pre70_2k"])
    assert r["ib8_ratio_70_2k"] == pytest.approx(r["ib_ratio_70_2k"] / 8)
    assert r["eth_ratio_70_2k"] == pytest.approx(4 * r["ib_ratio_70_2k"]) and r["eth_ratio_70_2k"] > 1
    assert r["slower_than_prefill"] == ["100 GbE 以太网"]
    assert r["ib_ratio_70_32k"] < r["ib_ratio_70_2k"]
    assert r["ib_ratio_oss_2k"] < 0.1 and r["eth_ratio_oss_2k"] < 1
    assert r["exposed_layerwise_70_2k"] == pytest.approx(r["ib_70_2k"] / 80)


# ---- 04 ----
OSS_PARAMS, OSS_ACTIVE = 116_829_156_672, 5_132_849_472          # gpt-oss-120b 的模型卡（arXiv 2508.10925）
OSS_EXPERT_W = 36 * 128 * 3 * 2880 * 2880                         # 专家的权重矩阵（gate、up、down），MXFP4
L70_BLOCKS = 80 * (2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 8192 * 28672)   # Llama-3.1-70B 块里的矩阵


def test_04_cards(s04, capsys):
    r = s04.demo1_how_many_cards()
    capsys.readouterr()
    assert r["draft_cards"] == 1 and r["draft_bytes"] == 1.6e9
    # 块内 8 位：块里的矩阵 1 字节，词嵌入、lm_head、norm 2 字节
    l70 = L70_BLOCKS + 2 * (70_553_706_496 - L70_BLOCKS)
    assert r["l70_8bit_cards"] == math.ceil(l70 / 2e9) == 37 and r["l70_8bit_h100"] == 1
    l8_blocks = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336)
    assert r["l8_8bit_cards"] == math.ceil((l8_blocks + 2 * (8_030_261_248 - l8_blocks)) / 2e9) == 5
    # 种子 05 的口径：全部参数 × 4.25 / 8
    assert r["oss_bytes"] == OSS_PARAMS * 4.25 / 8
    assert r["oss_cards"] == math.ceil(OSS_PARAMS * 4.25 / 8 / 2e9) == 32 and r["oss_h100"] == 1
    # 发布格式：专家矩阵 4.25 位、其余 BF16；模型卡：60.8 GiB（全部 4.25 位会是 57.8 GiB，块内 4.25 位 59.4 GiB）
    native = OSS_EXPERT_W * 4.25 / 8 + 2 * (OSS_PARAMS - OSS_EXPERT_W)
    assert r["oss_native_gib"] == pytest.approx(native / 2 ** 30, rel=1e-12)
    assert round(r["oss_native_gib"], 1) == 60.8 and r["oss_native_matches_card"]
    assert r["oss_native_cards"] == math.ceil(native / 2e9) == 33
    assert r["cap_ratio"] == 40


def test_04_per_token(s04, capsys):
    r = s04.demo2_per_token_time()
    capsys.readouterr()
    assert r["draft_h100"] == pytest.approx(1.6e9 / (3.35e12 * 0.8))
    assert r["draft_sram"] == pytest.approx(1.6e9 / (150e12 * 0.8))
    assert r["draft_speedup"] == pytest.approx(150 / 3.35) == pytest.approx(r["bw_ratio_1card"])
    # 按层切：一次只有一张卡在读，每一行都只快一张卡对一块 H100 的带宽之比
    assert r["all_one_h100"] and len(r["layer_speedups"]) == 7
    assert all(s == pytest.approx(150 / 3.35, rel=1e-12) for s in r["layer_speedups"])
    # 理想张量并行：带宽乘卡数
    assert r["l70_cards"] == 37 and r["l70_tp_speedup"] == pytest.approx(37 * 150 / 3.35, rel=1e-12)
    assert r["oss_tp"] == pytest.approx(OSS_ACTIVE * 4.25 / 8 / (32 * 150e12 * 0.8), rel=1e-12)
    assert r["oss_layer"] == pytest.approx(32 * r["oss_tp"], rel=1e-12)
    assert r["l8_lpddr"] > r["l8_h100"]


def test_04_cost_coefficient_matches_seed05(s04, capsys):
    r = s04.demo3_cost_coefficient()
    capsys.readouterr()
    seed = load_script("lecture05/05_heterogeneous_spec_decode.py")
    assert r["d_bytes"] == 1.6e9 and r["t_bytes"] == OSS_ACTIVE * 4.25 / 8     # 种子的口径：参数 × 位数 / 8
    assert r["t_gpu"] == pytest.approx(seed.t_draft("gpu"), rel=1e-12)
    assert r["t_sram"] == pytest.approx(seed.t_draft("sram"), rel=1e-12)
    assert r["t_tgt"] == pytest.approx(1.5e-3 + OSS_ACTIVE * 4.25 / 8 / (3.35e12 * 0.8), rel=1e-12)
    # 种子用近似的参数数（非专家 1.5e9 + 36·4·24.9e6 = 50.9 亿 vs 精确的 51.3 亿激活参数）：目标一步差 < 0.4%
    assert r["t_tgt"] == pytest.approx(seed.t_target(1), rel=0.004)
    assert r["c_gpu"] == pytest.approx(seed.t_draft("gpu") / seed.t_target(1), rel=0.004)
    assert r["c_sram"] == pytest.approx(seed.t_draft("sram") / seed.t_target(1), rel=0.004)
    assert 10 <= r["ratio"] < 20                                          # "十几倍"（第 6 讲 04）
    assert r["ratio"] == pytest.approx(seed.t_draft("gpu") / seed.t_draft("sram"), rel=1e-12)
    assert r["ratio_no_ovh"] == pytest.approx(2 * CORSAIR.mem_bw / H100.mem_bw)
    assert r["sram_ovh_share"] == pytest.approx(0.05e-3 / seed.t_draft("sram"))
    assert r["g_sram"] > r["g_gpu"] and r["s_sram"] > r["s_gpu"] > 1
    assert GPT_OSS_120B.n_layers == 36 and GPT_OSS_120B.active_params() == OSS_ACTIVE


def _independent_batching(out_lens, slots, continuous, prompt=1024):
    """
    演示 3 的第二条代码路径：不调第 5 讲的实验模块，直接用 8B 在 H100 上 decode 一步的 roofline 闭式
    max(FLOPs / P, 字节 / BW) 一步一步推，返回 (每个请求的完成时刻, 按 token 加权的步时间, 每步平均)。
    【做法】先定每个请求从第几步开始：静态批是前一批最长的那个做完的下一步；连续批是一个位置空出来的下一步，
    先来的先进（一堆位置的空出时刻，每次取最早的）。请求 i 从第 a_i 步起出 L_i 个 token，出第 k 个那步之前已经有
    k 个：所以第 s 步有 n(s) 个请求、上下文共 n(s)·prompt + Σ(s − a_i)，两个都按步累加（差分数组）；步时间整列算出，
    完成时刻 = 它最后一步（a_i + L_i − 1）结束时的累计时间。
    """
    import heapq
    w = 2 * (8_030_261_248 - 128256 * 4096)                 # 每步读的 BF16 权重（不含输入词嵌入）
    matmul, attn, kv_pos = 7_504_658_432, 4 * 32 * 128 * 32, 131072
    lens = np.asarray(out_lens).astype(np.int64)
    start = np.empty(len(lens), dtype=np.int64)
    if not continuous:
        s = 0
        for g in range(0, len(lens), slots):
            start[g:g + slots] = s
            s += int(lens[g:g + slots].max())
    else:
        free = [0] * slots                                   # 每个位置空出来的那一步
        for i, n_out in enumerate(lens):
            start[i] = heapq.heappop(free)
            heapq.heappush(free, int(start[i] + n_out))
    end = start + lens                                       # 请求 i 在第 start … end − 1 步
    n_steps = int(end.max())
    n, a_sum = np.zeros(n_steps + 1), np.zeros(n_steps + 1)
    np.add.at(n, start, 1)
    np.add.at(n, end, -1)
    np.add.at(a_sum, start, start)
    np.add.at(a_sum, end, -start)
    n, a_sum = np.cumsum(n)[:-1], np.cumsum(a_sum)[:-1]
    ctx = n * prompt + (n * np.arange(n_steps) - a_sum)      # 提示 + 每个请求已经出的 token
    dt = np.maximum((2 * matmul * n + attn * ctx) / 989.4e12, (w + kv_pos * ctx) / 3.35e12)
    t = np.cumsum(dt)
    return t[end - 1], (dt * n).sum() / n.sum(), t[-1] / n_steps


def test_01_continuous_batching_cuts_completion_time(s01, capsys):
    """issue 8 第 10 条：连续批不只是拿 TPOT 换吞吐，请求的完成时间（平均、p90）也更短。"""
    r = script_results(S01)["d3"]         # 演示 3 返回的数：脚本自己那次运行存下的（console.save_results）
    outs = 16 + np.floor(np.random.default_rng(1).random(512) * (1024 - 16))
    runs = {(sl, c): _independent_batching(outs, sl, c) for sl in (32, 128) for c in (False, True)}  # 每种各推一次
    for slots in (32, 128):
        for cont in (False, True):
            finish, tok, per_step = runs[(slots, cont)]
            assert r["done_mean"][(slots, cont)] == pytest.approx(finish.mean(), rel=1e-9)
            assert r["done_p90"][(slots, cont)] == pytest.approx(np.percentile(finish, 90), rel=1e-9)
            assert r["tpot_tok"][(slots, cont)] == pytest.approx(tok, rel=1e-9)
            assert r["tpot_step"][(slots, cont)] == pytest.approx(per_step, rel=1e-9)
            assert tok > per_step                                           # "按 token 加权的每一行都比每步平均大"
        # 每步更慢，但完成时间（平均和 p90）更短
        assert r["tpot_tok"][(slots, True)] > r["tpot_tok"][(slots, False)]
        assert r["done_mean"][(slots, True)] < r["done_mean"][(slots, False)]
        assert r["done_p90"][(slots, True)] < r["done_p90"][(slots, False)]
    # 观察 2 和 4 的倍数，用独立路径的总时间（最后一个请求完成的时刻）算：吞吐比 = 总时间之反比（token 一样多）
    tot = {k: finish.max() for k, (finish, _, _) in runs.items()}
    for sl, g, gp in ((128, 1.26, 1.20), (32, 1.63, 1.55)):
        assert r[f"gain_{sl}"] == pytest.approx(tot[(sl, False)] / tot[(sl, True)], rel=1e-9)
        assert round(r[f"gain_{sl}"], 2) == g
        pre = (tot[(sl, False)] + r["t_prefill"]) / (tot[(sl, True)] + r["t_prefill"])
        assert r[f"gain_pre_{sl}"] == pytest.approx(pre, rel=1e-9) and round(pre, 2) == gp
    assert round(r["t_prefill"], 2) == 7.54
    # issue 里的数：128 个位置平均 16.6 → 13.2 s，32 个位置 42.7 → 26.4 s
    assert [round(r["done_mean"][k], 1) for k in ((128, False), (128, True), (32, False), (32, True))] == \
        [16.6, 13.2, 42.7, 26.4]


def _closed_form_best(alpha, c, gammas=range(1, 257)):
    """定理 3.8 的加速比 (1 − α^{γ+1}) / ((1 − α)(γc + 1)) 逐个 γ 算出来取最大（不调 decode_lab）。"""
    sp = {g: (1 - alpha ** (g + 1)) / ((1 - alpha) * (g * c + 1)) for g in gammas}
    g = max(sp, key=lambda x: (sp[x], -x))
    return g, sp[g]


def test_04_native_format_case(s04, capsys):
    """issue 8 第 11 条：演示 3 也按发布格式（专家 MXFP4、其余 BF16）算 c、最优 γ 和加速比。"""
    r = s04.demo3_cost_coefficient()
    capsys.readouterr()
    experts = 36 * 4 * 3 * 2880 * 2880                                  # 激活的专家权重矩阵（top-4）
    native = experts * 4.25 / 8 + 2 * (OSS_ACTIVE - experts)
    assert r["native_bytes"] == pytest.approx(native, rel=1e-12)
    assert round(r["native_extra"] * 100) == 83                       # "多 83%"
    t_tgt = 1.5e-3 + native / (3.35e12 * 0.8)
    t_gpu, t_sram = 0.3e-3 + 1.6e9 / (3.35e12 * 0.8), 0.05e-3 + 1.6e9 / (2 * 150e12 * 0.8)
    n = r["native"]
    assert n["t_tgt"] == pytest.approx(t_tgt, rel=1e-12)
    assert n["c_gpu"] == pytest.approx(t_gpu / t_tgt, rel=1e-12) and n["c_sram"] == pytest.approx(t_sram / t_tgt, rel=1e-12)
    g, sp = _closed_form_best(0.93, t_gpu / t_tgt)
    assert (n["g_gpu"], n["s_gpu"]) == (g, pytest.approx(sp, rel=1e-12))
    g, sp = _closed_form_best(0.93, t_sram / t_tgt)
    assert (n["g_sram"], n["s_sram"]) == (g, pytest.approx(sp, rel=1e-12))
    # 观察："目标越慢，加速比越大；但每个 token 仍比种子口径慢"
    assert n["s_gpu"] > r["s_gpu"] and n["s_sram"] > r["s_sram"]
    assert r["per_tok"][("native", True)][1] == pytest.approx(t_tgt / n["s_sram"], rel=1e-12)
    assert t_tgt / n["s_sram"] > r["t_tgt"] / r["s_sram"] and t_tgt / n["s_gpu"] > r["t_tgt"] / r["s_gpu"]
    # 不加开销时，发布格式那一列：目标一步只读字节
    nb = r["native_no_ovh"]
    assert nb["t_tgt"] == pytest.approx(native / (3.35e12 * 0.8), rel=1e-12)
    assert nb["g_sram"] == _closed_form_best(0.93, (1.6e9 / 300e12) / (native / 3.35e12))[0]


def test_04_reconciles_best_gamma_with_seed05(s04, capsys):
    """issue 8 第 12 条：种子 05 印 5、8、20（它的 10 个 γ），所有整数里是 6、9、24；网络项和 5.09B vs 5.13B 也算出来。"""
    r = s04.demo3_cost_coefficient()
    capsys.readouterr()
    seed = load_script("lecture05/05_heterogeneous_spec_decode.py")
    grid, ints = (1, 2, 3, 5, 8, 10, 15, 20, 30, 40), range(1, 257)

    def seed_best(where, moe, gammas, net=True):
        def sp(g):
            t = seed.round_time(g, where, moe) - (0.0 if net or where == "gpu" else 2 * seed.NET)
            return seed.t_target(1) / (t / seed.tokens_per_round(0.93, g))
        g = max(gammas, key=lambda x: (sp(x), -x))
        return g, sp(g)

    rc = r["recon"]
    want = [(seed_best("gpu", False, grid), seed_best("sram", False, grid)),
            (seed_best("gpu", False, ints), seed_best("sram", False, ints)),
            (seed_best("gpu", False, ints, net=False), seed_best("sram", False, ints, net=False)),
            (_closed_form_best(0.93, r["c_gpu"]), _closed_form_best(0.93, r["c_sram"])),
            (seed_best("gpu", True, grid), seed_best("sram", True, grid)),
            (seed_best("gpu", True, ints), seed_best("sram", True, ints))]
    for row, ((gg, sg), (gs, ss)) in zip(rc, want):
        assert (row["g_gpu"], row["g_sram"]) == (gg, gs)
        assert row["s_gpu"] == pytest.approx(sg, rel=1e-12) and row["s_sram"] == pytest.approx(ss, rel=1e-12)
    # issue 里的数：种子的网格挑出 5、8、20，所有整数里是 6、9、24；GPU + MoE 验证两边都是 3
    assert (rc[0]["g_gpu"], rc[4]["g_sram"], rc[0]["g_sram"]) == (5, 8, 20)
    assert (rc[1]["g_gpu"], rc[5]["g_sram"], rc[1]["g_sram"]) == (6, 9, 24)
    assert rc[4]["g_gpu"] == rc[5]["g_gpu"] == 3
    # 第四行（去掉网络、换成精确的 5.13B）正是上表的"4.25 位，有开销"：6 和 24
    assert r["recon_row4_is_table"] and (r["g_gpu"], r["g_sram"]) == (6, 24)
    assert r["seed_active"] == pytest.approx(5.0856e9, rel=1e-12)     # 1.5e9 + 36 × 4 × 24.9e6
    # 观察 1 的"种子 05 印 2.51 ms"和观察 5 的"目标一步长 0.37%"：种子的目标一步用独立闭式算
    t_seed = 1.5e-3 + 5.0856e9 * 4.25 / 8 / (3.35e12 * 0.8)
    assert r["t_tgt_seed"] == pytest.approx(t_seed, rel=1e-12) and round(t_seed * 1e3, 2) == 2.51
    t_exact = 1.5e-3 + OSS_ACTIVE * 4.25 / 8 / (3.35e12 * 0.8)
    assert round(t_exact * 1e3, 2) == 2.52 and round((t_exact / t_seed - 1) * 100, 2) == 0.37
    # 每一步都让 SRAM 加速变大：网格 → 整数 → 去网络 → 精确参数（观察 5 的箭头方向）
    assert rc[0]["s_sram"] < rc[1]["s_sram"] < rc[2]["s_sram"] < rc[3]["s_sram"]


def test_02_tpot_rises_with_load_without_prefill_too(s02, capsys):
    """re-read：TPOT 随负载涨不全是插队——解耦的 decode 机上没有 prefill，TPOT 也涨；4 req/s 时解耦的 TPOT 反而略高。"""
    r = script_results(S02)["d2"]         # 演示 2 返回的数：脚本自己那次运行存下的（console.save_results）
    lo, hi = s02.RATES[0], s02.RATES[-1]
    assert r[(hi, "disagg")]["tpot_mean"] > 1.3 * r[(lo, "disagg")]["tpot_mean"]
    assert r[(lo, "disagg")]["tpot_mean"] > r[(lo, "colo")]["tpot_mean"]          # "4 req/s 时反而略高"
    assert r[(hi, "disagg")]["tpot_mean"] < r[(hi, "colo")]["tpot_mean"]


def test_03_oss_ratio_is_kv_ratio_over_prefill_ratio(s03, capsys):
    """re-read：gpt-oss 的比例小，是因为 KV 小 8.4 倍、prefill 只短 1.8 倍（一块卡 vs 八块卡）。"""
    r = s03.demo2_transfer_vs_prefill()
    capsys.readouterr()
    kv70 = 2 * 80 * 8 * 128 * 2 * 2048
    kv_oss = 2 * 8 * 64 * 2 * (18 * 2048 + 18 * 128)
    assert r["kv_ratio_2k"] == pytest.approx(kv70 / kv_oss, rel=1e-12) and round(r["kv_ratio_2k"], 1) == 8.4
    assert r["pre_ratio_2k"] == pytest.approx(r["pre70_2k"] / prefill_time(GPT_OSS_120B, H100, 2048, w_bits=4.25))
    assert round(r["pre_ratio_2k"], 1) == 1.8
    assert r["ib_ratio_oss_2k"] == pytest.approx(r["ib_ratio_70_2k"] * r["pre_ratio_2k"] / r["kv_ratio_2k"], rel=1e-12)


def test_04_smaller_c_gives_longer_gamma_and_more_speedup(s04, capsys):
    """观察 2、3：c 差几倍只看草稿（四列只有两个数）；把八个 (c, γ*, 加速) 按 c 排好，γ* 不减、加速比递增。"""
    r = s04.demo3_cost_coefficient()
    capsys.readouterr()
    n, nb = r["native"], r["native_no_ovh"]
    assert n["ratio"] == pytest.approx(r["ratio"], rel=1e-12) and nb["ratio"] == pytest.approx(r["ratio_no_ovh"], rel=1e-12)
    pts = []
    for c in (r, n, nb):
        pts += [(c["c_gpu"], c["g_gpu"], c["s_gpu"]), (c["c_sram"], c["g_sram"], c["s_sram"])]
    pts.sort()
    assert all(a[1] >= b[1] and a[2] > b[2] for a, b in zip(pts, pts[1:]))


def test_01_throughput_ceiling(s01, capsys):
    """演示 1 的图和观察 4：memory-bound 时 TPOT = (W + B·k) / BW 是 B 的直线，吞吐趋向 BW / k。"""
    r = s01.demo1_batch_sweep()
    capsys.readouterr()
    k8, k70 = 131072 * 2048, 327680 * 2048                         # 一个序列在上下文 2048 时每步读的 KV 字节
    assert r["ceil_8b"] == pytest.approx(3.35e12 / k8, rel=1e-12) and round(r["ceil_8b"]) == 12480
    assert r["ceil_70b"] == pytest.approx(8 * 3.35e12 / k70, rel=1e-12)
    w8 = 2 * (8_030_261_248 - 128256 * 4096)
    assert r["ceil_share_8b"] == pytest.approx(238 / ((w8 + 238 * k8) / 3.35e12) / (3.35e12 / k8), rel=1e-12)
    assert 0.75 < r["ceil_share_70b"] < r["ceil_share_8b"] < 0.85                # "81% 和 78%"
    # "最多再涨 23% 和 28%"：上限 / 装满时的吞吐 − 1，闭式
    w70 = 2 * (70_553_706_496 - 128256 * 8192)
    more8 = (3.35e12 / k8) / (238 / ((w8 + 238 * k8) / 3.35e12)) - 1
    more70 = (8 * 3.35e12 / k70) / (743 / ((w70 + 743 * k70) / (8 * 3.35e12))) - 1
    assert (round(more8 * 100), round(more70 * 100)) == (23, 28)
    assert 1 / r["ceil_share_8b"] - 1 == pytest.approx(more8, rel=1e-12)
    assert 1 / r["ceil_share_70b"] - 1 == pytest.approx(more70, rel=1e-12)


def test_01_batch_sweep_closed_form(s01, capsys):
    """演示 1 观察 1–3、5 的数：memory-bound 时 TPOT = (W + B·k) / BW，逐个闭式写出来（不调 llm_math）。"""
    r = s01.demo1_batch_sweep()
    capsys.readouterr()
    k8, k70 = 131072 * 2048, 327680 * 2048
    w8, w70 = 2 * (8_030_261_248 - 128256 * 4096), 2 * (70_553_706_496 - 128256 * 8192)
    t8 = {b: (w8 + b * k8) / 3.35e12 for b in (1, 64, 238)}
    assert r["tpot_8b_b64"] == pytest.approx(t8[64], rel=1e-12) and r["tpot_8b_bmax"] == pytest.approx(t8[238], rel=1e-12)
    assert round(t8[64] / t8[1], 2) == 2.11 and round(64 * t8[1] / t8[64], 1) == 30.4       # "×2.11"、"30.4 倍"
    assert round(238 * t8[1] / t8[238]) == 46 and round(t8[238] / t8[1], 1) == 5.2         # "46 倍"、"5.2 倍"
    assert r["kv_over_w_8b_bmax"] == pytest.approx(238 * k8 / w8, rel=1e-12) and round(238 * k8 / w8, 1) == 4.3
    t70 = {b: (w70 + b * k70) / (8 * 3.35e12) for b in (1, 743)}
    assert r["tpot_70b_b1"] == pytest.approx(t70[1], rel=1e-12) and r["tpot_70b_bmax"] == pytest.approx(t70[743], rel=1e-12)
    assert round(743 / t70[743]) == 31229


def test_03_only_network_rows_join_two_machines(s03, capsys):
    """issue 19 第 17 条：NVLink 4（同一台机器里的 GPU）和 PCIe（GPU 到它的主机）连不了 prefill 机和 decode 机；
    能连两台机器的是 InfiniBand 和以太网那几行。"""
    r = s03.demo2_transfer_vs_prefill()
    out = capsys.readouterr().out
    assert sorted(s03.INSIDE_ONE_MACHINE) == ["NVLink 4（H100 SXM5，每块 GPU）", "PCIe Gen5 x16"]
    assert r["across_machines"] == ["InfiniBand NDR（一个 400 Gb/s 端口）", "400 GbE 以太网", "100 GbE 以太网",
                                    "InfiniBand NDR × 每块 GPU 一个端口"]
    assert "NVLink 4、PCIe Gen5 x16 两行连不了两台机器" in out


def test_01_paging_is_not_a_cost_of_continuous_batching(s01, capsys):
    """issue 35 第 19 条：旧句子把"KV cache 要按页管理"算作连续批的代价。Orca 连续批时按请求预留连续空间；
    分页是 vLLM 对预留造成的碎片的办法（05/07 量碎片）。"""
    text = unwrap(script_demo_text(S01, 3))             # 演示 3 打印的文字：脚本自己那次运行的输出
    assert "连续批的代价是每步都要调度、KV cache 要按页管理" not in text
    assert "KV cache 按页管理不是连续批的代价：Orca 做连续批时给每个请求预留一段连续的 KV 空间" in text
    assert "07 脚本量了这些碎片" in text
    assert os.path.exists(os.path.join(ROOT, "lecture05", "07_paged_kv_cache.py"))

"""
=============================================================================
CS349E · 第 5 讲 · 02_prefill_decode_disagg.py —— prefill 和 decode 放在一起还是分开：互相干扰的账
=============================================================================

【这个脚本要回答的问题】
演示 1：干扰有多大：一次 prefill 插进正在 decode 的批里，批里每个用户要多等几步的时间；分块 prefill 把它摊薄成多少。
演示 2：一个模拟的工作负载（泊松到达、提示和输出长短不一），两块 GPU 三种用法：同机（prefill 优先）、同机（分块 prefill）、
解耦（一块只做 prefill、一块只做 decode，中间经网络搬 KV）：TTFT、TPOT、最长卡顿各是多少，负载升高时怎么变。

【怎么读输出】TTFT = 第一个 token 出来的时刻 − 请求到达的时刻；TPOT = (最后一个 token − 第一个 token) / (输出数 − 1)；
"最长卡顿" = 一个请求相邻两个 token 之间最长的等待（取所有请求里的第 99 百分位）——用户看到的"字突然停住"。

【模型的假设（务必看）】
Llama-3.1-8B，BF16 权重和 KV，每块 H100 SXM5 放一份完整的模型。每次迭代的时间是 roofline 下界（iteration_lab.iteration_time：
权重读一遍 + 读 KV，和 FLOPs / 峰值比取大者），没有调度、kernel 启动等开销（**假设**）。
工作负载（**假设**，种子固定）：400 个请求，泊松到达（每秒 4 / 10 / 16 个），提示长度在 [512, 4096) 均匀，
输出长度在 [64, 512) 均匀。同机：请求轮流分给两块 GPU；prefill 优先时一次 prefill 一个完整的提示，这次迭代不 decode；
分块 prefill 每次迭代 decode 所有序列并顺带 prefill 512 个提示 token（**假设**的块大小）。
解耦：prefill 机先来先服务，一次一个提示；KV 经一个 InfiniBand NDR 端口（单向 50 GB/s，见 hw_specs 的互联表）
搬到 decode 机；decode 机连续批处理。第一个 token 由 prefill 机给出。

【运行】python3 02_prefill_decode_disagg.py （约 1 秒）

【依赖】numpy；本目录的 iteration_lab（iteration_time、link_time）、workload_lab（poisson_arrivals、uniform_ints）、
disagg_lab（simulate_colocated、simulate_disaggregated）；../lecture01 的 console、hw_specs、llm_math。
"""
import math
import os
import sys
from dataclasses import replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_time, print_header, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from hw_specs import H100, IB_NDR  # noqa: E402
from llm_math import LLAMA31_8B  # noqa: E402
from disagg_lab import simulate_colocated, simulate_disaggregated  # noqa: E402
from iteration_lab import iteration_time, link_time  # noqa: E402
from workload_lab import poisson_arrivals, uniform_ints  # noqa: E402

# ---- 模型、硬件、工作负载（假设，见文件开头）----
MODEL, CHIP, LINK = LLAMA31_8B, H100, IB_NDR
N_REQ, RATES = 400, (4, 10, 16)                  # 请求数；每秒到达的请求数
PROMPT_RANGE, OUT_RANGE = (512, 4096), (64, 512)
SEED_ARRIVAL, SEED_PROMPT, SEED_OUT = 0, 1, 2
CHUNK = 512                                      # 分块 prefill 的块大小
DEMO1_BATCH, DEMO1_CONTEXT = 32, 2048            # 演示 1：正在 decode 的批


def kv_transfer_time(n_prompt):
    """解耦时一个请求的 KV cache（提示长度 n_prompt）经一个 NDR 端口搬过去的时间。"""
    return link_time(MODEL.kv_bytes(n_prompt), LINK)


# ---------------------------------------------------------------------------
# 演示 1：一次 prefill 让 decode 等多久
# ---------------------------------------------------------------------------
def demo1_interference():
    print_header(f"演示 1：一次 prefill 插进 decode 的批（{MODEL.name}，一块 H100；批 {DEMO1_BATCH} 个序列、上下文 {DEMO1_CONTEXT}）")
    ctx_sum = DEMO1_BATCH * DEMO1_CONTEXT
    t_dec = iteration_time(MODEL, CHIP, DEMO1_BATCH, ctx_sum)
    rows, out = [], {"t_dec": t_dec}
    for n in (512, 1024, 2048, 4096):
        t_pre = iteration_time(MODEL, CHIP, prefill_tokens=n)
        n_chunks = -(-n // CHUNK)
        t_mixed = [iteration_time(MODEL, CHIP, DEMO1_BATCH, ctx_sum, prefill_tokens=min(CHUNK, n - i * CHUNK),
                                  prefill_prefix=i * CHUNK) for i in range(n_chunks)]
        out[n] = {"t_pre": t_pre, "stall_steps": t_pre / t_dec, "chunks": n_chunks, "worst_mixed": max(t_mixed),
                  "extra_chunked": sum(t_mixed) - n_chunks * t_dec}
        rows.append([n, fmt_time(t_pre), f"{t_pre / t_dec:.1f}", n_chunks, fmt_time(max(t_mixed)),
                     f"{max(t_mixed) / t_dec:.2f}×", fmt_time(sum(t_mixed) - n_chunks * t_dec)])
    print(f"只 decode 一步：{fmt_time(t_dec)}（批里每个用户每 {fmt_time(t_dec)} 得到一个 token）")
    print_table(["提示 token", "整段 prefill", "≈ decode 步数", "块数", "最慢的混合步", "÷ 纯 decode",
                 "分块额外耗时"], rows)
    print(f"（块数：每块 {CHUNK} 个提示 token；混合步：decode 一步、顺带 prefill 一块；")
    print(" 分块额外耗时：所有混合步比纯 decode 步多出的时间之和）")
    p = out[4096]
    # 同一步只算一半：算力无限 -> 读字节的时间；带宽无限 -> 算力的时间（roofline 取两者的较大值）
    mem_only, flops_only = replace(CHIP, flops={"bf16": math.inf}), replace(CHIP, mem_bw=math.inf)
    last = dict(prefill_tokens=CHUNK, prefill_prefix=4096 - CHUNK)          # 最慢的混合步：最后一块
    out["dec_compute"] = iteration_time(MODEL, flops_only, DEMO1_BATCH, ctx_sum)
    out["worst_compute"] = iteration_time(MODEL, flops_only, DEMO1_BATCH, ctx_sum, **last)
    out["worst_bytes"] = iteration_time(MODEL, mem_only, DEMO1_BATCH, ctx_sum, **last)
    print_observations([
        f"整段 prefill 一个 4096 个 token 的提示要 {fmt_time(p['t_pre'])}，相当于 {p['stall_steps']:.1f} 步 decode："
        f"这段时间里批里的 {DEMO1_BATCH} 个用户一个 token 也拿不到——这就是同机部署里 prefill 对 TPOT 的干扰。",
        "反过来，如果让 decode 优先、prefill 排队，新请求的 TTFT 就要等——同一台机器上两个阶段在抢同一份时间。",
        f"分块 prefill（Sarathi）把它摊开：每步 decode 顺带算 {CHUNK} 个提示 token，最慢的一步 {fmt_time(p['worst_mixed'])}，"
        f"是纯 decode 步的 {p['worst_mixed'] / t_dec:.2f} 倍，不再是一次卡住 {p['stall_steps']:.1f} 步。"
        f"而且分块后 prefill 总共只多占 {fmt_time(p['extra_chunked'])}（整段要 {fmt_time(p['t_pre'])}）——这是 roofline 的账："
        "一步的时间取算力和读字节两者的较大值，两者完美重叠（假设）。纯 decode 一步只用 "
        f"{fmt_time(out['dec_compute'])} 的算力、读字节却要 {fmt_time(t_dec)}，闲着的算力装下了约 "
        f"{(1 - p['extra_chunked'] / p['t_pre']) * 100:.0f}% 的 prefill；{CHUNK} 个 token 的一块已经装不下，混合步受算力限制"
        f"（最慢的一步算 {fmt_time(out['worst_compute'])}、读 {fmt_time(out['worst_bytes'])}），多出来的就是那 "
        f"{fmt_time(p['extra_chunked'])}。真实的 kernel 做不到完美重叠，混合迭代也有额外开销（演示 2 观察 3），"
        f"所以 {(1 - p['extra_chunked'] / p['t_pre']) * 100:.0f}% 是这个模型给的上限。",
    ])
    return out


# ---------------------------------------------------------------------------
# 演示 2：模拟一个工作负载
# ---------------------------------------------------------------------------
def summarize(res):
    """一种部署的结果 → 几个汇总数（秒）。"""
    return {"ttft_mean": float(res["ttft"].mean()), "ttft_p90": float(np.percentile(res["ttft"], 90)),
            "tpot_mean": float(res["tpot"].mean()), "tpot_p90": float(np.percentile(res["tpot"], 90)),
            "gap_p99": float(np.percentile(res["max_gap"], 99)),
            "first_gap_is_max": float(np.mean(res["first_gap"] >= res["max_gap"])),
            "first_gap_mean": float(res["first_gap"].mean())}


def demo2_simulation():
    print_header(f"演示 2：两块 H100 的三种用法（{MODEL.name}，{N_REQ} 个请求，提示 {PROMPT_RANGE[0]}–{PROMPT_RANGE[1] - 1}，"
                 f"输出 {OUT_RANGE[0]}–{OUT_RANGE[1] - 1}）")
    prompts = uniform_ints(*PROMPT_RANGE, N_REQ, SEED_PROMPT)
    outs = uniform_ints(*OUT_RANGE, N_REQ, SEED_OUT)
    names = ("同机 ×2（prefill 优先）", f"同机 ×2（分块 prefill {CHUNK}）", "解耦：1 prefill + 1 decode")
    rows, out = [], {}
    for rate in RATES:
        arr = poisson_arrivals(rate, N_REQ, SEED_ARRIVAL)
        runs = (simulate_colocated(MODEL, CHIP, arr, prompts, outs, n_gpus=2),
                simulate_colocated(MODEL, CHIP, arr, prompts, outs, n_gpus=2, chunk=CHUNK),
                simulate_disaggregated(MODEL, CHIP, arr, prompts, outs, kv_transfer_time))
        for key, name, res in zip(("colo", "chunk", "disagg"), names, runs):
            s = summarize(res)
            out[(rate, key)] = s
            rows.append([rate, name, fmt_time(s["ttft_mean"]), fmt_time(s["ttft_p90"]), fmt_time(s["tpot_mean"]),
                         fmt_time(s["tpot_p90"]), fmt_time(s["gap_p99"])])
    print_table(["到达率 req/s", "部署", "TTFT 平均", "TTFT p90", "TPOT 平均", "TPOT p90", "最长卡顿 p99"], rows)
    hi, lo = RATES[-1], RATES[0]
    c, k, d = out[(hi, "colo")], out[(hi, "chunk")], out[(hi, "disagg")]
    kv_mean = kv_transfer_time(int(prompts.mean()))
    t_long = iteration_time(MODEL, CHIP, prefill_tokens=PROMPT_RANGE[1] - 1)
    out["kv_mean"], out["t_long"] = kv_mean, t_long
    tpot_word = "更低" if d["tpot_mean"] < c["tpot_mean"] else "不低"
    print_observations([
        f"同机、prefill 优先：TTFT 最短（{hi} req/s 时平均 {fmt_time(c['ttft_mean'])}），因为新请求一来就插队 prefill；"
        f"代价是所有正在 decode 的用户一起停下来等：最长卡顿（p99）{fmt_time(c['gap_p99'])}，"
        f"是最长的提示（{PROMPT_RANGE[1] - 1} 个 token）prefill 一次（{fmt_time(t_long)}）的 {c['gap_p99'] / t_long:.1f} 倍——几个 prefill 接连插队。"
        f"负载越高，平均 TPOT 从 {fmt_time(out[(lo, 'colo')]['tpot_mean'])}（{lo} req/s）涨到 {fmt_time(c['tpot_mean'])}："
        f"插队更频繁，在跑的序列也更多。后者不是 prefill 的错：解耦的 decode 机上没有 prefill，"
        "纯 decode 一步的时间只随批里的序列数和上下文变，"
        f"平均 TPOT 也从 {fmt_time(out[(lo, 'disagg')]['tpot_mean'])} 涨到 {fmt_time(d['tpot_mean'])}。",
        f"解耦：decode 机上没有 prefill。{hi} req/s 时 {d['first_gap_is_max'] * 100:.0f}% 的请求最长的一次等待就是第 1 个到第 2 个 token 之间"
        f"（平均 {fmt_time(d['first_gap_mean'])}：搬 KV——平均长度的提示 {fmt_time(kv_mean)}——再等 decode 机的下一步），"
        f"之后每步都是纯 decode；最长卡顿 p99 {fmt_time(d['gap_p99'])}；平均 TPOT {fmt_time(d['tpot_mean'])}，"
        f"比 prefill 优先的同机{tpot_word}"
        + (f"（{lo} req/s 时反而略高：{fmt_time(out[(lo, 'disagg')]['tpot_mean'])} vs "
           f"{fmt_time(out[(lo, 'colo')]['tpot_mean'])}——解耦只有一台 decode 机，所有请求的 decode 都挤在它上面，同机是两台分摊）"
           if out[(lo, "disagg")]["tpot_mean"] > out[(lo, "colo")]["tpot_mean"] else "")
        + f"。代价在 TTFT：所有 prefill 挤在一块 GPU 上排队，平均 {fmt_time(d['ttft_mean'])}、"
        f"p90 {fmt_time(d['ttft_p90'])}，负载越高排得越长——所以真实系统要按负载调 prefill 机和 decode 机的比例（DistServe）。",
        f"同机、分块 prefill：在这个只算 roofline 的模型里两头都不差（{hi} req/s 时 TTFT 平均 {fmt_time(k['ttft_mean'])}、"
        f"TPOT 平均 {fmt_time(k['tpot_mean'])}、最长卡顿 {fmt_time(k['gap_p99'])}），因为 decode 步的算力本来就闲着。"
        "它没算的是：混合迭代的 kernel 效率和调度开销（每块重读前面的 KV 已经算在里面）；而且两个阶段仍然只能用同一种硬件、"
        "同一种并行方式——"
        "解耦的真正好处是两边可以各选各的（第 1 讲 04、本讲 03–05）。",
    ])
    return out


if __name__ == "__main__":
    demo1_interference()
    save_results({"d2": demo2_simulation()})   # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数

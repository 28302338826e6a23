"""
=============================================================================
CS349E · 第 1 讲 · 03_prefill_vs_decode.py —— prefill 受算力限制，decode 受带宽限制
=============================================================================

【这个脚本要回答的问题】
演示 1：decode 一步（批里每个序列各生成一个 token）的时间下界随批大小怎么变：读权重、读 KV cache、计算各占多少。
演示 2：decode 在批多大时变成受算力限制——以及上下文一长，为什么永远到不了。
演示 3：prefill（一次处理整个提示）的时间下界随提示长度怎么变：几百个 token 以上就受算力限制。
演示 4：一个请求的 TTFT（第一个 token 的延迟）和 TPOT（之后每个 token 的间隔），以及批大小怎么在两者和吞吐之间取舍。

【怎么读输出】所有时间都是 roofline 下界：max(FLOPs / 峰值算力, 字节 / 带宽)，用 llm_math.decode_step /
prefill_step（= prefill_time 的分项）算。"受限于"一列说两项里哪一项大。模型是 Llama-3.1-8B，一块 H100 SXM5，
权重和 KV cache 都是 BF16——8B 的权重（16 GB）一块卡放得下，不用考虑多卡。

【模型的假设（务必看）】
- 下界假设算力和带宽跑到峰值、计算和访存完全重叠、没有 kernel 启动和调度开销；真实系统慢一些。
- prefill 只算读权重的字节（不算激活、写 KV cache），decode 算读权重和读全部 KV cache。
- 演示 4 的请求（提示 2048 个 token、输出 256 个）是**假设的**；批里其他序列和它处在同样的上下文长度（假设），
  TTFT 不含排队（假设：请求一到就 prefill，prefill 时没有别的工作）。
- H100 数字来自数据手册（3.35 TB/s、989.4 TFLOP/s BF16 稠密），见 hw_specs。

【运行】python3 03_prefill_vs_decode.py （< 1 秒）

【依赖】本目录的 console、hw_specs、llm_math。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import LLAMA31_70B, LLAMA31_8B, decode_step, prefill_step  # noqa: E402

MODEL, CHIP = LLAMA31_8B, H100
CONTEXT = 4096                        # 演示 1 的上下文长度
PROMPT, OUTPUT = 2048, 256            # 演示 4：一个请求的提示和输出长度（假设）
BOUND_ZH = {"compute": "算力", "memory": "带宽"}
NEVER = 1 << 40                       # 搜索批大小的上限：超过它就算"永远不会"


def fits(model, chip, batch, context):
    """权重 + batch 个序列的 KV cache（BF16）放不放得进一块 chip 的显存。"""
    return 2 * model.params() + batch * model.kv_bytes(context) <= chip.mem_bytes


def crossover_batch(model, chip, context):
    """decode 变成受算力限制的最小批大小（decode_step 的 bound == "compute"）；永远不会时返回 None。"""
    if decode_step(model, chip, NEVER, context)["bound"] == "memory":
        return None
    lo, hi = 1, NEVER                 # 不变式：hi 受算力限制；lo 之前的都受带宽限制
    if decode_step(model, chip, lo, context)["bound"] == "compute":
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if decode_step(model, chip, mid, context)["bound"] == "compute":
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------------------
# 演示 1：decode 一步的时间 vs 批大小
# ---------------------------------------------------------------------------
def demo1_decode_vs_batch():
    m, c = MODEL, CHIP
    print_header(f"演示 1：decode 一步的时间下界 vs 批大小（{m.name}，{c.name}，上下文 {CONTEXT}，BF16）")
    rows = []
    res = {}
    for b in (1, 4, 16, 64, 256, 1024):
        r = decode_step(m, c, b, CONTEXT)
        res[b] = r
        rows.append([b, fmt_time(r["t_compute"]), fmt_time(r["w_bytes"] / c.mem_bw), fmt_time(r["kv_bytes"] / c.mem_bw),
                     fmt_time(r["time"]), BOUND_ZH[r["bound"]], f"{b / r['time']:.0f}",
                     "是" if fits(m, c, b, CONTEXT) else "否"])
    print_table(["批大小 B", "计算", "读权重", "读 KV cache", "一步（下界）", "受限于", "吞吐 token/s", "显存放得下？"], rows)
    max_b = int((c.mem_bytes - 2 * m.params()) // m.kv_bytes(CONTEXT))
    t1, t64 = res[1]["time"], res[64]["time"]
    kv_eq = m.params() * 2 / m.kv_bytes(CONTEXT)
    print_observations([
        f"批大小 1：一步 {fmt_time(t1)}，几乎全是读权重（{fmt_bytes(res[1]['w_bytes'])} ÷ {fmt_bytes(c.mem_bw)}/s）；"
        f"计算只要 {fmt_time(res[1]['t_compute'])}，H100 的算力 {100 * res[1]['t_compute'] / t1:.2f}% 在干活。",
        f"批大小 64：一步 {fmt_time(t64)}，只比批大小 1 慢 {t64 / t1:.1f} 倍，吞吐却高 {64 * t1 / t64:.0f} 倍——权重读一遍被 64 个序列共用。",
        f"但 KV cache 不共用：每个序列读自己的 {fmt_bytes(m.kv_bytes(CONTEXT))}，批里有 {kv_eq:.0f} 个以上序列时读 KV 就比读权重还久"
        f"（B = 64 时 {fmt_time(res[64]['kv_bytes'] / c.mem_bw)} 对 {fmt_time(res[64]['w_bytes'] / c.mem_bw)}）。"
        f"所以在上下文 {CONTEXT} 时批再大也一直受带宽限制，吞吐涨到一定程度就涨不动了。",
        f"显存也有上限：{fmt_bytes(c.mem_bytes)} 减去 {fmt_bytes(2 * m.params())} 的权重，只够 {max_b} 个上下文 {CONTEXT} 的序列；表里更大的批只是算账，实际放不下。",
    ])
    return {"t_b1": t1, "t_b64": t64, "speedup_64": 64 * t1 / t64, "kv_eq_batch": kv_eq, "max_batch": max_b,
            "compute_share_b1": res[1]["t_compute"] / t1, "bounds": {b: r["bound"] for b, r in res.items()}}


# ---------------------------------------------------------------------------
# 演示 2：decode 什么时候变成受算力限制
# ---------------------------------------------------------------------------
def demo2_compute_bound_batch():
    print_header(f"演示 2：decode 变成受算力限制的最小批大小（{CHIP.name}，BF16；只看 roofline，不管显存放不放得下）")
    rows = []
    cross = {}
    for m in (LLAMA31_8B, LLAMA31_70B):
        for ctx in (0, 128, 256, 512, 1024, 4096, 32768):
            b = crossover_batch(m, CHIP, ctx)
            cross[(m.name, ctx)] = b
            if b is None:
                rows.append([m.name, ctx, "永远不会", "—"])
            else:
                rows.append([m.name, ctx, b, fmt_bytes(2 * m.params() + b * m.kv_bytes(ctx))])
    print_table(["模型", "上下文", "最小批大小", "那时的权重 + KV"], rows)

    limits = {}
    for m in (LLAMA31_8B, LLAMA31_70B):
        lo, hi = 0, 1 << 20           # 找"永远不会"开始的上下文：lo 能越过拐点、hi 不能
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if crossover_batch(m, CHIP, mid) is None:
                hi = mid
            else:
                lo = mid
        limits[m.name] = hi
    ridge = CHIP.ridge_point("bf16")
    b0 = cross[(LLAMA31_8B.name, 0)]
    print_observations([
        f"不算 KV（上下文 0）时，{LLAMA31_8B.name} 的 decode 在批大小 {b0} 时越过拐点——和 H100 的拐点 {ridge:.0f} FLOP/字节"
        f"差不多：BF16 时每个权重 2 字节、每个 token 对它做 2 FLOPs，强度 ≈ 批大小。",
        f"有了 KV cache 就不一样：批里每多一个序列，FLOPs 和读 KV 的字节一起增加，这部分的强度固定在 GQA 组大小"
        f"（8B 是 {LLAMA31_8B.group}，70B 是 {LLAMA31_70B.group}），远低于拐点。上下文到 {limits[LLAMA31_8B.name]}（8B）/ "
        f"{limits[LLAMA31_70B.name]}（70B）个 token 以后，批多大都越不过拐点。",
        f"所以\"decode 受带宽限制\"在长上下文时是硬的：加大批只能摊薄读权重，摊不薄读 KV。这正是第 2 讲的注意力强度、"
        f"第 5 讲的注意力 / FFN 解耦要处理的问题。",
    ])
    return {"crossover": cross, "never_from": limits, "b0_8b": b0, "ridge": ridge}


# ---------------------------------------------------------------------------
# 演示 3：prefill 的时间 vs 提示长度
# ---------------------------------------------------------------------------
def demo3_prefill_vs_length():
    m, c = MODEL, CHIP
    print_header(f"演示 3：prefill 的时间下界 vs 提示长度（{m.name}，{c.name}，BF16）")
    rows = []
    res = {}
    for n in (16, 64, 256, 512, 1024, 4096, 16384, 65536):
        r = prefill_step(m, c, n)
        res[n] = r
        rows.append([n, fmt_time(r["t_compute"]), fmt_time(r["t_memory"]), fmt_time(r["time"]), BOUND_ZH[r["bound"]],
                     f"{r['flops'] / r['w_bytes']:.0f}", fmt_time(r["time"] / n), f"{n / r['time']:.0f}"])
    print_table(["提示长度 n", "计算", "读权重", "prefill（下界）", "受限于", "强度 FLOP/B", "每 token", "token/s"], rows)
    n_cross = 1
    while prefill_step(m, c, n_cross)["bound"] == "memory":
        n_cross += 1
    r4k = res[4096]
    dec1 = decode_step(m, c, 1, 4096)["time"]
    attn_share = 1 - 2 * m.matmul_params() * 65536 / res[65536]["flops"]
    print_observations([
        f"提示长度 ≥ {n_cross} 个 token 时 prefill 受算力限制：所有 token 共用读一遍的权重，强度约等于提示长度。"
        f"更短的提示（比如多轮对话里新加的一句）也是读权重为主，和 decode 一样。",
        f"prefill 4096 个 token 要 {fmt_time(r4k['time'])}，每个 token {fmt_time(r4k['time'] / 4096)}；"
        f"decode 一个 token（批大小 1、上下文 4096）要 {fmt_time(dec1)}，贵 {dec1 / (r4k['time'] / 4096):.0f} 倍。"
        f"同样是一个 token，prefill 里用上了算力，decode 里大部分时间在等内存。",
        f"提示很长时注意力（和 n² 成正比）开始占大头：n = 65536 时它占 prefill FLOPs 的 {100 * attn_share:.0f}%，"
        f"每 token 的时间也从 {fmt_time(res[1024]['time'] / 1024)}（n = 1024）涨到 {fmt_time(res[65536]['time'] / 65536)}。",
    ])
    return {"n_cross": n_cross, "t_4096": r4k["time"], "decode_b1": dec1,
            "ratio_decode_prefill_per_token": dec1 / (r4k["time"] / 4096), "attn_share_64k": attn_share,
            "bounds": {n: r["bound"] for n, r in res.items()}}


# ---------------------------------------------------------------------------
# 演示 4：一个请求的 TTFT 和 TPOT
# ---------------------------------------------------------------------------
def demo4_ttft_tpot():
    m, c = MODEL, CHIP
    print_header(f"演示 4：一个请求（提示 {PROMPT}、输出 {OUTPUT} 个 token）的 TTFT 和 TPOT（{m.name}，{c.name}）")
    ttft = prefill_step(m, c, PROMPT)["time"]
    rows = []
    res = {}
    for b in (1, 8, 32, 64, 128):
        steps = [decode_step(m, c, b, PROMPT + i)["time"] for i in range(1, OUTPUT)]
        tpot = sum(steps) / len(steps)
        total = ttft + sum(steps)
        res[b] = {"tpot": tpot, "total": total, "throughput": b / tpot,
                  "fits": fits(m, c, b, PROMPT + OUTPUT)}
        rows.append([b, fmt_time(ttft), fmt_time(tpot), f"{1 / tpot:.0f}", fmt_time(total),
                     f"{100 * sum(steps) / total:.0f}%", f"{b / tpot:.0f}", "是" if res[b]["fits"] else "否"])
    print_table(["批大小 B", "TTFT", "TPOT（平均）", "每个用户 token/s", "整个请求", "decode 占", "总吞吐 token/s",
                 "显存放得下？"], rows)
    r1, r64 = res[1], res[64]
    print_observations([
        f"TTFT = prefill {PROMPT} 个 token = {fmt_time(ttft)}（受算力限制）；之后 {OUTPUT - 1} 个 token 每个约 {fmt_time(r1['tpot'])}"
        f"（批大小 1，受带宽限制）。prefill 处理的 token 是 decode 的 {PROMPT / (OUTPUT - 1):.0f} 倍，"
        f"时间却只占整个请求的 {100 * ttft / r1['total']:.0f}%。",
        f"批大小 64：TPOT 从 {fmt_time(r1['tpot'])} 变成 {fmt_time(r64['tpot'])}（慢 {r64['tpot'] / r1['tpot']:.1f} 倍），"
        f"总吞吐从 {r1['throughput']:.0f} 涨到 {r64['throughput']:.0f} token/s（{r64['throughput'] / r1['throughput']:.0f} 倍）。"
        f"服务端拿单个用户慢一些换多得多的吞吐；慢多少可以接受，是第 5 讲的话题。",
        f"TTFT 和 TPOT 由不同的资源决定：TTFT 靠算力，TPOT 靠带宽。两种工作挤在同一块卡上时还会互相拖慢"
        f"（插进来一个 {PROMPT} token 的 prefill，批里所有人的下一个 token 就要多等约 {fmt_time(ttft)}，"
        f"是 B = 64 时一个 TPOT 的 {ttft / r64['tpot']:.1f} 倍）——04 脚本讲把它们分开。",
    ])
    return {"ttft": ttft, "tpot_b1": r1["tpot"], "tpot_b64": r64["tpot"], "thr_b1": r1["throughput"],
            "thr_b64": r64["throughput"], "prefill_share_b1": ttft / r1["total"], "results": res}


if __name__ == "__main__":
    demo1_decode_vs_batch()
    demo2_compute_bound_batch()
    demo3_prefill_vs_length()
    demo4_ttft_tpot()

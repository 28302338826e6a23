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
decode 的"上下文 L"指新位置要看的位置数（**含它自己**），和 llm_math.decode_step 的口径一样。
演示 2 的两个拐点用 llm_math 的闭式：compute_bound_batch 给实数 B*，最小的受算力限制的整数批是 ⌈B*⌉；
critical_context 给实数 L*，能变成受算力限制的最长整数上下文是 ⌈L*⌉ − 1（第 2、5 讲用同样的口径）。
"显存放得下？"用 llm_math.max_batch（权重 + 批里所有序列的 KV cache ≤ 80 GB，不算激活）。

【模型的假设（务必看）】
- 下界假设算力和带宽跑到峰值、计算和访存完全重叠、没有 kernel 启动和调度开销；真实系统慢一些。
- prefill 只算读权重的字节（不算激活、写 KV cache），decode 算读权重和读全部 KV cache。
  prefill 的 lm_head 只算最后一个位置（生成第一个 token 只要它的 logits）。
- 演示 4 的请求（提示 2048 个 token、输出 256 个）是**假设的**；批里其他序列和它处在同样的上下文长度（假设），
  TTFT 不含排队（假设：请求一到就 prefill，prefill 时没有别的工作）。
- H100 数字来自数据手册（3.35 TB/s、989.4 TFLOP/s BF16 稠密），见 hw_specs。

【运行】python3 03_prefill_vs_decode.py （约 0.1 秒）

【依赖】本目录的 console、hw_specs、llm_math。
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import (LLAMA31_70B, LLAMA31_8B, compute_bound_batch, critical_context, decode_step,  # noqa: E402
                      max_batch, prefill_step, weight_bytes)

MODEL, CHIP = LLAMA31_8B, H100
CONTEXT = 4096                        # 演示 1 的上下文长度
PROMPT, OUTPUT = 2048, 256            # 演示 4：一个请求的提示和输出长度（假设）
BOUND_ZH = {"compute": "算力", "memory": "带宽"}
# ---------------------------------------------------------------------------
# 演示 1：decode 一步的时间 vs 批大小
# ---------------------------------------------------------------------------
def demo1_decode_vs_batch():
    m, c = MODEL, CHIP
    print_header(f"演示 1：decode 一步的时间下界 vs 批大小（{m.name}，{c.name}，上下文 {CONTEXT}，BF16）")
    max_b = max_batch(m, c, CONTEXT)
    rows = []
    res = {}
    for b in (1, 4, 16, 64, 256, 1024):
        r = decode_step(m, c, b, CONTEXT)
        res[b] = r
        rows.append([b, fmt_time(r["t_compute"]), fmt_time(r["w_bytes"] / c.mem_bw), fmt_time(r["kv_bytes"] / c.mem_bw),
                     fmt_time(r["time"]), BOUND_ZH[r["bound"]], f"{b / r['time']:.0f}", "是" if b <= max_b else "否"])
    print_table(["批大小 B", "计算", "读权重", "读 KV cache", "一步（下界）", "受限于", "吞吐 token/s", "显存放得下？"], rows)
    t1, t64 = res[1]["time"], res[64]["time"]
    w_step, kv_seq = res[1]["w_bytes"], res[1]["kv_bytes"]     # 每步读的权重；一个序列的 KV cache
    b_kv = math.floor(w_step / kv_seq) + 1                      # 读 KV 比读权重多的最小批：B·kv > w
    thr_cap = c.mem_bw / kv_seq                                 # B → ∞：B / ((w + B·kv) / 带宽) → 带宽 / kv
    print_observations([
        f"批大小 1：一步 {fmt_time(t1)}，几乎全是读权重（{fmt_bytes(w_step)} ÷ {fmt_bytes(c.mem_bw)}/s；"
        f"不含输入词嵌入，它是查表）；计算只要 {fmt_time(res[1]['t_compute'])}，H100 的算力 "
        f"{100 * res[1]['t_compute'] / t1:.2f}% 在干活。",
        f"批大小 64：一步 {fmt_time(t64)}，时间只是批大小 1 的 {t64 / t1:.1f} 倍，吞吐却是它的 {64 * t1 / t64:.0f} 倍——权重读一遍被 64 个序列共用。",
        f"但 KV cache 不共用：每个序列读自己的 {fmt_bytes(kv_seq)}。批里有 {b_kv} 个或更多序列时，KV 加起来就比"
        f"每步读的权重（{w_step / 1e9:.2f} GB）还多（{b_kv - 1} 个 {(b_kv - 1) * kv_seq / 1e9:.2f} GB，"
        f"{b_kv} 个 {b_kv * kv_seq / 1e9:.2f} GB），读 KV 比读权重还久（B = 64 时 "
        f"{fmt_time(res[64]['kv_bytes'] / c.mem_bw)} 对 {fmt_time(res[64]['w_bytes'] / c.mem_bw)}）。"
        f"每多一个序列，读 KV 多 {fmt_time(kv_seq / c.mem_bw)}，计算只多 {fmt_time(res[1]['t_compute'])}："
        f"所以在上下文 {CONTEXT} 时批再大也一直受带宽限制，吞吐趋于 带宽 ÷ 每个序列的 KV = {thr_cap:.0f} token/s"
        f"（B = 1024 时已经 {1024 / res[1024]['time']:.0f}），涨不动了。",
        f"显存也有上限：{fmt_bytes(c.mem_bytes)} 减去 {fmt_bytes(weight_bytes(m))} 的权重（这里含输入词嵌入），"
        f"只够 {max_b} 个上下文 {CONTEXT} 的序列；表里更大的批只是算账，实际放不下。",
    ])
    return {"t_b1": t1, "t_b64": t64, "speedup_64": 64 * t1 / t64, "kv_over_w_batch": b_kv, "max_batch": max_b,
            "compute_share_b1": res[1]["t_compute"] / t1, "bounds": {b: r["bound"] for b, r in res.items()},
            "throughput_cap": thr_cap, "kv_time_per_seq": kv_seq / c.mem_bw, "compute_per_seq": res[1]["t_compute"]}


# ---------------------------------------------------------------------------
# 演示 2：decode 什么时候变成受算力限制
# ---------------------------------------------------------------------------
def demo2_compute_bound_batch():
    print_header(f"演示 2：decode 变成受算力限制的最小批大小 ⌈B*⌉（{CHIP.name}，BF16；只看 roofline，不管显存放不放得下）")
    rows = []
    cross = {}
    for m in (LLAMA31_8B, LLAMA31_70B):
        for ctx in (0, 128, 256, 512, 1024, 4096, 32768):
            b_star = compute_bound_batch(m, CHIP, ctx)
            b = None if math.isinf(b_star) else math.ceil(b_star)
            cross[(m.name, ctx)] = b
            if b is None:
                rows.append([m.name, ctx, "永远不会", "—"])
            else:
                rows.append([m.name, ctx, b, fmt_bytes(weight_bytes(m) + b * m.kv_bytes(ctx))])
    print_table(["模型", "上下文 L", "最小批大小 ⌈B*⌉", "那时的权重 + KV"], rows)

    longest, b_edge = {}, {}
    for m in (LLAMA31_8B, LLAMA31_70B):
        L = math.ceil(critical_context(m, CHIP)) - 1          # 还能变成受算力限制的最长整数上下文
        longest[m.name] = L
        b_edge[m.name] = math.ceil(compute_bound_batch(m, CHIP, L))
    n8, n70 = LLAMA31_8B.name, LLAMA31_70B.name
    bmax_edge = max_batch(LLAMA31_8B, CHIP, longest[n8])
    ridge = CHIP.ridge_point("bf16")
    b0 = cross[(n8, 0)]
    print_observations([
        f"不算 KV（上下文 0）时，{n8} 的 decode 在批大小 {b0} 时越过拐点——和 H100 的拐点 {ridge:.0f} FLOP/字节"
        f"差不多：BF16 时每个权重 2 字节、每个 token 对它做 2 FLOPs，强度 ≈ 批大小。",
        f"有了 KV cache 就不一样：批里每多一个序列，FLOPs 和读 KV 的字节一起增加，这部分的强度固定在 GQA 组大小"
        f"（8B 是 {LLAMA31_8B.group}，70B 是 {LLAMA31_70B.group}），远低于拐点。能越过拐点的最长上下文是 "
        f"{longest[n8]}（8B）/ {longest[n70]}（70B）个 token，再长一个 token，批多大都越不过。"
        f"而且越靠近这个长度要的批越大：8B 在上下文 {longest[n8]} 时要 {b_edge[n8]:,} 个序列"
        f"（一块 H100 的显存只放得下 {bmax_edge:,} 个）。",
        f"所以\"decode 受带宽限制\"在长上下文时是硬的：加大批只能摊薄读权重，摊不薄读 KV。这正是第 2 讲的注意力强度、"
        f"第 5 讲的注意力 / FFN 解耦要处理的问题。",
    ])
    return {"crossover": cross, "longest_compute_ctx": longest, "batch_at_longest": b_edge,
            "max_batch_at_longest_8b": bmax_edge, "b0_8b": b0,
            "ridge": ridge}


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
    # 拐点是 295，越过它却要 n_cross 个 token：读的字节含 lm_head，它的 FLOPs 却只在最后一个位置算一次
    ridge = c.ridge_point("bf16")
    head = m.vocab * m.d_model                                   # lm_head 的参数
    body_share = (m.matmul_params() - head) / m.active_params()   # 强度 ≈ n × 这个比例（不算注意力）
    n_no_attn = (ridge * m.active_params() - head) / (m.matmul_params() - head)   # 只看矩阵乘时的临界 n（实数）
    r4k = res[4096]
    dec1 = decode_step(m, c, 1, 4096)["time"]
    n_long = 65536
    attn_long = 4 * m.n_heads * m.head_dim * m.n_layers * n_long * (n_long + 1) // 2   # 第 i 个位置看 i 个位置
    attn_share = attn_long / res[n_long]["flops"]
    print_observations([
        f"提示长度 ≥ {n_cross} 个 token 时 prefill 受算力限制：所有 token 共用读一遍的权重，强度随提示长度增长，约 {body_share:.2f} × n"
        f"（提示很长时注意力的 FLOPs 再把它往上推：n = {n_long} 时 {res[n_long]['flops'] / res[n_long]['w_bytes']:.0f}）。"
        f"更短的提示（比如多轮对话里新加的一句）也是读权重为主，和 decode 一样。"
        f"{n_cross} 比拐点 {ridge:.0f} 大，是因为读的字节里有 lm_head 的 {head / 1e6:.0f}M 个参数（{fmt_bytes(2 * head)}），"
        f"它的 FLOPs 却只在最后一个位置算一次：不算注意力时强度 = {body_share:.3f} × n + {head / m.active_params():.3f}，要 n ≥ {n_no_attn:.1f} 才够；"
        f"注意力的 FLOPs 再把它拉回到 {n_cross}。",
        f"prefill 4096 个 token 要 {fmt_time(r4k['time'])}，每个 token {fmt_time(r4k['time'] / 4096)}；"
        f"decode 一个 token（批大小 1、上下文 4096）要 {fmt_time(dec1)}，贵 {dec1 / (r4k['time'] / 4096):.0f} 倍。"
        f"同样是一个 token，prefill 里用上了算力，decode 里大部分时间在等内存。",
        f"提示很长时注意力（和 n² 成正比）开始占大头：n = {n_long} 时它占 prefill FLOPs 的 {100 * attn_share:.0f}%，"
        f"每 token 的时间也从 {fmt_time(res[1024]['time'] / 1024)}（n = 1024）涨到 {fmt_time(res[n_long]['time'] / n_long)}。",
    ])
    return {"n_cross": n_cross, "n_cross_no_attn": n_no_attn, "body_share": body_share, "t_4096": r4k["time"], "decode_b1": dec1,
            "ratio_decode_prefill_per_token": dec1 / (r4k["time"] / 4096), "attn_share_64k": attn_share,
            "bounds": {n: r["bound"] for n, r in res.items()}}


# ---------------------------------------------------------------------------
# 演示 4：一个请求的 TTFT 和 TPOT
# ---------------------------------------------------------------------------
def demo4_ttft_tpot():
    m, c = MODEL, CHIP
    print_header(f"演示 4：一个请求（提示 {PROMPT}、输出 {OUTPUT} 个 token）的 TTFT 和 TPOT（{m.name}，{c.name}）")
    pre = prefill_step(m, c, PROMPT)
    ttft = pre["time"]
    max_b = max_batch(m, c, PROMPT + OUTPUT)        # 请求结束时每个序列的 KV 最多
    rows = []
    res = {}
    for b in (1, 8, 32, 64, 128):
        steps = [decode_step(m, c, b, PROMPT + i)["time"] for i in range(1, OUTPUT)]
        tpot = sum(steps) / len(steps)
        total = ttft + sum(steps)
        res[b] = {"tpot": tpot, "total": total, "throughput": b / tpot, "fits": b <= max_b}
        rows.append([b, fmt_time(ttft), fmt_time(tpot), f"{1 / tpot:.0f}", fmt_time(total),
                     f"{100 * sum(steps) / total:.0f}%", f"{b / tpot:.0f}", "是" if res[b]["fits"] else "否"])
    print_table(["批大小 B", "TTFT", "TPOT（平均）", "每个用户 token/s", "整个请求", "decode 占", "总吞吐 token/s",
                 "显存放得下？"], rows)
    r1, r64 = res[1], res[64]
    b1_bounds = {decode_step(m, c, 1, PROMPT + i)["bound"] for i in (1, OUTPUT - 1)}   # 第一步和最后一步
    b1_bound = BOUND_ZH[b1_bounds.pop()] if len(b1_bounds) == 1 else "时而算力时而带宽"
    print_observations([
        f"TTFT = prefill {PROMPT} 个 token = {fmt_time(ttft)}（受{BOUND_ZH[pre['bound']]}限制）；之后 {OUTPUT - 1} 个 token "
        f"每个约 {fmt_time(r1['tpot'])}（批大小 1，受{b1_bound}限制）。prefill 处理的 token 是 decode 的 {PROMPT / (OUTPUT - 1):.0f} 倍，"
        f"时间却只占整个请求的 {100 * ttft / r1['total']:.0f}%。",
        f"批大小 64：TPOT 从 {fmt_time(r1['tpot'])} 变成 {fmt_time(r64['tpot'])}（是原来的 {r64['tpot'] / r1['tpot']:.1f} 倍），"
        f"总吞吐从 {r1['throughput']:.0f} 涨到 {r64['throughput']:.0f} token/s（{r64['throughput'] / r1['throughput']:.0f} 倍）。"
        f"服务端拿单个用户慢一些换多得多的吞吐；慢多少可以接受，是第 5 讲的话题。",
        f"TTFT 和 TPOT 由不同的资源决定：TTFT 靠算力，TPOT 靠带宽。两种工作挤在同一块卡上时还会互相拖慢"
        f"（一个 {PROMPT} token 的 prefill 整段插进来、不分块时，批里所有人的下一个 token 就要多等约 {fmt_time(ttft)}，"
        f"是 B = 64 时一个 TPOT 的 {ttft / r64['tpot']:.1f} 倍）——04 脚本比较把 prefill 分块拼进 decode 步和把两者分开。",
    ])
    return {"ttft": ttft, "ttft_bound": pre["bound"], "tpot_b1": r1["tpot"], "tpot_b64": r64["tpot"], "thr_b1": r1["throughput"],
            "thr_b64": r64["throughput"], "prefill_share_b1": ttft / r1["total"], "results": res}


if __name__ == "__main__":
    demo1_decode_vs_batch()
    demo2_compute_bound_batch()
    demo3_prefill_vs_length()
    demo4_ttft_tpot()

"""
=============================================================================
CS349E · 第 5 讲 · 01_batching_tradeoff.py —— 连续批处理：吞吐和每个 token 的延迟怎么换
=============================================================================

【这个脚本要回答的问题】
演示 1：decode 的批从 1 加到显存装得下的最大值：每步时间（= 每个用户看到的 TPOT）涨得很慢，吞吐几乎成倍涨——服务为什么总跑大批。
演示 2：批大到多少才变成 compute-bound（B*）？上下文一长，读 KV 的时间跟着批一起涨，B* 变大，甚至永远到不了。
演示 3：连续批处理 vs 静态批处理：同样的位置数，输出长短不一的请求，连续批把空出来的位置立刻补上：吞吐高多少，
每一步（TPOT）慢多少，请求的完成时间（平均、p90）怎么变。

【怎么读输出】"TPOT"是每步时间：这一步里每个序列多出一个 token 要等的时间；"吞吐" = 批大小 / 每步时间。
"受限于"：memory = 读权重和 KV 的时间比计算长（roofline，第 1 讲）。演示 1 的两张图把表里的两列画成曲线：
横轴是批大小（从 1 到显存装得下的最大批），纵轴分别是 TPOT 和吞吐，每个记号是一个模型。演示 3 的第二张表多看两种延迟：
按 token 加权的每步时间（用户平均每个 token 等多久），和请求的完成时间（含排队）。

【模型的假设（务必看）】
所有时间都是 roofline 下界（llm_math.decode_step 的口径：max(FLOPs / 峰值, 字节 / 带宽)），没有 kernel 启动、调度等固定开销；
权重和 KV cache 都是 BF16。Llama-3.1-8B 放在一块 H100 SXM5 上；Llama-3.1-70B 放在 8 块 H100 上，按**理想张量并行**
（带宽、容量、算力都乘 8，卡间通信不要钱——**假设**）。演示 1 里一批序列的上下文都按 2048 个位置算，演示 2 换着看（**假设**）；
"显存装得下的最大批"只算权重和 KV，不算激活和碎片（上界）。演示 3 的 512 个请求、提示 1024 个 token、
输出长度在 [16, 1024) 里均匀分布（种子固定）都是**假设的工作负载**；模拟里 prefill 不占时间，
观察 4 另算一次一个提示的 prefill 时间（llm_math.prefill_time）加到两边。硬件数字见 ../lecture01/hw_specs 的出处。

【运行】python3 01_batching_tradeoff.py （约 0.5 秒）

【依赖】numpy；本目录的 batching_lab（simulate_batching）、workload_lab（uniform_ints）；../lecture01 的 console、hw_specs（gang）、
llm_math（decode_step、max_batch、compute_bound_batch、critical_context、prefill_time）。
"""
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_time, print_header, print_observations, print_plot, print_table  # noqa: E402
from console import save_results  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import LLAMA31_70B, LLAMA31_8B, decode_step, prefill_time  # noqa: E402
from hw_specs import gang  # noqa: E402
from llm_math import compute_bound_batch, critical_context, max_batch  # noqa: E402
from batching_lab import simulate_batching  # noqa: E402
from workload_lab import uniform_ints  # noqa: E402

# ---- 部署和工作负载（假设，见文件开头）----
CONTEXT = 2048                                   # 演示 1、2：批里每个序列的上下文长度
SETUPS = ((LLAMA31_8B, H100), (LLAMA31_70B, gang(H100, 8)))
N_REQ, PROMPT, OUT_LO, OUT_HI, OUT_SEED = 512, 1024, 16, 1024, 1   # 演示 3 的工作负载


# ---------------------------------------------------------------------------
# 演示 1：批大小 → TPOT 和吞吐
# ---------------------------------------------------------------------------
def demo1_batch_sweep():
    print_header(f"演示 1：decode 的批大小 vs 每步时间（TPOT）和吞吐（上下文 {CONTEXT}，BF16，roofline 下界）")
    rows, out = [], {}
    for model, chip in SETUPS:
        bmax = max_batch(model, chip, CONTEXT)
        batches = [b for b in (1, 4, 16, 64, 128, 256, 512) if b < bmax] + [bmax]
        for b in batches:
            s = decode_step(model, chip, b, CONTEXT)
            rows.append([model.name, chip.name, b, fmt_time(s["time"]), f"{b / s['time']:,.0f}",
                         fmt_time(s["w_bytes"] / chip.mem_bw), fmt_time(s["kv_bytes"] / chip.mem_bw),
                         fmt_time(s["t_compute"]), s["bound"],
                         "最大" if b == bmax else ""])
            out[(model.name, b)] = s
        out[(model.name, "bmax")] = bmax
    print_table(["模型", "硬件", "批 B", "TPOT", "吞吐 tok/s", "读权重", "读 KV", "计算", "受限于", "显存"], rows)
    curves = {}
    for model, chip in SETUPS:                       # 画图用：从 1 到显存装得下的最大批，均匀取点
        bs = np.unique(np.round(np.linspace(1, out[(model.name, "bmax")], 36)).astype(int))
        steps = [decode_step(model, chip, int(b), CONTEXT)["time"] for b in bs]
        curves[f"{model.name}（{chip.name}）"] = (bs, np.array(steps))
    print()
    print_plot({k: (bs, t * 1e3) for k, (bs, t) in curves.items()}, "批大小 B", "TPOT（ms）", height=12)
    print()
    print_plot({k: (bs, bs / t / 1e3) for k, (bs, t) in curves.items()}, "批大小 B", "吞吐（千 token/s）",
               height=12)
    m8, m70 = LLAMA31_8B.name, LLAMA31_70B.name
    b8, b70 = out[(m8, "bmax")], out[(m70, "bmax")]
    t1, t64, tmax = out[(m8, 1)]["time"], out[(m8, 64)]["time"], out[(m8, b8)]["time"]
    r = {"tpot_8b_b1": t1, "tpot_8b_b64": t64, "tpot_8b_bmax": tmax, "bmax_8b": b8, "bmax_70b": b70,
         "thr_ratio_64": 64 * t1 / t64, "tpot_ratio_64": t64 / t1,
         "kv_over_w_8b_bmax": out[(m8, b8)]["kv_bytes"] / out[(m8, b8)]["w_bytes"],
         "thr_8b_bmax": b8 / tmax, "thr_8b_b1": 1 / t1,
         "tpot_70b_b1": out[(m70, 1)]["time"], "tpot_70b_bmax": out[(m70, b70)]["time"],
         "thr_70b_bmax": b70 / out[(m70, b70)]["time"],
         "all_memory_bound": all(v["bound"] == "memory" for k, v in out.items() if k[1] != "bmax")}
    # 吞吐的上限：memory-bound 时 TPOT = (W + B·k) / BW，B → ∞ 时 B / TPOT → BW / k（k：一个序列每步读的 KV 字节）
    ceil = {m.name: chip.mem_bw / (out[(m.name, 1)]["kv_bytes"]) for m, chip in SETUPS}
    r.update(ceil_8b=ceil[m8], ceil_70b=ceil[m70], ceil_share_8b=r["thr_8b_bmax"] / ceil[m8],
             ceil_share_70b=r["thr_70b_bmax"] / ceil[m70])
    print_observations([
        f"{m8}：批从 1 到 64，每步时间只从 {fmt_time(t1)} 涨到 {fmt_time(t64)}（×{r['tpot_ratio_64']:.2f}），"
        f"吞吐却是 B = 1 时的 {r['thr_ratio_64']:.1f} 倍。权重每步只读一遍，批里所有序列共用；每多一个序列只多读它自己的 KV。",
        f"这就是服务总跑大批的原因：每个用户的 TPOT 变慢的倍数远小于吞吐涨的倍数，而吞吐决定每个 token 的成本。"
        f"批 = 1 时 {r['thr_8b_b1']:,.0f} tok/s，显存装满（B = {b8}）时 {r['thr_8b_bmax']:,.0f} tok/s（{r['thr_8b_bmax'] / r['thr_8b_b1']:.0f} 倍），"
        f"TPOT 只从 {fmt_time(t1)} 变成 {fmt_time(tmax)}（{tmax / t1:.1f} 倍）。",
        f"批大了以后，读 KV 成了大头：B = {b8} 时 KV 字节是权重的 {r['kv_over_w_8b_bmax']:.1f} 倍。批最终被显存卡住（装 KV），"
        + ("不是被算力卡住：表里每一行都是 memory-bound，计算时间始终比读数据短。" if r["all_memory_bound"]
           else "有的行已经 compute-bound。"),
        f"两张图：TPOT 随 B 是一条直线（截距是读一遍权重，斜率是每个序列读自己的 KV），吞吐 = B / TPOT 越涨越慢，"
        f"趋向 带宽 / 每个序列的 KV 字节 这个上限：{m8} 是 {r['ceil_8b']:,.0f} tok/s，{m70}（8 卡）是 "
        f"{r['ceil_70b']:,.0f} tok/s。显存装满时分别到了上限的 {r['ceil_share_8b'] * 100:.0f}% 和 "
        f"{r['ceil_share_70b'] * 100:.0f}%：即使显存再大，再加批吞吐也最多再涨 {(1 / r['ceil_share_8b'] - 1) * 100:.0f}% 和 "
        f"{(1 / r['ceil_share_70b'] - 1) * 100:.0f}%。",
        f"{m70} 在 8 块 H100 上同理：B = 1 时 {fmt_time(r['tpot_70b_b1'])}，装满（B = {b70}）时 {fmt_time(r['tpot_70b_bmax'])}、"
        f"{r['thr_70b_bmax']:,.0f} tok/s。连续批处理（演示 3）的目的就是让批一直保持在这么大。",
    ])
    return r


# ---------------------------------------------------------------------------
# 演示 2：什么时候变成 compute-bound
# ---------------------------------------------------------------------------
def demo2_compute_bound():
    print_header("演示 2：批多大才 compute-bound？B* = (W/BW) / (f/P - k/BW)（f、k：每个序列每步的 FLOPs、KV 字节）")
    rows, out = [], {}
    contexts = (128, 256, 512, 1024, 2048, 8192)
    for model, chip in SETUPS:
        for L in contexts:
            bs = compute_bound_batch(model, chip, L)
            bm = max_batch(model, chip, L)
            reach = bs <= bm
            rows.append([model.name, chip.name, L, "永远到不了" if bs == math.inf else math.ceil(bs), bm,
                         "能" if reach else "不能"])
            out[(model.name, L)] = (bs, bm)
    print_table(["模型", "硬件", "上下文 L", "最小的\ncompute-bound 批 ⌈B*⌉", "显存装得下\n的最大批", "装得下吗"], rows)
    ridge = H100.ridge_point("bf16")
    lc8, lc70 = critical_context(LLAMA31_8B, SETUPS[0][1]), critical_context(LLAMA31_70B, SETUPS[1][1])
    b0 = compute_bound_batch(LLAMA31_8B, H100, 0)
    b128, b1024 = out[(LLAMA31_8B.name, 128)][0], out[(LLAMA31_70B.name, 1024)][0]
    r = {"ridge": ridge, "b0_8b": b0, "lc_8b": lc8, "lc_70b": lc70,
         "lmax_8b": math.ceil(lc8) - 1, "lmax_70b": math.ceil(lc70) - 1,
         "b128_8b": b128, "b1024_70b": b1024, "bm1024_70b": out[(LLAMA31_70B.name, 1024)][1],
         "nb128_8b": math.ceil(b128), "nb1024_70b": math.ceil(b1024)}
    print_observations([
        f"不读 KV 时（L → 0），B* = {b0:.1f}，几乎正好是 H100 的拐点 {ridge:.1f} FLOP/字节：BF16 权重每个参数 2 字节、"
        f"每个 token 2 FLOPs，投影和 FFN 的算术强度就等于批大小（第 2 讲）。表里给的是最小的 compute-bound 整数批 ⌈B*⌉。",
        f"KV 把 B* 往上推：注意力核心的强度只有 GQA 的组大小（8B 是 {LLAMA31_8B.group}、70B 是 {LLAMA31_70B.group}），远低于拐点，每加一个序列就多一份读 KV 的时间。"
        f"8B 在 L = 128 时批要到 {r['nb128_8b']} 才 compute-bound；70B 在 L = 1024 时要到 {r['nb1024_70b']}，"
        f"显存装得下 {r['bm1024_70b']} 个序列，{'还够得着' if r['nb1024_70b'] <= r['bm1024_70b'] else '已经够不着'}。",
        f"上下文到了临界长度 L*，分母变成 ≤ 0，批再大也到不了 compute-bound：8B 的 L* = {lc8:.2f}，70B（8 卡）的 L* = {lc70:.2f}；"
        f"能变成 compute-bound 的最长整数上下文是 ⌈L*⌉ - 1，分别是 {r['lmax_8b']} 和 {r['lmax_70b']}（llm_math.critical_context 的约定）。"
        "上下文比 L* 长的请求（8B 只要几百个 token），批再大 decode 也是 memory-bound，算力总有闲着的——"
        "这正是投机解码（第 6 讲）有闲置算力可用、以及把 decode 放到带宽更高的硬件上（04、05）有意义的原因。",
    ])
    return r


# ---------------------------------------------------------------------------
# 演示 3：静态批 vs 连续批
# ---------------------------------------------------------------------------
def demo3_continuous_batching():
    print_header(f"演示 3：静态批 vs 连续批（{LLAMA31_8B.name}，一块 H100；{N_REQ} 个请求同时到达，提示 {PROMPT}，"
                 f"输出 {OUT_LO}..{OUT_HI - 1}）")
    outs = uniform_ints(OUT_LO, OUT_HI, N_REQ, OUT_SEED)
    rows, rows_lat, res = [], [], {}
    for slots in (32, 128):
        for cont in (False, True):
            s = simulate_batching(LLAMA31_8B, H100, PROMPT, outs, slots, cont)
            done = np.asarray(s["finish"])
            s = dict(s, done_mean=float(done.mean()), done_p90=float(np.percentile(done, 90)))
            res[(slots, cont)] = s
            name = "连续批" if cont else "静态批"
            rows.append([slots, name, s["steps"], f"{s['mean_active']:.1f}", f"{s['time']:.1f} s",
                         f"{s['throughput']:,.0f}"])
            rows_lat.append([slots, name, fmt_time(s["tpot"]), fmt_time(s["tpot_token"]),
                             f"{s['done_mean']:.1f} s", f"{s['done_p90']:.1f} s"])
    print_table(["位置数", "做法", "迭代次数", "平均在算的序列", "总时间", "吞吐 tok/s"], rows)
    print()
    print_table(["位置数", "做法", "TPOT\n每步平均", "TPOT\n按 token 加权", "完成时间\n平均", "完成时间\np90"], rows_lat)
    print("（按 token 加权：每个 token 记产出它的那一步的时间，再对所有 token 平均。")
    print(" 完成时间：请求最后一个 token 出来的时刻；请求都在 0 时刻到达，所以含排队）")
    gain = {k: res[(k, True)]["throughput"] / res[(k, False)]["throughput"] for k in (32, 128)}
    t_pre = N_REQ * prefill_time(LLAMA31_8B, H100, PROMPT)          # 两种做法要 prefill 的提示一样多
    gain_pre = {k: (res[(k, False)]["time"] + t_pre) / (res[(k, True)]["time"] + t_pre) for k in (32, 128)}
    st, co, st32, co32 = res[(128, False)], res[(128, True)], res[(32, False)], res[(32, True)]
    r = {"gain_32": gain[32], "gain_128": gain[128], "tokens": int(outs.sum()),
         "t_prefill": t_pre, "gain_pre_32": gain_pre[32], "gain_pre_128": gain_pre[128],
         "active_static_128": st["mean_active"], "active_cont_128": co["mean_active"],
         "tpot_static_128": st["tpot"], "tpot_cont_128": co["tpot"],
         "tpot_tok": {k: v["tpot_token"] for k, v in res.items()},
         "tpot_step": {k: v["tpot"] for k, v in res.items()},
         "done_mean": {k: v["done_mean"] for k, v in res.items()},
         "done_p90": {k: v["done_p90"] for k, v in res.items()}}
    up = (co["tpot_token"] / st["tpot_token"] - 1) * 100
    up32 = (co32["tpot_token"] / st32["tpot_token"] - 1) * 100
    weighted_higher = all(v["tpot_token"] > v["tpot"] for v in res.values())
    print_observations([
        f"同样 128 个位置，静态批平均只有 {r['active_static_128']:.1f} 个序列在算：一组里先生成完的请求占着位置等最长的那个；"
        f"连续批平均 {r['active_cont_128']:.1f} 个，空出来的位置下一步就补上新请求"
        "（Orca，Yu et al., OSDI 2022 的迭代级调度：一次只排一步，而不是一次排一整批请求）。",
        f"吞吐因此是静态批的 {gain[128]:.2f} 倍（高 {(gain[128] - 1) * 100:.0f}%；32 个位置时 {gain[32]:.2f} 倍），"
        f"一共都是 {r['tokens']:,} 个 token。代价是每一步变慢：在算的序列多了，每步多读它们的 KV（演示 1）。"
        f"128 个位置时每步平均从 {fmt_time(st['tpot'])} 涨到 {fmt_time(co['tpot'])}"
        f"（+{(co['tpot'] / st['tpot'] - 1) * 100:.0f}%），按 token 加权从 {fmt_time(st['tpot_token'])} 涨到 "
        f"{fmt_time(co['tpot_token'])}（+{up:.0f}%；32 个位置时 +{up32:.0f}%）。"
        + ("按 token 加权的数每一行都比每步平均大：批大的步更慢、产出的 token 也更多，静态批尾巴上那些只剩几个序列的快步"
           "产出的 token 很少。" if weighted_higher else ""),
        f"但整个请求反而完成得更早：128 个位置时完成时间平均从 {st['done_mean']:.1f} s 降到 {co['done_mean']:.1f} s、"
        f"p90 从 {st['done_p90']:.1f} s 降到 {co['done_p90']:.1f} s；32 个位置时平均 {st32['done_mean']:.1f} s → "
        f"{co32['done_mean']:.1f} s、p90 {st32['done_p90']:.1f} s → {co32['done_p90']:.1f} s。"
        "静态批里后面的请求要排队等前一组里最长的那个做完才能开始；连续批一有空位就开始。"
        f"所以连续批不只是拿 TPOT 换吞吐：128 个位置时每个 token 平均慢 {up:.0f}%，整个请求的平均完成时间却短了 "
        f"{(1 - co['done_mean'] / st['done_mean']) * 100:.0f}%——迭代级调度既提高吞吐、又缩短请求的完成时间，"
        "这正是 Orca 的主要论点。",
        "对静态批有利的假设有两条：组里先完成的位置空着、不计算（真实的静态批常常照算填充的位置）；"
        "先完成的请求马上算完成（按请求调度的系统常常要等整批做完才一起返回）。"
        f"另一条假设——prefill 不占时间（完成时间里也没有它）——反而让吞吐的差距显得更大：两种做法要 prefill 的提示一样多（{N_REQ} 个 × "
        f"{PROMPT} 个 token，一次一个提示共 {fmt_time(t_pre)}），把它加到两边的总时间上，128 个位置时的倍数从 "
        f"{gain[128]:.2f} 降到 {gain_pre[128]:.2f}（32 个位置：{gain[32]:.2f} → {gain_pre[32]:.2f}）。"
        "连续批的代价是每步都要调度，以及新请求的 prefill 会插进 decode 里（02 脚本）。KV cache 按页管理不是连续批"
        "的代价：Orca 做连续批时给每个请求预留一段连续的 KV 空间；分页是 vLLM 为这种预留造成的碎片想的办法"
        "（PagedAttention，Kwon et al., SOSP 2023，拿 Orca 作按请求预留的基线），07 脚本量了这些碎片。",
    ])
    return r


if __name__ == "__main__":
    demo1_batch_sweep()
    demo2_compute_bound()
    save_results({"d3": demo3_continuous_batching()})   # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数

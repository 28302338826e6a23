"""
=============================================================================
CS349E · 第 5 讲 · 07_paged_kv_cache.py —— KV 内存去哪了：整段预留 vs 分页、共享前缀、FP8 KV
=============================================================================

【这个脚本要回答的问题】
演示 1：同一串请求、同一块 H100 上的 KV 内存（Llama-3.1-8B，BF16 KV），三种分配法：按服务上限整段预留、按"提示 +
这个请求的最大输出"预留、每 16 个 token 一块随用随分（vLLM 的 PagedAttention）：真 token 占了预留内存的多少，
同时能跑几个请求；分页剩下的浪费（每个请求最后那一块没填满的位置）有多少，块大小怎么影响它。
演示 2：共享前缀：所有请求开头是同一段 1500 个 token 的系统提示，满块共享、最后一块写时复制：省下多少内存，多跑几个请求。
演示 3：FP8 的 KV cache：每个 token 的字节减半，装得下的批和 roofline 上的 TPOT，和 BF16 并排比。

【怎么读输出】"真 token 占预留" = 每次迭代里存着真 token 的位置 / 分出去（预留或分了块）的位置，对所有迭代求和再相除；
"占整个 KV 池" = 真 token / 整块 KV 内存（论文图 2 的口径）。"并发" = 批里同时在跑的请求数。只统计队列里还有人在等的
那些迭代：那时内存是瓶颈，分配法决定批能多大。

【模型的假设（务必看）】
一块 H100 SXM5（80 GB，按十进制 GB），Llama-3.1-8B 的 BF16 权重（llm_math.weight_bytes，16.1 GB）之外全部给 KV cache，
激活和框架的占用不算（上限）；每个 token 的 KV 131,072 字节（BF16），FP8 减半（llm_math.kv_bytes_per_token）。
请求（**假设**，同本讲 02 的长度，种子固定）：600 个，全部在 t = 0 排队、先来先服务；提示长度在 [512, 4096) 均匀，
输出长度在 [64, 512) 均匀；每个请求声明的最大输出是 512（**假设**：取输出范围的上端）。服务的上下文上限 8192（**假设**，
不是模型的 131072）：第一种分配法给每个请求预留这么多。分页：16 个 token 一块（vLLM 的默认），水位线 1%（vLLM 的
默认），没块可分时把最后进来的请求挤出去重算（vLLM 的 recompute）。整段预留时内存按 token 数算，没有"外部碎片"
（对整段预留有利的假设：真实的连续分配还会留下放不下新请求的空洞）。共享前缀的系统提示 1500 个 token（**假设**），
加在每个请求的提示前面。TPOT 是 roofline 下界（llm_math.decode_step），批和上下文取模拟里的平均。
出处：vLLM / PagedAttention（Kwon et al., SOSP 2023, arXiv 2309.06180）图 2 和 §1 的数字，对照了 arXiv 正文的转录本；
"浪费不到 4%"出自 vLLM 的博客（2023-06-20，不是论文）：对照了博客在 GitHub 上的 markdown 原文；论文图 2 里 vLLM 的
96.3% 和它一致。

【运行】python3 07_paged_kv_cache.py （约 0.5 秒）

【依赖】numpy；本目录的 paging_lab（simulate_kv_allocation）、workload_lab（uniform_ints）；../lecture01 的 console、hw_specs、
llm_math（max_batch、weight_bytes、decode_step）。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_time, print_header, print_observations, print_table, save_results  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import LLAMA31_8B, decode_step, max_batch, weight_bytes  # noqa: E402
from paging_lab import simulate_kv_allocation  # noqa: E402
from workload_lab import uniform_ints  # noqa: E402

# ---- 模型、硬件、请求（假设，见文件开头）----
MODEL, CHIP = LLAMA31_8B, H100
N_REQ = 600
PROMPT_RANGE, OUT_RANGE = (512, 4096), (64, 512)
SEED_PROMPT, SEED_OUT = 1, 2
MAX_OUT = 512                                    # 每个请求声明的最大输出（假设）
SERVING_CAP = 8192                               # 服务的上下文上限（假设；模型本身是 131072）
BLOCK = 16                                       # vLLM 的默认块大小
BLOCK_SIZES = (8, 16, 32, 128)
SYSTEM_PROMPT = 1500                             # 共享的系统提示（假设）

PROMPTS = uniform_ints(*PROMPT_RANGE, N_REQ, SEED_PROMPT)
OUTS = uniform_ints(*OUT_RANGE, N_REQ, SEED_OUT)
# 上下文 1 时的最大批 = KV 内存能放多少个 token：(显存 − 权重) // 每个 token 的 KV 字节
CAP_BF16 = max_batch(MODEL, CHIP, 1)
CAP_FP8 = max_batch(MODEL, CHIP, 1, kv_bits=8)
# Kwon et al. 图 2：各系统的 KV 内存里存着真 token 的比例（%）
PAPER_TOKEN_STATES = (("Orca (Max)", 20.4), ("Orca (Pow2)", 26.8), ("Orca (Oracle)", 38.2), ("vLLM", 96.3))


# ---------------------------------------------------------------------------
# 演示 1：三种分配法
# ---------------------------------------------------------------------------
def demo1_allocators():
    print_header(f"演示 1：同一串请求、同一块 KV 内存（{MODEL.name}，一块 H100，BF16 KV：{CAP_BF16:,} 个 token 位置）")
    runs = (("按服务上限预留", f"{SERVING_CAP}", dict(policy="reserve", reserve=SERVING_CAP)),
            ("按提示 + 最大输出预留", f"提示 + {MAX_OUT}", dict(policy="reserve", reserve=PROMPTS + MAX_OUT)),
            (f"分页（{BLOCK} 个一块）", "随用随分", dict(policy="paged", block=BLOCK)))
    rows, out = [], {}
    for name, per_req, kw in runs:
        s = simulate_kv_allocation(PROMPTS, OUTS, CAP_BF16, **kw)
        out[name] = s
        rows.append([name, per_req, f"{s['used_frac']:.1%}", f"{s['pool_frac']:.1%}", f"{s['mean_running']:.0f}",
                     s["max_running"], s["preempted"]])
    print_table(["分配法", "每个请求占", "真 token 占预留", "占整个 KV 池", "平均并发", "最多并发", "挤出重算"], rows)
    print()
    sizes = {}
    for b in BLOCK_SIZES:
        s = simulate_kv_allocation(PROMPTS, OUTS, CAP_BF16, "paged", block=b)
        sizes[b] = s
    print_table(["块大小（token）", "最后一块空着（占已分配）", "每个请求平均空几个", "(块 − 1)/2", "平均并发"],
                [[b, f"{s['waste_frac']:.2%}", f"{s['mean_waste']:.1f}",
                  f"{(b - 1) / 2:g}", f"{s['mean_running']:.0f}"] for b, s in sizes.items()])
    cap, mx, pg = (out[n] for n, _, _ in runs)
    paper = "、".join(f"{n} {v}%" for n, v in PAPER_TOKEN_STATES)
    r = {"runs": out, "sizes": sizes, "gain_paged_vs_cap": pg["mean_running"] / cap["mean_running"],
         "gain_paged_vs_maxout": pg["mean_running"] / mx["mean_running"], "mean_out": float(OUTS.mean()),
         "mean_prompt": float(PROMPTS.mean())}
    print_observations([
        f"按服务上限预留（每个请求 {SERVING_CAP} 个位置，假设的服务上限）：只有 {cap['used_frac']:.1%} 的预留内存存着真 token，"
        f"批只有 {cap['max_running']} 个请求。在跑的请求平均只存 {cap['mean_tokens']:.0f} 个 token，其余大多是它永远用不到的长度"
        f"（内部碎片）。按提示 + 最大输出预留好得多（{mx['used_frac']:.1%}），剩下的浪费是还没生成、"
        f"以及最终也不会生成的输出位置（平均输出 {r['mean_out']:.0f}，却按假设的最大输出 {MAX_OUT} 留）。",
        f"分页随用随分：{pg['used_frac']:.2%} 的已分配位置存着真 token，平均并发 {pg['mean_running']:.0f}，"
        f"是按上限预留的 {r['gain_paged_vs_cap']:.1f} 倍、按最大输出预留的 {r['gain_paged_vs_maxout']:.2f} 倍。"
        f"代价是内存会被挤满：{pg['preempted']} 次要把最后进来的请求挤出去重算（这里不计它的时间）。",
        f"分页剩下的浪费只在每个请求的最后一块：{BLOCK} 个一块时占已分配位置的 {pg['waste_frac']:.2%}，平均每个请求空着约 "
        f"(块 − 1)/2 个位置（上面第二张表：最后一块里的 token 数近似均匀分布）。块越大浪费越多，但 {BLOCK_SIZES[-1]} 个一块也只有 "
        f"{sizes[BLOCK_SIZES[-1]]['waste_frac']:.1%}——因为这里在跑的请求平均存着 {pg['mean_tokens']:.0f} 个 token（{BLOCK} 个一块时；"
        "在跑的是哪些请求随分配法变，所以和观察 1 的数不同），比一块大得多。",
        f"和论文比（Kwon et al. 图 2，KV 内存里存着真 token 的比例）：{paper}；§1 的说法是现有系统只有 20.4%–38.2%，"
        "vLLM 的博客说浪费不到 4%。这里按上限预留是 "
        f"{cap['pool_frac']:.1%}（占整个 KV 池）、分页是 {pg['pool_frac']:.1%}，方向和量级一致。数字不同有两个原因："
        f"一是长度分布——这里提示平均 {r['mean_prompt']:.0f}、输出平均 {r['mean_out']:.0f}，提示占了大头，预留给输出的浪费相对小；"
        "二是这里没有外部碎片（论文里 Orca 的外部碎片和其他占 8.9%–41.6%）。",
    ])
    return r


# ---------------------------------------------------------------------------
# 演示 2：共享前缀
# ---------------------------------------------------------------------------
def demo2_prefix_sharing():
    print_header(f"演示 2：所有请求开头是同一段 {SYSTEM_PROMPT} 个 token 的系统提示（分页，{BLOCK} 个一块）")
    prompts = PROMPTS + SYSTEM_PROMPT
    base = simulate_kv_allocation(prompts, OUTS, CAP_BF16, "paged", block=BLOCK)
    shared = simulate_kv_allocation(prompts, OUTS, CAP_BF16, "paged", block=BLOCK, shared_prefix=SYSTEM_PROMPT)
    full = SYSTEM_PROMPT // BLOCK
    rows = [["各存一份", f"{base['mean_running']:.0f}", base["max_running"], f"{base['mean_tokens']:.0f}", "—"],
            ["满块共享、最后一块写时复制", f"{shared['mean_running']:.0f}", shared["max_running"],
             f"{shared['mean_tokens']:.0f}", fmt_bytes(shared["saved_tokens"] * MODEL.kv_bytes_per_token())]]
    print_table(["系统提示的 KV", "平均并发", "最多并发", "每个请求的上下文", "平均省下"], rows)
    r = {"base": base, "shared": shared, "gain": shared["mean_running"] / base["mean_running"], "full_blocks": full,
         "copied": SYSTEM_PROMPT - full * BLOCK,
         "saved_bytes": shared["saved_tokens"] * MODEL.kv_bytes_per_token(),
         "per_request_bytes": full * BLOCK * MODEL.kv_bytes_per_token()}
    print_observations([
        f"{SYSTEM_PROMPT} 个 token 的系统提示是 {full} 个满块加一个装了 {r['copied']} 个 token 的块。满块所有请求共用一份"
        f"（引用计数）；最后那一块每个请求都要接着往里写自己的 token，所以各复制一份（写时复制）。每多一个请求省下 "
        f"{full} × {BLOCK} 个位置 = {fmt_bytes(r['per_request_bytes'])}。",
        f"批里平均 {shared['mean_running']:.0f} 个请求时，平均省下 {fmt_bytes(r['saved_bytes'])}——省下的内存又装进了更多请求："
        f"平均并发从 {base['mean_running']:.0f} 到 {shared['mean_running']:.0f}（{r['gain']:.2f} 倍）。"
        "整段预留做不到这一点：每个请求的 KV 在自己那一段连续内存里，没法指向别人的块。",
    ])
    return r


# ---------------------------------------------------------------------------
# 演示 3：FP8 的 KV cache
# ---------------------------------------------------------------------------
def demo3_fp8_kv():
    print_header(f"演示 3：FP8 的 KV cache（{MODEL.name}，一块 H100，分页 {BLOCK} 个一块）")
    rows, out = [], {}
    for name, bits, cap in (("BF16", 16, CAP_BF16), ("FP8", 8, CAP_FP8)):
        s = simulate_kv_allocation(PROMPTS, OUTS, cap, "paged", block=BLOCK)
        ctx = round(s["mean_tokens"])
        batch = round(s["mean_running"])
        step = decode_step(MODEL, CHIP, batch, ctx, kv_bits=bits)
        closed = max_batch(MODEL, CHIP, ctx, kv_bits=bits)
        out[name] = {"sim": s, "cap": cap, "batch": batch, "ctx": ctx, "tpot": step["time"], "closed": closed,
                     "throughput": batch / step["time"],
                     "free": 1 - s["pool_frac"] / s["used_frac"], "last_block": s["pool_frac"] / s["used_frac"] - s["pool_frac"],
                     "kv_share": step["kv_bytes"] / (step["kv_bytes"] + step["w_bytes"])}
        rows.append([name, fmt_bytes(MODEL.kv_bytes_per_token(bits / 8)), f"{cap:,}", closed, batch, ctx,
                     fmt_time(step["time"]), f"{batch / step['time']:,.0f}"])
    bf, f8 = out["BF16"], out["FP8"]
    same = decode_step(MODEL, CHIP, bf["batch"], bf["ctx"], kv_bits=8)["time"]
    print_table(["KV 格式", "每个 token", "能放的 token", "max_batch\n（平均上下文）", "平均并发", "平均上下文", "TPOT",
                 "吞吐 tok/s"], rows)
    r = {"bf16": bf, "fp8": f8, "batch_gain": f8["batch"] / bf["batch"], "tpot_fp8_same_batch": same,
         "weights": weight_bytes(MODEL)}
    print_observations([
        f"权重占 {fmt_bytes(r['weights'])}，剩下的都给 KV：BF16 能放 {bf['cap']:,} 个 token，FP8 {f8['cap']:,} 个（两倍，"
        f"各自向下取整）。平均并发从 {bf['batch']} 到 {f8['batch']}（{r['batch_gain']:.2f} 倍），比按平均上下文算的闭式 "
        f"max_batch（{bf['closed']} 和 {f8['closed']}）少 {1 - bf['batch'] / bf['closed']:.1%} 和 "
        f"{1 - f8['batch'] / f8['closed']:.1%}（两边都取了整）。不取整：真 token 占 KV 池的 {bf['sim']['pool_frac']:.1%} 和 "
        f"{f8['sim']['pool_frac']:.1%}，其余是放新请求时留的 1% 水位线（平均空着 {bf['free']:.1%} 和 {f8['free']:.1%}）"
        f"和每个请求最后一块的空位（{bf['last_block']:.1%} 和 {f8['last_block']:.1%}）。",
        f"TPOT：批里 KV 的字节没变（请求多了一倍、每个 token 小了一半），每步读的字节差不多，TPOT 几乎不变（{fmt_time(bf['tpot'])} "
        f"和 {fmt_time(f8['tpot'])}，差 {abs(f8['tpot'] / bf['tpot'] - 1):.1%}），吞吐却是 {f8['throughput'] / bf['throughput']:.2f} 倍。"
        f"反过来保持 {bf['batch']} 个请求不变，FP8 让每步少读一半 KV：TPOT 从 {fmt_time(bf['tpot'])} 降到 {fmt_time(same)}"
        f"（BF16 时 KV 占每步读的字节的 {bf['kv_share']:.0%}）。",
        "FP8 的 KV 对输出质量的影响是第 3 讲的事；这里只算内存和带宽。",
    ])
    return r


if __name__ == "__main__":
    save_results({"demo1_allocators": demo1_allocators(), "demo2_prefix_sharing": demo2_prefix_sharing(),
                  "demo3_fp8_kv": demo3_fp8_kv()})    # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数

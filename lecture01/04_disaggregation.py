"""
=============================================================================
CS349E · 第 1 讲 · 04_disaggregation.py —— 按算术强度分工：prefill 和 decode 想要不同的硬件
=============================================================================

【这个脚本要回答的问题】
演示 1：prefill 和 decode 的算术强度，和每块芯片的 roofline 拐点比：一个远在拐点之上，一个远在拐点之下。
演示 2：同样换一块芯片，prefill 和 decode 各快多少——"比较优势"：拐点低的芯片相对更适合 decode。
演示 3：分开的代价之一：prefill 做完要把 KV cache 搬到 decode 的机器，经不同的互联要多久（加上协调开销）；
只看 Llama-3.1-8B 一个例子，更多模型、更长的提示和"逐层边算边发"见第 5 讲 03_kv_transfer.py。
演示 4：一笔总账：同一块卡上混着跑（prefill 单独占一步 / 分块拼进 decode 步）vs 分开跑（同种卡 / decode 换成
带宽更高的卡）的 TTFT、TPOT 和每块卡的吞吐；分开买到的是什么（不是 roofline 上的吞吐）。
整个脚本说的是一句话：**按算术强度把计算分给最合适的硬件，代价是搬数据和协调**（Splitwise，Patel 等，
ISCA 2024，arXiv 2311.18677，把两个阶段放到不同的机器上；DistServe，Zhong 等，OSDI 2024，arXiv 2401.09670）。

【怎么读输出】时间都是 roofline 下界（llm_math.decode_step / prefill_step）。强度 = FLOPs / 读的字节；
"用上的算力" = min(1, 强度 / 拐点)。

【模型的假设（务必看）】
- 演示 1 用 Llama-3.1-70B 的形状，只比较强度（与芯片无关）；演示 2–4 用 Llama-3.1-8B，它一块卡放得下。
  权重和 KV 都是 BF16。请求：提示 4096 个 token、输出 256 个（假设）；decode 批大小 64（假设）。
- 协调开销（调度、建立传输、通知 decode 端）每个请求 1 ms：**假设值**，真实系统从几百微秒到几毫秒不等。
- 互联带宽取单向带宽（hw_specs 末尾的互联表：NVLink 4 每块 GPU 450 GB/s、InfiniBand NDR 50 GB/s、
  PCIe Gen5 x16 64 GB/s、100 GbE 12.5 GB/s），假设能跑满、没有协议开销；演示 4 默认走 InfiniBand NDR（假设）。
- 交接时间 = KV 字节 / 单向带宽 + 协调开销（handoff_time；整份 KV 等 prefill 算完再一次发出，不和 prefill 重叠——
  最朴素的做法，是上界）。prefill 的 lm_head 只算最后一个位置（llm_math.prefill_step）。
- 演示 4 有两种"同机"：不分块是最朴素的做法，prefill 单独占一步、不和 decode 拼在一起；分块（chunked prefill，
  Sarathi）把每个提示切成 输出数 ÷ 批大小 = 256 ÷ 64 = 4 块（每块 1024 个 token），每个 decode 步顺带做一块
  （llm_math.mixed_step：一步 = max(两部分的 FLOPs 之和 / 算力, 两部分的字节之和 / 带宽)，两种资源完全重叠，
  是下界；第 5 讲 02 用同一个式子模拟）。两种都假设一个新请求平均要等半个 decode 步才开始它的 prefill；
  批里各序列的上下文均匀分布在 4096..4352 之间，decode 一步按平均上下文算（受带宽限制时这是精确的平均）；
  prefill 卡的台数可以是小数（一个 prefill 池被很多 decode 卡共用，假设）；功耗按板卡功耗满载算（假设）。

【出处】芯片和互联：hw_specs（数据手册）；模型结构：llm_math（config.json、模型卡）；"H100 做 prefill、A100 做 decode"：
Splitwise（Patel et al., ISCA 2024, arXiv 2311.18677）的 Splitwise-HA 设计。

【运行】python3 04_disaggregation.py （约 0.1 秒）

【依赖】本目录的 console、hw_specs（芯片和互联表）、llm_math。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import (A100, B200, CORSAIR, ETH_100G, H100, H100_PCIE, H200, IB_NDR, NVLINK4,  # noqa: E402
                      PCIE5_X16)
from llm_math import LLAMA31_70B, LLAMA31_8B, decode_step, mixed_step, prefill_step  # noqa: E402

GPUS = (A100, H100_PCIE, H100, H200, B200)
LINKS = (NVLINK4, PCIE5_X16, IB_NDR, ETH_100G)
PROMPT, OUTPUT, BATCH = 4096, 256, 64      # 请求和 decode 批大小（假设）
COORD = 1e-3                               # 每个请求的协调开销（假设）
MODEL = LLAMA31_8B
BOUND_ZH = {"compute": "算力", "memory": "带宽"}


def short(chip):
    """表头里的芯片短名。"""
    return {"H100 SXM5": "H100", "H100 PCIe": "H100 PCIe", "H200 SXM": "H200", "A100 80GB SXM": "A100",
            "B200": "B200"}[chip.name]


def link_short(link):
    """表头里的互联短名。"""
    return link.name.split("（")[0]


def handoff_time(kv_bytes, link):
    """把一个请求的 KV cache 从 prefill 机交给 decode 机要多久（秒）= 字节 / 单向带宽 + 协调开销 COORD（假设）。"""
    return kv_bytes / link.bw + COORD


def mean_decode_step(model, chip, batch=BATCH):
    """decode 一步：批里的上下文均匀分布在 PROMPT..PROMPT+OUTPUT，按平均上下文算（见文件开头的假设）。"""
    return decode_step(model, chip, batch, PROMPT + OUTPUT // 2)


# ---------------------------------------------------------------------------
# 演示 1：两个阶段的强度 vs 拐点
# ---------------------------------------------------------------------------
def demo1_intensity_vs_ridge():
    m = LLAMA31_70B
    print_header(f"演示 1：prefill 和 decode 的算术强度 vs 各芯片的拐点（{m.name}，BF16，decode 上下文 {PROMPT}）")
    cases = []
    for n in (512, 4096):
        r = prefill_step(m, H100, n)
        cases.append((f"prefill，提示 {n}", r["flops"] / r["w_bytes"]))
    for b in (1, 16, 64, 256):
        r = decode_step(m, H100, b, PROMPT)
        cases.append((f"decode，批 {b}", r["flops"] / (r["w_bytes"] + r["kv_bytes"])))
    rows = []
    for name, i in cases:
        rows.append([name, f"{i:.1f}"] + [f"{BOUND_ZH['compute' if i >= c.ridge_point('bf16') else 'memory']} "
                                          f"{100 * min(1.0, i / c.ridge_point('bf16')):.3g}%" for c in GPUS])
    print("每块芯片一列（表头里是它的拐点，FLOP/B）：受什么限制、用上峰值算力的百分之几")
    print_table(["阶段", "强度\nFLOP/B"] + [f"{short(c)}\n拐点 {c.ridge_point('bf16'):.0f}" for c in GPUS], rows)
    intens = dict(cases)
    i_pre = intens[f"prefill，提示 {PROMPT}"]
    i_dec = intens["decode，批 64"]
    i_dec256 = intens["decode，批 256"]
    util = i_dec / H100.ridge_point("bf16")
    i_lim = m.flops_per_token(PROMPT) / m.kv_bytes(PROMPT)      # B → ∞：权重摊薄到 0，只剩每个序列自己的账
    min_ratio = min(i_pre / c.ridge_point("bf16") for c in GPUS)
    print_observations([
        f"prefill {PROMPT} 个 token 的强度是 {i_pre:.0f} FLOP/字节，至少是每块 GPU 拐点的 {min_ratio:.1f} 倍：它要的是算力。",
        f"decode 批 64、上下文 {PROMPT} 的强度只有 {i_dec:.1f}：在 H100 上只用上 {100 * util:.1f}% 的算力；批加到 256 也只有 "
        f"{i_dec256:.1f}：每多一个序列都带来它自己的 KV 字节（KV 这部分的强度只有 GQA 组大小 {m.group}），"
        f"批再大，整步的强度也只趋于 {i_lim:.0f}（每个序列的 FLOPs ÷ 它的 KV 字节），低于每块 GPU 的拐点。"
        f"它要的是带宽（和放 KV 的容量）。",
        f"一步只做一种工作时，总有一种资源闲着：prefill 时带宽闲着，decode 时算力闲着；把 prefill 切成块拼进 decode 步"
        f"（分块 prefill）时，一步里两样都用上（演示 4）。拐点只有 {CORSAIR.ridge_point('mxint8'):.0f}（MXINT8）的 SRAM 芯片是 decode 型工作的极端（第 5 讲）。",
    ])
    return {"i_prefill": i_pre, "i_decode64": i_dec, "i_decode256": i_dec256, "h100_util_decode64": util,
            "min_ratio_prefill": min_ratio, "i_decode_limit": i_lim,
            "group": m.group}


# ---------------------------------------------------------------------------
# 演示 2：比较优势
# ---------------------------------------------------------------------------
def demo2_comparative_advantage():
    m = MODEL
    print_header(f"演示 2：换一块芯片，prefill 和 decode 各快多少（{m.name}；prefill {PROMPT} token；"
                 f"decode 批 {BATCH}）")
    base_pre = prefill_step(m, H100, PROMPT)["time"]
    base_dec = mean_decode_step(m, H100)["time"]
    rows = []
    res = {}
    for c in GPUS:
        tp, td = prefill_step(m, c, PROMPT)["time"], mean_decode_step(m, c)["time"]
        sp, sd = base_pre / tp, base_dec / td
        res[short(c)] = {"prefill": tp, "decode": td, "sp_pre": sp, "sp_dec": sd, "adv": sd / sp}
        rows.append([c.name, fmt_time(tp), f"{sp:.2f}×", fmt_time(td), f"{sd:.2f}×", f"{sd / sp:.2f}",
                     f"{H100.ridge_point('bf16') / c.ridge_point('bf16'):.2f}"])
    print_table(["芯片", "prefill", "相对\nH100", "decode\n一步", "相对\nH100", "decode 优势\n（两者之比）",
                 "H100 拐点 ÷\n本芯片拐点"], rows)
    print()
    print_table(["芯片", "功耗 W", "prefill token/s/W", "decode token/s/W"],
                [[c.name, f"{c.power_w:.0f}", f"{PROMPT / res[short(c)]['prefill'] / c.power_w:.0f}",
                  f"{BATCH / res[short(c)]['decode'] / c.power_w:.2f}"] for c in GPUS])
    a, h = res["A100"], res["H200"]
    power = {short(c): c.power_w for c in GPUS}
    best_pre = max(res, key=lambda k: PROMPT / res[k]["prefill"] / power[k])
    best_dec = max(res, key=lambda k: BATCH / res[k]["decode"] / power[k])
    best_adv = max(res, key=lambda k: res[k]["adv"])
    per_w = {k: (PROMPT / res[k]["prefill"] / power[k], BATCH / res[k]["decode"] / power[k]) for k in res}
    a_vs_h = (per_w["A100"][0] / per_w["H100"][0], per_w["A100"][1] / per_w["H100"][1])   # A100 每瓦 ÷ H100 每瓦
    beaten = [c.name for c in GPUS if per_w[short(c)][1] < per_w["A100"][1]]              # decode 每瓦比 A100 低的卡
    better = sorted((c for c in GPUS if per_w[short(c)][1] > per_w["A100"][1]),             # 比 A100 高的卡，高的在前
                    key=lambda c: -per_w[short(c)][1])
    print_observations([
        f"prefill 受算力限制，快多少看算力之比；decode 受带宽限制，看带宽之比。两者之比（\"decode 优势\"）"
        f"正好是拐点之比：拐点越低的芯片，相对越适合 decode。",
        f"H200 和 H100 算力相同：prefill {h['sp_pre']:.2f}×，decode 却快 {h['sp_dec']:.2f}×——H200 多出来的带宽只在 decode 时有回报。"
        f"A100 的 prefill 只有 H100 的 {a['sp_pre']:.2f}×，decode 还有 {a['sp_dec']:.2f}×：和 H100 比，A100 在 decode 上落后得少得多"
        f"（Splitwise 论文（arXiv 2311.18677）的 Splitwise-HA 就是 H100 做 prefill、A100 做 decode）。",
        f"按功耗算，prefill 每瓦最好的是 {best_pre}（{per_w[best_pre][0]:.0f}），decode 每瓦最好的是 {best_dec}"
        f"（{per_w[best_dec][1]:.2f}）{'：新一代芯片可以两样都最好' if best_pre == best_dec else ''}。"
        f"\"decode 优势\"回答的是另一个问题：一块卡两样工作里哪一样相对更强，不是谁的 decode 最省电。"
        f"decode 优势最大的是 {best_adv}（{res[best_adv]['adv']:.2f}），可它 decode 每瓦只有 {per_w['A100'][1]:.2f}，"
        f"不如 {'、'.join(f'{c.name}（{per_w[short(c)][1]:.2f}）' for c in better)}，表里只比 {'、'.join(beaten)} 高："
        f"每瓦 decode 是 H100 SXM5 的 {a_vs_h[1]:.2f}×，prefill 只有 {a_vs_h[0]:.2f}×。所以已经有 A100 和 H100 时，让 A100 做 decode、"
        "H100 做 prefill；要新买卡，按每瓦看是另一个答案。",
    ])
    res["best_prefill_per_w"], res["best_decode_per_w"], res["best_adv"] = best_pre, best_dec, best_adv
    res["per_w"], res["a100_vs_h100_per_w"] = per_w, a_vs_h
    res["decode_per_w_above_a100"], res["decode_per_w_below_a100"] = [short(c) for c in better], beaten
    return res


# ---------------------------------------------------------------------------
# 演示 3：搬 KV cache 的代价
# ---------------------------------------------------------------------------
def demo3_kv_transfer():
    m = MODEL
    kv = m.kv_bytes(PROMPT)
    tp = prefill_step(m, H100, PROMPT)["time"]
    print_header(f"演示 3：分开的代价——搬 KV cache（{m.name}，提示 {PROMPT} token，{fmt_bytes(kv)}）+ 协调 "
                 f"{fmt_time(COORD)}（假设）")
    rows = []
    res = {}
    for lk in LINKS:
        t = handoff_time(kv, lk)
        res[link_short(lk)] = t / tp
        rows.append([link_short(lk), f"{fmt_bytes(lk.bw)}/s", fmt_time(kv / lk.bw), fmt_time(t), f"{100 * t / tp:.0f}%"])
    print_table(["互联", "单向带宽", "搬 KV", "搬 KV + 协调", f"占 prefill（{fmt_time(tp)}，1 块 H100）的比例"], rows)
    t_ib = kv / IB_NDR.bw
    print_observations([
        f"{m.name} 的 {fmt_bytes(kv)} KV cache 经 InfiniBand NDR 要 {fmt_time(t_ib)}，加上协调是 prefill 时间的 "
        f"{100 * res['InfiniBand NDR']:.0f}%；经 100 GbE 要 {100 * res['100 GbE 以太网']:.0f}%，"
        f"在同一台机器里经 NVLink 只要 {100 * res['NVLink 4']:.0f}%。",
        "这段时间直接加在 TTFT 上（演示 4 就这么算）；真实系统可以按层边算边传（Splitwise，arXiv 2311.18677），"
        "把它大部分藏在 prefill 后面。"
        "其他模型（70B；gpt-oss-120b 每 token 的 KV 本来就小，滑动窗口再让长提示的 KV 减半）和更长的提示见第 5 讲 03_kv_transfer.py。",
    ])
    return {"ratio": res, "t_ib": t_ib, "kv_bytes": kv, "t_prefill": tp}


# ---------------------------------------------------------------------------
# 演示 4：总账
# ---------------------------------------------------------------------------
def demo4_ledger():
    m = MODEL
    print_header(f"演示 4：总账（{m.name}；提示 {PROMPT}、输出 {OUTPUT}；decode 批 {BATCH}；"
                 f"KV 经 InfiniBand NDR + 协调 {fmt_time(COORD)}）")
    t_pre = prefill_step(m, H100, PROMPT)["time"]
    t_kv = handoff_time(m.kv_bytes(PROMPT), IB_NDR)
    rows = []
    res = {}
    # 同机：每个请求在它的 OUTPUT 步里要插进一次 prefill；一个批 BATCH 个请求 → 平均每步多 BATCH/OUTPUT 次 prefill
    t_dec = mean_decode_step(m, H100)["time"]
    tpot = t_dec + BATCH / OUTPUT * t_pre
    thr = BATCH / tpot
    res["colocated"] = {"ttft": t_pre + t_dec / 2, "tpot": tpot, "worst": t_dec + t_pre, "gpus": 1.0,
                        "thr_per_gpu": thr, "thr_per_kw": thr / (H100.power_w / 1e3)}
    rows.append(["同机，不分块", fmt_time(t_pre + t_dec / 2), fmt_time(tpot), fmt_time(t_dec + t_pre),
                 "1", f"{thr:.0f}", f"{thr / (H100.power_w / 1e3):.0f}"])
    # 同机分块：每步顺带 prefill BATCH/OUTPUT 个提示 = 一个提示的一块；一个提示分 n_chunks 块、占 n_chunks 个相邻的步
    n_chunks, chunk = OUTPUT // BATCH, PROMPT * BATCH // OUTPUT
    mixed = [mixed_step(m, H100, BATCH, PROMPT + OUTPUT // 2, chunk, i * chunk) for i in range(n_chunks)]
    steps = [r["time"] for r in mixed]
    t_mix = sum(steps) / n_chunks                           # 每一步都在做某个提示的某一块，平均一步
    thr = BATCH / t_mix
    res["chunked"] = {"ttft": t_mix / 2 + sum(steps), "tpot": t_mix, "worst": max(steps), "gpus": 1.0,
                      "thr_per_gpu": thr, "thr_per_kw": thr / (H100.power_w / 1e3), "chunks": n_chunks,
                      "chunk": chunk, "steps": steps,
                      "all_compute_bound": all(r["bound"] == "compute" for r in mixed)}
    rows.append([f"同机，分块 {chunk}", fmt_time(t_mix / 2 + sum(steps)), fmt_time(t_mix), fmt_time(max(steps)),
                 "1", f"{thr:.0f}", f"{thr / (H100.power_w / 1e3):.0f}"])
    for dec_chip in (H100, H200, A100):
        t_dec = mean_decode_step(m, dec_chip)["time"]
        rate = BATCH / (OUTPUT * t_dec)                     # 每块 decode 卡每秒完成的请求
        n_pre = rate * t_pre                                # 需要的 prefill 卡（可以是小数）
        thr = BATCH / t_dec
        key = f"H100→{short(dec_chip)}"
        watts = dec_chip.power_w + n_pre * H100.power_w
        res[key] = {"ttft": t_pre + t_kv, "tpot": t_dec, "worst": t_dec, "gpus": 1 + n_pre,
                    "thr_per_gpu": thr / (1 + n_pre), "thr_per_kw": thr / (watts / 1e3), "n_prefill": n_pre}
        rows.append([f"分开 H100 → {short(dec_chip)}", fmt_time(t_pre + t_kv), fmt_time(t_dec),
                     fmt_time(t_dec), f"1 + {n_pre:.2f}", f"{thr / (1 + n_pre):.0f}", f"{thr / (watts / 1e3):.0f}"])
    print("同机：一块 H100 既 prefill 又 decode（不分块：prefill 单独占一步；")
    print(f"      分块：每个 decode 步顺带 prefill 一个提示的 {chunk} 个 token）；分开：prefill 卡 → decode 卡")
    print("卡数 = 1 块 decode 卡 + 配给它的 prefill 卡（可以是小数）")
    print_table(["部署", "TTFT", "平均\nTPOT", "最长的\ntoken 间隔", "卡数\ndecode + prefill", "每块卡\ntoken/s",
                 "每 kW\ntoken/s"], rows)
    co, ck, hh, h2, a1 = res["colocated"], res["chunked"], res["H100→H100"], res["H100→H200"], res["H100→A100"]
    disagg = ("H100→H100", "H100→H200", "H100→A100")
    best_key = max(disagg, key=lambda k: res[k]["thr_per_gpu"])
    best_dis, best_dis_kw = res[best_key], max((res[k] for k in disagg), key=lambda r: r["thr_per_kw"])
    print_observations([
        f"同机不分块时，每个请求的 prefill（{fmt_time(t_pre)}）都插在别人的 decode 之间：平均 TPOT 从纯 decode 的 "
        f"{fmt_time(hh['tpot'])} 涨到 {fmt_time(co['tpot'])}，碰上 prefill 的那一步要等 {fmt_time(co['worst'])}。"
        f"分开后 TPOT 稳定在 {fmt_time(hh['tpot'])}。",
        f"代价：prefill 之后多了搬 KV 和协调的 {fmt_time(t_kv)}（同机的新请求也要先等半个 decode 步，"
        f"所以表里的 TTFT 只比不分块的同机多 {fmt_time(hh['ttft'] - co['ttft'])}）；还要配 {hh['n_prefill']:.2f} 块 prefill 卡"
        f"给每块 decode 卡。同一种卡分开跑，每块卡的吞吐 {hh['thr_per_gpu']:.0f} 和不分块同机的 {co['thr_per_gpu']:.0f} "
        f"token/s 一样——在 roofline 的账上两者恒等（每个 token 摊到的 decode 时间和 prefill 时间都没变）："
        f"两种做法每一步都只用上一种资源。",
        f"分块 prefill 让一步同时用上两种资源：一步 = max(FLOPs 之和 / 算力, 字节之和 / 带宽)，decode 闲着的算力拿来做 "
        f"prefill，平均一步只要 {fmt_time(ck['tpot'])}（最长 {fmt_time(ck['worst'])}{'，每一步都受算力限制' if ck['all_compute_bound'] else ''}），"
        f"每块卡 {ck['thr_per_gpu']:.0f} token/s，是同种卡分开跑的 {ck['thr_per_gpu'] / hh['thr_per_gpu']:.2f}×，"
        f"也高于表里每一种分开跑（最好的是 {best_key.replace('→', ' → ')}，{best_dis['thr_per_gpu']:.0f}）；"
        f"每 kW {ck['thr_per_kw']:.0f} token/s，同样高于每一种分开跑（最好 {best_dis_kw['thr_per_kw']:.0f}）。"
        f"这是 roofline 给的吞吐上限：两种资源在一步里完全重叠，真实 kernel 做不到（第 5 讲 02 用同一个式子算分块 prefill）。",
        f"所以在 roofline 的账上，分开买到的不是吞吐，而是别的：decode 步里不再有 prefill（TPOT {fmt_time(hh['tpot'])}，"
        f"分块同机 {fmt_time(ck['tpot'])}）；TTFT 和 TPOT 可以分开调（两个池各自的卡数、批大小、并行方式）；"
        f"两个阶段可以用不同的卡：decode 换成 H200（带宽 ×{H200.mem_bw / H100.mem_bw:.2f}），TPOT 降到 "
        f"{fmt_time(h2['tpot'])}，每块卡 {h2['thr_per_gpu']:.0f} token/s，"
        f"比不分块的同机多 {100 * (h2['thr_per_gpu'] / co['thr_per_gpu'] - 1):.0f}%；decode 放在旧的 A100 上，每块卡只有 "
        f"{a1['thr_per_gpu']:.0f} token/s，但每 kW 有 {a1['thr_per_kw']:.0f}，比不分块同机的 {co['thr_per_kw']:.0f} 高。"
        f"这就是本脚本的一句话：按算术强度把计算分给最合适的硬件，代价是搬数据和协调。",
    ])
    res["best_disagg"], res["best_disagg_thr"] = best_key, best_dis["thr_per_gpu"]
    res["best_disagg_kw"] = best_dis_kw["thr_per_kw"]
    return res


if __name__ == "__main__":
    demo1_intensity_vs_ridge()
    demo2_comparative_advantage()
    demo3_kv_transfer()
    demo4_ledger()

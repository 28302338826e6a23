"""
=============================================================================
CS349E · 第 3 讲 · 02_quantized_model_quality.py —— 量化以后，模型还是原来那个模型吗
=============================================================================

【这个脚本要回答的问题】
01 看的是"权重差了多少"。这里看"模型的输出差了多少"：把第 3 讲的 QCFG 模型按各种方案量化，
在原模型自己采样的文本上逐位置比较两个模型给出的下一个 token 的分布。
演示 1：只量化 transformer 块里的 7 个矩阵（lm_head 保持原样）：KL(p_原 ‖ p_量化)、top-1 一致率、样本的困惑度；
        MXFP4 比 INT4-g32 差，差在元素的格子（E2M1）还是 scale（E8M0）——两个对照方案各只换一处，再加 NVFP4。
演示 2：lm_head 也量化时，同样三个指标怎么变；只量化 lm_head 的 KL 和只量化块的比一比（这个模型上的份额）。
演示 3：这些差别显著吗——方案两两之间的配对差值和它的抽样误差（以序列为单位估计），以及为什么 KL 比 top-1 和困惑度更可靠。

【怎么读输出】
- KL(p_原 ‖ p_量化) = Σ_x p_原(x) · (log p_原(x) − log p_量化(x))，每个位置算一个，再对所有位置取平均（单位 nats）。
  它是"在原模型的分布下，量化模型平均多'惊讶'多少"；0 表示两个分布一模一样。
- top-1 一致率：两个模型概率最大的 token 相同的位置占多少。
- 困惑度 = exp(样本 token 的平均负对数似然)。样本是原模型采的，所以 log(量化模型的困惑度 / 原模型的困惑度)
  是平均 KL 的一个**无偏但有噪声**的估计（只用了抽中的那一个 token，而 KL 用了整个分布）。

【模型的假设（务必看）】
- 模型是第 3 讲的随机小模型 QCFG（词表 192、d_model 64、4 层，float64；见 ../lecture03/quant_lab），
  不是训练出来的语言模型：它的权重近似高斯分布，没有真实 LLM 权重和激活里的离群值，所以这里的误差
  比真实模型上的**偏小、偏整齐**（离群值的问题见 01 和 07）。
- "文本"是原模型在温度 1 下自己采样的 32 条 × 128 个 token（quant_lab.sample_tokens，seed 0）；
  每条序列的前 127 个位置各预测下一个 token，共 4064 个位置。
- 只有权重被量化（再反量化成 float64 来算），激活仍是 float64：这是"只量化权重"（weight-only）的误差。
  词嵌入（查表）和 RMSNorm 的权重不量化。
- 演示 1 的对照方案在这个脚本里量化（numfmt）："E2M1 + FP16 scale" 每 32 个一个 FP16 scale = max|v| / 6（4.5 位，
  和 INT4-g32 一样）；NVFP4 = E2M1 + 每 16 个一个 E4M3 scale + 整个张量一个 FP32 scale（4.5 位，张量 scale 摊下来忽略）。
- 演示 3 的抽样误差把 32 条序列当成 32 个独立样本（同一条序列里的位置可能相关，所以不按位置数算）。

【运行】python3 02_quantized_model_quality.py （约 2 秒）

【依赖】numpy；本目录的 quant_lab（QCFG、LAYER_MATRICES、quantize_params、sample_tokens）；
../prereq3 的 numfmt（FP4_E2M1、FP16、round_to、quantize_nvfp4：演示 1 的对照方案）；
../lecture02 的 transformer_lab（NumpyTransformer、init_params）；../lecture06 的 decode_lab（acceptance_beta）；
../lecture01 的 console、hw_specs（H100 的 FP8 / INT8 峰值）。
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "lecture06", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import print_header, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from decode_lab import acceptance_beta  # noqa: E402
from hw_specs import H100  # noqa: E402
from numfmt import quantize_e2m1_fp16, quantize_nvfp4  # noqa: E402
from quant_lab import LAYER_MATRICES, QCFG, quantize_params, sample_tokens  # noqa: E402
from transformer_lab import NumpyTransformer, init_params  # noqa: E402

# ---- 实验的设定（样本的多少是选的，不是事实）----
N_SEQ, LENGTH, TEXT_SEED = 32, 128, 0
# QCFG 的 d_model = 64，所以 int4-g128 用不了（输入维 64 不能被 128 整除）；int4-g64 对输入维为 64 的矩阵就是每通道
SCHEMES = ("int8", "fp8-e4m3", "int4", "int4-g64", "int4-g32", "mxfp4")
INT4_FAMILY = ("int4", "int4-g64", "int4-g32")
NAME_ZH = {"int8": "INT8 每通道", "fp8-e4m3": "FP8 每通道", "int4": "INT4 每通道",
           "int4-g64": "INT4-g64", "int4-g32": "INT4-g32", "mxfp4": "MXFP4"}


# MXFP4 为什么比 INT4-g32 差：把"元素的格子"和"scale"两处不同拆开的对照方案（只量化块，lm_head 不动）
# 名字 -> (每个矩阵的量化函数, 每个数的位数（含 scale）)
FP4_CONTROLS = {
    "e2m1-fp16-g32": (lambda w: quantize_e2m1_fp16(w)[0], 4 + 16 / 32),
    "nvfp4": (lambda w: quantize_nvfp4(w)[0], 4 + 8 / 16),     # E4M3 scale 每 16 个；整个张量的 FP32 scale 摊下来忽略
}


# 演示 1 第二张表：每个方案的元素格式和 scale
FP4_PARTS = {"int4-g32": ("INT4-g32", "INT4 等间距", "FP16 / 32 个"),
             "e2m1-fp16-g32": ("E2M1 + FP16 scale", "E2M1", "FP16 / 32 个"),
             "mxfp4": ("MXFP4", "E2M1", "E8M0 / 32 个"), "nvfp4": ("NVFP4", "E2M1", "E4M3 / 16 个")}


def quantize_blocks(P, fn):
    """块里的 7 个矩阵都换成 fn(矩阵)（lm_head、词嵌入不动）-> (Pq, 各矩阵相对误差的平均)。"""
    Pq = dict(P)
    Pq["layers"] = [dict(L, **{m: fn(L[m]) for m in LAYER_MATRICES}) for L in P["layers"]]
    errs = [np.linalg.norm(Lq[m] - L[m]) / np.linalg.norm(L[m]) for L, Lq in zip(P["layers"], Pq["layers"])
            for m in LAYER_MATRICES]
    return Pq, float(np.mean(errs))


def log_softmax(logits):  # [..., V] -> [..., V]
    """数值稳定的 log softmax：logits − logsumexp(logits)。"""
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def position_metrics(logp_orig, logp_quant, toks):
    """
    逐位置的指标 -> dict：kl、agree（top-1 是否相同，0/1）、nll（样本的下一个 token 在量化模型下的负对数似然）、
    overlap = Σ_x min(p_原(x), p_量化(x))（decode_lab.acceptance_beta：= 1 − 总变差距离；第 6 讲拿它当草稿时，
    它的平均就是接受率 α）、
    margin = 原模型第一名和第二名的对数概率之差。

    【参数】logp_*：[n_seq, len, V] 的对数概率；toks：[n_seq, len]。只用前 len − 1 个位置（它们的下一个 token 在样本里）。
    【推导】KL(p ‖ q) = Σ_x p(x) (log p(x) − log q(x))；形状都是 [n_seq, len − 1]。
    """
    lp, lq = logp_orig[:, :-1], logp_quant[:, :-1]
    p, q = np.exp(lp), np.exp(lq)
    kl = (p * (lp - lq)).sum(axis=-1)
    agree = (lp.argmax(axis=-1) == lq.argmax(axis=-1)).astype(np.float64)
    nll = -np.take_along_axis(lq, toks[:, 1:, None], axis=-1)[..., 0]
    top2 = np.sort(lp, axis=-1)[..., -2:]
    return {"kl": kl, "agree": agree, "nll": nll, "overlap": acceptance_beta(p, q),
            "margin": top2[..., 1] - top2[..., 0]}


def final_hidden(P, toks):  # [n_seq, len] -> [n_seq, len, d_model]
    """
    最后一个 RMSNorm 之后的隐藏状态 h（logits = h @ lm_head）。

    【做法】把 lm_head 换成 d_model × d_model 的单位矩阵再前向：输出就是 h 本身。lm_head 量化与否，块里的计算完全一样，
    所以每个方案只前向一次，再分别乘原来的和量化的 lm_head（省一半时间）。
    """
    Ph = dict(P)
    Ph["lm_head"] = np.eye(QCFG.d_model)
    return NumpyTransformer(Ph, QCFG).forward(toks)


def evaluate_all():
    """
    采样文本、算原模型和每个方案（lm_head 量化与否）的逐位置指标 -> dict（三个演示共用，只算一遍）。

    返回 {"toks", "orig": 原模型的逐位置指标, "runs": {(方案, 含 lm_head?): (逐位置指标, quantize_params 的 report)},
    "head_only": {方案: 只量化 lm_head 时的逐位置指标}, "controls": {FP4_CONTROLS 的名字: {"metrics", "rel_err", "bits"}},
    "logit_std": 原模型每个位置的 logits 在词表上的标准差（所有位置平均）}。
    """
    P = init_params(QCFG, seed=0)
    toks = sample_tokens(P, QCFG, n_seq=N_SEQ, length=LENGTH, seed=TEXT_SEED)
    h0 = final_hidden(P, toks)
    logits = h0 @ P["lm_head"]
    logp = log_softmax(logits)
    out = {"toks": toks, "orig": position_metrics(logp, logp, toks), "runs": {}, "head_only": {}, "controls": {},
           "logit_std": float(logits.std(axis=-1).mean())}
    for scheme in SCHEMES:
        runs = {head: quantize_params(P, scheme, include_lm_head=head) for head in (False, True)}
        h = final_hidden(runs[False][0], toks)           # 两种情况下块的权重相同
        for head, (Pq, report) in runs.items():
            logq = log_softmax(h @ Pq["lm_head"])
            out["runs"][(scheme, head)] = (position_metrics(logp, logq, toks), report)
        # 只量化 lm_head：块用原来的权重（隐藏状态 h0），logits 乘量化的 lm_head
        out["head_only"][scheme] = position_metrics(logp, log_softmax(h0 @ runs[True][0]["lm_head"]), toks)
    for name, (fn, bits) in FP4_CONTROLS.items():
        Pq, err = quantize_blocks(P, fn)
        logq = log_softmax(final_hidden(Pq, toks) @ P["lm_head"])
        out["controls"][name] = {"metrics": position_metrics(logp, logq, toks), "rel_err": err, "bits": bits}
    return out


def summary(m):
    """逐位置指标 -> 平均 KL、top-1 一致率、困惑度。"""
    return float(m["kl"].mean()), float(m["agree"].mean()), float(np.exp(m["nll"].mean()))


def paired_diff(a, b):
    """
    两个方案的逐位置指标之差 a − b 的平均和标准误 -> (平均, 标准误)。

    【推导】先在每条序列内平均，得到 n_seq 个差值；标准误 = 它们的标准差（ddof = 1）/ √n_seq。
    同一批样本、同一批位置上比较（配对），两个方案共有的噪声（哪些位置难）相互抵消。
    """
    d = (a - b).mean(axis=1)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size))


# 演示 3 比较的方案对：INT4 三种粒度两两之间（前 3 对），再加两对对照
PAIRS = (("int4", "int4-g64"), ("int4-g64", "int4-g32"), ("int4", "int4-g32"), ("mxfp4", "int4-g32"),
         ("fp8-e4m3", "int8"))
INT4_PAIRS = PAIRS[:3]
METRICS = ("kl", "agree", "nll")


def pair_significance(ev):
    """
    PAIRS 里每对方案（只量化块）三个指标的配对差 -> {"diff": {(a, b): {指标: (平均, 标准误)}}, "z": {指标: {(a, b): |平均| / 标准误}}}。

    演示 1 的观察和演示 3 的表都用它，所以两处说的"几个标准误"是同一组数。
    """
    diff, z = {}, {key: {} for key in METRICS}
    for a, b in PAIRS:
        ma, mb = ev["runs"][(a, False)][0], ev["runs"][(b, False)][0]
        diff[(a, b)] = {key: paired_diff(ma[key], mb[key]) for key in METRICS}
        for key in METRICS:
            mean, se = diff[(a, b)][key]
            z[key][(a, b)] = abs(mean) / se if se > 0 else float("inf")
    return {"diff": diff, "z": z}


def pair_name(p):
    return f"{p[0]} − {p[1]}"


def z_range_text(label, zs):
    """一组 z 值 -> "KL 之差 17.8–32.7 个标准误" 这样的话；有不到 2 个标准误的，说几对。"""
    under = sum(1 for v in zs if v < 2)
    text = f"{label} {min(zs):.1f}–{max(zs):.1f} 个标准误"
    if under:
        text += f"（{under} 对不到 2 个，分不出先后）"
    return text


# ---------------------------------------------------------------------------
# 演示 1：只量化 transformer 块
# ---------------------------------------------------------------------------
def demo1_block_weights(ev):
    n_pos = ev["orig"]["kl"].size
    print_header(f"演示 1：只量化 transformer 块里的矩阵（lm_head 不动），在原模型的 {N_SEQ} × {LENGTH} 个样本 token 上比较")
    ppl0 = summary(ev["orig"])[2]
    rows = [["原模型（float64）", "64", "0", "0", "100%", f"{ppl0:.3f}", "—"]]
    res = {"ppl_orig": ppl0, "n_positions": n_pos}
    for s in SCHEMES:
        m, rep = ev["runs"][(s, False)]
        kl, agree, ppl = summary(m)
        rel = float(np.mean([x["rel_err"] for x in rep["matrices"]]))
        res[s] = {"bits": rep["bits_per_param"], "rel_err": rel, "kl": kl, "agree": agree, "ppl": ppl,
                  "log_ppl_ratio": float(np.log(ppl / ppl0))}
        rows.append([NAME_ZH[s], f"{rep['bits_per_param']:.3f}", f"{100 * rel:.2f}%", f"{kl:.5f}",
                     f"{100 * agree:.1f}%", f"{ppl:.3f}", f"{100 * (ppl / ppl0 - 1):+.2f}%"])
    print_table(["方案", "位/参数", "权重误差", "KL（nats）", "top-1 一致", "困惑度", "困惑度变化"], rows)

    # MXFP4 和 INT4-g32 差在两处（元素的格子、scale）：对照方案一次只换一处
    g32m = ev["runs"][("int4-g32", False)][0]
    ctl = {"int4-g32": {"bits": res["int4-g32"]["bits"], "rel_err": res["int4-g32"]["rel_err"],
                        "kl": res["int4-g32"]["kl"], "kl_diff": None}}
    for name, metrics, err, bits in (
            [(n, c["metrics"], c["rel_err"], c["bits"]) for n, c in ev["controls"].items()]
            + [("mxfp4", ev["runs"][("mxfp4", False)][0], res["mxfp4"]["rel_err"], res["mxfp4"]["bits"])]):
        ctl[name] = {"bits": bits, "rel_err": err, "kl": float(metrics["kl"].mean()),
                     "kl_diff": paired_diff(metrics["kl"], g32m["kl"])}
    rows = []
    for name in ("int4-g32", "e2m1-fp16-g32", "mxfp4", "nvfp4"):
        c = ctl[name]
        label, elem, scale = FP4_PARTS[name]
        diff = "—" if c["kl_diff"] is None else f"{1e3 * c['kl_diff'][0]:+.2f} ± {1e3 * c['kl_diff'][1]:.2f}"
        rows.append([label, elem, scale, f"{c['bits']:.2f}", f"{100 * c['rel_err']:.2f}%", f"{c['kl']:.5f}", diff])
    print("\nMXFP4 比 INT4-g32 差在哪：元素的格子和 scale 一次只换一处（只量化块）：")
    print_table(["方案", "元素", "scale", "位/参数", "权重误差", "KL（nats）", "KL − INT4-g32\n（10⁻³）"], rows)
    res["fp4_controls"] = ctl

    i8, f8 = res["int8"], res["fp8-e4m3"]
    kls = {s: res[s]["kl"] for s in INT4_FAMILY}
    kl_order = kls["int4-g32"] < kls["int4-g64"] < kls["int4"]
    ag = {s: res[s]["agree"] for s in INT4_FAMILY}
    pp = {s: res[s]["ppl"] for s in INT4_FAMILY}
    agree_order = ag["int4-g32"] > ag["int4-g64"] > ag["int4"]
    ppl_order = pp["int4-g32"] < pp["int4-g64"] < pp["int4"]
    # 输入维为 64 的矩阵，int4-g64 和每通道 int4 完全相同；只有 w_down（输入维 192）分成 3 组
    _, rep_c = ev["runs"][("int4", False)]
    _, rep_g = ev["runs"][("int4-g64", False)]
    same = [a["name"] for a, b in zip(rep_c["matrices"], rep_g["matrices"]) if a["rel_err"] == b["rel_err"]]
    n_same = sum(int(np.prod(a["shape"])) for a in rep_c["matrices"] if a["name"] in same)
    share_same = n_same / rep_c["n_params"]
    res.update({"kl_order_int4": kl_order, "agree_order_int4": agree_order, "ppl_order_int4": ppl_order,
                "g64_equals_channel_share": share_same})
    mx, g32 = res["mxfp4"], res["int4-g32"]
    e2, nv = ctl["e2m1-fp16-g32"], ctl["nvfp4"]
    e2_z = abs(e2["kl_diff"][0]) / e2["kl_diff"][1]
    scale_part = ctl["mxfp4"]["kl"] - e2["kl"]                 # 元素同是 E2M1，只差 scale
    res.update({"e2m1_kl_z": e2_z, "mxfp4_scale_part": scale_part})

    if kl_order:
        kl_text = (f"按 KL 看，分组越细越好：每通道 {kls['int4']:.4f} > 每 64 个一组 {kls['int4-g64']:.4f} > "
                   f"每 32 个一组 {kls['int4-g32']:.4f}（多付 {g32['bits'] - res['int4']['bits']:.2f} 位 scale，KL 少 "
                   f"{100 * (1 - kls['int4-g32'] / kls['int4']):.0f}%）。")
    else:
        kl_text = (f"按 KL 看，这里分组并没有按'越细越好'排好：每通道 {kls['int4']:.4f}、每 64 个一组 {kls['int4-g64']:.4f}、"
                   f"每 32 个一组 {kls['int4-g32']:.4f}。")
    named = [f"top-1 一致率（{100 * ag['int4']:.1f}% / {100 * ag['int4-g64']:.1f}% / {100 * ag['int4-g32']:.1f}%）",
             f"困惑度（{pp['int4']:.2f} / {pp['int4-g64']:.2f} / {pp['int4-g32']:.2f}）"]
    same_order = [t for t, ok in zip(named, (agree_order, ppl_order)) if ok]
    other_order = [t for t, ok in zip(named, (agree_order, ppl_order)) if not ok]
    if same_order:
        kl_text += "和".join(same_order) + "在这次抽样里也是这个顺序。"
    if other_order:
        kl_text += "和".join(other_order) + "的顺序不是这样。"
    # 三对 INT4 方案之差各是几个标准误（演示 3 的表）
    z = pair_significance(ev)["z"]
    zs = {key: [z[key][p] for p in INT4_PAIRS] for key in METRICS}
    res["int4_pair_z"] = zs
    kl_text += ("但三个指标的分辨力差得远（两两之差是几个标准误，演示 3）："
                + z_range_text("KL 之差", zs["kl"]) + "；" + z_range_text("log 困惑度之差", zs["nll"]) + "；"
                + z_range_text("top-1 一致率之差", zs["agree"]) + "。")
    # INT8 和原模型 top-1 不一致的位置：原模型前两名的对数概率差
    margin, agree8 = ev["orig"]["margin"], ev["runs"][("int8", False)][0]["agree"]
    m_dis = float(np.median(margin[agree8 == 0])) if np.any(agree8 == 0) else float("nan")
    m_all = float(np.median(margin))
    res.update({"int8_disagree_margin": m_dis, "all_margin": m_all, "h100_fp8_tflops": H100.peak_flops("fp8") / 1e12,
                "h100_int8_tflops": H100.peak_flops("int8") / 1e12,
                "int4_over_int8_kl": min(kls.values()) / i8["kl"]})
    print_observations([
        f"INT8 几乎无损：KL 只有 {i8['kl']:.1e} nats，困惑度变化 {100 * (i8['ppl'] / ppl0 - 1):+.3f}%，"
        f"top-1 一致 {100 * i8['agree']:.1f}%：不一致的那些位置上，原模型前两名的对数概率只差 {m_dis:.4f}（中位数；"
        f"所有位置的中位数是 {m_all:.2f}）——前两名几乎一样大，一点扰动就换了名次。",
        f"FP8-E4M3 也很小（KL {f8['kl']:.1e}），但比 INT8 大 {f8['kl'] / i8['kl']:.0f} 倍，权重误差 {100 * f8['rel_err']:.2f}% "
        f"对 {100 * i8['rel_err']:.2f}%：E4M3 只有 3 位尾数（正规数的相对舍入误差最多 2⁻⁴），INT8 在每通道的范围里均匀地有 255 个刻度，"
        f"对这种没有离群值的高斯权重更细。FP8 的好处也不在算得快：H100 的 FP8 和 INT8 稠密峰值一样（都是 "
        f"{H100.peak_flops('fp8') / 1e12:.0f} TFLOP/s，BF16 的 {H100.peak_flops('fp8') / H100.peak_flops('bf16'):.0f} 倍；"
        f"03 里 W8A8 FP8 和 W8A8 INT8 一样快），而在给激活用时的动态范围：E4M3 的相对精度不随数的大小变，"
        f"离群值撑大 scale 时其余的数精度不变（01 演示 3 观察 4），INT8 的刻度却被撑粗（06 演示 1）。",
        f"4 位是另一个量级：INT4 的三种粒度 KL 约 {min(kls.values()):.3f}–{max(kls.values()):.3f}，是 INT8 的 {min(kls.values()) / i8['kl']:.0f} 倍以上，"
        f"top-1 只有 {100 * min(ag.values()):.1f}–{100 * max(ag.values()):.1f}% 一致，困惑度高 "
        f"{100 * (min(pp.values()) / ppl0 - 1):.1f}–{100 * (max(pp.values()) / ppl0 - 1):.1f}%。",
        kl_text,
        f"每 64 个一组和每通道几乎一样，是这个小模型的特点：d_model = 64，输入维为 64 的矩阵（占被量化参数的 "
        f"{100 * share_same:.0f}%）每通道就是一组 64 个，两种方案逐位相同；只有 w_down（输入维 192）被分成 3 组。"
        f"在 Llama 这种输入维几千的矩阵上，分组和每通道的差别大得多（01 的 g128 例子）。",
        f"MXFP4（{mx['bits']:.2f} 位）的 KL {mx['kl']:.4f} 比 INT4-g32（{g32['bits']:.2f} 位）的 {g32['kl']:.4f} "
        f"{'大' if mx['kl'] > g32['kl'] else '小'}。第二张表把两处不同分开：只把元素换成 E2M1、scale 仍是每 32 个一个 FP16"
        f"（也是 {e2['bits']:.1f} 位），权重误差 {100 * e2['rel_err']:.2f}% 对 {100 * g32['rel_err']:.2f}%、"
        f"KL {'大' if e2['kl'] > g32['kl'] else '小'} {1e3 * abs(e2['kl_diff'][0]):.2f}×10⁻³（{e2_z:.0f} 个标准误）——"
        f"在这种近似高斯的权重上，E2M1 不等间距的格子本身就比 INT4 等间距的格子"
        f"{'略差' if e2['rel_err'] > g32['rel_err'] else '略好'}；再把 scale 换成只能取 2 的幂的 E8M0（就是 MXFP4），"
        f"误差升到 {100 * mx['rel_err']:.2f}%，KL 比 INT4-g32 大 {1e3 * ctl['mxfp4']['kl_diff'][0]:.2f}×10⁻³，其中 "
        f"{1e3 * scale_part:.2f}×10⁻³ 是换 scale 加上的：差距的{'大部分' if scale_part > e2['kl_diff'][0] else '小部分'}"
        f"来自 scale。更细、更准的 scale 有用：NVFP4（同样 {nv['bits']:.1f} 位，每 16 个一个 E4M3 scale）误差 "
        f"{100 * nv['rel_err']:.2f}%、KL {nv['kl']:.4f}，比 INT4-g32 {'还小' if nv['kl'] < g32['kl'] else '大'}。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 2：lm_head 也量化
# ---------------------------------------------------------------------------
def demo2_lm_head(ev):
    print_header("演示 2：lm_head 也量化——它只占很少的参数，误差却直接写进 logits")
    rows, rows2 = [], []
    res = {}
    for s in SCHEMES:
        m0, rep0 = ev["runs"][(s, False)]
        m1, rep1 = ev["runs"][(s, True)]
        kl0, ag0, pp0 = summary(m0)
        kl1, ag1, pp1 = summary(m1)
        klh = float(ev["head_only"][s]["kl"].mean())
        head = rep1["matrices"][-1]
        res[s] = {"kl_without": kl0, "kl_with": kl1, "kl_head_only": klh, "agree_without": ag0, "agree_with": ag1,
                  "ppl_without": pp0, "ppl_with": pp1, "head_rel_err": head["rel_err"],
                  "alpha_without": float(m0["overlap"].mean()), "alpha_with": float(m1["overlap"].mean()),
                  "head_share_params": int(np.prod(head["shape"])) / rep1["n_params"]}
        rows.append([NAME_ZH[s], f"{kl0:.5f}", f"{klh:.5f}", f"{kl1:.5f}", f"{klh / kl0:.2f}×", f"{kl1 / kl0:.2f}×",
                     f"{kl1 / (kl0 + klh):.2f}×"])
        rows2.append([NAME_ZH[s], f"{100 * ag0:.1f}%", f"{100 * ag1:.1f}%", f"{pp0:.3f}", f"{pp1:.3f}",
                      f"{res[s]['alpha_without']:.3f}", f"{res[s]['alpha_with']:.3f}"])
    print("KL（nats/位置）：只量化块、只量化 lm_head、两者都量化")
    print_table(["方案", "只量化块", "只量化 lm_head", "两者都", "只 lm_head ÷ 只块", "两者都 ÷ 只块",
                 "两者都 ÷ 相加"], rows)
    print("\n另外三个指标：只量化块 vs 两者都量化")
    print_table(["方案", "top-1：只块", "top-1：都", "困惑度：只块", "困惑度：都", "Σmin(p,q)：只块", "Σmin(p,q)：都"],
                rows2)
    ratios = [res[s]["kl_with"] / res[s]["kl_without"] for s in SCHEMES]
    head_vs_block = [res[s]["kl_head_only"] / res[s]["kl_without"] for s in SCHEMES]
    additive = [res[s]["kl_with"] / (res[s]["kl_without"] + res[s]["kl_head_only"]) for s in SCHEMES]
    share = res["int4"]["head_share_params"]
    all_worse = all(res[s]["kl_with"] > res[s]["kl_without"] for s in SCHEMES)
    res.update({"ratio_min": min(ratios), "ratio_max": max(ratios), "all_worse": all_worse,
                "head_vs_block_min": min(head_vs_block), "head_vs_block_max": max(head_vs_block),
                "additive_min": min(additive), "additive_max": max(additive)})
    g32 = res["int4-g32"]
    logit_std = ev["logit_std"]
    res["logit_std"] = logit_std
    print_observations([
        f"把 lm_head 也量化，每种方案的 KL 都{'变大' if all_worse else '变了'}：是只量化块时的 {min(ratios):.2f}–{max(ratios):.2f} 倍。"
        f"lm_head 只占被量化参数的 {100 * share:.0f}%（{QCFG.d_model} × {QCFG.vocab}），可只量化它的 KL 是只量化块"
        f"（其余 {100 * (1 - share):.0f}% 的参数）时的 {min(head_vs_block):.2f}–{max(head_vs_block):.2f} 倍；"
        f"两部分几乎直接相加：两者都量化的 KL 是两者之和的 {min(additive):.2f}–{max(additive):.2f} 倍。",
        "这个份额是这个模型、这一批文本上的事，不是一般规律。QCFG 的残差支路是有意调小的"
        f"（wo、w_down 的尺度系数 {QCFG.wo_gain:g}、{QCFG.down_gain:g}，quant_lab），块里的误差只改动残差流的一小部分；"
        f"lm_head 的误差 x·ΔW 却直接加在 logits 上，而 lm_head 的尺度（系数 {QCFG.head_gain:g}，每个位置 logits 的标准差"
        f"平均 {logit_std:.2f}）是为第 6 讲的草稿选的。换一个训练出来的模型，两部分的比例不一定一样。",
        f"第 6 讲拿来当草稿的\"INT4 量化的自己\"是 int4-g32 连 lm_head 一起量化的：KL {g32['kl_with']:.4f}、"
        f"top-1 一致 {100 * g32['agree_with']:.1f}%、Σmin(p,q) = {g32['alpha_with']:.3f}——最后这个数就是投机解码的接受率 α"
        "（第 6 讲：α = E[Σmin(p,q)]）。草稿不需要完全一样，拒绝采样会把输出纠正回目标模型的分布。"
        "真实的 checkpoint 各有各的做法，例如 gpt-oss 只把专家的矩阵存成 MXFP4，注意力和 lm_head 都留在 BF16"
        "（模型卡；04 脚本演示 2）。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 3：这些差别显著吗
# ---------------------------------------------------------------------------
def demo3_significance(ev):
    print_header(f"演示 3：方案之间的差别显著吗（配对差值 ± 标准误，{N_SEQ} 条序列当 {N_SEQ} 个独立样本；不含 lm_head）")
    sig = pair_significance(ev)
    diff, z = sig["diff"], sig["z"]
    rows = []
    for p in PAIRS:
        cells = [pair_name(p)]
        for key, scale, fmt in (("kl", 1e3, "{:+.3f} ± {:.3f}"), ("agree", 100.0, "{:+.2f} ± {:.2f}"),
                                ("nll", 1e3, "{:+.2f} ± {:.2f}")):
            mean, se = diff[p][key]
            cells.append(fmt.format(scale * mean, scale * se))
            cells.append(f"{z[key][p]:.1f}" if se > 0 else "—")
        rows.append(cells)
    print_table(["差（前 − 后）", "KL 之差\n（10⁻³ nats）", "几倍\n标准误", "top-1 之差\n（百分点）", "几倍\n标准误",
                 "log 困惑度之差\n（10⁻³）", "几倍\n标准误"], rows)

    kl_z, ag_z, nll_z = z["kl"], z["agree"], z["nll"]
    se_ratio = [diff[p]["nll"][1] / diff[p]["kl"][1] for p in PAIRS]
    ratio_se = float(np.median(se_ratio))
    res = dict(diff)
    res.update({"kl_z": kl_z, "agree_z": ag_z, "nll_z": nll_z, "nll_se_over_kl_se": ratio_se,
                "nll_se_over_kl_se_range": (min(se_ratio), max(se_ratio))})
    kl_sig = [p for p in INT4_PAIRS if kl_z[p] >= 2]
    ag_sig = [p for p in INT4_PAIRS if ag_z[p] >= 2]
    nll_sig = [p for p in INT4_PAIRS if nll_z[p] >= 2]
    noisy_ag = [p for p in PAIRS if ag_z[p] < 2]
    noisy_nll = [p for p in PAIRS if nll_z[p] < 2]
    res.update({"n_sig_int4": {"kl": len(kl_sig), "agree": len(ag_sig), "nll": len(nll_sig)},
                "noisy_agree": noisy_ag, "noisy_nll": noisy_nll, "min_kl_z": min(kl_z.values())})
    lesson = []
    if noisy_ag:
        lesson.append("top-1 一致率之差 " + "、".join(
            f"{100 * abs(diff[p]['agree'][0]):.2f} 个百分点（{pair_name(p)}，{ag_z[p]:.1f} 个标准误）" for p in noisy_ag))
    if noisy_nll:
        lesson.append("log 困惑度之差 " + "、".join(
            f"{1e3 * abs(diff[p]['nll'][0]):.2f}×10⁻³（{pair_name(p)}，{nll_z[p]:.1f} 个标准误；同一对的 KL 之差是 "
            f"{kl_z[p]:.1f} 个标准误）" for p in noisy_nll))
    lesson_text = ("表里的 " + "；".join(lesson) + "——不到 2 个标准误，单看它们可能只是抽样的运气。" if lesson else
                   "这次抽样里表中的差别都超过了 2 个标准误，但 top-1 和困惑度的误差棒仍比 KL 宽得多。")
    print_observations([
        f"INT4 三种粒度两两之间，KL 之差超过 2 倍标准误的有 {len(kl_sig)} 对（共 {len(INT4_PAIRS)} 对）"
        + (f"：{'、'.join(pair_name(p) for p in kl_sig)}" if kl_sig else "") +
        f"；log 困惑度之差有 {len(nll_sig)} 对，top-1 一致率之差有 {len(ag_sig)} 对。",
        f"KL 在每个位置上用了整个分布（{QCFG.vocab} 个概率），配对之后两个方案共有的噪声抵消，所以很稳；"
        f"log 困惑度之差估计的也是它（两个方案的平均 KL 之差），但只用了抽中的那一个 token，标准误是 KL 的 "
        f"{min(se_ratio):.0f}–{max(se_ratio):.0f} 倍（表里 {len(PAIRS)} 对方案各一个比值，中位数 {ratio_se:.0f} 倍）。"
        "top-1 只有对/错两种结果，同样吵。",
        lesson_text + f"KL 之差在全部 {len(PAIRS)} 对上都至少 {min(kl_z.values()):.1f} 个标准误。"
        "教训：比较两种量化方案的细小差别，要用 KL 这种\"整个分布\"的指标（或者大得多的评测集），并且把误差棒一起报出来。",
    ])
    return res


if __name__ == "__main__":
    EV = evaluate_all()
    Q = demo1_block_weights(EV), demo2_lm_head(EV), demo3_significance(EV)
    save_results({"ev": EV, "q": Q})        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数

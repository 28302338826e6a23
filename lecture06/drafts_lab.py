"""
drafts_lab —— 第 6 讲的目标模型和草稿怎么造：种子 04（和 03）的 QCFG 目标与四个草稿（INT4 量化的自己、前 3 层、
前 1 层、二元语法表）；真实模型（SmolLM2，第 2 讲 real_model_lab）的自草稿：重新量化的自己、跳过中间几层、
只用前 k 层（不训练的提前退出），以及每个草稿每个 token 读多少字节的权重（代价系数 c 用）。
草稿要量化，所以这个模块用第 3 讲的 quant_lab；解码本身（decode_lab）不依赖量化。
"""
import copy
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture03", "prereq3", "lecture02", "lecture01"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from decode_lab import NGramLM, TransformerLM  # noqa: E402
from quant_lab import LAYER_MATRICES, QCFG, quantize_params, sample_tokens  # noqa: E402
from transformer_lab import config_like, init_params  # noqa: E402

__all__ = ["build_seed04_models", "layer_subset", "layer_skip_draft", "early_exit_draft", "requantized_draft",
           "matrix_bytes"]


def build_seed04_models():
    """
    种子 04（和 03）的目标模型和四个草稿 -> (target, drafts)；drafts = {名字: 模型}，名字、顺序和种子 04 打印的一样。

    【做法】和种子 04 的 build_models 完全相同（同样的种子、同样的量化；测试逐个参数、逐个 α 核对）：目标 = 第 3 讲的
    QCFG 模型（init_params 的种子 0）；草稿 = INT4-g32 量化的自己（lm_head 也量化）、只用前 3 层、只用前 1 层、
    在目标采样的 64 × 128 个 token（种子 1）上拟合的二元语法表。种子脚本不能被导入（文件名以数字开头），
    所以把它放在这里给 06、07、09 用。
    """
    P = init_params(QCFG, seed=0)
    target = TransformerLM(P, QCFG, "目标")
    drafts = {"INT4 量化的自己": TransformerLM(quantize_params(P, "int4-g32", include_lm_head=True)[0], QCFG, "int4")}
    for k in (3, 1):
        pk = dict(P)
        pk["layers"] = P["layers"][:k]
        drafts[f"只用前 {k} 层"] = TransformerLM(pk, config_like(QCFG, n_layers=k), f"前{k}层")
    drafts["二元语法表"] = NGramLM.fit(sample_tokens(P, QCFG, n_seq=64, length=128, seed=1), QCFG.vocab)
    return target, drafts


# ---------------------------------------------------------------------------
# 真实模型的自草稿（第 6 讲 10）
# ---------------------------------------------------------------------------
def layer_subset(model, keep, name=""):
    """
    只用 model 的第 keep 层（按给的顺序）的草稿 -> TransformerLM，和目标共用同一份权重（不多占内存）。

    【做法】和 TransformerLM(pk, config_like(cfg, n_layers=len(keep))) 完全相同（pk = params 只留这几层；测试逐位核对），
    只是不重新做构造时的融合（transformer_lab.NumpyTransformer 的【为了快做的等价变换】）：直接引用目标已经融合好的
    那几层矩阵。SmolLM2 一份 float32 的融合权重约 0.5 GB，几个草稿各融合一次就是几份。
    【边界】keep 为空、有重复、越界：ValueError。
    """
    keep = [int(i) for i in keep]
    n = model.cfg.n_layers
    if not keep or len(set(keep)) != len(keep) or min(keep) < 0 or max(keep) >= n:
        raise ValueError(f"keep 必须是 0..{n - 1} 里不重复的层号，至少一个（收到 {keep}）")
    sub = copy.copy(model)
    sub.params = dict(model.params)
    sub.params["layers"] = [model.params["layers"][i] for i in keep]
    sub._layers = [model._layers[i] for i in keep]
    sub.cfg = config_like(model.cfg, n_layers=len(keep))
    sub.name = name or f"{len(keep)} 层"
    return sub


def layer_skip_draft(model, first_skipped, n_skipped, name=""):
    """
    跳过中间连续 n_skipped 层（第 first_skipped .. first_skipped + n_skipped − 1 层）的自草稿 -> TransformerLM（共用权重）。

    【来源】Draft & Verify（Zhang et al. 2023，arXiv 2309.08168）：跳过目标模型的一部分中间层当草稿，不训练；
    LayerSkip（Elhoushi et al. 2024，arXiv 2404.16710）要训练（层 dropout + 提前退出的损失）才能只用前几层。
    【边界】跳过的层不在 1..L−2 里（第一层和最后一层留着）、n_skipped < 1：ValueError。
    """
    L = model.cfg.n_layers
    if not (isinstance(n_skipped, (int, np.integer)) and n_skipped >= 1 and first_skipped >= 1
            and first_skipped + n_skipped <= L - 1):
        raise ValueError(f"跳过的层必须在 1..{L - 2} 之间（第一层和最后一层留着），至少一层"
                         f"（收到从第 {first_skipped} 层起 {n_skipped} 层）")
    keep = list(range(first_skipped)) + list(range(first_skipped + n_skipped, L))
    return layer_subset(model, keep, name or f"跳过第 {first_skipped}–{first_skipped + n_skipped - 1} 层")


def early_exit_draft(model, k, name=""):
    """
    只用前 k 层、接最后的 RMSNorm 和 lm_head 的自草稿（不训练的提前退出）-> TransformerLM（共用权重）。

    【边界】k 不在 1..L−1 里：ValueError（k = L 就是目标自己）。
    """
    L = model.cfg.n_layers
    if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and 1 <= k <= L - 1):
        raise ValueError(f"k 必须是 1..{L - 1} 之间的整数（收到 {k!r}；k = {L} 就是目标自己）")
    return layer_subset(model, range(k), name or f"只用前 {k} 层")


def requantized_draft(params, cfg, scheme, include_lm_head=False, name=""):
    """
    把模型重新量化（就近舍入，第 3 讲 quant_lab.quantize_params）当草稿 -> (TransformerLM, report)。

    report 是 quantize_params 的报告（"scheme"、"bits_per_param"、"matrices"……；matrix_bytes 读它）。
    【做法】每层的 7 个矩阵量化再反量化（quant_lab 按 float64 算），马上转成 cfg.dtype（float32 的模型：草稿的权重和
    计算都是 float32），所以任何时候只多一个矩阵的 float64 副本。
    每个量化的草稿都是一份完整的层权重（加上前向的融合副本）：用完就丢掉再造下一个。
    真实模型的文件本来就是 4 位的（Q4_1），这里量化的是反量化以后的权重：第二次舍入。
    【参数】include_lm_head：lm_head 也量化。默认不量化：共享词嵌入的模型（SmolLM2）的 lm_head 就是词嵌入，
    草稿和目标共用这一份（部署时也只存一份），量化它就多出一个单独的矩阵。
    """
    Pq, report = quantize_params(params, scheme, include_lm_head=include_lm_head, dtype=cfg.dtype)
    return TransformerLM(Pq, cfg, name or scheme.upper()), report


def matrix_bytes(params, report=None, bits=16.0, head_bits=None):
    """
    生成一个 token 要读的权重字节数（batch 1 的 decode：每个矩阵读一遍）-> float。

    【推导】Σ 每层的 7 个矩阵（wq wk wv wo w_gate w_up w_down）+ lm_head 的参数个数 × 每个参数的位数 / 8。
    词嵌入只查一行、RMSNorm 的权重每层 d 个数、KV cache：都不算（短上下文下比矩阵小两个数量级以上，见第 6 讲 10）。
    【参数】report：quant_lab.quantize_params 的报告：被量化的矩阵按报告里的位数（含 scale）；其余矩阵按 bits；
    head_bits：lm_head 的位数（默认同 bits；报告里有 lm_head 时用报告的）。
    """
    quantized = {m["name"]: m["bits"] for m in report["matrices"]} if report else {}
    total = 0.0
    for i, L in enumerate(params["layers"]):
        for m in LAYER_MATRICES:
            total += L[m].size * quantized.get(f"layers[{i}].{m}", bits) / 8
    hb = bits if head_bits is None else head_bits
    total += params["lm_head"].size * quantized.get("lm_head", hb) / 8
    return total

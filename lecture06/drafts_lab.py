"""
drafts_lab —— 第 6 讲的目标模型和草稿怎么造：种子 04（和 03）的 QCFG 目标与四个草稿（INT4 量化的自己、前 3 层、
前 1 层、二元语法表）。草稿要量化，所以这个模块用第 3 讲的 quant_lab；解码本身（decode_lab）不依赖量化。
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture03", "prereq3", "lecture02", "lecture01"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from decode_lab import NGramLM, TransformerLM  # noqa: E402
from quant_lab import QCFG, quantize_params, sample_tokens  # noqa: E402
from transformer_lab import config_like, init_params  # noqa: E402

__all__ = ["build_seed04_models"]


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

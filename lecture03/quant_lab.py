"""
quant_lab —— 第 3 讲的模型（QCFG）、把它的权重量化的各种方案、以及从模型里采样"文本"。

【QCFG：一个表现得足够像语言模型的随机模型】
词表 192、d_model 64、4 层、4 个 query 头 / 2 个 KV 头（GQA）、head_dim 16、SwiGLU d_ff 192、上下文 256，float64。
随机初始化的 transformer 默认"什么都不像"：输出要么接近均匀（熵太高，任何草稿都猜得中），要么被一两层支配。
第 6 讲拿它当投机解码的目标模型，需要：INT4 量化的自己很像它（α ≈ 0.9），只用前 3 层的草稿差一些（≈ 0.83），
只用前 1 层的更差（≈ 0.7），二元语法表最差（≈ 0.6）。这些由初始化的尺度决定（**这是选出来的假设**，
可行区域的中间；tests/replicate_seed04.py 是调它时用的工具）：
- 词嵌入 N(0, 1)；wq、wk、wv、w_gate、w_up 的标准差 1/√64（in_gain = 1；注意力不能更"尖"，
  否则 int4 对 wq/wk 的误差会翻转注意力，INT4 草稿的 α 会掉到 0.7 多）；
- wo 的标准差 0.29/√64、w_down 的标准差 0.44/√192：残差支路小一些，后面几层的贡献小，浅层草稿也像样；
- lm_head 的标准差 1.78/√64：logits 的标准差约 1.8，目标模型的熵约 3.8 nats（像"有一些把握的"语言模型）。

【量化方案】quantize_params(P, scheme)：对每层的 7 个矩阵（和可选的 lm_head）量化再反量化，结构不变：
  "int8"、"int4"：每个输出通道一个 FP16 scale；"int4-g128"、"int4-g64"、"int4-g32"：沿输入维每组一个 FP16 scale；
  "fp8-e4m3"：每个输出通道一个 FP32 scale（把最大值对到 448），元素舍入到 E4M3；
  "mxfp4"、"mxfp8"：OCP MX 块格式，每 32 个一个 E8M0 scale。
词嵌入（查表）和 RMSNorm 的权重不量化。数的格式本身在 ../prereq3/numfmt。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("prereq3", "lecture02"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from numfmt import FP8_E4M3, FP4_E2M1, bits_per_value, quantize_fp8, quantize_int, quantize_mx  # noqa: E402
from transformer_lab import LMConfig, NumpyTransformer, sample_inverse_cdf, softmax  # noqa: E402

__all__ = ["QCFG", "SCHEMES", "LAYER_MATRICES", "quantize_matrix", "quantize_params", "sample_tokens"]

QCFG = LMConfig(name="QCFG", vocab=192, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=192,
                max_seq=256, emb_std=1.0, in_gain=1.0, wo_gain=0.29, down_gain=0.44, head_gain=1.78)

LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")

# 方案名 -> (种类, 参数)
SCHEMES = {
    "int8": ("int", 8, None),
    "int4": ("int", 4, None),
    "int4-g128": ("int", 4, 128),
    "int4-g64": ("int", 4, 64),
    "int4-g32": ("int", 4, 32),
    "fp8-e4m3": ("fp8", 8, None),
    "mxfp4": ("mx", FP4_E2M1, 32),
    "mxfp8": ("mx", FP8_E4M3, 32),
}


def _check_scheme(scheme):
    if scheme not in SCHEMES:
        raise ValueError(f"未知的量化方案 {scheme!r}；可用的方案：{', '.join(SCHEMES)}")
    return SCHEMES[scheme]


def quantize_matrix(w, scheme, name="矩阵"):
    """
    量化再反量化一个权重矩阵 w [输入维, 输出维] -> (w', 每个数的平均位数（含 scale）)。

    【边界】分组 / MX 的块大小不整除输入维时抛 ValueError，消息里写出矩阵名；未知方案抛 ValueError 列出可用的。
    """
    kind, a, g = _check_scheme(scheme)
    n_in = w.shape[0]
    if g and n_in % g:
        raise ValueError(f"{scheme}：{name} 的输入维 {n_in} 不能被分组大小 {g} 整除")
    if kind == "int":
        wq, _ = quantize_int(w, a, "group" if g else "channel", g)
        return wq, bits_per_value(f"int{a}", n_in=n_in, group=g)
    if kind == "fp8":
        return quantize_fp8(w)[0], bits_per_value("fp8", n_in=n_in)
    wq, _ = quantize_mx(w, a, g)
    return wq, bits_per_value("mxfp4" if a is FP4_E2M1 else "mxfp8")


def quantize_params(P, scheme, include_lm_head=False):
    """
    量化模型的权重 -> (Pq, report)。Pq 和 P 结构相同（反量化后的 float64 权重），P 不被修改。

    report = {"scheme", "bits_per_param"（被量化的矩阵的平均位数，含 scale），"n_params"（被量化的参数个数），
              "matrices": [{"name", "shape", "bits", "rel_err" = ‖W − W'‖_F / ‖W‖_F, "max_abs_err"}]}。
    【参数】include_lm_head：lm_head 也量化（第 6 讲的 INT4 草稿这样做）。
    """
    _check_scheme(scheme)
    Pq = dict(P)
    Pq["layers"] = []
    mats = []

    def q(w, name):
        wq, bits = quantize_matrix(w, scheme, name)
        err = wq - w
        mats.append({"name": name, "shape": w.shape, "bits": bits,
                     "rel_err": float(np.linalg.norm(err) / max(np.linalg.norm(w), np.finfo(float).tiny)),
                     "max_abs_err": float(np.abs(err).max())})
        return wq

    for i, L in enumerate(P["layers"]):
        Lq = dict(L)
        for m in LAYER_MATRICES:
            Lq[m] = q(L[m], f"layers[{i}].{m}")
        Pq["layers"].append(Lq)
    if include_lm_head:
        Pq["lm_head"] = q(P["lm_head"], "lm_head")
    n = sum(int(np.prod(m["shape"])) for m in mats)
    bits = sum(m["bits"] * int(np.prod(m["shape"])) for m in mats) / n
    return Pq, {"scheme": scheme, "bits_per_param": bits, "n_params": n, "matrices": mats}


def sample_tokens(P, cfg, n_seq, length, seed, T=1.0):
    """
    从模型里按温度 T（默认 1）采样 n_seq 条长 length 的序列 -> int 数组 [n_seq, length]（第 3、6 讲测量用的"文本"）。

    【做法】第一个 token 在词表上均匀地抽；之后每一步用 KV cache 把上一个 token 喂进去，按 softmax(logits / T) 抽下一个。
    随机数：np.random.default_rng(seed)，每一步 rng.random(n_seq) 个均匀数，CDF 反查（不依赖 numpy 版本）。
    【边界】T = 0 是贪心（取 argmax，随机数照样消耗，所以只有第一个 token 是随机的）；T < 0 抛 ValueError。
    """
    if not T >= 0:
        raise ValueError(f"温度 T 必须 ≥ 0（T = 0 表示贪心），收到 {T}")
    if n_seq < 1 or length < 1:
        raise ValueError(f"n_seq 和 length 都至少为 1（收到 {n_seq}, {length}）")
    if length > cfg.max_seq:
        raise ValueError(f"length = {length} 超过模型的上下文 max_seq = {cfg.max_seq}")
    rng = np.random.default_rng(seed)
    model = NumpyTransformer(P, cfg)
    cache = model.new_cache(n_seq, length)
    out = np.zeros((n_seq, length), dtype=np.int64)
    out[:, 0] = sample_inverse_cdf(np.full((n_seq, cfg.vocab), 1.0 / cfg.vocab), rng.random(n_seq))
    for t in range(1, length):
        logits = model.forward(out[:, t - 1:t], cache)[:, -1]
        u = rng.random(n_seq)
        out[:, t] = logits.argmax(-1) if T == 0 else sample_inverse_cdf(softmax(logits / T), u)
    return out

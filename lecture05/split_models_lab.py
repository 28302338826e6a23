"""
split_models_lab —— 把"一个模型"写成一个配方字符串：草稿和目标分在两个进程里时，两边各自按配方造自己的模型
（spawn 出来的进程拿不到父进程的对象，只拿得到字符串），进程内的参考生成器也按同一个配方造，两边才是同一个模型。

【配方的写法】（S = init_params 的种子，K = 层数；都是非负整数）
  qcfg:S              第 3 讲的 QCFG 随机模型（quant_lab.QCFG，vocab 192），第 6 讲 03 / 种子 04 的目标（S = 0）
  qcfg-layers:K:S     它的前 K 层（K = 1..3），共用词嵌入和 lm_head（第 6 讲 03 的"只用前 K 层"）
  qcfg-int4:S         它的 INT4-g32 量化（lm_head 也量化），第 6 讲 03 的"INT4 量化的自己"
  qcfg-bigram:S       在它采样的 64 × 128 个 token（种子 1）上拟合的二元语法表（NGramLM）
  tiny4:S             4 个 token 的词表的小模型（TINY4，精确枚举用：4^n 条路径）
  tiny4-layers:K:S    它的前 K 层（K = 1）
  split:S             这个问题新造的一对里的目标（SPLIT_CFG：16 层，decode 一步在这台机器上几毫秒）
  split-draft:S       这一对的草稿 = split:S 的前 SPLIT_DRAFT_LAYERS = 4 层（共用词嵌入和 lm_head）
  split-layers:K:S    split:S 的前 K 层（K = 1..15）
  smollm2             SmolLM2-135M-Instruct（float64），经 hub_lab / real_model_lab.load_gguf 装载
  smollm2:float32     同上，float32
  smollm2-layers:K    SmolLM2 的前 K 层（drafts_lab.early_exit_draft，K = 1..29），后面可以加 ":float32"
模型都是 decode_lab.TransformerLM（或 NGramLM），有 session()，decode_lab.speculative_generate、
tree_lab.dynamic_tree_generate 和 overlap_spec_lab 直接用。SmolLM2 只在 build_split_model 被调用时才读文件
（import 这个模块不读）；整个 SmolLM2 同一个进程里同一种 dtype 只读一次（目标和它的前 K 层草稿共用权重）。还没有整个
SmolLM2 时，"smollm2-layers:K" 只装前 K 层（real_model_lab.load_gguf(n_layers=K)：worker 进程只要它时少反量化、少融合
二十几层；模型逐位相同，见 build_split_model）。

【为什么要新的一对（split）】种子 04 的草稿在 numpy 里并不比目标便宜：INT4 的草稿反量化后和目标一样是 float64
矩阵，一步一样贵；前 3 层的 ĉ ≈ 0.76；QCFG 本身太小（d = 64），一步的时间几乎全是 Python 的开销，层数少几层省不了
多少。split 的目标有 16 层、d = 192，一步在毫秒量级；草稿是它的前 4 层，c 是量出来的（measure_pair_costs）。
【α 从哪来（随机权重，没有训练）】split 的残差支路初始化得很小（wo_gain = 0.10、down_gain = 0.15，QCFG 是
0.29、0.44）：每一层只把残差流挪一点，前 4 层的输出离 16 层的输出不远，所以草稿的 α 不是 0——这是我们选的构造，
不是训练出来的草稿；它的 α 在 11 脚本里量出来、打印出来。
"""
import functools
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02", "lecture03", "prereq3", "lecture06"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from transformer_lab import LMConfig, init_params  # noqa: E402

__all__ = ["build_split_model", "recipe_names", "measure_pair_costs", "TINY4", "SPLIT_CFG", "SPLIT_DRAFT_LAYERS"]

# 4 个 token 的玩具（精确枚举：n_new = 3 时 4³ = 64 条输出路径）
TINY4 = LMConfig(name="TINY4", vocab=4, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=4, d_ff=16,
                 max_seq=32)
# 新的一对（选出来的，不是事实）：见模块说明"为什么要新的一对"
SPLIT_CFG = LMConfig(name="SPLIT", vocab=512, d_model=192, n_layers=16, n_heads=4, n_kv_heads=2, head_dim=48,
                     d_ff=576, max_seq=256, emb_std=1.0, in_gain=1.0, wo_gain=0.10, down_gain=0.15, head_gain=1.78)
SPLIT_DRAFT_LAYERS = 4

_GRAMMAR = ("qcfg:S", "qcfg-layers:K:S", "qcfg-int4:S", "qcfg-bigram:S", "tiny4:S", "tiny4-layers:K:S",
            "split:S", "split-draft:S", "split-layers:K:S", "smollm2[:float32]", "smollm2-layers:K[:float32]")


def recipe_names():
    """配方的写法（S = 种子，K = 层数）-> tuple of str（错误信息和测试用）。"""
    return _GRAMMAR


def _bad(recipe, why=""):
    return ValueError(f"不认识的模型配方 {recipe!r}{('（' + why + '）') if why else ''}；"
                      f"可以用的写法：{', '.join(_GRAMMAR)}（S = 种子，K = 层数，都是非负整数）")


def _int(recipe, s):
    if not s.isdigit():
        raise _bad(recipe, f"{s!r} 不是非负整数")
    return int(s)


@functools.lru_cache(maxsize=8)
def _random_target(kind, seed):
    from decode_lab import TransformerLM
    if kind == "qcfg":
        from quant_lab import QCFG
        cfg = QCFG
    elif kind == "tiny4":
        cfg = TINY4
    else:
        cfg = SPLIT_CFG
    return TransformerLM(init_params(cfg, seed), cfg, f"{kind}:{seed}")


@functools.lru_cache(maxsize=1)
def _smollm2_params(dtype):
    from real_model_lab import load_gguf
    P, cfg, _ = load_gguf(dtype=np.dtype(dtype).type)
    return P, cfg


_SMOLLM2 = {}                 # dtype -> 整个 SmolLM2（同一时刻只留一种 dtype，同 lru_cache(maxsize=1)）


def _smollm2(dtype):
    if dtype not in _SMOLLM2:
        from decode_lab import TransformerLM
        _SMOLLM2.clear()
        _SMOLLM2[dtype] = TransformerLM(*_smollm2_params(dtype), "SmolLM2")
    return _SMOLLM2[dtype]


def _smollm2_layers(recipe, dtype, k):
    """SmolLM2 的前 k 层：整个模型已经建了就共用它融合好的层（drafts_lab.early_exit_draft）；还没建就只装前 k 层
    （先读文件头看有几层，再 real_model_lab.load_gguf(n_layers=k)）建一个 TransformerLM(前 k 层的参数, n_layers = k
    的配置)：和前者逐位相同，不为用不到的层反量化、做融合。"""
    from decode_lab import TransformerLM
    from gguf_lab import read_gguf
    from hub_lab import gguf_path
    from real_model_lab import gguf_config, load_gguf
    if dtype in _SMOLLM2:
        return _layers(recipe, _SMOLLM2[dtype], k)
    path = gguf_path()
    n = gguf_config(read_gguf(path)).n_layers
    if not 1 <= k <= n - 1:
        raise _bad(recipe, f"K 必须在 1..{n - 1} 之间，收到 {k}")
    pk, cfg, _ = load_gguf(path, np.dtype(dtype).type, n_layers=k)
    return TransformerLM(pk, cfg, f"SmolLM2 前 {k} 层")


def _layers(recipe, base, k):
    from drafts_lab import early_exit_draft
    L = base.cfg.n_layers
    if not 1 <= k <= L - 1:
        raise _bad(recipe, f"K 必须在 1..{L - 1} 之间，收到 {k}")
    return early_exit_draft(base, k, f"{base.name} 前 {k} 层")


def build_split_model(recipe):
    """
    配方字符串 -> 模型（decode_lab.TransformerLM 或 NGramLM，有 session()）。写法见模块说明。

    【做法】QCFG 的四种和第 6 讲 03 的 build_models 完全相同（同样的种子、同样的量化；测试逐个参数核对）；
    "…-layers:K" 是 drafts_lab.early_exit_draft（和 TransformerLM(前 K 层的参数, n_layers = K 的配置) 逐位相同，
    共用目标的权重）。同一个进程里同一个目标只造一次（缓存），所以目标和它的草稿共用一份权重。"smollm2-layers:K"
    在进程里还没有整个 SmolLM2 时，只从文件装前 K 层直接建（就是上面那个逐位相同的模型，只是不共用权重）。
    【边界】配方不是字符串、不认识、K 或 S 不是非负整数、K 出界：ValueError，消息列出可以用的写法。
    SmolLM2 拿不到文件：hub_lab.ModelUnavailableError（消息说怎么办）。
    """
    if not isinstance(recipe, str):
        raise _bad(recipe, "配方必须是字符串")
    parts = recipe.split(":")
    head, rest = parts[0], parts[1:]
    if head in ("smollm2", "smollm2-layers"):
        dtype = "float64"
        if rest and rest[-1] == "float32":
            dtype, rest = "float32", rest[:-1]
        if head == "smollm2" and not rest:
            return _smollm2(dtype)
        if head == "smollm2-layers" and len(rest) == 1:
            return _smollm2_layers(recipe, dtype, _int(recipe, rest[0]))
        raise _bad(recipe)
    if head in ("qcfg", "tiny4", "split") and len(rest) == 1:
        return _random_target(head, _int(recipe, rest[0]))
    if head in ("qcfg-layers", "tiny4-layers", "split-layers") and len(rest) == 2:
        k, s = _int(recipe, rest[0]), _int(recipe, rest[1])
        return _layers(recipe, _random_target(head.split("-")[0], s), k)
    if head == "split-draft" and len(rest) == 1:
        return _layers(recipe, _random_target("split", _int(recipe, rest[0])), SPLIT_DRAFT_LAYERS)
    if head == "qcfg-int4" and len(rest) == 1:
        from decode_lab import TransformerLM
        from quant_lab import QCFG, quantize_params
        s = _int(recipe, rest[0])
        P = _random_target("qcfg", s).params
        return TransformerLM(quantize_params(P, "int4-g32", include_lm_head=True)[0], QCFG, "int4")
    if head == "qcfg-bigram" and len(rest) == 1:
        from decode_lab import NGramLM
        from quant_lab import QCFG, sample_tokens
        P = _random_target("qcfg", _int(recipe, rest[0])).params
        return NGramLM.fit(sample_tokens(P, QCFG, n_seq=64, length=128, seed=1), QCFG.vocab)
    raise _bad(recipe)


def _step_times(model, context, n_steps):
    """在长 context 的上下文后面一个一个喂 token，每步（一次 session.logits）的时间 -> ndarray [n_steps]（秒）。"""
    sess = model.session()
    V = model.cfg.vocab
    seq = [i % V for i in range(context)]
    sess.logits(seq)
    out = np.empty(n_steps)
    for i in range(n_steps):
        seq.append((7 * i + 1) % V)
        t0 = time.perf_counter()
        sess.logits(seq)
        out[i] = time.perf_counter() - t0
    return out


def measure_pair_costs(target_recipe="split:0", draft_recipe="split-draft:0", *, context=64, n_steps=40,
                       repeats=3):
    """
    量一对模型 decode 一步的时间 -> dict：target_ms、draft_ms（每步的中位数，毫秒）、c = draft_ms / target_ms、
    以及量的条件（recipes、context、n_steps、repeats）。给 --calibrate 写进 cpu_calibration.json 的 "heterogeneous" 节。

    【做法】两个模型各开一个会话，先喂 context 个 token，再一个一个喂 n_steps 个（每步一次带 KV cache 的前向，
    投机解码里草稿一步、目标一步就是这个），每步计时；两个模型轮流量 repeats 遍，取所有步的中位数
    （轮流量：机器上别的负载对两边的影响差不多）。在调用它的进程自己的 BLAS 线程数下量（编号脚本和 worker 都是 1 个）。
    目标一次验证 γ + 1 个位置比一步贵一点，这里不量（11 脚本的模型按一步算，并说明）。
    【边界】context < 1、n_steps < 1、repeats < 1、上下文装不下：ValueError。
    """
    for name, v in (("context", context), ("n_steps", n_steps), ("repeats", repeats)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")
    target, draft = build_split_model(target_recipe), build_split_model(draft_recipe)
    for m in (target, draft):
        if hasattr(m, "cfg") and context + n_steps > m.cfg.max_seq:
            raise ValueError(f"context + n_steps = {context + n_steps} 超过模型的上下文 max_seq = {m.cfg.max_seq}")
    t_all, d_all = [], []
    for _ in range(repeats):
        t_all.append(_step_times(target, context, n_steps))
        d_all.append(_step_times(draft, context, n_steps))
    t_ms = float(np.median(np.concatenate(t_all))) * 1e3
    d_ms = float(np.median(np.concatenate(d_all))) * 1e3
    return {"target_ms": t_ms, "draft_ms": d_ms, "c": d_ms / t_ms, "target_recipe": target_recipe,
            "draft_recipe": draft_recipe, "context": int(context), "n_steps": int(n_steps), "repeats": int(repeats)}

"""
real_model_lab —— 把一个 GGUF 文件（默认 SmolLM2-135M-Instruct）装进课程自己的 numpy transformer -> (params, cfg, tokenizer)。

【三件事分在三个实验模块里】找到 / 下载文件（hub_lab）、读 GGUF（gguf_lab，块格式的解码在 ../prereq3/numfmt）、
分词器（bpe_lab）；本模块只做"从文件到 transformer_lab 的参数字典和配置"这一步：
1. 检查文件是课程的 numpy 模型能跑的（见下面【支持什么】），不能跑就抛 ValueError，说出看到了什么；
2. 反量化每个张量（Q4_1 / Q8_0 → float32 → cfg 的 dtype），按 transformer_lab 的名字和 [输入维, 输出维] 的方向放好；
3. **撤销 llama.cpp 对 Q、K 行的重排**：llama.cpp 的转换脚本为了它自己的 RoPE（相邻两个数一对）把每个头里的行重排过：
   GGUF 的第 h·hd + 2i + s 行 = Hugging Face 的第 h·hd + s·hd/2 + i 行（s ∈ {0, 1}，i < hd/2）。transformer_lab 的 RoPE
   是 Hugging Face 的写法（前一半和后一半一对），所以要排回去（Q 有 9 个头，K 有 3 个）。不撤销、或撤销两次，模型照样
   跑、照样吐出像样的英文，但 logits 是错的——测试核对 logits，不只看"能跑"；
4. lm_head：文件里没有 output.weight 时和词嵌入共享（tied）：lm_head = 词嵌入的转置（一个视图，不多占内存）。

【支持什么】（CS349E_GGUF 指向别的文件时也按这个检查）general.architecture = llama；张量类型 F32 / F16 / Q8_0 / Q4_0 /
Q4_1（别的类型 gguf_lab 会说出类型名）；分词器 gpt2 + smollm 预分词器（bpe_lab 检查）；lm_head 共享或不共享；
没有 RoPE 缩放（llama.rope.scaling.type 不是 none 就拒绝）；按选的 dtype 装得进内存（权重 + 前向用的融合副本，
约 2 份权重，和 /proc/meminfo 的 MemAvailable 比）。

【上下文】文件的上下文是 8192 个位置；一个 float64 的 KV cache 开满 8192 个位置约 0.75 GB（30 层 × 2 × 3 头 × 64 ×
8 字节 × 8192）。load_gguf 默认把 cfg.max_seq 截到 2048（max_seq 参数可以改，最多到文件的上下文）：
课程的提示和生成都远短于它。
【类型】dtype = np.float64（默认；和 Hugging Face 的 float64 对得上 ~1e-13）或 np.float32（快约一倍、内存减半，
舍入误差 ~1e-5）：见 transformer_lab 的 LMConfig.dtype。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from bpe_lab import BPETokenizer  # noqa: E402
from gguf_lab import read_gguf  # noqa: E402
from hub_lab import gguf_path  # noqa: E402
from transformer_lab import LMConfig, config_like  # noqa: E402

__all__ = ["load_gguf", "as_dtype", "gguf_config", "unpermute_rope_rows", "permute_rope_rows", "DEFAULT_MAX_SEQ"]

DEFAULT_MAX_SEQ = 2048     # KV cache 的长度上限（文件的上下文是 8192）；见模块说明


def unpermute_rope_rows(w, n_heads):  # [heads·hd, d] -> 同形状
    """
    撤销 llama.cpp 转换时对 Q / K 权重行的重排 -> Hugging Face 的行顺序。

    【推导】GGUF 的第 h·hd + 2i + s 行 = HF 的第 h·hd + s·hd/2 + i 行：把 GGUF 的行看成 [头, i, s]，换成 [头, s, i]。
    """
    rows, d = w.shape
    hd = rows // n_heads
    if rows % n_heads or hd % 2:
        raise ValueError(f"{rows} 行分不成 {n_heads} 个头、每个头偶数行（head_dim = {rows / n_heads:g}）")
    return w.reshape(n_heads, hd // 2, 2, d).transpose(0, 2, 1, 3).reshape(rows, d)


def permute_rope_rows(w, n_heads):  # [heads·hd, d] -> 同形状
    """llama.cpp 的重排本身（unpermute_rope_rows 的逆）：HF 的 [头, s, i] 行排成 GGUF 的 [头, i, s]。测试用它做反例。"""
    rows, d = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, d).transpose(0, 2, 1, 3).reshape(rows, d)


def _meta(md, key, kind=int):
    if key not in md:
        raise ValueError(f"GGUF 文件缺少元数据 {key!r}：不是一个完整的 llama 模型文件")
    v = md[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ValueError(f"元数据 {key!r} 应当是整数（收到 {v!r}）")
    return v


def gguf_config(g, dtype=np.float64, max_seq=None):
    """
    从打开的 GGUF（gguf_lab.GGUFFile）的元数据得到 transformer_lab.LMConfig -> cfg。

    【边界】不是 llama 架构、有 RoPE 缩放、维数对不上、max_seq 超过文件的上下文：抛 ValueError，说出看到的值。
    """
    md = g.metadata
    arch = md.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"只支持 general.architecture = 'llama' 的 GGUF（这个文件是 {arch!r}）")
    scaling = md.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ValueError(f"不支持 RoPE 缩放（这个文件的 llama.rope.scaling.type = {scaling!r}；课程的 RoPE 只有普通的一种）")
    d = _meta(md, "llama.embedding_length")
    H = _meta(md, "llama.attention.head_count")
    Hkv = md.get("llama.attention.head_count_kv", H)
    hd = md.get("llama.attention.key_length", d // H)
    if md.get("llama.rope.dimension_count", hd) != hd:
        raise ValueError(f"只支持 RoPE 转整个 head_dim（rope.dimension_count = {md['llama.rope.dimension_count']}，"
                         f"head_dim = {hd}）")
    ctx = _meta(md, "llama.context_length")
    max_seq = min(DEFAULT_MAX_SEQ, ctx) if max_seq is None else max_seq
    if not (isinstance(max_seq, (int, np.integer)) and 1 <= max_seq <= ctx):
        raise ValueError(f"max_seq 必须是 1..{ctx}（文件的上下文）之间的整数（收到 {max_seq!r}）")
    vocab = len(md.get("tokenizer.ggml.tokens", [])) or _meta(md, "llama.vocab_size")
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype 只能是 np.float64 或 np.float32（收到 {dtype!r}）")
    name = md.get("general.basename", "gguf") + ("-" + md["general.size_label"] if "general.size_label" in md else "")
    return LMConfig(name=name, vocab=vocab, d_model=d, n_layers=_meta(md, "llama.block_count"), n_heads=H,
                    n_kv_heads=Hkv, head_dim=hd, d_ff=_meta(md, "llama.feed_forward_length"), max_seq=int(max_seq),
                    rope_theta=float(md.get("llama.rope.freq_base", 10000.0)),
                    norm_eps=float(_meta(md, "llama.attention.layer_norm_rms_epsilon", float)),
                    tied="output.weight" not in g.tensors, dtype=dt.name)


def _mem_available():
    """本机可用内存（字节，/proc/meminfo 的 MemAvailable）；读不到时 None（不检查）。"""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def load_gguf(path=None, dtype=np.float64, max_seq=None, n_layers=None):
    """
    读一个 GGUF，装成课程的 numpy transformer 用的参数 -> (params, cfg, tokenizer)。

    params 的结构同 transformer_lab.init_params（词嵌入 [V, d]，每层 wq [d, H·hd] 等，lm_head [d, V]）；
    cfg 是 LMConfig（tied、dtype 见模块说明）；tokenizer 是 bpe_lab.BPETokenizer。
    NumpyTransformer(params, cfg) 或 decode_lab.TransformerLM(params, cfg) 跑它。
    【参数】path=None：hub_lab.gguf_path()（CS349E_GGUF，否则缓存里的 SmolLM2，否则第一次用时下载）；
    dtype：np.float64 或 np.float32；max_seq：KV cache 的长度上限（默认 2048）；
    n_layers：只装前 n_layers 层（cfg.n_layers 也是它；词嵌入、最后的 RMSNorm 和 lm_head 照装）。默认 None：全部。
    装出来的前 n_layers 层和全部装出来再取前 n_layers 层逐位相同；给只要几层的 worker 进程用（少读、少反量化）。
    【边界】文件不合要求：ValueError（见模块说明）；下载不了：hub_lab.ModelUnavailableError，消息说怎么办。
    """
    path = gguf_path() if path is None else os.fspath(path)
    g = read_gguf(path)
    cfg = gguf_config(g, dtype, max_seq)
    if n_layers is not None:
        if not (isinstance(n_layers, (int, np.integer)) and not isinstance(n_layers, bool) and 1 <= n_layers <= cfg.n_layers):
            raise ValueError(f"n_layers 必须是 1..{cfg.n_layers}（文件的层数）之间的整数（收到 {n_layers!r}）")
        cfg = config_like(cfg, n_layers=int(n_layers))
    tok = BPETokenizer.from_gguf_metadata(g.metadata)
    if len(tok) != cfg.vocab:
        raise ValueError(f"分词器有 {len(tok)} 个 token，模型的词表是 {cfg.vocab}")
    dt = np.dtype(cfg.dtype)
    need = 2 * g.n_parameters * dt.itemsize
    avail = _mem_available()
    if avail is not None and need > avail:
        raise ValueError(f"{os.path.basename(path)} 有 {g.n_parameters:,} 个参数，按 {dt.name} 装进来（权重 + 前向的融合副本）"
                         f"约要 {need / 1e9:.1f} GB，本机只剩 {avail / 1e9:.1f} GB：换 float32，或换一个小一点的模型")

    def load(name, shape):        # -> float32（gguf_lab 在 float32 里反量化：float64 的结果就是它的精确拷贝）
        if name not in g.tensors:
            raise ValueError(f"{os.path.basename(path)} 里没有张量 {name!r}：不是一个完整的 llama 模型文件")
        w = g.load(name, np.float32)
        if w.shape != shape:
            raise ValueError(f"张量 {name!r} 的形状是 {w.shape}（numpy 顺序），按元数据应当是 {shape}")
        return w

    def vec(name, n):
        return load(name, (n,)).astype(dt, copy=False)

    def mat(name, shape, heads=None):
        """GGUF 的矩阵是 [out, in]，课程的是 [in, out]：在 float32 里（撤销 Q、K 的行重排、）转置，连续存放（矩阵乘快），
        转 dtype 和转置一次做完——值和先转 float64 再转置逐位相同（float32 -> float64 是精确的），少一份大数组。"""
        w = load(name, shape)
        if heads is not None:
            w = unpermute_rope_rows(w, heads)
        return np.ascontiguousarray(w.T, dtype=dt)

    d, ff, V = cfg.d_model, cfg.d_ff, cfg.vocab
    nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    P = {"embed": load("token_embd.weight", (V, d)).astype(dt, copy=False), "layers": []}
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        P["layers"].append({
            "attn_norm": vec(b + "attn_norm.weight", d),
            "wq": mat(b + "attn_q.weight", (nq, d), cfg.n_heads),
            "wk": mat(b + "attn_k.weight", (nkv, d), cfg.n_kv_heads),
            "wv": mat(b + "attn_v.weight", (nkv, d)),
            "wo": mat(b + "attn_output.weight", (d, nq)),
            "mlp_norm": vec(b + "ffn_norm.weight", d),
            "w_gate": mat(b + "ffn_gate.weight", (ff, d)),
            "w_up": mat(b + "ffn_up.weight", (ff, d)),
            "w_down": mat(b + "ffn_down.weight", (d, ff)),
        })
    P["final_norm"] = vec("output_norm.weight", d)
    P["lm_head"] = P["embed"].T if cfg.tied else mat("output.weight", (V, d))
    g.close()
    return P, cfg, tok


def as_dtype(loaded, dtype):
    """
    load_gguf 的结果换一种 dtype -> (params, cfg, tokenizer)：和 load_gguf(同一个文件, dtype) 逐位相同，只是不再读文件、
    不再反量化（float64 的 SmolLM2 装一次约 1–2 秒；换类型只是一次转换）。分词器是同一个对象。
    【为什么逐位相同】load_gguf 在 float32 里反量化每个张量（F32、F16、Q8_0、Q4_0、Q4_1 都是），float64 的参数是这些
    float32 数的精确拷贝：float32 -> float64 -> float32 和 float64 -> float32 -> float64 都不丢一位。
    只对 load_gguf 装出来的参数成立（自己算出来的 float64 参数转 float32 是舍入）。lm_head 和词嵌入共享时仍是它的转置视图。
    """
    P, cfg, tok = loaded
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype 只能是 np.float64 或 np.float32（收到 {dtype!r}）")
    if dt.name == cfg.dtype:
        return loaded
    Q = {"embed": P["embed"].astype(dt), "final_norm": P["final_norm"].astype(dt),
         "layers": [{k: w.astype(dt) for k, w in L.items()} for L in P["layers"]]}
    Q["lm_head"] = Q["embed"].T if cfg.tied else P["lm_head"].astype(dt)
    return Q, config_like(cfg, dtype=dt.name), tok

"""
测试共用的 SmolLM2 模型：conftest.real_model 整个会话只装一次参数；这里在它上面每种 dtype 只建一次
decode_lab.TransformerLM（建的时候融合权重：float64 约 1 GB，不到 1 秒），所有用它的测试文件共用同一个。
"""
from conftest import REAL_LOCK, real_model

_LM = {}


def smollm2_lm(dtype="float64"):
    """-> (TransformerLM, cfg, tokenizer)，每种 dtype 整个测试会话只建一次（conftest 的后台线程可能已经在建：拿同一把锁）。"""
    with REAL_LOCK:
        if dtype not in _LM:
            from decode_lab import TransformerLM
            P, cfg, tok = real_model(dtype)
            _LM[dtype] = (TransformerLM(P, cfg), cfg, tok)
    return _LM[dtype]


def with_layers(base, changed):
    """
    base（一个 NumpyTransformer / TransformerLM）换掉几层参数的模型 -> 同类的浅拷贝；changed = {层号: 这一层的参数 dict}。

    只融合换掉的那几层：构造时的融合（transformer_lab.NumpyTransformer 的【为了快做的等价变换】）是逐层、逐元素的，
    一层单独融合和整个模型重新构造得到的那一层逐位相同；其余的层、词嵌入、融合进最后 RMSNorm 的 lm_head 和 base 共用同一批
    数组（调用者保证这些参数和 base 的一样）。单层融合时给的是占位的词嵌入和 lm_head（1 列），不再算一遍 V × d 的 lm_head。
    float64 的 SmolLM2 整个重新融合一遍约 1.5–2.5 秒（lm_head 就有 2.8e7 个数）；这里只算换掉的层。
    """
    import copy
    m = copy.copy(base)
    m.params = dict(base.params, layers=list(base.params["layers"]))
    m._layers = list(base._layers)
    for li, L in changed.items():
        m.params["layers"][li] = L
        m._layers[li] = fused_layer(base.cfg, L)
    return m


def fused_layer(cfg, L):
    """
    一层的参数 L（dict）-> 融合好的这一层（NumpyTransformer 的 _layers 的一项）：放进一个只有它的模型里融合，词嵌入和
    lm_head 用 1 列的占位、上下文只留 1 个位置（RoPE 的表不用算 2048 行）。融合逐层独立，和整个模型一起融合逐位相同。
    """
    import numpy as np
    from transformer_lab import NumpyTransformer, config_like
    d = cfg.d_model
    stub = {"embed": np.zeros((1, d)), "lm_head": np.zeros((d, 1)), "final_norm": np.ones(d), "layers": [L]}
    return NumpyTransformer(stub, config_like(cfg, n_layers=1, max_seq=1))._layers[0]


def packed(seqs):
    """
    几条 token 序列首尾相接摞成一条，一次前向算完 -> (toks [1, S]、遮罩 [S, S]、RoPE 位置 [S]、每段的起点)。
    遮罩是块对角的因果遮罩（每个位置只看同一段里它自己和它前面的位置），位置每段从 0 数起：每段看到的和单独前向时
    一模一样（别段的打分加 −inf，softmax 以后正好是 0），只差矩阵乘分块的舍入（float64 的 1e-16 量级）。
    为什么摞起来：每个权重矩阵乘一次 S 行，而不是每段各乘一次几十行（行数少时 BLAS 的效率低，numpy 的调用也多几倍）。
    多算的只是被遮住的跨段打分。
    """
    import numpy as np
    lens = [len(s) for s in seqs]
    starts = np.cumsum([0] + lens[:-1])
    toks = np.concatenate([np.asarray(s) for s in seqs]).astype(np.int64)[None]
    seg = np.repeat(np.arange(len(seqs)), lens)
    i = np.arange(seg.size)
    mask = (seg[:, None] == seg[None, :]) & (i[None, :] <= i[:, None])
    pos = np.concatenate([np.arange(n) for n in lens])
    return toks, mask, pos, starts


def new_token_logits(model, prompt, new):
    """
    model 在 prompt + new 这一段上一次前向、只在预测 new 的那几个位置（len(prompt) − 1 起 len(new) 个）算 lm_head
    -> [len(new), V]（logits_at 的一条序列的写法）。
    """
    import numpy as np
    return logits_at(model, np.array([list(prompt) + list(new)]), slice(len(prompt) - 1, len(prompt) - 1 + len(new)))[0]


def logits_at(model, toks, cut):
    """
    model 在 toks [B, n] 上一次前向、只在 cut（一个 slice）那几个位置算 lm_head -> [B, cut 的位置数, V]。
    前向和 model.forward(toks) 完全一样（每层都算整段），只是 lm_head 不乘用不上的那些行：lm_head 对每个位置是独立的
    一次矩阵乘（[n, d] @ [d, V] 的行互不相干），所以留下的行和整段算完再切出来的一样，只差 BLAS 分块的舍入。
    SmolLM2 的 lm_head 每个位置 2.8e7 次乘加，约是 30 层的四分之一。
    """
    import numpy as np
    toks = np.asarray(toks)
    want = len(range(*cut.indices(toks.shape[1])))
    own = vars(model).get("lm_head")                 # 实例上已经换过的 lm_head（一般没有：用类的方法）
    head = model.lm_head
    model.lm_head = lambda h: head(h[:, cut])
    try:
        out = model.forward(toks)
    finally:
        if own is None:
            del model.lm_head
        else:
            model.lm_head = own
    assert out.shape[:2] == (toks.shape[0], want)
    return out

"""
runner_lab —— 引擎的模型执行：一步一次前向，把不规则的批（几段 prefill、几个 decode，各在各的位置）摊成一个
[N, d] 矩阵做每一次权重矩阵乘（一步只读一遍权重：这就是成批划算的原因），注意力按序列各算各的（按块表取出它自己的
K、V），RoPE 按每个 token 自己的位置转；然后给要抽下一个 token 的序列抽样。还有一步的账（FLOPs、字节）和
一台 CPU 上的模型时间。

【模型的数学只在一处】这里只调用 transformer_lab.NumpyTransformer 的零件（embed、rms_scale、qkv_proj、rope、
attention、o_proj、mlp、lm_head），不抄一层的代码。
【KV 块池】每层一个 K 和一个 V 数组 [n_blocks, block_size, n_kv_heads, head_dim]（模型的 dtype）；
token 在块里的"槽"= 块表[位置 // block_size]·block_size + 位置 % block_size。
【抽样】每个请求带着自己的种子、自己的 np.random.default_rng(seed)——这是 STYLE"随机数传进来"的一个例外：
一个请求抽到什么不能取决于同一步里还有谁。规则同 decode_lab.autoregressive_generate：每个新 token 一个 rng.random()，
adjust(logits, T) 的 CDF 反查（T = 0 是贪心，也照样消耗一个均匀数）。所以引擎里的请求和它单独生成的抽到同样的 token。
【批不变】numpy 的矩阵乘不是批不变的：float32 里一行的结果随这次调用有几行而变（~1e-6 相对）。batch_invariant=True 时
每次权重矩阵乘一行一次（rowwise_matmul），注意力一次只算一个 query：一行的结果只取决于它自己的数据，和批里还有谁、
prefill 怎么分块都无关（测试断言 float32 下逐位相同）。代价：每个 token 都把权重读一遍——成批的好处全没了。
更省的做法是固定形状的块（每次都乘同样的 M 行）：但这台机器上（OpenBLAS）同一行放在块里的第 0–5 行和第 6–15 行
结果就不同，一行在块里的位置也得固定，这依赖 BLAS 的内核，换一台机器就不成立，所以这里不用。
"""
import functools
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02", "lecture06"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from transformer_lab import BYTES_PER_EL, NumpyTransformer, analytic_ops, sample_inverse_cdf  # noqa: E402
from decode_lab import adjust  # noqa: E402

__all__ = ["ModelRunner", "rowwise_matmul", "chunk_counts", "step_counts", "CPU_COST",
           "modelled_step_time"]



def rowwise_matmul(a, w):  # [..., k] @ [k, m] -> [..., m]
    """一行一次的矩阵乘（[1, k] @ [k, m]）：一行的结果只取决于它自己，和这次有几行、别的行是什么都无关。"""
    x = a.reshape(-1, a.shape[-1])
    out = np.concatenate([x[i:i + 1] @ w for i in range(len(x))])
    return out.reshape(a.shape[:-1] + (w.shape[1],))


class ModelRunner:
    """
    一个模型 + 一个 KV 块池。run(chunks) 做一步的前向 -> (每段抽出的 token 或 None, 抽样那几行的 logits [k, V])。

    params：init_params / load_gguf 的参数 dict，或一个现成的 NumpyTransformer（例如 decode_lab.TransformerLM：
    脚本里引擎和"单独生成"共用一份融合好的权重）。
    chunks：scheduler_lab.ScheduledChunk 的列表（req、start、n、sample），块表已经够放这一步要写的 token。
    """

    def __init__(self, params, cfg, num_blocks, block_size, batch_invariant=False):
        self.cfg, self.block_size = cfg, block_size
        if isinstance(params, NumpyTransformer):        # 一个现成的模型（省得再融合一遍权重）
            if params.cfg != cfg:
                raise ValueError("给的模型的配置和 cfg 不同")
            self.model = params
        else:
            self.model = NumpyTransformer(params, cfg)
        if batch_invariant:
            if self.model.matmul is not rowwise_matmul and isinstance(params, NumpyTransformer):
                self.model = NumpyTransformer(params.params, cfg)   # 不改调用者的模型
            self.model.matmul = rowwise_matmul
        self.invariant = batch_invariant
        self.keep_hidden, self.hidden = False, None      # 引擎的 keep_hidden=True 打开：见 forward 的最后一行
        dt = np.dtype(cfg.dtype)
        shape = (cfg.n_layers, num_blocks * block_size, cfg.n_kv_heads, cfg.head_dim)   # 块 × 块内位置摊平成"槽"
        self.k, self.v = np.zeros(shape, dtype=dt), np.zeros(shape, dtype=dt)
        self._causal = {}
        self.prepare_s = 0.0

    def _mask(self, start, n):  # -> [n, start + n] 加性遮罩（0 = 能看）
        key = (start, n)
        if key not in self._causal:
            S = start + n
            self._causal[key] = np.where(np.arange(S)[None, :] > (start + np.arange(n))[:, None], -np.inf,
                                         0.0).astype(self.cfg.dtype)
            if len(self._causal) > 4096:
                self._causal.clear()
        return self._causal[key]

    def prepare(self, chunks):
        """
        一步的下标数组：token、位置、写入的槽、每段的上下文槽和遮罩、要抽样的行（nano-vllm 的 prepare_prefill / decode）。
        一段可以自带 toks（这一段的 token）和 n_out（要最后几行的 logits：验证 γ 个草稿要 γ + 1 行）。
        """
        bs = self.block_size
        toks, pos, slots, seqs, rows = [], [], [], [], []
        r = 0
        for c in chunks:
            tbl = np.asarray(c.req.block_table, dtype=np.int64)
            p = np.arange(c.start, c.start + c.n)
            S = c.start + c.n
            ctx = np.arange(S)
            own = getattr(c, "toks", None)                # 投机解码的一段自带 token（草稿不在 req.tokens 里）
            toks.append(c.req.tokens[c.start:S] if own is None else own)
            pos.append(p)
            slots.append(tbl[p // bs] * bs + p % bs)
            seqs.append((r, c.n, c.start, tbl[ctx // bs] * bs + ctx % bs))
            r += c.n
            rows.extend(range(r - getattr(c, "n_out", 1 if c.sample else 0), r))   # 要 logits 的行：通常只有最后一行
        toks = np.asarray([t for ts in toks for t in ts], dtype=np.int64)
        return toks, np.concatenate(pos), np.concatenate(slots), seqs, np.asarray(rows, dtype=np.int64)

    def forward(self, chunks):
        """一步的前向 -> 要抽样的那几行的 logits [k, V]（k = 各段 n_out 之和，通常是抽样的段数；按 chunks 的顺序）。"""
        m, cfg = self.model, self.cfg
        H, Hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        nq, nkv = H * hd, Hkv * hd
        t0 = time.perf_counter()
        toks, pos, slots, seqs, rows = self.prepare(chunks)
        self.prepare_s = time.perf_counter() - t0                        # 建下标数组的时间（引擎自己的开销）
        N = len(toks)
        rot = m.rope_table(pos)                                          # [N, 1, hd/2]：每个 token 自己的位置
        x = m.embed(toks)                                                # [N, d]
        A = np.empty((N, nq), dtype=x.dtype)
        masks = [None if (n == 1 or self.invariant) else self._mask(start, n) for _, n, start, _ in seqs]
        for li in range(cfg.n_layers):
            qkv = m.qkv_proj(li, m.rms_scale(x))                         # [N, nq + 2·nkv]：一次读这一层的权重
            qk = m.rope(qkv, rot)                                        # [N, H + Hkv, hd]
            kl, vl = self.k[li], self.v[li]
            kl[slots] = qk[:, H:]
            vl[slots] = qkv[:, nq + nkv:].reshape(N, Hkv, hd)
            q = qk[:, :H]
            for (r0, n, start, ctx), mask in zip(seqs, masks):          # 注意力：按序列，只看它自己的块
                K = kl[ctx].transpose(1, 0, 2)[None]                     # [1, Hkv, S, hd]
                V = vl[ctx].transpose(1, 0, 2)[None]
                if self.invariant:                                       # 一次一个 query：形状和批无关
                    for j in range(n):
                        S = start + j + 1
                        A[r0 + j] = m.attention(q[None, r0 + j:r0 + j + 1], K[:, :, :S], V[:, :, :S], None)[0, 0]
                else:
                    A[r0:r0 + n] = m.attention(q[None, r0:r0 + n], K, V, mask)[0]
            x = x + m.o_proj(li, A)
            x = x + m.mlp(li, m.rms_scale(x))
        if not len(rows):
            self.hidden = np.zeros((0, cfg.d_model), dtype=x.dtype) if self.keep_hidden else None
            return np.zeros((0, cfg.vocab), dtype=x.dtype)
        h = m.rms_scale(x[rows])                                         # [k, d]：最后的 RMSNorm（权重已并进 lm_head）
        if self.keep_hidden:                                             # 训练草稿用的隐状态：lm_head(h) 就是这几行的 logits
            self.hidden = h
        return m.lm_head(h)                                              # [k, V]

    def run(self, chunks):
        """前向 + 抽样 -> (list：每段抽出的 token，不抽的段是 None；logits [k, V])。"""
        logits = self.forward(chunks)
        out, k = [], 0
        for c in chunks:
            if not c.sample:
                out.append(None)
                continue
            probs = adjust(logits[k], c.req.temperature)
            out.append(int(sample_inverse_cdf(probs, c.req.rng.random())))
            k += 1
        return out, logits


# ---------------------------------------------------------------------------
# 一步的账和 CPU 上的模型时间
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=1 << 12)
def _chunk_ints(cfg, n, sample):
    """
    一段 n 个 token 的账（整数，BF16 的字节）在 start = 0 处的值和对 start 的斜率 -> ((flops, w, kv, emb), (斜率…))。

    【推导】账本里和已缓存长度 start 有关的只有注意力：打分和乘 V 的 FLOPs 2·H·n·(start + n)·hd、softmax 的
    H·n·(start + n)、读 KV 的字节 Hkv·(start + n)·hd——都是 start 的一次函数（ledger_lab._layer_ledger），所以
    f(start) = f(0) + start·(f(1) − f(0))，整数上精确。一个 n 只跑两遍账本，不是每个 start 一遍（decode 的 start
    每步都不同：模型时间里最贵的就是这个）。
    """
    def at(start):
        rows = analytic_ops(cfg, 1, n, start, last_only=True)
        return (sum(r["flops"] for r in rows if sample or r["op"] != "lm_head"),
                sum(r["w"] for r in rows if r["op"] != "embed"),
                sum(r["kv"] for r in rows),
                sum(r["w"] for r in rows if r["op"] == "embed"))
    f0, f1 = at(0), at(1)
    return f0, tuple(b - a for a, b in zip(f0, f1))


def chunk_counts(cfg, n, start, sample):
    """
    一段（n 个新 token，前面已缓存 start 个）的账 -> (flops, 权重字节, KV 字节, 嵌入字节)，字节按模型的 dtype。

    【推导】ledger_lab.analytic_ops(cfg, 1, n, start, last_only=True) 逐算子求和（测试断言和账本一致）；不抽样的段
    （prefill 的中间块）不算 lm_head。字节的账按 BF16 记（2 字节），这里乘 dtype 的字节数 / 2。按 start 是一次函数
    来算（_chunk_ints）。sample 也可以是整数 k：lm_head 算 k 行（投机解码验证 γ 个草稿要 γ + 1 行的 logits），
    FLOPs = 不抽样的 + k × 一行 lm_head 的（= 抽样的 − 不抽样的）。
    """
    k = int(sample)
    (flops, w, kv, emb), (dflops, _, dkv, _) = _chunk_ints(cfg, n, k > 0)
    if k > 1:
        flops += (k - 1) * (flops - _chunk_ints(cfg, n, False)[0][0])
    scale = np.dtype(cfg.dtype).itemsize / BYTES_PER_EL
    return flops + start * dflops, w * scale, (kv + start * dkv) * scale, emb * scale


def step_counts(cfg, chunks):
    """
    一步（几段，每段 (n, start, sample)；sample 可以是要 logits 的行数）的账 -> dict flops、bytes（权重**只读一遍** + 每段的 KV + 嵌入行）、seqs、tokens。
    """
    flops = kv = emb = 0
    w = 0
    for n, start, sample in chunks:
        f, wc, k, e = chunk_counts(cfg, n, start, sample)
        flops, kv, emb, w = flops + f, kv + k, emb + e, max(w, wc)
    return {"flops": flops, "bytes": w + kv + emb, "seqs": len(chunks), "tokens": sum(c[0] for c in chunks)}


# CPU 的代价模型（假设）。算力和带宽是 `python3 tests/bench_decode.py --real` 在一台 AMD EPYC（2 核、一个 BLAS 线程、
# 空闲）上量的（2026-12-02，commit f746f19 引入时）；两个固定开销是估计（每步几百次 numpy 调用、每个序列每层约十次，每次几微秒），
# tests/bench_engine.py 会按"实测 − roofline"拟合出本机的值，空闲时待核对：
CPU_COST = {
    "flops_per_s": 53e9,     # 矩阵乘能达到的算力（SmolLM2 float32 prefill 195 token/s ≈ 53 GFLOP/s）
    "bytes_per_s": 10.4e9,   # 读权重的带宽（batch-1 decode 51.8 ms/token）
    "step_s": 2.0e-3,        # 每步固定的开销（估计）：几百次 numpy 调用、调度、建下标数组
    "seq_s": 0.5e-3,         # 每个序列每步的开销（估计）：每层一次按块表取 K/V 和一次小的注意力
}


def modelled_step_time(counts, cost=None):
    """
    一步的模型时间（秒）= max(FLOPs / 算力, 字节 / 带宽) + 每步开销 + 序列数 × 每序列开销（roofline + 固定开销）。
    """
    c = CPU_COST if cost is None else cost
    return (max(counts["flops"] / c["flops_per_s"], counts["bytes"] / c["bytes_per_s"]) + c["step_s"]
            + counts["seqs"] * c["seq_s"])

"""
runner_lab —— 引擎的模型执行：一步一次前向，把不规则的批（几段 prefill、几个 decode，各在各的位置）摊成一个
[N, d] 矩阵做每一次权重矩阵乘（一步只读一遍权重：这就是成批划算的原因），注意力按序列各算各的（按块表取出它自己的
K、V），RoPE 按每个 token 自己的位置转；然后给要抽下一个 token 的序列抽样。还有一步的账（FLOPs、字节）和
一台 CPU 上的模型时间。

【模型的数学只在一处】这里只调用 transformer_lab.NumpyTransformer 的零件（embed、rms_scale、qkv_proj、rope、
attention、o_proj、mlp、lm_head），不抄一层的代码。
【快在哪里（tests/bench_engine.py --profile 量的账）】一步的时间几乎全在权重矩阵乘里，其余的是注意力和取 K/V。
三处改动，各自保持 float64 下引擎 == 单独生成（tests/test_engine*.py、test_dispatch_matmul.py），批不变模式不动：
(1) dispatch_matmul：M = 2、3 行时一行一次（这个 BLAS 的小 M GEMM 比 M = 4 还慢）；
(1') 其中放不进缓存的 lm_head 按列分块、一块上把几行乘完（权重只从内存流一遍）：一次空闲时的 --profile，lm_head
    M = 2 从 7.7 降到 5.6 ms，M = 3 从 11.4 降到 7.4 ms；
(2) decode 的段一层只取一次 K/V、算一次注意力（槽矩阵 + 遮罩，paged attention 的形式），不再每个序列一次
    Python 循环：补齐的位置 exp(−inf) = 0，只多出精确的 0，舍入只随 BLAS 的求和顺序变（float64 下 < 1e-12）。
【主机的活】（调度、建下标、postprocess、抽样；tests/bench_engine.py --profile 打印各占一步多少）调度 + 建下标 +
postprocess 在批 64 时约 0.5 ms，不到一步的 0.3%：vLLM V1 的异步调度藏的就是这一份，这里不值得做。抽样：贪心的行
直接取 argmax；T > 0 时一行是 [V] 的 float64 softmax + 累积和（约 0.23 ms，累积和是一条串行的加法链，占一半多），
一个线程时批 16–64 占一步 5–6.7%（--temperature 1）。sample_threads=2 时另一个核抽一半的行、这个线程抽另一半
（numpy 在累积和里放开解释器锁）：批 64 的抽样 14.6 → 8.7 ms，每个批都在一步的 5% 以下。默认 1：确定性的页面
不需要它（抽到的 token 和线程数无关），worker 进程也不开（两个 worker 已经占了两个核）。
【KV 块池】每层一个 K 和一个 V 数组 [n_blocks, block_size, n_kv_heads, head_dim]（模型的 dtype）；
token 在块里的"槽"= 块表[位置 // block_size]·block_size + 位置 % block_size。
【抽样】每个请求带着自己的种子、自己的 np.random.default_rng(seed)——这是"随机数由调用者传进来"这条约定的一个例外：
一个请求抽到什么不能取决于同一步里还有谁。规则同 decode_lab.autoregressive_generate：每个新 token 一个 rng.random()，
adjust(logits, T, top_p=…, top_k=…, min_p=…)（请求自己的过滤器）的 CDF 反查（T = 0 是贪心，也照样消耗一个均匀数）。所以引擎里的请求和它单独生成的抽到同样的 token。
【批不变】numpy 的矩阵乘不是批不变的：float32 里一行的结果随这次调用有几行而变（~1e-6 相对）。batch_invariant=True 时
每次权重矩阵乘一行一次（rowwise_matmul），注意力一次只算一个 query：一行的结果只取决于它自己的数据，和批里还有谁、
prefill 怎么分块都无关（测试断言 float32 下逐位相同）。代价：每个 token 都把权重读一遍——成批的好处全没了。
更省的做法是固定形状的块（每次都乘同样的 M 行）：但这台机器上（OpenBLAS）同一行放在块里的第 0–5 行和第 6–15 行
结果就不同，一行在块里的位置也得固定，这依赖 BLAS 的内核，换一台机器就不成立，所以这里不用。
"""
import copy
import functools
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02", "lecture06"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from transformer_lab import BYTES_PER_EL, NumpyTransformer, analytic_ops, sample_inverse_cdf  # noqa: E402
from decode_lab import adjust  # noqa: E402

__all__ = ["ModelRunner", "rowwise_matmul", "dispatch_matmul", "ROWWISE_MAX_ROWS", "ROWWISE_BLOCK_COLS",
           "ROWWISE_BLOCK_BYTES", "chunk_counts", "step_counts",
           "decode_op_ledger",
           "CPU_COST", "CALIBRATION_PATH", "load_calibration", "modelled_step_time"]

# 几行以内的权重矩阵乘一行一次地乘（dispatch_matmul）。tests/bench_engine.py --profile 打印"一次 GEMM"和"一行一次"
# 在 SmolLM2 每个形状上的时间（权重从内存流过来，一个 BLAS 线程）：这台机器（AMD EPYC、OpenBLAS）上 M = 2、3 的
# GEMM 比 M = 4 的还慢，一行一次快约 1.4 倍；M ≥ 4 时一次 GEMM 快。换一台机器要重量。
ROWWISE_MAX_ROWS = 3
# 一行一次的矩阵乘里，比这大的权重矩阵按列分块乘（dispatch_matmul 的【推导】）：每块的列数、"大"的界（末级缓存的量级）
ROWWISE_BLOCK_COLS = 1024
ROWWISE_BLOCK_BYTES = 32 << 20
# 抽样分给几个线程（引擎的 sample_threads）：一行的抽样（[V] 的 float64 softmax + 累积和）里 numpy 放开解释器锁，
# 两个线程在两个核上各抽一半的行。行少时分线程的开销不值：至少这么多行才分。
SAMPLE_SPLIT_MIN_ROWS = 8
_SAMPLE_POOLS = {}                                   # 线程数 -> 共用的线程池（所有引擎共用，不随引擎一个个地建）


def _sample_pool(n):
    if n not in _SAMPLE_POOLS:
        _SAMPLE_POOLS[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="cs349e-sample")
    return _SAMPLE_POOLS[n]


def sample_row(row, req, bufs=None):
    """
    给一个请求抽下一个 token（引擎里每个要抽样的行都走这里）-> int。先从请求自己的生成器取一个均匀数（T = 0 也取：
    生成器的状态和单独生成时一样），T = 0 直接取 argmax（并列取下标最小的：和 adjust 的 one-hot 上 CDF 反查抽到的一样，
    省掉两遍 [V] 的 float64 数组），否则 adjust（温度、请求自己的过滤器）后 CDF 反查。
    【不分配内存的路】没有过滤器时（默认），bufs = (两个 [V] 的 float64 数组) 给了就在它们里面就地算：和
    sample_inverse_cdf(adjust(row, T), u) 是同样的运算、同样的顺序（float64 的 logits / T → 减最大值 → exp → 除以和
    → 累积和 → 反查），逐位相同（T = 1 时不除：x / 1.0 == x 在 IEEE 754 里是精确的）；只是不再每行新分配 6 个 [V] 的
    数组（新分配的大数组要先经过缺页：单独量一行的抽样，这台机器上不复用内存时慢 ~3 倍）。
    """
    u = req.rng.random()
    T = req.temperature
    if T == 0:
        return int(np.argmax(row))
    if bufs is None or any(v != _NO_FILTER[k] for k, v in req.filters.items()):
        return int(sample_inverse_cdf(adjust(row, T, **req.filters), u))
    if not T > 0:
        raise ValueError(f"温度 T 必须 ≥ 0（T = 0 表示贪心），收到 {T}")
    z, c = bufs
    np.copyto(z, row)                                    # float32 -> float64 精确
    if T != 1:
        np.divide(z, T, out=z)                           # adjust 的 logits / T
    np.subtract(z, z.max(axis=-1, keepdims=True), out=z)  # transformer_lab.softmax 的三步
    np.exp(z, out=z)
    np.divide(z, z.sum(axis=-1, keepdims=True), out=z)
    np.cumsum(z, out=c)                                  # sample_inverse_cdf 的一维路径
    j = int(np.searchsorted(c, float(u) * c[-1], side="right"))
    return j if j < len(c) else int(np.flatnonzero(z > 0)[-1])


_NO_FILTER = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}  # adjust 的三个过滤器都关着时的值（top_k = −1 也算关，走一般的路）


def rowwise_matmul(a, w):  # [..., k] @ [k, m] -> [..., m]
    """一行一次的矩阵乘（[1, k] @ [k, m]）：一行的结果只取决于它自己，和这次有几行、别的行是什么都无关。"""
    x = a.reshape(-1, a.shape[-1])
    out = np.concatenate([x[i:i + 1] @ w for i in range(len(x))])
    return out.reshape(a.shape[:-1] + (w.shape[1],))


def dispatch_matmul(a, w):  # [..., k] @ [k, m] -> [..., m]
    """
    引擎的权重矩阵乘：行数 M ≤ ROWWISE_MAX_ROWS 时一行一次（[1, k] @ [k, m]），否则一次 GEMM。

    【推导】一行一次时每行各读一遍权重，但 M = 2、3 的 GEMM 在这个 BLAS 上走了慢的内核（量法见 ROWWISE_MAX_ROWS）。
    一层的矩阵（float32 最大 7 MB）放得进 CPU 的末级缓存：第一行从内存读，后几行从缓存读。lm_head（[576, 49152]，
    float32 113 MB）放不进：一行一次等于每行都从内存再流一遍，M = 2 就是两倍的时间。所以大于 ROWWISE_BLOCK_BYTES 的
    矩阵按列分块（每块 ROWWISE_BLOCK_COLS 列，float32 约 2.4 MB），一块上把几行都乘完再换下一块：权重只从内存流一遍。
    结果和一次 GEMM 只差浮点舍入的顺序（float64 下引擎 == 单独生成的测试照样成立）；M = 1 时两者是同一次调用。
    """
    x = a.reshape(-1, a.shape[-1])
    if 1 < len(x) <= ROWWISE_MAX_ROWS and w.nbytes > ROWWISE_BLOCK_BYTES:
        out = np.empty((len(x), w.shape[1]), dtype=np.result_type(x, w))
        for j in range(0, w.shape[1], ROWWISE_BLOCK_COLS):          # 一块列：第一行从内存读进缓存，后几行从缓存读
            wj = w[:, j:j + ROWWISE_BLOCK_COLS]
            for i in range(len(x)):
                np.matmul(x[i:i + 1], wj, out=out[i:i + 1, j:j + ROWWISE_BLOCK_COLS])
    elif 1 < len(x) <= ROWWISE_MAX_ROWS:
        out = np.concatenate([x[i:i + 1] @ w for i in range(len(x))])
    else:
        out = x @ w
    return out.reshape(a.shape[:-1] + (w.shape[1],))


class ModelRunner:
    """
    一个模型 + 一个 KV 块池。run(chunks) 做一步的前向 -> (每段抽出的 token 或 None, 抽样那几行的 logits [k, V])。

    params：init_params / load_gguf 的参数 dict，或一个现成的 NumpyTransformer（例如 decode_lab.TransformerLM：
    脚本里引擎和"单独生成"共用一份融合好的权重）。
    chunks：scheduler_lab.ScheduledChunk 的列表（req、start、n、sample），块表已经够放这一步要写的 token。
    """

    batch_decode_attention = True   # decode 的段一层一次取 K/V、算注意力（False：各算各的；bench 量这一项的效果用）

    def __init__(self, params, cfg, num_blocks, block_size, batch_invariant=False, sample_threads=1):
        self.cfg, self.block_size = cfg, block_size
        self.sample_threads = sample_threads             # 抽样分给几个线程（见 run）
        self._sample_bufs = []                           # 抽样用的 [V] 缓冲，每个线程一对（见 sample_row）
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
        elif self.model.matmul is not dispatch_matmul:
            self.model = copy.copy(self.model)           # 浅拷贝：共用权重数组，只换自己的矩阵乘（不改调用者的模型）
            self.model.matmul = dispatch_matmul
        self.invariant = batch_invariant
        self.timer = None                                # 一个 dict 时，forward 把每类算子的秒数累加进去（bench 的 --profile）
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
        -> (toks, pos, slots, seqs, rows, dec)。seqs 是要各算各的注意力的段 (首行, n, start, 上下文的槽)；
        dec 是 decode 的段（n = 1，批不变模式之外）合起来的 (行号 [Bd], 槽矩阵 [Bd, S_max], 遮罩 [Bd, 1, 1, 1, S_max])
        或 None：注意力一层只取一次 K/V、算一次（paged attention 的补齐 + 遮罩的形式）。
        """
        bs = self.block_size
        toks, pos, slots, seqs, rows, dec = [], [], [], [], [], []
        r = 0
        for c in chunks:
            tbl = np.asarray(c.req.block_table, dtype=np.int64)
            p = np.arange(c.start, c.start + c.n)
            S = c.start + c.n
            own = getattr(c, "toks", None)                # 投机解码的一段自带 token（草稿不在 req.tokens 里）
            toks.append(c.req.tokens[c.start:S] if own is None else own)
            pos.append(p)
            slots.append(tbl[p // bs] * bs + p % bs)
            if c.n == 1 and not self.invariant and self.batch_decode_attention:
                dec.append((r, S, tbl))
            else:
                ctx = np.arange(S)
                seqs.append((r, c.n, c.start, tbl[ctx // bs] * bs + ctx % bs))
            r += c.n
            rows.extend(range(r - getattr(c, "n_out", 1 if c.sample else 0), r))   # 要 logits 的行：通常只有最后一行
        toks = np.asarray([t for ts in toks for t in ts], dtype=np.int64)
        dmat = None
        if dec:
            Smax = max(S for _, S, _ in dec)
            nblk = -(-Smax // bs)
            tm = np.zeros((len(dec), nblk), dtype=np.int64)
            for i, (_, S, tbl) in enumerate(dec):
                k = min(len(tbl), nblk)
                tm[i, :k] = tbl[:k]
                tm[i, k:] = tbl[0]                        # 补齐的块：随便一个有效的块（遮罩让它不起作用）
            j = np.arange(Smax)
            lens = np.array([S for _, S, _ in dec])
            mask = np.where(j[None, :] < lens[:, None], 0.0, -np.inf).astype(self.cfg.dtype)
            dmat = (np.array([r0 for r0, _, _ in dec], dtype=np.int64), tm[:, j // bs] * bs + j % bs,
                    mask[:, None, None, None, :])
        return toks, np.concatenate(pos), np.concatenate(slots), seqs, np.asarray(rows, dtype=np.int64), dmat

    def _tick(self, name, t0):
        """计时（只在 self.timer 是 dict 时）：把 t0 到现在的秒数加到 timer[name] -> 现在。"""
        t = time.perf_counter()
        self.timer[name] = self.timer.get(name, 0.0) + t - t0
        return t

    def forward(self, chunks):
        """
        一步的前向 -> 要抽样的那几行的 logits [k, V]（k = 各段 n_out 之和，通常是抽样的段数；按 chunks 的顺序）。

        注意力：prefill 的段（和批不变模式下的每一段）各取各的 K/V、各算各的；decode 的段一层只取一次 K/V（槽矩阵，
        短的序列补齐到最长的、补的位置遮罩成 −inf：exp(−inf) = 0，softmax 和加权和里只多出精确的 0），一次算完。
        """
        m, cfg = self.model, self.cfg
        H, Hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        nq, nkv = H * hd, Hkv * hd
        t0 = time.perf_counter()
        toks, pos, slots, seqs, rows, dec = self.prepare(chunks)
        self.prepare_s = time.perf_counter() - t0                        # 建下标数组的时间（引擎自己的开销）
        tm = self.timer is not None
        if tm:
            self.timer["prepare"] = self.timer.get("prepare", 0.0) + self.prepare_s
            hook0, mm0 = m.matmul_hook, m.matmul
            m.matmul_hook, m.matmul = self._timed(hook0, mm0)
        try:
            return self._forward(m, toks, pos, slots, seqs, rows, dec, H, Hkv, hd, nq, nkv, tm)
        finally:
            if tm:
                m.matmul_hook, m.matmul = hook0, mm0

    def _timed(self, hook0, mm0):
        """
        --profile 用的 (matmul_hook, matmul)：钩子在一次权重矩阵乘之前把到此为止的时间记到 "other"（范数、残差、
        激活……）、记下算子名；矩阵乘之后把它的时间记到这个算子名下。原来的钩子和矩阵乘照常调用。
        """
        def hook(op, li, x):
            if hook0 is not None:
                x = hook0(op, li, x)
            self._t = self._tick("other", self._t)
            self._op = op
            return x

        def mm(a, w):
            out = mm0(a, w)
            self._t = self._tick(self._op, self._t)
            return out
        return hook, mm

    def _forward(self, m, toks, pos, slots, seqs, rows, dec, H, Hkv, hd, nq, nkv, tm):
        cfg = self.cfg
        self._t = time.perf_counter()
        N = len(toks)
        rot = m.rope_table(pos)                                          # [N, 1, hd/2]：每个 token 自己的位置
        x = m.embed(toks)                                                # [N, d]
        A = np.empty((N, nq), dtype=x.dtype)
        masks = [None if (n == 1 or self.invariant) else self._mask(start, n) for _, n, start, _ in seqs]
        for li in range(cfg.n_layers):
            qkv = m.qkv_proj(li, m.rms_scale(x))                         # [N, nq + 2·nkv]：一次读这一层的权重
            if tm:
                self._t = self._tick("other", self._t)
            qk = m.rope(qkv, rot)                                        # [N, H + Hkv, hd]
            kl, vl = self.k[li], self.v[li]
            kl[slots] = qk[:, H:]
            vl[slots] = qkv[:, nq + nkv:].reshape(N, Hkv, hd)
            q = qk[:, :H]
            if tm:
                self._t = self._tick("other", self._t)
            for (r0, n, start, ctx), mask in zip(seqs, masks):          # 注意力：按序列，只看它自己的块
                K = kl[ctx].transpose(1, 0, 2)[None]                     # [1, Hkv, S, hd]
                V = vl[ctx].transpose(1, 0, 2)[None]
                if tm:
                    self._t = self._tick("gather", self._t)
                if self.invariant:                                       # 一次一个 query：形状和批无关
                    for j in range(n):
                        S = start + j + 1
                        A[r0 + j] = m.attention(q[None, r0 + j:r0 + j + 1], K[:, :, :S], V[:, :, :S], None)[0, 0]
                else:
                    A[r0:r0 + n] = m.attention(q[None, r0:r0 + n], K, V, mask)[0]
                if tm:
                    self._t = self._tick("attention", self._t)
            if dec is not None:                                          # decode 的段：一层一次
                drows, smat, dmask = dec
                K = kl[smat].transpose(0, 2, 1, 3)                       # [Bd, Hkv, S_max, hd]
                V = vl[smat].transpose(0, 2, 1, 3)
                if tm:
                    self._t = self._tick("gather", self._t)
                A[drows] = m.attention(q[drows][:, None], K, V, dmask)[:, 0]
                if tm:
                    self._t = self._tick("attention", self._t)
            x = x + m.o_proj(li, A)
            if tm:
                self._t = self._tick("other", self._t)
            x = x + m.mlp(li, m.rms_scale(x))
            if tm:
                self._t = self._tick("other", self._t)
        if not len(rows):
            self.hidden = np.zeros((0, cfg.d_model), dtype=x.dtype) if self.keep_hidden else None
            return np.zeros((0, cfg.vocab), dtype=x.dtype)
        h = m.rms_scale(x[rows])                                         # [k, d]：最后的 RMSNorm（权重已并进 lm_head）
        if self.keep_hidden:                                             # 训练草稿用的隐状态：lm_head(h) 就是这几行的 logits
            self.hidden = h
        out = m.lm_head(h)                                               # [k, V]
        if tm:
            self._t = self._tick("other", self._t)
        return out

    def run(self, chunks):
        """
        前向 + 抽样 -> (list：每段抽出的 token，不抽的段是 None；logits [k, V])。
        【抽样分线程】sample_threads > 1 且要抽的行 ≥ SAMPLE_SPLIT_MIN_ROWS 时，行按 0, n, 2n, … 分给 n 个线程
        （sample_row）。每行只用它自己那个请求的生成器、只读 logits 的那一行，算的和一个线程时逐位相同，所以引擎 ==
        单独生成照样成立；只是另一个核替主线程抽了一半（tests/bench_engine.py --profile --temperature 1 量它省了多少）。
        """
        logits = self.forward(chunks)
        t0 = time.perf_counter()
        out, todo = [None] * len(chunks), []
        for j, c in enumerate(chunks):
            if c.sample:
                todo.append((j, len(todo), c.req))      # (段, logits 的行, 请求)

        V = logits.shape[-1]
        n = self.sample_threads if len(todo) >= SAMPLE_SPLIT_MIN_ROWS else 1
        while len(self._sample_bufs) < n or (self._sample_bufs and self._sample_bufs[0][0].shape[0] != V):
            if self._sample_bufs and self._sample_bufs[0][0].shape[0] != V:
                self._sample_bufs = []
            self._sample_bufs.append((np.empty(V), np.empty(V)))     # 每个线程一对，一直留着（见 sample_row）

        def sample(i):
            for j, k, req in todo[i::n]:
                out[j] = sample_row(logits[k], req, self._sample_bufs[i])

        others = [_sample_pool(n - 1).submit(sample, i) for i in range(1, n)]   # 别的线程抽第 1..n−1 份
        sample(0)                                                                # 这个线程抽第 0 份
        for f in others:
            f.result()                                   # 等它们抽完；线程里的异常在这里抛出
        if self.timer is not None:
            self._tick("sample", t0)
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
    一步（几段，每段 (n, start, sample)；sample 可以是要 logits 的行数）的账 -> dict flops、bytes（权重**只读一遍** + 每段的 KV + 嵌入行）、
    kv_bytes（其中 KV 的字节）、seqs、tokens。
    """
    flops = kv = emb = 0
    w = 0
    for n, start, sample in chunks:
        f, wc, k, e = chunk_counts(cfg, n, start, sample)
        flops, kv, emb, w = flops + f, kv + k, emb + e, max(w, wc)
    return {"flops": flops, "bytes": w + kv + emb, "kv_bytes": kv, "seqs": len(chunks),
            "tokens": sum(c[0] for c in chunks)}


def decode_op_ledger(cfg, B, ctx):
    """
    一步 decode（B 个序列、每个已缓存 ctx 个 token、各喂 1 个）按算子的账 -> {算子: (FLOPs, 字节)}（字节按模型的 dtype）。

    【推导】权重矩阵乘（融合的 qkv、o_proj、gate_up、down 每层一次，lm_head 一次）：FLOPs = 2·B·k·m，字节 = 权重 k·m 个数；
    注意力：每层每个 query 头打分和乘 V 各 2·S·hd（S = ctx + 1），读 K、V 各 Hkv·S·hd 个数；gather（按槽矩阵把 K、V
    拷出来）：同样多的数读一遍、写一遍。--profile 把量到的每类时间放在这些账旁边。
    """
    it = np.dtype(cfg.dtype).itemsize
    L, d, H, Hkv, hd, ff = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    shapes = {"qkv": (d, (H + 2 * Hkv) * hd, L), "o_proj": (H * hd, d, L), "gate_up": (d, 2 * ff, L),
              "down": (ff, d, L), "lm_head": (d, cfg.vocab, 1)}
    out = {op: (2 * B * k * m * n, k * m * n * it) for op, (k, m, n) in shapes.items()}
    S = ctx + 1
    kv = L * B * S * 2 * Hkv * hd * it
    out["attention"] = (4 * L * B * H * S * hd, kv)
    out["gather"] = (0, 2 * kv)
    return out


# CPU 的代价模型：常数是量出来、拟合出来的，不是假设——lecture05/cpu_calibration.json 的 "engine_step" 一节，由
# python3 tests/bench_engine.py --calibrate --write 在一台机器上（一个 BLAS 线程）量一串真实的引擎步、拟合、写下
# （同一个文件里也记着那台机器的 CPU、numpy 和 BLAS 的版本、日期、拟合的残差）。学生的运行从不改它：
# 默认运行的页面读这份存下来的常数，所以打印的字节每次相同；--time 时页面把量到的时间打印在模型时间旁边。
CALIBRATION_PATH = os.path.join(_HERE, "cpu_calibration.json")
COST_KEYS = ("flops_per_s", "bytes_per_s", "overlap", "kv_bytes_per_s", "gemv_bytes_per_s", "reread", "rowwise_rows",
             "step_s", "seq_s")


def load_calibration(section="engine_step", path=None):
    """
    标定文件里的一节 -> dict（constants、command、machine、date……）。

    【格式】{"schema": 1, "sections": {节名: {"constants": {...}, "command": ..., "machine": {...}, "date": ..., …}}}：
    每个要量的东西一节，各自带着量它的命令和机器；别的讲（拆分 prefill / decode、异构的草稿）往同一个文件里加自己的节。
    【边界】文件不在、不是这个格式、没有这一节：ValueError，说该跑哪条命令。
    """
    path = CALIBRATION_PATH if path is None else path
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        return doc["sections"][section]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"读不到标定文件 {path} 的 {section!r} 一节（{type(e).__name__}）：跑一遍 "
                         f"python3 tests/bench_engine.py --calibrate --write") from None


CPU_COST = dict(load_calibration()["constants"])


def modelled_step_time(counts, cost=None):
    """
    一步的模型时间（秒）= 矩阵乘 + t_KV + 每步开销 + 序列数 × 每序列开销，t_KV = KV 字节 / KV 的速率。矩阵乘按行数 M
    （counts["tokens"]）分两条路，和 dispatch_matmul 一样：
    M > rowwise_rows（一次 GEMM）：max(t_算, t_权重) + (1 − overlap)·min(t_算, t_权重)，t_算 = FLOPs / 算力，
    t_权重 = (字节 − KV 字节) / 带宽；M ≤ rowwise_rows（一行一次，GEMV）：t_权重 = (字节 − KV 字节) / gemv 带宽 ×
    (1 + (M − 1)·reread)（第一行从内存流权重，后面几行从缓存里再读一遍；GEMV 的 FLOPs 藏在读里）。

    【推导】overlap = 1 是 roofline（只剩慢的那个），0 是两者相加。CPU 上小批的 GEMM 既不到算力也不到带宽
    （tests/bench_engine.py --profile 的账），GEMM 打包权重，流得比 GEMV 慢——所以两条路各有各的带宽。KV 单算一项：
    引擎按槽矩阵把每个序列的 K、V 拷出来再做很多个小矩阵乘。常数一起按量到的步拟合（CPU_COST，cpu_calibration.json）。
    【参数】cost：有 COST_KEYS 的 dict（默认 CPU_COST）；没有 overlap 的按 1，没有 kv_bytes_per_s 的 KV 字节按带宽读，
    没有 gemv_bytes_per_s 的不分两条路（旧的 roofline + 固定开销）；counts 没有 kv_bytes 时按 0，没有 tokens 时走 GEMM
    （05/09 的稳态：平均意义上的一步，批是小数）。
    """
    c = CPU_COST if cost is None else cost
    kv = counts.get("kv_bytes", 0.0) if "kv_bytes_per_s" in c else 0.0
    t_kv = kv / c["kv_bytes_per_s"] if kv else 0.0
    M = counts.get("tokens")
    if M is not None and "gemv_bytes_per_s" in c and M <= c.get("rowwise_rows", 0):
        core = (counts["bytes"] - kv) / c["gemv_bytes_per_s"] * (1.0 + (M - 1) * c["reread"])
    else:
        tf, tb = counts["flops"] / c["flops_per_s"], (counts["bytes"] - kv) / c["bytes_per_s"]
        core = max(tf, tb) + (1.0 - c.get("overlap", 1.0)) * min(tf, tb)
    return core + t_kv + c["step_s"] + counts["seqs"] * c["seq_s"]

"""
handoff_lab —— 解耦的交接：prefill 那边算完提示、抽出第一个 token 之后，把一个请求（token、采样设置、随机数发生器的
状态、时间戳、KV）打成一个 KVHandoff，经过进程之间的管道或共享内存送到 decode 那边。

【外观】KVHandoff（字段见类的说明；nbytes = k.nbytes + v.nbytes，线上的字节另算）；
LLMEngine.export_request(id) -> KVHandoff、LLMEngine.import_request(h, reservation=None) -> id（engine_lab）；
send_handoff(conn, h, via="pipe") -> 线上的字节数；recv_handoff(conn) -> KVHandoff。
【两种线】via="pipe"：一个小的头（pickle）+ K、V 两段原始字节（Connection.send_bytes；收的一边 recv_bytes_into 直接收进
新开的数组，不经过 pickle）。via="shm"：发的一边开一段 multiprocessing.shared_memory，把 K、V 写进去，只经管道发头和段名；
收的一边映射同一段内存，recv_handoff(conn, copy=False) 给出的 K、V 就是这段内存上的视图（零拷贝：import_request 直接
从它写进自己的块池），用完 h.release() 关掉并 unlink。这就是 NIXL / Mooncake 一类传输库的形状：登记过的内存区 +
只传描述符。每一段都由收的一边 unlink（送不到的段由路由器 close() 时 unlink），resource_tracker 不会在 stderr 上警告。
【为什么带着随机数发生器的状态】请求在 decode 那边接着抽样：T > 0 时下一个均匀数必须是它单独生成时的第 2 个，
所以要送 rng.bit_generator.state（PCG64 的 128 位状态 + 增量）。这是我们为精确多做的；SGLang 也由 prefill 那边抽出
第一个 token 跟 KV 一起送，vLLM 的代理则让 prefill 实例的请求 max_tokens=1 结束、丢掉它的 token，decode 实例自己
再算出第一个 token（vllm examples/online_serving/disaggregated_serving/disagg_proxy_demo.py）。
【指纹】fingerprint(params, cfg)：配置和全部权重的 BLAKE2b 摘要。import 时指纹或 dtype 不符：ValueError（另一个模型的
KV 写进来不会报错，只会悄悄地算错）。
"""
import dataclasses
import hashlib
import pickle

import numpy as np

from block_manager_lab import blocks_for
from scheduler_lab import Request

__all__ = ["KVHandoff", "fingerprint", "kv_bytes_per_token", "send_handoff", "recv_handoff", "export_request",
           "import_request"]


@dataclasses.dataclass
class KVHandoff:
    """
    一个交接的请求。tokens：提示 + 已生成（prefill 那边抽出的第一个 token 在最后）；n_prompt；max_tokens（原来的）；
    temperature、seed、stop（停止 token 的元组）、top_p、top_k、min_p、logprobs（每个 token 要几个 top logprobs，None = 不要）
    —— add_request 收的每个采样设置；logprob_records：已经记下的 logprobs（logprobs 不是 None 时）；rng_state：
    rng.bit_generator.state；arrival、token_times：发的一边的时钟；fingerprint、dtype：模型；k、v：
    [n_layers, n_tokens, n_kv_heads, head_dim]，n_tokens = len(tokens) − 1（最后抽出的 token 还没有 KV）；
    source_id：它在发的那个引擎里的请求 id。
    """
    tokens: list
    n_prompt: int
    max_tokens: int
    temperature: float
    seed: int
    stop: tuple
    top_p: float
    top_k: int
    min_p: float
    logprobs: object
    logprob_records: object
    rng_state: dict
    arrival: float
    token_times: list
    fingerprint: str
    dtype: str
    k: np.ndarray
    v: np.ndarray
    source_id: int = -1

    @property
    def n_tokens(self):
        """K、V 里的位置数 = len(tokens) − 1。"""
        return len(self.tokens) - 1

    @property
    def nbytes(self):
        """KV 的字节数 = k.nbytes + v.nbytes（= 2 · 层 · KV 头 · head_dim · 字节 · n_tokens）。"""
        return int(self.k.nbytes + self.v.nbytes)

    def meta(self):
        """除 K、V 以外的字段（线上的头）-> dict。"""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("k", "v")}

    def release(self):
        """K、V 是共享内存上的视图时（recv_handoff(…, copy=False)）：放掉视图、关掉并 unlink 那段内存；否则什么都不做。"""
        shm = getattr(self, "_shm", None)
        if shm is not None:
            self.k = self.v = None
            self._shm = None
            shm.close()
            shm.unlink()


def kv_bytes_per_token(cfg):
    """一个 token 的 KV 字节 = 2（K 和 V）· 层 · KV 头 · head_dim · 每个数的字节（第 1 讲的公式，llm_math.kv_bytes）。"""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * np.dtype(cfg.dtype).itemsize


def _arrays(obj):
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for key in sorted(obj):
            yield from _arrays(obj[key])
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _arrays(x)


def fingerprint(params, cfg):
    """
    模型的指纹 -> 32 个十六进制字符：BLAKE2b(配置的 repr + 每个权重数组的形状、dtype、字节)。
    params 可以是参数 dict、一个 NumpyTransformer（用它的 .params），或 None（不跑模型的 replay 引擎：只有配置）。
    SmolLM2 float64 约 1 GB 权重，算一次约 1 秒：引擎第一次交接时算，之后记住。
    字节按 C 顺序（和 np.ascontiguousarray(a).tobytes() 相同）。不连续的数组（例如和词嵌入共用的 lm_head，是它转置的
    视图，float64 时 226 MB）按几 MB 一块地拷成连续的再哈希：摘要和整个拷一次相同，不用再分配一份那么大的内存。
    """
    h = hashlib.blake2b(repr(cfg).encode(), digest_size=16)
    src = getattr(params, "params", params)
    for a in _arrays(src):
        h.update(repr((a.shape, a.dtype.str)).encode())
        if a.flags.c_contiguous:
            h.update(memoryview(a).cast("B"))
            continue
        rows = max(1, (4 << 20) // max(1, a[0].nbytes))        # 每块约 4 MB（至少一行）
        for i in range(0, len(a), rows):
            h.update(memoryview(np.ascontiguousarray(a[i:i + rows])).cast("B"))
    return h.hexdigest()


# ---------------------------------------------------------------------------
# 线：管道和共享内存
# ---------------------------------------------------------------------------
def send_handoff(conn, h, via="pipe"):
    """
    把 h 送过 multiprocessing 的 Connection -> 线上的字节数（头的 pickle + 数据）。
    via="pipe"：头 + K、V 的原始字节；via="shm"：K、V 写进一段新开的共享内存，只发头（带段名）。
    【边界】via 不是 "pipe" / "shm"：ValueError。
    """
    if via not in ("pipe", "shm"):
        raise ValueError(f"via 只能是 'pipe' 或 'shm'，收到 {via!r}")
    k, v = np.ascontiguousarray(h.k), np.ascontiguousarray(h.v)
    head = {"meta": h.meta(), "shape": k.shape, "dtype": k.dtype.str, "via": via}
    if via == "pipe":
        blob = pickle.dumps(head, protocol=pickle.HIGHEST_PROTOCOL)
        conn.send_bytes(blob)
        conn.send_bytes(k.reshape(-1).view(np.uint8))
        conn.send_bytes(v.reshape(-1).view(np.uint8))
        return len(blob) + k.nbytes + v.nbytes
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(create=True, size=max(1, k.nbytes + v.nbytes))
    try:
        buf = np.ndarray(k.nbytes + v.nbytes, dtype=np.uint8, buffer=shm.buf)
        buf[:k.nbytes] = k.reshape(-1).view(np.uint8)
        buf[k.nbytes:] = v.reshape(-1).view(np.uint8)
        del buf
        head["shm"] = shm.name
        blob = pickle.dumps(head, protocol=pickle.HIGHEST_PROTOCOL)
        conn.send_bytes(blob)
    except BaseException:
        shm.close()
        shm.unlink()
        raise
    shm.close()                                  # 段留着：收的一边 unlink
    return len(blob)


def recv_handoff(conn, copy=True):
    """
    从 Connection 收一个 send_handoff 送来的 KVHandoff。共享内存的：copy=True（默认）把 K、V 拷出来、立刻 unlink 那段；
    copy=False 时 K、V 是那段内存上的视图（零拷贝），用完调 h.release()。h.wire_bytes = 线上的字节数。
    """
    blob = conn.recv_bytes()
    head = pickle.loads(blob)
    shape, dt = tuple(head["shape"]), np.dtype(head["dtype"])
    n = int(np.prod(shape)) * dt.itemsize
    if head["via"] == "pipe":
        k, v = np.empty(shape, dtype=dt), np.empty(shape, dtype=dt)
        for a in (k, v):
            if n:
                conn.recv_bytes_into(a.reshape(-1).view(np.uint8))
            else:
                conn.recv_bytes()
        h = KVHandoff(k=k, v=v, **head["meta"])
        h.wire_bytes = len(blob) + 2 * n
        return h
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(name=head["shm"])
    k = np.ndarray(shape, dtype=dt, buffer=shm.buf, offset=0)
    v = np.ndarray(shape, dtype=dt, buffer=shm.buf, offset=n)
    h = KVHandoff(k=k, v=v, **head["meta"])
    h.wire_bytes = len(blob)
    h._shm = shm
    if copy:
        h.k, h.v = k.copy(), v.copy()
        del k, v
        shm_ = h._shm
        h._shm = None
        shm_.close()
        shm_.unlink()
    return h


# ---------------------------------------------------------------------------
# 引擎的两个方法：LLMEngine.export_request / import_request（engine_lab 把它们挂到 LLMEngine 上）
# ---------------------------------------------------------------------------
def _fingerprint(self):
    """这个引擎的模型指纹（handoff_lab.fingerprint；第一次用时算，之后记住）。"""
    if getattr(self, "_fp", None) is None:
        model = getattr(self.runner, "model", None)
        self._fp = fingerprint(getattr(model, "params", None), self.cfg)
    return self._fp


def _slots(self, req, n):
    bs, p = self.block_size, np.arange(n)
    return np.asarray(req.block_table, dtype=np.int64)[p // bs] * bs + p % bs


def export_request(self, request_id):
    """
    把一个运行中的请求交出去 -> KVHandoff（字段见 handoff_lab），然后放掉它的块；它在这个引擎里以 finish_reason
    "exported" 结束（step() 不再报告它，release 可以忘掉它）。

    【时机】prefill 那边在抽出第一个 token 的那一步之后导出（step() 已经报告了这个 token），自己从不 decode。
    【推导】K、V 从块池按槽取出：第 i 个位置的槽 = 块表[i // block_size]·block_size + i % block_size，
    k = runner.k[:, 槽] 的形状正好是 [n_layers, n_tokens, n_kv_heads, head_dim]。不跑模型的 replay 引擎没有块池：
    K、V 是同样形状的 0（字节数照样真实，脚本的默认运行拿它们量线上的字节）。
    【边界】（ValueError）没有这个 id；请求不在运行、已经结束（在 prefill 那边就结束的请求——max_tokens 1 或先抽到停止
    token——永远不导出）、或算过的长度不是 len(tokens) − 1（还在 prefill，或被挤出去等着重算）；引擎有
    speculative_config（草稿的 KV 和目标的共用块表，交不出去）。
    """
    self._check_id(request_id)
    if self.spec is not None:
        raise ValueError("有 speculative_config 的引擎不能导出请求：草稿模型的 KV 也在这些块里 / "
                         "export is refused with a speculative_config")
    req = self.requests.get(request_id)
    if req is None or req.finish_reason is not None or not any(r is req for r in self.scheduler.running):
        raise ValueError(f"请求 {request_id} 不在运行（已经结束、release 了或还在等）：只能导出运行中、没结束的请求")
    n = len(req.tokens) - 1
    if req.n_computed != n:
        raise ValueError(f"请求 {request_id} 算过 {req.n_computed} 个位置，导出要正好 len(tokens) − 1 = {n} 个"
                         "（抽出一个 token 之后、下一次 decode 之前）")
    cfg = self.cfg
    if hasattr(self.runner, "k"):
        slots = _slots(self, req, n)
        k, v = self.runner.k[:, slots], self.runner.v[:, slots]          # 花式下标：拷出来
    else:
        shape = (cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim)
        k, v = np.zeros(shape, dtype=cfg.dtype), np.zeros(shape, dtype=cfg.dtype)
    f = req.filters
    h = KVHandoff(tokens=list(req.tokens), n_prompt=req.n_prompt, max_tokens=req.max_tokens,
                  temperature=req.temperature, seed=req.seed, stop=tuple(sorted(req.stop)),
                  top_p=f["top_p"], top_k=f["top_k"], min_p=f["min_p"], logprobs=req.num_logprobs,
                  logprob_records=None if req.logprobs is None else list(req.logprobs),
                  rng_state=req.rng.bit_generator.state, arrival=float(req.arrival),
                  token_times=[float(t) for t in req.token_times], fingerprint=_fingerprint(self),
                  dtype=np.dtype(cfg.dtype).name, k=k, v=v, source_id=int(req.id))
    req.finish_reason = "exported"
    self.scheduler.finish(req)
    return h


def import_request(self, h, reservation=None):
    """
    收下一个交过来的请求 -> 这个引擎里的 request_id；现在收不下（没有序列的空位，或没给预留、空闲块不够）：None，
    调用者留着 h 稍后再试（背压）。从不挤出别人。

    【做法】先检查完（下面的【边界】），才动块池：块表 = 预留的块（给了 reservation 时），否则从空闲表拿够放
    n_tokens + 1 个 token 的块（下一次 decode 要写的位置也在里面）；每个位置写进新块（不去重：哪个满块的键已经
    缓存着，旧的那块仍是缓存的那块，block_manager_lab.commit_full 的 setdefault），写满的块登记进前缀缓存；
    随机数发生器的状态恢复成 h.rng_state；Scheduler.admit 把它放到运行队列的尾部，下一步是一个 decode。
    step() 只报告导入以后生成的 token。
    【挤出】导入的请求是最新的：块不够时先挤出它（重算仍然精确：随机数发生器只在抽样时前进，重算 prefill 不抽样之前的
    token），但那次传输就白费了。
    【边界】（ValueError，引擎和预留都不动）h 不是 KVHandoff；另一个模型的（指纹不同）；dtype 不同；K、V 的形状不对；
    token 越界；请求已经结束（生成满 max_tokens）；提示 + max_tokens − 1 超过上下文或整个块池（永远放不下）；
    预留不是这个引擎的、已经用掉、或放不下 n_tokens 个 token；引擎有 speculative_config。
    """
    cfg = self.cfg
    if not isinstance(h, KVHandoff):
        raise ValueError(f"import_request 要一个 KVHandoff，收到 {type(h).__name__}")
    if self.spec is not None:
        raise ValueError("有 speculative_config 的引擎不能导入请求：交过来的只有目标模型的 KV / "
                         "import is refused with a speculative_config")
    if h.fingerprint != _fingerprint(self):
        raise ValueError(f"这个交接来自另一个模型（指纹 {h.fingerprint[:12]}…，这个引擎是 {_fingerprint(self)[:12]}…）"
                         " / the handoff comes from another model")
    want = np.dtype(cfg.dtype)
    if h.dtype != want.name or h.k.dtype != want or h.v.dtype != want:
        raise ValueError(f"交接的 dtype 是 {h.dtype}（K {h.k.dtype}、V {h.v.dtype}），这个引擎是 {want.name} / dtype mismatch")
    n = h.n_tokens
    shape = (cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim)
    if tuple(h.k.shape) != shape or tuple(h.v.shape) != shape:
        raise ValueError(f"K、V 的形状应是 {shape}（[层, len(tokens) − 1, KV 头, head_dim]），收到 {h.k.shape}、{h.v.shape}")
    toks = [int(t) for t in h.tokens]
    if not (1 <= h.n_prompt <= n) or min(toks) < 0 or max(toks) >= cfg.vocab:
        raise ValueError(f"交接的 token 不对：n_prompt = {h.n_prompt}、len(tokens) = {len(toks)}、"
                         f"token 应在 0..{cfg.vocab - 1}")
    if not (isinstance(h.max_tokens, (int, np.integer)) and h.max_tokens >= 1 and len(toks) - h.n_prompt < h.max_tokens):
        raise ValueError(f"交过来的请求已经生成 {len(toks) - h.n_prompt} 个 token（max_tokens = {h.max_tokens}）：它已经结束")
    max_len = h.n_prompt + h.max_tokens - 1
    if max_len > cfg.max_seq or blocks_for(max_len, self.block_size) > self.num_blocks:
        raise ValueError(f"这个请求最多要 {max_len} 个位置 = {blocks_for(max_len, self.block_size)} 块，上下文 "
                         f"{cfg.max_seq}、整个块池 {self.num_blocks} 块：永远放不下")
    rng = np.random.default_rng()
    try:
        rng.bit_generator.state = h.rng_state
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"rng_state 不是一个 PCG64 的状态：{e}") from None
    if reservation is not None:
        if getattr(reservation, "owner", None) is not self.bm or not reservation.active:
            raise ValueError(f"{reservation!r} 不是这个引擎的、还没用的预留")
        if len(reservation.blocks) * self.block_size < n:
            raise ValueError(f"预留的 {len(reservation.blocks)} 块放不下 {n} 个位置")
    if not self.scheduler.can_admit():
        return None
    need = blocks_for(n + 1, self.block_size)
    if reservation is None:
        if need > self.bm.num_free_blocks:
            return None
        blocks = [int(i) for i in self.bm.pool.take_many(need)]
    else:
        reservation.active = False
        keep = min(len(reservation.blocks), blocks_for(max_len, self.block_size))
        blocks = list(reservation.blocks[:keep])
        if keep < len(reservation.blocks):
            self.bm.pool.decref_many(reservation.blocks[keep:][::-1])
    rid = self.requests.n_issued
    req = Request(rid, toks[:h.n_prompt], int(h.max_tokens), float(h.temperature), int(h.seed),
                  frozenset(int(t) for t in h.stop), rng, arrival=float(h.arrival))
    req.tokens = toks
    req.token_times = [float(t) for t in h.token_times]
    req.logits = [] if self.keep_logits else None
    req.filters = {"top_p": float(h.top_p), "top_k": int(h.top_k), "min_p": float(h.min_p)}
    if h.logprobs is not None:
        req.num_logprobs, req.logprobs = int(h.logprobs), list(h.logprob_records or [])
    req.block_table, req.n_cached_blocks, req.n_computed = blocks, 0, n
    if hasattr(self.runner, "k"):
        slots = _slots(self, req, n)
        self.runner.k[:, slots] = h.k
        self.runner.v[:, slots] = h.v
    self.bm.commit_full(req, req.tokens, n)
    self.requests.add(req)
    self.scheduler.admit(req)
    return rid

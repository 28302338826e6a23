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

__all__ = ["KVHandoff", "fingerprint", "kv_bytes_per_token", "send_handoff", "recv_handoff"]


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
    """
    h = hashlib.blake2b(repr(cfg).encode(), digest_size=16)
    src = getattr(params, "params", params)
    for a in _arrays(src):
        a = np.ascontiguousarray(a)
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(memoryview(a).cast("B"))
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

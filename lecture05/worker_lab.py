"""
worker_lab —— 引擎进程：一个 worker 是一个操作系统进程（multiprocessing，spawn），里面一个 LLMEngine，由"配方"建起来
（不是一个 pickle 过去的对象）：("toy", 配置名, 种子)、("gguf", 路径, dtype) 或 ("replay", "smollm2", 占位 token)
（不装权重：SmolLM2 的形状，只跑调度、块和模型时间，交接的 K、V 是同样大小的 0），加上引擎的关键字参数。
("gguf", 路径, dtype, K)：只装文件的前 K 层（drafts_lab.early_exit_draft 的那个模型；测试用它，建得快、指纹算得快）。

【一个循环】收一条消息、做、回答；管道一关（父进程 close() 了，或者死了）就退出，所以父进程被杀也不会留下孩子。
Ctrl-C 只给父进程处理（worker 忽略 SIGINT：父进程的 close() 负责结束它们）。
【一个 BLAS 线程】spawn 之前，OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS 没设的设成 1（两个进程在两个核上
各算各的；学生自己设了的不动）。
【消息】(op, args)：add、step（回答 (事件, 引擎的 now, 负载, {dt, kind, next})：后一项给路由器的模型时钟，见
lockstep_lab）、export（回答之后紧接着 send_handoff）、import（先 recv_handoff）、reserve（块和一个序列的空位：decode 那边
收下交接时不会因为没有空位而拒绝）、cancel、abort、match（前缀缓存能命中几个 token：只读，不改缓存）、info、
reset（按配方重建引擎）、bench（measure_bus 用）。回答是 ("ok", 结果) 或 ("err", 异常的类型名, 文字)。
【起几个】start_worker 等它建好引擎才返回；start_workers / spawn_worker + wait_ready 让几个 worker 同时装模型。
gguf 的 worker 启动时就算好模型的指纹（交接要用）。
"""
import os
import signal
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (_HERE,) + tuple(os.path.join(_HERE, "..", d) for d in ("lecture01", "lecture02", "lecture06")):
    if _p not in sys.path:                  # 回答里的 LMConfig 在父进程里拆包时要找得到 transformer_lab
        sys.path.insert(0, _p)

import multiprocessing as mp  # noqa: E402
from multiprocessing.connection import wait  # noqa: E402

__all__ = ["TOY_CONFIGS", "REPLAY_CONFIGS", "replay_config", "build_engine", "start_worker", "start_workers", "spawn_worker", "wait_all", "Worker", "WorkerDied", "BLAS_VARS"]

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
TOY_CONFIGS = {"tiny": dict(max_seq=64)}          # 配置名 -> transformer_lab.LMConfig 的关键字（测试和脚本的玩具）
REPLAY_CONFIGS = {"smollm2": 2048}                # 不装权重的 replay worker：配置名 -> 上下文（形状是 SmolLM2-135M 的）


class WorkerDied(RuntimeError):
    """worker 进程不在了（被杀、崩溃）或在限定的时间里没回答。"""


def build_engine(recipe, **engine_kw):
    """
    按配方建一个引擎 -> LLMEngine。("toy", 配置名, 种子)：TOY_CONFIGS 里的配置、init_params(cfg, 种子)；
    ("gguf", 路径, dtype)：real_model_lab.load_gguf；("gguf", 路径, dtype, K)：只装它的前 K 层（1 ≤ K < 层数；
    load_gguf(n_layers=K)），配置 n_layers = K（和 drafts_lab.early_exit_draft 的模型逐位相同）。
    引擎的块数 num_blocks 在 engine_kw 里（默认够放一个用满上下文的请求）。
    【边界】配方不认识：ValueError。
    """
    for sub in ("lecture01", "lecture02", "lecture06"):
        p = os.path.join(_HERE, "..", sub)
        if p not in sys.path:
            sys.path.insert(0, p)
    from engine_lab import LLMEngine
    kind = recipe[0] if isinstance(recipe, (tuple, list)) and recipe else None
    if kind == "toy" and len(recipe) == 3 and recipe[1] in TOY_CONFIGS:
        from transformer_lab import LMConfig, init_params
        cfg = LMConfig(**TOY_CONFIGS[recipe[1]])
        params = init_params(cfg, int(recipe[2]))
    elif kind == "gguf" and len(recipe) in (3, 4):
        import numpy as np
        from real_model_lab import load_gguf
        if len(recipe) == 4:
            params, cfg = _first_layers(recipe[1], np.dtype(recipe[2]).type, recipe[3])
        else:
            params, cfg, _ = load_gguf(recipe[1], np.dtype(recipe[2]).type)
    elif kind == "replay" and len(recipe) == 3 and recipe[1] in REPLAY_CONFIGS:
        cfg, params = replay_config(recipe[1]), None
    else:
        raise ValueError(f"配方只能是 ('toy', {sorted(TOY_CONFIGS)} 之一, 种子)、('replay', {sorted(REPLAY_CONFIGS)} 之一, "
                         f"占位 token)、('gguf', 路径, dtype) 或 ('gguf', 路径, dtype, 层数)，收到 {recipe!r}")
    kw = dict(engine_kw)
    nb = kw.pop("num_blocks", None)
    bs = kw.get("block_size", 16)
    if nb is None:
        nb = -(-cfg.max_seq // bs)
    if params is None:                                   # 不跑模型：每个位置都抽出占位的 token（调度只看长度）
        return LLMEngine.replay(_Filler(int(recipe[2])), cfg, nb, **kw)
    return LLMEngine(params, cfg, nb, **kw)


def _first_layers(path, dtype, k):
    """文件的前 k 层 -> (params, cfg)：先读文件头看有几层，再只装前 k 层（real_model_lab.load_gguf(n_layers=k)：和整个
    装出来再取前 k 层逐位相同，不为用不到的层反量化）；词嵌入、最后的 RMSNorm 和 lm_head 照装，配置 n_layers = k。
    【边界】k 不在 1..层数−1：ValueError（只读了文件头）。"""
    from gguf_lab import read_gguf
    from real_model_lab import gguf_config, load_gguf
    n = gguf_config(read_gguf(path), dtype).n_layers
    if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k < n):
        raise ValueError(f"层数必须是 1..{n - 1} 之间的整数（收到 {k!r}）")
    params, cfg, _ = load_gguf(path, dtype, n_layers=k)
    return params, cfg


class _Filler:
    """replay 引擎的 token 流：任何请求的任何位置都是同一个占位 token。"""

    def __init__(self, tok):
        self.tok = tok

    def __getitem__(self, rid):                          # streams[rid][i]
        return _Row(self.tok)


class _Row:
    def __init__(self, tok):
        self.tok = tok

    def __getitem__(self, i):
        return self.tok

    def __len__(self):
        return 1 << 30


def replay_config(name):
    """REPLAY_CONFIGS 里的名字 -> transformer_lab.LMConfig（SmolLM2-135M 的形状取自 llm_math，float32，同 05/09）。"""
    import numpy as np
    from llm_math import SMOLLM2_135M as M
    from transformer_lab import LMConfig
    if name not in REPLAY_CONFIGS:
        raise ValueError(f"replay 的配置只能是 {sorted(REPLAY_CONFIGS)} 之一，收到 {name!r}")
    return LMConfig(name=M.name, vocab=M.vocab, d_model=M.d_model, n_layers=M.n_layers, n_heads=M.n_heads,
                    n_kv_heads=M.n_kv_heads, head_dim=M.head_dim, d_ff=M.d_ff, max_seq=REPLAY_CONFIGS[name],
                    rope_theta=100000.0, norm_eps=float(np.float32(1e-5)), tied=True, dtype="float32")


def _load(eng):
    """还要算的 token：没算的提示 + (max_tokens − 已生成)（least_loaded 的负载）。"""
    sch = eng.scheduler
    return sum(max(0, r.n_prompt - r.n_computed) + r.max_tokens - len(r.output)
               for r in list(sch.running) + list(sch.waiting))


def _timing(eng, rec):
    """一步 "step" 的回答里给模型时钟的 -> {"dt": 这一步单独的模型时间（没跑：0）, "kind": "prefill"（这一步有 prefill 的
    token）/ "decode", "next": 下一步的种类（还有没算完的提示：prefill；只剩 decode：decode；没活：None）}。"""
    sch = eng.scheduler
    reqs = list(sch.running) + list(sch.waiting)
    nxt = ("prefill" if any(r.n_computed < len(r.tokens) - 1 for r in reqs) else "decode") if reqs else None
    if rec is None:
        return {"dt": 0.0, "kind": "decode", "next": nxt}
    return {"dt": float(rec["dt"]), "kind": "prefill" if rec["prefill"] else "decode", "next": nxt}


def _bench(eng, kind, n, prompt_len):
    """
    量共享总线用：kind="decode"：一个请求 prefill 完之后 n 个 decode 步各自的墙钟时间 -> 中位数（秒）；
    kind="prefill"：n 秒里一遍遍 prefill prompt_len 个 token 的提示（max_tokens 1）-> 做了几遍。
    """
    import time
    import numpy as np
    prompt = [1 + i % (eng.cfg.vocab - 1) for i in range(prompt_len)]
    if kind == "decode":
        rid = eng.add_request(prompt, n + 2)
        eng.step()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            eng.step()
            ts.append(time.perf_counter() - t0)
        eng.abort_request(rid)
        eng.step()
        return float(np.median(ts))
    t_end, k = time.perf_counter() + n, 0
    while time.perf_counter() < t_end:
        eng.add_request(prompt, 1)
        while eng.has_unfinished_requests():
            eng.step()
        k += 1
    return k


def measure_bus(recipe, n_steps=40, prompt_len=64, prefill_len=256):
    """
    共享内存总线的两个系数 -> {"decode_alone_s", "kappa_dd", "kappa_dp"}：一个 worker 的 decode 步（中位数）单独跑、
    旁边另一个 worker 也在 decode（κ_dd = 两者之比）、旁边另一个 worker 一遍遍 prefill（κ_dp）。两个 worker 各一个核。
    【命令】python3 -c "import sys; sys.path.insert(0, 'lecture05'); import worker_lab as w;
    from hub_lab import gguf_path; print(w.measure_bus(('gguf', gguf_path(), 'float32')))"
    """
    ws = [start_worker(recipe, block_size=16, clock="wall") for _ in range(2)]
    try:
        a, b = ws
        alone = a.call("bench", ("decode", n_steps, prompt_len))
        b.send("bench", ("decode", n_steps + 10, prompt_len))
        dd = a.call("bench", ("decode", n_steps, prompt_len))
        b.recv()
        b.send("bench", ("prefill", 3 * alone * n_steps + 1.0, prefill_len))
        dp = a.call("bench", ("decode", n_steps, prompt_len))
        b.recv()
    finally:
        for w in ws:
            w.close()
    return {"decode_alone_s": alone, "kappa_dd": dd / alone, "kappa_dp": dp / alone}


def worker_main(conn, recipe, engine_kw):
    """worker 进程的身体：建引擎，然后收一条、做、回答；管道关了（EOFError）就退出。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from handoff_lab import _fingerprint, recv_handoff, send_handoff
    eng = build_engine(recipe, **engine_kw)
    if recipe[0] == "gguf":                   # 模型的指纹（交接要用；float64 约 1 GB 要哈希 1 秒）：启动时算，几个 worker 同时算
        _fingerprint(eng)
    reservations, nid, wire = {}, 0, 0
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if op == "add":
                prompt, mt, kw = args
                res = eng.add_request(prompt, mt, **kw)
            elif op == "step":
                last = eng.steps[-1] if eng.steps else None
                out = eng.step()
                ev = []
                for rid, new, fin in out:
                    r = eng.requests[rid]
                    lps = r.logprobs[len(r.logprobs) - len(new):] if r.logprobs is not None and new else None
                    ev.append((rid, new, fin, r.token_times[-len(new):] if new else [], r.error, lps))
                ran = eng.steps[-1] if eng.steps and eng.steps[-1] is not last else None
                res = (ev, eng.now, _load(eng), _timing(eng, ran))
            elif op == "export":
                rid, via = args
                h = eng.export_request(rid)
                eng.release(rid)
                conn.send(("ok", h.nbytes))
                send_handoff(conn, h, via)
                continue
            elif op == "import":
                rkey = args
                h = recv_handoff(conn, copy=False)
                wire += h.wire_bytes
                r = reservations.pop(rkey, None) if rkey is not None else None
                try:
                    res = eng.import_request(h, r)
                finally:
                    h.release()
                    if r is not None and r.active:                # 没收下（或出错）：预留还是它的，留着
                        reservations[rkey] = r
            elif op == "reserve":                                 # 留块，也留一个序列的空位（运行 + 等待 + 预留 < max_num_seqs）
                sch = eng.scheduler
                full = len(sch.running) + len(sch.waiting) + len(reservations) >= sch.max_seqs
                r = None if full else eng.bm.reserve(args)
                if r is None:
                    res = None
                else:
                    nid += 1
                    reservations[nid] = r
                    res = nid
            elif op == "cancel":
                r = reservations.pop(args, None)
                if r is not None:
                    eng.bm.cancel(r)
                res = None
            elif op == "abort":
                eng.abort_request(args)
                res = None
            elif op == "match":
                res = len(eng.bm.match_prefix(args)) * eng.block_size
            elif op == "info":
                res = {"num_free_blocks": eng.num_free_blocks, "num_blocks": eng.num_blocks, "now": eng.now,
                       "load": _load(eng), "unfinished": eng.has_unfinished_requests(), "pid": os.getpid(),
                       "hit_tokens": eng.bm.hits * eng.block_size,
                       "prefill_tokens": sum(s["prefill"] for s in eng.steps), "wire_bytes": wire,
                       "cfg": eng.cfg, "block_size": eng.block_size}
            elif op == "bench":
                res = _bench(eng, *args)
            elif op == "reset":
                eng, reservations, wire = build_engine(recipe, **engine_kw), {}, 0
                res = None
            elif op == "set_now":
                eng.now = max(eng.now, float(args))
                res = eng.now
            else:
                raise ValueError(f"不认识的消息 {op!r}")
            conn.send(("ok", res))
        except Exception as e:                                    # 一条消息出错：告诉父进程，worker 不死
            conn.send(("err", type(e).__name__, str(e)))


class Worker:
    """
    父进程手里的一个 worker：proc（进程）、conn（管道的这一头）、recipe。call(op, args) 发一条、等回答；
    worker 不在了或 timeout 秒没回答：WorkerDied（进程被杀时立刻知道：等的是管道和进程的 sentinel）。
    """

    def __init__(self, proc, conn, recipe, timeout):
        self.proc, self.conn, self.recipe, self.timeout, self.alive = proc, conn, recipe, timeout, True

    def send(self, op, args=None):
        try:
            self.conn.send((op, args))
        except (OSError, EOFError, BrokenPipeError) as e:
            self.alive = False
            raise WorkerDied(f"worker {self.proc.pid} 不在了：{e}") from None

    def recv(self, timeout=None):
        t = self.timeout if timeout is None else timeout
        ready = wait([self.conn, self.proc.sentinel], t)
        if self.conn in ready:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                msg = None
            if msg is not None:
                if msg[0] == "err":
                    raise ValueError(f"{msg[1]}: {msg[2]}")
                return msg[1]
        self.alive = False
        raise WorkerDied(f"worker {self.proc.pid} 不在了（退出码 {self.proc.exitcode}）或 {t} 秒没回答")

    def wait_ready(self):
        """等 worker 建好引擎（第一条 info 的回答）-> info；已经等过：直接给。"""
        if getattr(self, "info", None) is None:
            self.info = self.call("info")
        return self.info

    def call(self, op, args=None, timeout=None):
        self.send(op, args)
        return self.recv(timeout)

    def close(self, grace=5.0):
        """关管道（worker 收到 EOF 就退出）、等它；grace 秒还不走就 terminate，再不走就 kill。"""
        self.alive = False
        try:
            self.conn.close()
        except OSError:
            pass
        self.proc.join(grace)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2.0)


def start_worker(recipe, timeout=120.0, **engine_kw):
    """
    起一个 worker 进程 -> Worker（等它建好引擎才返回：第一条 info 的回答）。timeout：每次等回答最多几秒。
    【边界】配方不认识：ValueError（在父进程里就查，不起进程）。
    """
    w = spawn_worker(recipe, timeout, **engine_kw)
    w.wait_ready()
    return w


def start_workers(recipe, n, timeout=120.0, **engine_kw):
    """同一个配方起 n 个 worker -> list：先全部 spawn，再一个个等 info（几个进程同时装模型，各在一个核上）。"""
    return wait_all([spawn_worker(recipe, timeout, **engine_kw) for _ in range(n)])


def wait_all(ws):
    """等一串刚 spawn 的 worker 都装好模型 -> ws；有一个起不来（或 Ctrl-C）就全部关掉再抛。"""
    try:
        for w in ws:
            w.wait_ready()
    except BaseException:
        for w in ws:
            w.close()
        raise
    return ws


def spawn_worker(recipe, timeout=120.0, **engine_kw):
    """
    起一个 worker 进程、不等它 -> Worker（还没有 info：用之前调 wait_ready()，它等引擎建好）。测试拿它在 worker 装模型的
    同时在本进程里做别的事。【边界】同 start_worker。
    """
    kind = recipe[0] if isinstance(recipe, (tuple, list)) and recipe else None
    if not ((kind == "toy" and len(recipe) == 3 and recipe[1] in TOY_CONFIGS)
            or (kind == "gguf" and (len(recipe) == 3 or (len(recipe) == 4 and isinstance(recipe[3], int)
                                                          and not isinstance(recipe[3], bool) and recipe[3] >= 1)))
            or (kind == "replay" and len(recipe) == 3 and recipe[1] in REPLAY_CONFIGS)):
        raise ValueError(f"配方只能是 ('toy', {sorted(TOY_CONFIGS)} 之一, 种子)、('gguf', 路径, dtype) 或 "
                         f"('gguf', 路径, dtype, 层数 ≥ 1)，收到 {recipe!r}")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    set_here = [v for v in BLAS_VARS if v not in os.environ]
    for v in set_here:
        os.environ[v] = "1"
    try:
        proc = ctx.Process(target=worker_main, args=(child, tuple(recipe), dict(engine_kw)), daemon=True)
        proc.start()
    finally:
        for v in set_here:
            os.environ.pop(v, None)
    child.close()
    return Worker(proc, parent, tuple(recipe), timeout)


# ---------------------------------------------------------------------------
# 量链路：管道和共享内存每秒搬多少字节（模型时钟里交接的时间用它）
# ---------------------------------------------------------------------------
def _sink(conn):
    """量链路的孩子：收一个交接（recv_handoff 拷进自己的数组，和 import 写进块池一样多一次拷贝），回答 1；管道关了退出。"""
    from handoff_lab import recv_handoff
    while True:
        try:
            h = recv_handoff(conn)
        except (EOFError, OSError):
            return
        conn.send(int(h.nbytes))


def measure_link(via="pipe", nbytes=64_000_000, repeats=5):
    """
    一个 nbytes 字节的交接从父进程送到一个 spawn 的孩子、孩子收进自己的数组、回答 -> 字节/秒（repeats 次里最快的）。
    【命令】python3 -c "import sys; sys.path.insert(0, 'lecture05'); import worker_lab as w; print(w.measure_link('pipe'),
    w.measure_link('shm'))"
    """
    import time
    import numpy as np
    from handoff_lab import KVHandoff, send_handoff
    n = max(1, int(nbytes) // 16)
    z = np.zeros((1, n, 1, 1), dtype=np.float64)
    h = KVHandoff(tokens=[0, 0], n_prompt=1, max_tokens=2, temperature=0.0,   # 头很小：只量 K、V 的字节
                  seed=0, stop=(), top_p=1.0,
                  top_k=0, min_p=0.0, logprobs=None, logprob_records=None, rng_state={}, arrival=0.0, token_times=[],
                  fingerprint="", dtype="float64", k=z, v=z.copy())
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_sink, args=(b,), daemon=True)
    p.start()
    b.close()
    best = float("inf")
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            send_handoff(a, h, via)
            a.recv()
            best = min(best, time.perf_counter() - t0)
    finally:
        a.close()
        p.join(5)
    return h.nbytes / best

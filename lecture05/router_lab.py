"""
router_lab —— 在几个 worker 进程（worker_lab）前面的路由器：Router(workers, policy) 给 N 个同样的副本分请求，
PDRouter(prefill_workers, decode_workers) 把一个请求先交给 prefill 的 worker、再把 KV 交给 decode 的 worker。

【外观】两个都有 add_request(prompt_ids, max_tokens, **LLMEngine.add_request 的关键字) -> id；
step(timeout=None) -> [(id, 新 token, finish_reason)]；has_unfinished_requests()；abort_request(id)；close() 和 with。
token_times[id]：每个 token 到路由器的时刻（路由器自己的一个时钟：time.perf_counter() − 开始的时刻）。
【策略】round_robin：轮流；least_loaded：还要算的 token 最少的（没算的提示 + max_tokens − 已生成；并列取编号小的）；
prefix：前缀缓存能命中最长的那个（SGLang 的 cache-aware router、llm-d 的 prefix-aware scheduling；每个 worker 自己答
match：chain_hash 的键在进程之间不可比——Python 3.12 之前 hash(None) 随进程变）；没命中或并列时退回 least_loaded。
【PD 的流程】（SGLang："decode 先留块、prefill 算、写、放"）请求先在路由器的队列里等 decode 那边的预留
（BlockManager.reserve(提示 + 1)），留到了才交给 prefill 的 worker；prefill 抽出第一个 token 的那一步之后导出，
路由器把线上的帧原样转给 decode 的 worker（via="shm" 时只转段名：零拷贝），decode 导入进预留的块、一直生成到结束。
在 prefill 那边就结束的请求（max_tokens 1、先抽到停止 token）取消预留、从不导出。
【出错】一个 worker 死了（被杀、崩溃）：它手上的请求以 "error" 结束，error_message[id] 说明；路由器用剩下的接着服务，
一个都不剩时 add_request 抛 RuntimeError。
"""
import os
import pickle
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from lockstep_lab import LockstepClock  # noqa: E402
from worker_lab import WorkerDied  # noqa: E402

__all__ = ["Router", "PDRouter", "POLICIES", "serve_trace"]

POLICIES = ("round_robin", "least_loaded", "prefix")


class _Base:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.token_times, self.outputs, self.error_message, self.finished = {}, {}, {}, {}
        self._pending, self._next = [], 0
        self.loads = {}
        self.logprobs = {}
        self.requests = _Records(self)
        self.last_error = None
        self.arrival = {}
        self.lock, self._future, self._t_event = None, [], 0.0

    def _init_clock(self, clock, bus):
        if clock not in ("wall", "model"):
            raise ValueError(f"clock 只能是 'wall'（墙钟，默认）或 'model'（齐步走的模型时钟），收到 {clock!r}")
        self.clock = clock
        ws = self._all_workers()
        self._idx = {id(w): i for i, w in enumerate(ws)}
        if clock == "model":
            self.lock = LockstepClock(len(ws), bus)

    # ---- 和 LLMEngine 一样的几处（serve.py 的引擎线程用）----
    @property
    def cfg(self):
        return self._all_workers()[0].info["cfg"]

    @property
    def num_blocks(self):
        """最小的那个 worker 的块池（serve.py 用它拒绝永远放不下的请求）。"""
        return min(w.info["num_blocks"] for w in self._all_workers())

    @property
    def block_size(self):
        return self._all_workers()[0].info["block_size"]

    def release(self, request_id):
        """忘掉一个已经报告结束的请求（token、时间、logprobs 的记录）。"""
        for d in (self.token_times, self.outputs, self.error_message, self.finished, self.logprobs):
            d.pop(request_id, None)

    def add_request(self, prompt_ids, max_tokens, temperature=0.0, seed=0, stop=None, arrival=None, **kw):
        """-> 全局 id。arrival：模型时钟下这个请求几时到（默认：现在）；墙钟下不收（它到的时刻就是现在）。"""
        kw = dict(kw, temperature=temperature, seed=seed, stop=stop)
        prompt = [int(t) for t in prompt_ids]
        if self.lock is None:
            if arrival is not None:
                raise ValueError("arrival 只在 clock='model' 时用（墙钟下请求到的时刻就是现在）")
            self._check_alive()
            gid = self._new_id()
            self.arrival[gid] = self.now()
            self._add(gid, prompt, max_tokens, **kw)
            return gid
        self._check_alive()
        a = self._t_event if arrival is None else float(arrival)
        gid = self._new_id()
        self.arrival[gid] = a
        self._future.append((a, gid, prompt, max_tokens, kw))
        self._future.sort(key=lambda f: (f[0], f[1]))
        return gid

    def now(self):
        """路由器的时钟：墙钟（开始以来的秒）或模型时钟（正在处理的那件事的时刻）。"""
        return self._t_event if self.lock is not None else time.perf_counter() - self.t0

    def _busy(self, w, t, kind):
        """模型时钟：w 在 t 时刻拿到一件活（它的时钟跳到 t；下一步的种类 kind，prefill 优先）。"""
        if self.lock is not None:
            i = self._idx[id(w)]
            self.lock.wait_until(i, t)
            if self.lock.nxt[i] is None or kind == "prefill":
                self.lock.nxt[i] = kind

    def _step_model(self, out, timeout):
        """
        模型时钟的一步：下一件事是一个请求到达（比任何 worker 能开始的时刻都早或同时）就收下这一批；否则推能开始的时刻最小的
        worker 一步（并列取编号小的），这一步结束的时刻 = lockstep_lab 的总线模型。
        """
        cand = self._candidates()
        t_w = min(cand)[0] if cand else float("inf")
        t_a = self._future[0][0] if self._future else float("inf")
        if t_a == float("inf") and t_w == float("inf"):
            return
        if t_a <= t_w:
            self._t_event = t_a
            while self._future and self._future[0][0] <= t_a:
                _, gid, prompt, mt, kw = self._future.pop(0)
                self._add(gid, prompt, mt, **kw)
            self._after_event(out)
            return
        w = self._all_workers()[min(cand)[1]]
        self._prepare(w, out)
        owner = self._owner_of(w)
        if not any(k[0] is w for k in owner):
            return
        i = self._idx[id(w)]
        try:
            w.send("step")
            events, _, load, tm = w.recv(timeout)
        except WorkerDied:
            self._fail_worker(w, out, owner)
            return
        self.loads[id(w)] = load
        end = self.lock.advance(i, tm["dt"], tm["kind"], tm["next"])
        self._t_event = end
        self._on_events(w, owner, events, out, end)
        if any(w is q for q in getattr(self, "pre", ())):      # prefill worker：交出去的不再是它的活
            self.lock.nxt[i] = "prefill" if any(k[0] is w for k in owner) else None
        self._after_event(out)

    def _after_event(self, out):
        pass

    def _prepare(self, w, out):
        pass

    def _new_id(self):
        gid = self._next
        self._next += 1
        self.token_times[gid], self.outputs[gid] = [], []
        return gid

    def _emit(self, out, gid, new, fin, t=None):
        t = self.now() if t is None else t
        self.outputs[gid].extend(new)
        self.token_times[gid].extend([t] * len(new))
        if fin is not None:
            self.finished[gid] = fin
        out.append((gid, list(new), fin))

    def _fail_worker(self, w, out, owned):
        """w 死了：它手上的每个请求以 "error" 结束。owned：{(worker, 本地 id): 全局 id}。"""
        w.alive = False
        msg = (f"worker process {w.proc.pid} died (exit code {w.proc.exitcode}) / "
               f"worker 进程 {w.proc.pid} 不在了（退出码 {w.proc.exitcode}）")
        for key in [k for k in owned if k[0] is w]:
            gid = owned.pop(key)
            if gid not in self.finished:
                self.error_message[gid] = msg
                self._emit(out, gid, [], "error")

    def _send_step(self, workers, owned, out):
        """给 workers 里还活着、手上有请求的每一个发一次 "step" -> 发出去了的那些；发不出去的（死了）当场判它的请求出错。"""
        sent = []
        for w in self._alive(workers):
            if not any(k[0] is w for k in owned):
                continue
            try:
                w.send("step")
                sent.append(w)
            except WorkerDied:
                self._fail_worker(w, out, owned)
        return sent

    def _alive(self, ws):
        return [w for w in ws if w.alive]

    def _check_alive(self):
        pass

    def _on_events(self, w, owner, events, out, t=None):
        """一个 worker 一步的事件 -> 报告（新 token、结束、出错）；t：模型时钟下这一步结束的时刻。"""
        for rid, new, fin, _, err, lps in events:
            gid = owner.get((w, rid))
            if gid is None:
                continue
            if err:
                self.error_message[gid] = err
            if lps:
                self.logprobs.setdefault(gid, []).extend(lps)
            if self._on_token(w, owner, rid, gid, new, fin, out, t):
                continue
            self._emit(out, gid, new, fin, t)
            if fin is not None:
                del owner[(w, rid)]
                self._on_finish(gid)

    def _on_token(self, w, owner, rid, gid, new, fin, out, t):
        return False

    def _on_finish(self, gid):
        pass

    def close(self):
        """结束每个 worker（关管道、等它退出；不走的 terminate / kill）。"""
        for w in self._all_workers():
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Record:
    __slots__ = ("output", "logprobs", "error", "token_times", "finish_reason", "arrival")


class _Records:
    """router.requests.get(id) -> 一个像 scheduler_lab.Request 的记录（output、logprobs、error、token_times）。"""

    def __init__(self, router):
        self.r = router

    def get(self, gid):
        r = self.r
        if gid not in r.outputs:
            return None
        rec = _Record()
        rec.output, rec.logprobs = r.outputs[gid], r.logprobs.get(gid)
        rec.error, rec.token_times, rec.finish_reason = r.error_message.get(gid), r.token_times[gid], r.finished.get(gid)
        rec.arrival = r.arrival.get(gid)
        return rec

    def __getitem__(self, gid):
        rec = self.get(gid)
        if rec is None:
            raise KeyError(gid)
        return rec


def _pick_least(ws, loads):
    return min(range(len(ws)), key=lambda i: (loads.get(id(ws[i]), 0), i))


class Router(_Base):
    """N 个同样的副本（colocated：每个 worker 自己 prefill、自己 decode）。policy 见模块说明。"""

    def __init__(self, workers, policy="round_robin", clock="wall", bus=None):
        if policy not in POLICIES:
            raise ValueError(f"policy 只能是 {POLICIES} 之一，收到 {policy!r}")
        if not workers:
            raise ValueError("至少要一个 worker")
        super().__init__()
        self.workers, self.policy, self._rr = list(workers), policy, 0
        self.owner = {}                                # (worker, 本地 id) -> 全局 id
        self.where = {}                                # 全局 id -> (worker, 本地 id)
        self.prefix_hits = 0
        self._init_clock(clock, bus)

    def _check_alive(self):
        if not self._alive(self.workers):
            raise RuntimeError("没有活着的 worker：路由器不能再服务 / no worker left")

    def _owner_of(self, w):
        return self.owner

    def _candidates(self):
        return [(self.lock.t[i], i) for i, w in enumerate(self.workers)
                if w.alive and any(k[0] is w for k in self.owner)]

    def _all_workers(self):
        return self.workers

    def _choose(self, prompt):
        ws = self._alive(self.workers)
        if not ws:
            raise RuntimeError("没有活着的 worker：路由器不能再服务 / no worker left")
        if self.policy == "round_robin":
            w = ws[self._rr % len(ws)]
            self._rr += 1
            return w
        if self.policy == "prefix":
            hits = []
            for w in ws:
                try:
                    hits.append(w.call("match", list(prompt)))
                except WorkerDied:
                    hits.append(-1)
            best = max(hits)
            if best > 0 and hits.count(best) == 1:
                self.prefix_hits += best
                return ws[hits.index(best)]
        return ws[_pick_least(ws, self.loads)]

    def _add(self, gid, prompt, max_tokens, **kw):
        w = self._choose(prompt)
        rid = w.call("add", (prompt, max_tokens, kw))
        self.owner[(w, rid)], self.where[gid] = gid, (w, rid)
        self.loads[id(w)] = self.loads.get(id(w), 0) + len(prompt) + max_tokens
        self._busy(w, self.arrival[gid], "prefill")

    def has_unfinished_requests(self):
        return bool(self.owner) or bool(self._pending) or bool(self._future)

    def abort_request(self, request_id):
        w, rid = self.where.get(request_id, (None, None))
        if w is not None and w.alive and (w, rid) in self.owner:
            try:
                w.call("abort", rid)
            except WorkerDied:
                pass

    def step(self, timeout=None):
        out, self._pending = self._pending, []
        if self.lock is not None:
            self._step_model(out, timeout)
            return out
        sent = self._send_step(self.workers, self.owner, out)
        for w in sent:
            try:
                events, _, load, _ = w.recv(timeout)
            except WorkerDied:
                self._fail_worker(w, out, self.owner)
                continue
            self.loads[id(w)] = load
            self._on_events(w, self.owner, events, out)
        return out


class PDRouter(_Base):
    """P 个 prefill worker + D 个 decode worker（同一个模型）。via："pipe" 或 "shm"（KV 怎么过去）。"""

    def __init__(self, prefill_workers, decode_workers, via="pipe", clock="wall", bus=None):
        if not prefill_workers or not decode_workers:
            raise ValueError("prefill 和 decode 各至少要一个 worker")
        if via not in ("pipe", "shm"):
            raise ValueError(f"via 只能是 'pipe' 或 'shm'，收到 {via!r}")
        super().__init__()
        self.pre, self.dec, self.via = list(prefill_workers), list(decode_workers), via
        self.queue = []                                # 等预留的：(全局 id, prompt, max_tokens, kw)
        self.pre_owner, self.dec_owner = {}, {}        # (worker, 本地 id) -> 全局 id
        self.resv = {}                                 # 全局 id -> (decode worker, 预留的编号)
        self.where = {}
        self.bytes_moved = self.n_handoffs = 0
        self._inflight, self._stalled = {}, []         # 全局 id -> 在飞的共享内存段名；decode 暂时收不下的交接
        self._wire = []                                # 模型时钟：在链路上的交接 (到达时刻, 全局 id, d, 预留, 帧)
        self.transfer_s = {}                           # 模型时钟：全局 id -> 它的交接在链路上的模型时间
        self._init_clock(clock, bus)

    def _check_alive(self):
        if not self._alive(self.pre) or not self._alive(self.dec):
            raise RuntimeError("prefill 或 decode 那边没有活着的 worker：路由器不能再服务 / no worker left")

    def _owner_of(self, w):
        return self.pre_owner if any(w is p for p in self.pre) else self.dec_owner

    def _candidates(self):
        """能开始下一步的 worker 和时刻：手上有请求的；decode worker 手上没有、有交接在路上的，时刻是最早那个到达。"""
        out = []
        for i, w in enumerate(self._all_workers()):
            if not w.alive:
                continue
            if any(k[0] is w for k in self._owner_of(w)):
                out.append((self.lock.t[i], i))
            else:
                arr = [a for a, _, d, _, _ in self._wire if d is w]
                if arr:
                    out.append((max(self.lock.t[i], min(arr)), i))
        return out

    def _prepare(self, w, out):
        """模型时钟：推 decode worker w 之前，收下到它那一步开始时已经到了的交接。"""
        if not any(w is d for d in self.dec):
            return
        i = self._idx[id(w)]
        if not any(k[0] is w for k in self.dec_owner):
            arr = [a for a, _, d, _, _ in self._wire if d is w]
            if arr:
                self.lock.wait_until(i, min(arr))
        keep = []
        for item in self._wire:
            a, gid, d, key, frames = item
            if d is w and a <= self.lock.t[i]:
                self._import(gid, d, key, frames, out)
                self._busy(d, a, "decode")
            else:
                keep.append(item)
        self._wire = keep

    def _after_event(self, out):
        self._dispatch(out)

    def _all_workers(self):
        return self.pre + self.dec

    def _add(self, gid, prompt, max_tokens, **kw):
        self.queue.append((gid, prompt, max_tokens, kw))

    def has_unfinished_requests(self):
        return bool(self.queue or self.pre_owner or self.dec_owner or self._pending or self._stalled or self._future
                    or self._wire)

    def abort_request(self, request_id):
        for i, q in enumerate(self.queue):
            if q[0] == request_id:
                del self.queue[i]
                self._pending.append((request_id, [], "abort"))
                self.finished[request_id] = "abort"
                return
        w, rid = self.where.get(request_id, (None, None))
        if w is not None and w.alive:
            try:
                w.call("abort", rid)
            except WorkerDied:
                pass

    def _dispatch(self, out):
        while self.queue:
            gid, prompt, mt, kw = self.queue[0]
            decs, pres = self._alive(self.dec), self._alive(self.pre)
            if not decs or not pres:
                for q in self.queue:
                    self.error_message[q[0]] = "no worker left / 没有活着的 worker"
                    self._emit(out, q[0], [], "error")
                self.queue = []
                return
            d = decs[_pick_least(decs, self.loads)]
            try:
                key = d.call("reserve", len(prompt) + 1)
            except WorkerDied:
                self._fail_worker(d, out, self.dec_owner)
                continue
            if key is None:
                return                                 # 背压：在路由器的队列里等，不是作为交接在内存里等
            p = pres[_pick_least(pres, self.loads)]
            try:
                rid = p.call("add", (prompt, mt, kw))
            except WorkerDied:
                d.call("cancel", key)
                self._fail_worker(p, out, self.pre_owner)
                continue
            except ValueError:
                d.call("cancel", key)
                raise
            self.queue.pop(0)
            self.pre_owner[(p, rid)], self.where[gid] = gid, (p, rid)
            self._busy(p, max(self.arrival[gid], self._t_event), "prefill")
            self.resv[gid] = (d, key)
            self.loads[id(p)] = self.loads.get(id(p), 0) + len(prompt)
            self.loads[id(d)] = self.loads.get(id(d), 0) + mt

    def _fail_worker(self, w, out, owned):
        """w 死了：它手上的请求以 "error" 结束，它们在 decode 那边的预留取消（不漏块）。"""
        gids = [g for k, g in owned.items() if k[0] is w]
        super()._fail_worker(w, out, owned)
        for gid in gids:
            self._cancel(gid)

    def _cancel(self, gid):
        d, key = self.resv.pop(gid, (None, None))
        if d is not None and d.alive:
            try:
                d.call("cancel", key)
            except WorkerDied:
                pass

    def _handoff(self, p, rid, gid, out):
        d, key = self.resv[gid]
        try:
            p.send("export", (rid, self.via))
            nbytes = p.recv()
            self.bytes_moved += nbytes
            frames = [p.conn.recv_bytes() for _ in range(3 if self.via == "pipe" else 1)]
        except WorkerDied:
            self._cancel(gid)
            raise
        if self.via == "shm":                         # 段在飞：送到之前 decode 死了，由路由器 unlink
            self._inflight[gid] = pickle.loads(frames[0])["shm"]
        if self.lock is None:
            self._import(gid, d, key, frames, out)
            return None
        dt = self.lock.transfer(nbytes, self.via)     # 模型时钟：在链路上走 dt 秒，到了 decode 那一步开始时才收下
        self.transfer_s[gid] = dt
        self._wire.append((self._t_event + dt, gid, d, key, frames))
        return self._t_event + dt

    def _import(self, gid, d, key, frames, out):
        """把一个交接的帧转给 decode worker d（预留 key）。d 说现在收不下：留着帧，下一步再试；d 死了：这个请求出错。"""
        try:
            d.send("import", key)
            for f in frames:
                d.conn.send_bytes(f)
            drid = d.recv()
        except WorkerDied:
            self._unlink(gid)
            self.resv.pop(gid, None)
            self._fail_worker(d, out, self.dec_owner)
            self.error_message[gid] = "decode worker died / decode worker 不在了"
            self._emit(out, gid, [], "error")
            return
        if drid is None:                              # 预留了空位就不会发生；发生了也不丢请求
            self._stalled.append((gid, d, key, frames))
            return
        self.resv.pop(gid, None)
        self._inflight.pop(gid, None)                 # decode 那边收下、已经 unlink
        self.n_handoffs += 1
        self.dec_owner[(d, drid)], self.where[gid] = gid, (d, drid)

    def _unlink(self, gid):
        name = self._inflight.pop(gid, None)
        if name is None:
            return
        from multiprocessing import shared_memory
        try:
            seg = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            return
        seg.close()
        seg.unlink()

    def close(self):
        """结束每个 worker；还在飞的共享内存段（送出去、没被收下的）unlink。"""
        super().close()
        for gid in list(self._inflight):
            self._unlink(gid)

    def _on_token(self, w, owner, rid, gid, new, fin, out, t):
        """prefill 那边抽出第一个 token 而没结束：交接出去（模型时钟下这个 token 在交接到达 decode 的时刻才报告——
        像 vLLM 的代理，用户看到的第一个 token 来自 decode 那边）。"""
        if owner is not self.pre_owner or not new or fin is not None:
            return False
        del owner[(w, rid)]
        try:
            t_arr = self._handoff(w, rid, gid, out)
        except WorkerDied:
            self._emit(out, gid, new, None, t)
            self._fail_worker(w, out, owner)
            self.error_message[gid] = "prefill worker died / prefill worker 不在了"
            self._emit(out, gid, [], "error", t)
            return True
        self._emit(out, gid, new, None, t if t_arr is None else t_arr)
        return True

    def _on_finish(self, gid):
        self._cancel(gid)

    def step(self, timeout=None):
        out, self._pending = self._pending, []
        stalled, self._stalled = self._stalled, []
        for item in stalled:
            self._import(*item, out)
        if self.lock is not None:
            self._dispatch(out)
            self._step_model(out, timeout)
            return out
        self._dispatch(out)
        for owner in (self.pre_owner, self.dec_owner):
            sent = self._send_step(self.pre if owner is self.pre_owner else self.dec, owner, out)
            for w in sent:
                try:
                    events, _, load, _ = w.recv(timeout)
                except WorkerDied:
                    self._fail_worker(w, out, owner)
                    continue
                self.loads[id(w)] = load
                self._on_events(w, owner, events, out)
        return out


def serve_trace(router, trace):
    """
    按到达时间把请求交给路由器、跑到全部结束 -> 全局 id 的 list。trace：[(到达 s, prompt, max_tokens)]，按到达排好。
    模型时钟：一次全交（arrival=），路由器齐步走；墙钟：到点才交（路由器闲着时睡到下一个到达），router.arrival 记
    排定的到达时刻（不是交进去的时刻：路由器忙着一步时交晚了，晚的那段也算进 TTFT）。
    """
    if router.lock is not None:
        ids = [router.add_request(p, mt, arrival=a) for a, p, mt in trace]
        while router.has_unfinished_requests():
            router.step()
        return ids
    t0, ids, i = router.now(), [], 0
    while i < len(trace) or router.has_unfinished_requests():
        while i < len(trace) and trace[i][0] <= router.now() - t0:
            a, p, mt = trace[i]
            gid = router.add_request(p, mt)
            router.arrival[gid] = t0 + a
            ids.append(gid)
            i += 1
        if router.has_unfinished_requests():
            router.step()
        elif i < len(trace):
            time.sleep(max(0.0, trace[i][0] - (router.now() - t0)))
    return ids

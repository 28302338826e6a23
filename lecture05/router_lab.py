"""
router_lab —— 在几个 worker 进程（worker_lab）前面的路由器：Router(workers, policy) 给 N 个同样的副本分请求，
PDRouter(prefill_workers, decode_workers) 把一个请求先交给 prefill 的 worker、再把 KV 交给 decode 的 worker。

【外观】两个都有 add_request(prompt_ids, max_tokens, **LLMEngine.add_request 的关键字) -> id；
step(timeout=None) -> [(id, 新 token, finish_reason)]；has_unfinished_requests()；abort_request(id)；close() 和 with。
token_times[id]、arrival[id]：在路由器的一个时钟上——clock="wall"（默认，墙钟）或 clock="model"（齐步走的模型时钟：
add_request(…, arrival=t)，见 router_base_lab 和 lockstep_lab）。serve_trace(router, trace) 按到达时间喂一串请求。
【策略】round_robin：轮流；least_loaded：还要算的 token 最少的（没算的提示 + max_tokens − 已生成；并列取编号小的）；
prefix：前缀缓存能命中最长的那个（SGLang 的 cache-aware router、llm-d 的 prefix-aware scheduling；每个 worker 自己答
match：chain_hash 的键在进程之间不可比——Python 3.12 之前 hash(None) 随进程变）；没命中或并列时退回 least_loaded。
【PD 的流程】（SGLang："decode 先留块、prefill 算、写、放"）请求先在路由器的队列里等 decode 那边的预留
（BlockManager.reserve(提示 + 1)，连同一个序列的空位：运行 + 等待 + 预留 < max_num_seqs），留到了才交给 prefill 的
worker；prefill 抽出第一个 token 的那一步之后导出，路由器把线上的帧原样转给 decode 的 worker（via="shm" 时只转段名：
零拷贝），decode 导入进预留的块、一直生成到结束。在 prefill 那边就结束的请求（max_tokens 1、先抽到停止 token）取消预留、
从不导出。万一 decode 仍说收不下，帧留在路由器里下一步再试（不丢请求）。模型时钟下交接在 prefill 那一步结束的时刻 +
字节 / 存下的链路速率到达，decode 在那之后开始的一步才收下它；第一个 token 按到达的时刻报告（用户从 decode 那边看到它）。
【出错】一个 worker 死了（被杀、崩溃）：它手上的请求以 "error" 结束，error_message[id] 说明；路由器用剩下的接着服务，
一个都不剩时 add_request 抛 RuntimeError。死掉的 prefill worker 手上的请求在 decode 那边的预留取消；交接送到之前
decode 死了，还在飞的共享内存段由路由器 unlink（close() 时也 unlink 所有还在飞的）。
"""
import os
import pickle
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from router_base_lab import RouterBase, pick_least  # noqa: E402
from worker_lab import WorkerDied  # noqa: E402

__all__ = ["Router", "PDRouter", "POLICIES", "serve_trace"]

POLICIES = ("round_robin", "least_loaded", "prefix")

class Router(RouterBase):
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
        return ws[pick_least(ws, self.loads)]

    def _add(self, gid, prompt, max_tokens, **kw):
        w = self._choose(prompt)
        rid = w.call("add", (prompt, max_tokens, kw))
        self.owner[(w, rid)], self.where[gid] = gid, (w, rid)
        self.loads[id(w)] = self.loads.get(id(w), 0) + len(prompt) + max_tokens
        self._busy(w, self.arrival[gid], "prefill")

    def has_unfinished_requests(self):
        return bool(self.owner) or bool(self._pending) or bool(self._future)

    def abort_request(self, request_id):
        if self._abort_future(request_id):
            return
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


class PDRouter(RouterBase):
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
        self._defer = None                             # 墙钟：这一步里导出、等 decode 答完再转的交接
        self.transfer_s = {}                           # 模型时钟：全局 id -> 它的交接在链路上的模型时间
        self.handoff_wall = {}                         # 全局 id -> 交接在墙钟上花的秒（导出 + 收帧 + 转给 decode + 导入）
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

    def _after_step(self, w, i, owner):
        """模型时钟：prefill worker 这一步交出去的请求不再是它的活（worker 报告的"下一步"是在导出之前算的）。"""
        if owner is self.pre_owner:
            self.lock.nxt[i] = "prefill" if any(k[0] is w for k in owner) else None

    def _all_workers(self):
        return self.pre + self.dec

    def _add(self, gid, prompt, max_tokens, **kw):
        self.queue.append((gid, prompt, max_tokens, kw))

    def has_unfinished_requests(self):
        return bool(self.queue or self.pre_owner or self.dec_owner or self._pending or self._stalled or self._future
                    or self._wire)

    def abort_request(self, request_id):
        if self._abort_future(request_id):
            return
        for i, q in enumerate(self.queue):
            if q[0] == request_id:
                del self.queue[i]
                self._pending.append((request_id, [], "abort"))
                self.finished[request_id] = "abort"
                return
        for lst, pos in (("_wire", 1), ("_stalled", 0)):   # 交接在路上 / 等 decode 收：不再转，段 unlink，预留取消
            items = getattr(self, lst)
            if any(it[pos] == request_id for it in items):
                setattr(self, lst, [it for it in items if it[pos] != request_id])
                self._unlink(request_id)
                self._cancel(request_id)
                self._pending.append((request_id, [], "abort"))
                self.finished[request_id] = "abort"
                return
        if request_id in self.finished:
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
            d = decs[pick_least(decs, self.loads)]
            try:
                key = d.call("reserve", len(prompt) + 1)
            except WorkerDied:
                self._fail_worker(d, out, self.dec_owner)
                continue
            if key is None:
                return                                 # 背压：在路由器的队列里等，不是作为交接在内存里等
            p = pres[pick_least(pres, self.loads)]
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
        t0 = time.perf_counter()
        try:
            p.send("export", (rid, self.via))
            nbytes = p.recv()
            self.bytes_moved += nbytes
            frames = [p.conn.recv_bytes() for _ in range(3 if self.via == "pipe" else 1)]
        except WorkerDied:
            self._cancel(gid)
            raise
        self.handoff_wall[gid] = time.perf_counter() - t0  # 墙钟：导出 + 收帧（下面 _import 加上转给 decode、它写进块池）
        if self.via == "shm":                         # 段在飞：送到之前 decode 死了，由路由器 unlink
            self._inflight[gid] = pickle.loads(frames[0])["shm"]
        if self.lock is None:
            if self._defer is not None:               # 墙钟：decode worker 正在算它的一步，它答完再转
                self._defer.append((gid, d, key, frames))
                return None
            self._import(gid, d, key, frames, out)
            return None
        dt = self.lock.transfer(nbytes, self.via)     # 模型时钟：在链路上走 dt 秒，到了 decode 那一步开始时才收下
        self.transfer_s[gid] = dt
        self._wire.append((self._t_event + dt, gid, d, key, frames))
        return self._t_event + dt

    def _import(self, gid, d, key, frames, out):
        """把一个交接的帧转给 decode worker d（预留 key）。d 说现在收不下：留着帧，下一步再试；d 死了：这个请求出错。"""
        t0 = time.perf_counter()
        try:
            d.send("import", key)
            for f in frames:
                d.conn.send_bytes(f)
            drid = d.recv()
            self.handoff_wall[gid] = self.handoff_wall.get(gid, 0.0) + time.perf_counter() - t0
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
        # 墙钟：先把 "step" 发给两边每个有活的 worker（它们在各自的核上同时算），再收；prefill 这一步导出的交接
        # 等 decode 那边答完这一步才转过去（一条管道上回答按顺序来）
        sent = [(w, self.pre_owner) for w in self._send_step(self.pre, self.pre_owner, out)]
        sent += [(w, self.dec_owner) for w in self._send_step(self.dec, self.dec_owner, out)]
        self._defer = []
        try:
            for w, owner in sent:
                try:
                    events, _, load, _ = w.recv(timeout)
                except WorkerDied:
                    self._fail_worker(w, out, owner)
                    continue
                self.loads[id(w)] = load
                self._on_events(w, owner, events, out)
        finally:
            items, self._defer = self._defer, None
        for item in items:
            self._import(*item, out)
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

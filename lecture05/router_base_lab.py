"""
router_base_lab —— 两种路由器（router_lab 的 Router、PDRouter）共用的那一半：LLMEngine 的外观（add_request、release、
cfg、num_blocks、requests.get）、报告 token 和时刻、worker 死了怎么办、模型时钟下齐步走的一步（lockstep_lab 的时钟）。

【两个时钟】clock="wall"（默认）：token 的时刻是路由器的墙钟（time.perf_counter() − 开始），每一步把"step"同时发给每个
有活的 worker（它们在各自的核上并行算）。clock="model"：add_request(…, arrival=t) 先记下，路由器一次只推一件事——
最早的到达，或模型时间最早的那个 worker 的一步（lockstep_lab.LockstepClock.pick）；token 的时刻是那一步在共享总线上
结束的模型时刻（bus_finish）。真做的事（调度、块、交接的字节）两个时钟下完全一样。
"""
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from lockstep_lab import LockstepClock  # noqa: E402
from worker_lab import WorkerDied  # noqa: E402

__all__ = ["RouterBase", "pick_least"]


class RouterBase:
    """Router、PDRouter 的基类（见模块说明）；子类给出 _all_workers、_add、_owner_of、_candidates。"""

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
        for d in (self.token_times, self.outputs, self.error_message, self.finished, self.logprobs, self.arrival,
                  getattr(self, "transfer_s", {}), getattr(self, "handoff_wall", {})):
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
            try:
                self._add(gid, prompt, max_tokens, **kw)
            except BaseException:                         # worker 拒绝（ValueError）或死了：不留这个 id 的记录
                self.release(gid)
                raise
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
        self._after_step(w, i, owner)
        self._after_event(out)

    def _after_step(self, w, i, owner):
        pass

    def _abort_future(self, gid):
        """模型时钟：还没到的请求被中止 -> True（从待到的表里拿掉，下一步报告 "abort"）。"""
        for i, f in enumerate(self._future):
            if f[1] == gid:
                del self._future[i]
                self._pending.append((gid, [], "abort"))
                self.finished[gid] = "abort"
                return True
        return False

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


def pick_least(ws, loads):
    """ws 里负载（loads[id(w)]）最小的编号，并列取小的。"""
    return min(range(len(ws)), key=lambda i: (loads.get(id(ws[i]), 0), i))

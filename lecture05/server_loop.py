"""
server_loop —— serve.py 的引擎线程：引擎只在一个线程里跑，别的线程经一个线程安全的收件箱交请求和中止，它把每步的新
token（和 log-probabilities）放进每个请求自己的队列。

【一个请求的事件】Job.events 里按顺序是 Event：tokens（这一步的新 token）、reason（None = 还在跑；"stop" / "length" /
"abort" / "error"）、logprobs（要了 logprobs 时每个新 token 一项）、message（出错时说为什么）、status（出错时的 HTTP 状态）。
加请求的结果先由 Job.added（threading.Event）说出来：引擎收下（Job.refused 是 None）或拒收（Job.refused 是 (HTTP 状态, 消息)：引擎不收 400、关机 503）
——流式的响应头要等它，所以拒收的请求决不会变成一个 200 的流。
【出错】step() 抛了异常（引擎的一个 bug、一个坏掉的 runner）：这一步里的每个请求都收到一个 "error" 事件（HTTP 500），
循环接着跑后面的请求。引擎自己把失败的一步报告成 (id, [], "error")、engine.requests[id].error 是消息时，同样处理。
"""
import queue
import threading
import traceback

MAX_QUEUE = 64              # 同时在服务器里（排着或在跑）的请求数上限，再多就 503


class QueueFull(Exception):
    pass


class Event:
    __slots__ = ("tokens", "reason", "logprobs", "message", "status")

    def __init__(self, tokens, reason, logprobs=None, message=None, status=None):
        self.tokens, self.reason, self.logprobs, self.message, self.status = tokens, reason, logprobs, message, status

    def __repr__(self):
        return f"Event({self.tokens!r}, {self.reason!r}, message={self.message!r})"


class Job:
    """一个在服务器里的请求：req 是 openai_protocol.GenRequest；events 见模块说明；rid 是引擎的 id。"""

    def __init__(self, req):
        self.req, self.events, self.rid = req, queue.Queue(), None
        self.added, self.refused, self.n_lp = threading.Event(), None, 0


class EngineLoop(threading.Thread):
    """
    引擎只在这一个线程里跑。submit(job) 和 abort(job) 可以从任何线程调：它们只往收件箱（线程安全的队列）里放东西。
    循环：收件箱里的都处理掉（加请求 / 中止）；引擎有活就 step() 一次，把新 token 分给各个请求；没活就在收件箱上等。
    同时在服务器里的请求数（排着的 + 在跑的）到了 max_queue 时 submit 抛 QueueFull。
    一个请求的结束交给它的连接之后，engine.release(id) 忘掉它。log：一个函数（一行字），出错时说一声。
    """

    def __init__(self, engine, max_queue=MAX_QUEUE, log=None):
        super().__init__(name="engine-loop", daemon=True)
        self.engine, self.max_queue, self.log = engine, max_queue, log or (lambda s: None)
        self.inbox, self.jobs = queue.Queue(), {}
        self.lock, self.n_live = threading.Lock(), 0
        self._halt = threading.Event()
        self.error = None
        self.n_step_errors = 0

    def submit(self, job):
        with self.lock:
            if self._halt.is_set() or self.n_live >= self.max_queue:
                raise QueueFull()
            self.n_live += 1
        self.inbox.put(("add", job))

    def abort(self, job):
        self.inbox.put(("abort", job))

    def _done(self, job):
        with self.lock:
            self.n_live -= 1

    def _handle(self, kind, job):
        eng = self.engine
        if kind == "add":
            r = job.req
            try:
                job.rid = eng.add_request(r.prompt_ids, r.max_tokens, r.temperature, r.seed, r.stop_ids,
                                          **r.engine_kwargs())
            except ValueError as e:                          # parse_request 已经查过；这里是最后一道
                job.refused = (400, str(e))
                job.added.set()
                self._done(job)
                return
            self.jobs[job.rid] = job
            job.added.set()
        elif kind == "abort" and job.rid in self.jobs:
            eng.abort_request(job.rid)                       # 块马上放回块池；下一次 step() 报告 (id, [], "abort")

    def _finish(self, rid, job):
        del self.jobs[rid]
        try:
            self.engine.release(rid)
        except (ValueError, KeyError):
            pass
        self._done(job)

    def _new_logprobs(self, rid, job, n):
        r = self.engine.requests.get(rid) if hasattr(self.engine.requests, "get") else self.engine.requests[rid]
        lps = getattr(r, "logprobs", None) if r is not None else None
        if job.req.logprobs is None or lps is None:
            return None
        out = list(lps[job.n_lp:job.n_lp + n])
        job.n_lp += n
        return out

    def _step_failed(self, exc):
        """step() 抛了异常：每个在引擎里的请求中止、收到 "error"（500）；循环接着跑。"""
        self.n_step_errors += 1
        self.log("engine step failed: " + "".join(traceback.format_exception_only(type(exc), exc)).strip())
        msg = f"the engine failed on this request's step ({type(exc).__name__}: {exc}) / 引擎在这一步出错"
        for rid, job in list(self.jobs.items()):
            try:
                self.engine.abort_request(rid)
            except Exception:                                # noqa: BLE001  引擎已经坏了：能放就放
                pass
            job.events.put(Event([], "error", message=msg, status=500))
        self._drain_aborts()

    def _drain_aborts(self):
        """中止过的请求：它们的结束由下一次 step() 报告；让引擎报告完、release。"""
        for _ in range(3):
            try:
                out = self.engine.step() if self.engine.has_unfinished_requests() else []
            except Exception:                                # noqa: BLE001
                out = []
            for rid, _toks, _reason in out:
                if rid in self.jobs:
                    self._finish(rid, self.jobs[rid])
            if not self.engine.has_unfinished_requests():
                break
        for rid, job in list(self.jobs.items()):             # 引擎报告不了的：忘掉
            del self.jobs[rid]
            self._done(job)

    def run(self):
        eng = self.engine
        try:
            while not self._halt.is_set():
                try:
                    item = self.inbox.get_nowait() if eng.has_unfinished_requests() else self.inbox.get(timeout=0.1)
                    while item is not None:
                        self._handle(*item)
                        item = self.inbox.get_nowait()
                except queue.Empty:
                    pass
                if self._halt.is_set() or not eng.has_unfinished_requests():
                    continue
                try:
                    out = eng.step()
                except Exception as e:                       # noqa: BLE001  一步坏了：这些请求 500，服务器照常
                    self._step_failed(e)
                    continue
                for rid, toks, reason in out:
                    job = self.jobs.get(rid)
                    if job is None:
                        continue
                    if reason == "error":
                        r = eng.requests.get(rid) if hasattr(eng.requests, "get") else None
                        msg = getattr(r, "error", None) or "the engine failed on this request"
                        exc = getattr(eng, "last_error", None)
                        self.log(f"engine step failed for request {rid}: "
                                 + (f"{type(exc).__name__}: {exc}" if exc is not None else msg))
                        job.events.put(Event(list(toks), "error", message=f"{msg} / 引擎在这个请求上出错", status=500))
                    else:
                        job.events.put(Event(list(toks), reason, self._new_logprobs(rid, job, len(toks))))
                    if reason is not None:                   # 结束（含中止）已经报告：引擎忘掉它，requests 不会无限长
                        self._finish(rid, job)
        except Exception as e:                               # 循环自己坏了：让每个请求都知道，不挂住
            self.error = e
            raise
        finally:
            self._halt.set()
            msg = "the server is shutting down; this request was aborted / 服务器正在关机，这个请求被中止了"
            while True:                                      # 收件箱里还没处理的加请求
                try:
                    kind, job = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if kind == "add":
                    job.refused = (503, msg)
                    job.added.set()
            for rid, job in list(self.jobs.items()):
                try:
                    eng.abort_request(rid)                   # 已经结束的：引擎什么都不做
                except Exception:                            # noqa: BLE001
                    pass
                job.events.put(Event(None, "shutdown", message=msg, status=503))
            self.jobs.clear()

    def stop(self, timeout=10.0):
        self._halt.set()
        self.inbox.put(("noop", None))
        self.join(timeout)

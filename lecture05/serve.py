"""
=============================================================================
CS349E · 第 5 讲 · serve.py —— 把引擎开成一个服务：OpenAI 兼容的 HTTP 接口（只用标准库）
=============================================================================

一个能跑的工具（不是实验模块，也不是编号脚本：没有模块 import 它，测试按路径加载）。三块各有一个家：
HTTP（这个文件：连接、超时、路由、流）、OpenAI 协议（openai_protocol：请求的解析和检查；openai_response：回答的
形状、增量的文字、logprobs）、引擎线程（server_loop）。

【运行】python3 lecture05/serve.py [--port 8000] [--host 127.0.0.1] [--dtype float32|float64]
        [--speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}']
  默认服务 SmolLM2-135M-Instruct（或环境变量 CS349E_GGUF 指的 GGUF），float32，只听本机 127.0.0.1。
  模型只装一次（约几秒）；Ctrl-C 或 SIGTERM 干净地停下（流式的请求收到一个错误事件和 [DONE]、连接关掉、线程结束）。
  然后在另一个终端：
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 20}'

【接口】（OpenAI 的格式：platform.openai.com/docs/api-reference 的 chat 和 completions；字段见 openai_protocol 的说明）
- POST /v1/chat/completions：messages 按 ChatML 拼成提示（只有一条 user 消息时就是 bpe_lab 的 chat(text)）。
- POST /v1/completions：prompt（字符串，其中的特殊 token 字符串照样切成特殊 id；或 token id 的列表）。
- GET /v1/models、GET /v1/models/{id}、GET /health。查询串（?…）不看；路由对、方法不对：405；每个错误都是 JSON。
【连接】HTTP/1.1，连接可以重用（keep-alive）：不流式的回答带 Content-Length，流（server-sent events）用分块传输
  （HTTP/1.0 的客户端：流完关连接）。超时都是构造参数：空闲的连接 idle_timeout 后关掉；请求头和请求体要在
  request_timeout 内到齐（否则 408、关连接）；写不出去超过 write_timeout 当客户端走了。同时最多 max_connections 个
  连接（一个连接一个线程），再来的立刻收到 503。等 token 时每 poll_s 秒看一眼客户端还在不在（流式和不流式都看）：
  走了就中止请求、块放回块池。
【文字】每个 token 是一串字节（特殊 token 不进文字）。流式输出时不完整的 UTF-8 字节先留着，凑齐了再发；可能是停止串开头的
  文字也先留着；所以流式的各块拼起来 == 不流式的文字（测试核对）。停止 token（含第 max_tokens 个正好是停止 token 时）
  不进文字，finish_reason 是 "stop"。usage 的 completion_tokens 含停下来的那个停止 token。
【出错】OpenAI 的错误体 {"error": {"message", "type", "param", "code"}}，message 先英文后中文。坏 JSON（含嵌套太深）、
  坏文字（孤立代理）、字段不对：400；不支持的字段不是默认值：400；模型名不对：404；方法不对：405；请求体没到齐：408；
  没有 Content-Length：411；请求体太大：413；排队满或连接满：503；引擎的一步出错：500（流：一个错误事件再 [DONE]），
  服务器接着服务。流式请求的检查（含引擎收不收）都在发响应头之前：一个会被拒的请求决不会变成 200 的流。
【依赖】只用标准库和 numpy；本目录的 openai_protocol、openai_response、server_loop、engine_lab（LLMEngine）、block_manager_lab；
  ../lecture02 的 real_model_lab（load_gguf）、bpe_lab（分词器）。
"""
import os
import sys

import argparse  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import re  # noqa: E402
import select  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from urllib.parse import unquote, urlsplit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (HERE, os.path.join(HERE, "..", "lecture02"), os.path.join(HERE, "..", "lecture01")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import blas_threads  # noqa: E402  （lecture01：一个 BLAS 线程，除非你设了线程变量；README 的"一个 BLAS 线程"）

blas_threads.apply_rule()

from block_manager_lab import blocks_for  # noqa: E402
from openai_protocol import ApiError, GenRequest, TokenBound, chat_prompt_ids, parse_request  # noqa: E402,F401
from openai_response import Completion, LogprobFormat, TextStream, token_bytes_table  # noqa: E402,F401
from server_loop import MAX_QUEUE, EngineLoop, Event, Job, QueueFull  # noqa: E402,F401

MAX_BODY = 1 << 20          # 请求体的上限（字节）：1 MiB 装得下任何放得进上下文的提示
STEP_HISTORY = 1000         # load_server 的引擎只留最近这么多步的记录（engine_lab 的 max_step_history）
POLL_S = 0.1                # 等新 token 时每隔多久看一眼客户端断了没有（醒得太勤会和引擎线程抢 GIL）
IDLE_TIMEOUT = 5.0          # 一个连接空闲（等下一个请求）最多多久
REQUEST_TIMEOUT = 10.0      # 请求头和请求体要在多久内到齐
WRITE_TIMEOUT = 30.0        # 一次写最多等客户端多久
MAX_CONNECTIONS = 128       # 同时开着的连接（= 连接线程）的上限
ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET", "/health": "GET"}
_CONTENT_LENGTH = re.compile(r"[0-9]{1,15}")      # 只认 ASCII 数字（str.isdigit 还认 "²"）
_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
          408: "invalid_request_error", 411: "invalid_request_error", 413: "request_too_large", 500: "server_error",
          503: "server_error"}


# 同标准库 socketserver 的选择：有 poll 用 poll（select 只收编号 < 1024 的文件描述符）
_Selector = selectors.PollSelector if hasattr(selectors, "PollSelector") else selectors.SelectSelector


class _ClientGone(Exception):
    pass


def _dumps(obj):
    try:
        return json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:                          # 里面有孤立代理（例如回显的坏模型名）：全用 \\u 转义
        return json.dumps(obj).encode("ascii")


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------
class Handler(BaseHTTPRequestHandler):
    server_version = "CS349E-serve/2.0"
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"     # 请求行坏了时也回状态行和头（标准库默认 HTTP/0.9：只回一个光秃秃的体）

    def log_message(self, fmt, *args):      # 默认每个请求往 stderr 打一行；--log 时才打
        if self.server.log:
            super().log_message(fmt, *args)

    def setup(self):
        super().setup()
        self.connection.settimeout(self.server.idle_timeout)
        self.busy, self.chunked = False, False
        self.server.track(self, True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.track(self, False)

    def handle_one_request(self):
        self.connection.settimeout(self.server.idle_timeout)    # 等下一个请求：空闲的超时
        if self.server.closing:
            self.close_connection = True
            return
        super().handle_one_request()

    # ---- 回应 ----
    def _json(self, status, obj, headers=()):
        data = _dumps(obj)
        if self.server.closing:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, e, headers=()):
        self._json(e.status, e.body(), headers)

    def send_error(self, code, message=None, explain=None):
        """标准库在请求行 / 头坏了、方法不认识时调它：换成 JSON 的错误体（不是 HTML）；不认识的方法是 405 或 404。"""
        if code == 501:
            self._wrong_method()
            return
        self.close_connection = True
        en = message or self.responses.get(code, ("error",))[0]
        try:
            self._error(ApiError(code, en, type_=_TYPES.get(code, "invalid_request_error")))
        except OSError:
            pass

    def _route(self):
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _wrong_method(self):
        path = self._route()
        allowed = ROUTES.get(path) or ("GET" if path.startswith("/v1/models/") else None)
        if allowed is None:
            e = ApiError(404, f"no such route: {self.command} {path}", f"没有这个地址：{self.command} {path}",
                         type_="not_found_error")
            self._drain_body()
            self._error(e)
            return
        self._drain_body()
        self._error(ApiError(405, f"method {self.command} is not allowed on {path}; use {allowed}",
                             f"{path} 只收 {allowed}", type_="invalid_request_error"), [("Allow", allowed)])

    def _drain_body(self):
        """不看的请求体也要读掉（连接要接着用）；读不了就关连接。"""
        n = self.headers.get("Content-Length") if self.headers else None
        if n and _CONTENT_LENGTH.fullmatch(n.strip()) and int(n) <= self.server.max_body:
            try:
                self._read_exact(int(n))
                return
            except (ApiError, OSError):
                pass
        if n or (self.headers and self.headers.get("Transfer-Encoding")):
            self.close_connection = True

    def do_PUT(self):
        self._wrong_method()

    do_DELETE = do_PATCH = do_PUT

    def do_HEAD(self):
        self._wrong_method()

    def do_GET(self):
        self.busy = True
        try:
            self._get()
        except (OSError, _ClientGone):
            self.close_connection = True
        finally:
            self.busy = False

    def _get(self):
        s, path = self.server, self._route()
        model = {"id": s.model_name, "object": "model", "created": s.created, "owned_by": "cs349e",
                 "max_model_len": s.cfg.max_seq}
        if path == "/health":
            self._json(200, {"status": "ok" if s.loop.is_alive() else "engine stopped"})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [model]})
        elif path.startswith("/v1/models/"):
            mid = unquote(path[len("/v1/models/"):])
            if mid == s.model_name:
                self._json(200, model)
            else:
                self._error(ApiError(404, f"the model {mid!r} does not exist: this server has {s.model_name!r}",
                                     "没有这个模型", "model", type_="not_found_error", code="model_not_found"))
        elif path in ROUTES:
            self._wrong_method()
        else:
            self._error(ApiError(404, f"no such route: GET {path}", f"没有这个地址：GET {path}",
                                 type_="not_found_error"))

    def do_POST(self):
        self.busy = True
        try:
            self._post()
        except ApiError as e:
            try:
                self._error(e)
            except OSError:
                self.close_connection = True
        except (OSError, _ClientGone):
            self.close_connection = True
        except Exception as e:                               # noqa: BLE001  决不让一个请求弄掉连接、打出 traceback
            self.server.warn(f"internal error on {self.command} {self.path}: {type(e).__name__}: {e}")
            self.close_connection = True
            try:
                self._error(ApiError(500, f"internal server error ({type(e).__name__})", "服务器内部错误",
                                     type_="server_error"))
            except OSError:
                pass
        finally:
            self.busy = False

    def _read_exact(self, n):
        """读 n 个字节的请求体，整个要在 request_timeout 内到齐；没到齐 408（关连接）；客户端先关了：_ClientGone。"""
        deadline = time.monotonic() + self.server.request_timeout
        parts, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise socket.timeout()
                self.connection.settimeout(left)
                b = self.rfile.read1(n - got)
            except socket.timeout:
                self.close_connection = True
                raise ApiError(408, f"the request body did not arrive in time: got {got} of {n} bytes in "
                                    f"{self.server.request_timeout:g} s", f"请求体没在时限内到齐（{got} / {n} 字节）",
                               type_="invalid_request_error") from None
            if not b:
                self.close_connection = True
                raise _ClientGone()
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def _read_body(self):
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(411, "chunked request bodies are not supported: send Content-Length",
                           "不支持分块传输的请求体，要有 Content-Length")
        n = self.headers.get("Content-Length")
        if n is None or not _CONTENT_LENGTH.fullmatch(n.strip()):
            self.close_connection = True
            raise ApiError(411 if n is None else 400, "a Content-Length header with a decimal byte count is required"
                           + ("" if n is None else f" (got {n!r})"), "要有 Content-Length 头（十进制的字节数）")
        n = int(n)
        if n > self.server.max_body:
            self.close_connection = True
            raise ApiError(413, f"the request body has {n} bytes, more than the limit {self.server.max_body}",
                           f"请求体 {n} 字节，超过上限 {self.server.max_body} 字节", type_="request_too_large")
        raw = self._read_exact(n)
        try:
            return json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ApiError(400, f"the request body is not UTF-8: {e}", "请求体不是 UTF-8") from None
        except RecursionError:
            raise ApiError(400, "the request body is not usable JSON: nested too deeply",
                           "请求体的 JSON 嵌套太深") from None
        except ValueError as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}", "请求体不是合法的 JSON") from None

    def _post(self):
        s, path = self.server, self._route()
        if path not in ("/v1/chat/completions", "/v1/completions"):
            if path in ROUTES or path.startswith("/v1/models/"):
                self._wrong_method()                         # 它读掉请求体
                return
            self._drain_body()
            raise ApiError(404, f"no such route: POST {path}", f"没有这个地址：POST {path}", type_="not_found_error")
        self.connection.settimeout(s.request_timeout)
        chat = path == "/v1/chat/completions"
        body = self._read_body()
        eng = s.loop.engine
        try:
            req = parse_request(body, chat, s.tok, s.cfg, eng.num_blocks, eng.block_size, s.model_name, s.gamma,
                                s.bound)
        except ValueError as e:                              # 分词器不收的文字（例如词表缺的字节）
            raise ApiError(400, f"the text could not be tokenized: {e}", "这段文字切不了词",
                           "messages" if chat else "prompt") from None
        if req.ignored:
            s.warn(f"ignored fields (not used by this server): {', '.join(req.ignored)}")
        job = Job(req)
        try:
            s.loop.submit(job)
        except QueueFull:
            raise ApiError(503, f"the server is busy: {s.loop.max_queue} requests are already queued or running; "
                                "retry later", f"服务器忙：已经有 {s.loop.max_queue} 个请求", type_="server_error",
                           code="overloaded") from None
        with s.counter_lock:
            s.counter += 1
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{s.counter}"
        try:
            self.connection.settimeout(s.write_timeout)
            self._respond(job, req, rid)
        except BaseException:
            s.loop.abort(job)                                # 客户端走了或者出错：中止，块放回块池
            raise

    def _client_gone(self):
        """客户端关了连接吗（发完请求后，连接上再有可读的东西要么是下一个请求，要么是关闭：读到 0 字节）。"""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            return bool(r) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _events(self, job):
        """按顺序给出引擎送来的 Event，直到结束。客户端断了抛 _ClientGone（每 poll_s 秒看一次，流式和不流式都看）。"""
        poll = self.server.poll_s
        next_check = time.monotonic() + poll
        while True:
            try:
                ev = job.events.get(timeout=poll)
            except queue.Empty:
                ev = None
            if time.monotonic() >= next_check:           # token 一直来（不流式、或文字留着没发）时也按时看
                next_check = time.monotonic() + poll
                if self._client_gone():
                    raise _ClientGone()
            if ev is None:
                continue
            yield ev
            if ev.reason is not None:
                return

    def _wait_added(self, job):
        while not job.added.wait(self.server.poll_s):
            if self._client_gone():
                raise _ClientGone()
        if job.refused is not None:
            status, msg = job.refused
            raise ApiError(status, ("the engine refused the request: " if status == 400 else "") + msg,
                           type_=_TYPES[status])

    def _send_chunk(self, data):
        if self.chunked:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.wfile.write(data)

    def _respond(self, job, req, rid):
        s = self.server
        self._wait_added(job)                                # 引擎收下了：之后才发响应头
        c = Completion(req, rid, s.model_name, int(time.time()), s.tbytes, s.lpfmt)

        def send(obj):
            self._send_chunk(b"data: " + _dumps(obj) + b"\n\n")

        def done():
            self._send_chunk(b"data: [DONE]\n\n")
            if self.chunked:
                self.wfile.write(b"0\r\n\r\n")

        if req.stream:
            self.chunked = self.request_version == "HTTP/1.1" and not s.closing
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            if self.chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            for obj in c.opening():
                send(obj)
        for ev in self._events(job):
            if ev.tokens is None or ev.reason == "error":    # 关机，或引擎的这一步出错
                e = ApiError(ev.status or 500, ev.message or "error", type_="server_error")
                if not req.stream:
                    raise e
                send(e.body())                               # 头已经发了：流里发一个错误事件，再正常结束
                done()
                return
            piece, hit = c.feed(ev.tokens, ev.reason, ev.logprobs)
            if hit:
                s.loop.abort(job)                            # 引擎不知道停止串：叫它停、放掉块
            if piece is not None:
                send(piece)
            if c.reason is not None:
                break
        if req.stream:
            for obj in c.closing():
                send(obj)
            done()
        else:
            self._json(200, c.final())


class Server(ThreadingHTTPServer):
    """多线程的 HTTP 服务器：连接数有上限（再来的立刻 503）、记着每个开着的连接（关机时把空闲的关掉）。"""
    daemon_threads = False          # 关机时等每个连接的线程结束（server_close 里 join）
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, addr, handler, max_connections):
        super().__init__(addr, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_connections, self.closing = max_connections, False
        self.conns, self.conns_lock = set(), threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()    # shutdown() 往这里写一个字节，叫醒 serve_forever
        self._stop_asked, self._stopped = False, threading.Event()

    def serve_forever(self, poll_interval=0.5):
        """同标准库的 socketserver.serve_forever，另外听一个唤醒用的 socket：shutdown() 立刻叫醒这个循环
        （标准库的循环要等到下一次轮询才看见关机请求，最多 poll_interval 秒）。"""
        self._stopped.clear()
        try:
            with _Selector() as sel:
                sel.register(self, selectors.EVENT_READ)
                sel.register(self._wake_r, selectors.EVENT_READ)
                while not self._stop_asked:
                    ready = sel.select(poll_interval)
                    if self._stop_asked:
                        break
                    if any(key.fileobj is self for key, _ in ready):
                        self._handle_request_noblock()
                    self.service_actions()
        finally:
            self._stop_asked = False
            self._stopped.set()

    def shutdown(self):
        """让 serve_forever 停下，等它结束（同标准库：必须在 serve_forever 跑在另一个线程里时调）。"""
        self._stop_asked = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._stopped.wait()

    def server_close(self):
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    def track(self, handler, on):
        with self.conns_lock:
            (self.conns.add if on else self.conns.discard)(handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            data = _dumps(ApiError(503, f"too many connections (limit {self.max_connections}); retry later",
                                   "连接太多", type_="server_error", code="overloaded").body())
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        """连接上出了没接住的异常：一行日志，不打 traceback（每个请求的异常在 Handler 里已经变成了 JSON 错误）。"""
        e = sys.exc_info()[1]
        self.warn(f"connection {client_address}: {type(e).__name__}: {e}")


class ServerHandle:
    """一个在后台线程里跑着的服务器：url、port、loop（EngineLoop）、httpd、close()（停服务、停引擎、等所有线程）。"""

    def __init__(self, httpd, loop):
        self.httpd, self.loop = httpd, loop
        self.port = httpd.server_address[1]
        self.url = f"http://{httpd.server_address[0]}:{self.port}"
        self.thread = threading.Thread(target=httpd.serve_forever, name="http-server", daemon=True)

    def close(self, grace=2.0):
        """不再收连接；引擎停下（在跑的请求：流式收到错误事件和 [DONE]，不流式 503）；正在回答的连接最多等 grace 秒
        写完，然后关掉所有连接（空闲的 keep-alive 连接不会拖住关机）；等每个线程结束。"""
        h = self.httpd
        h.closing = True
        h.shutdown()
        self.loop.stop()
        t = time.monotonic() + grace
        while time.monotonic() < t:
            with h.conns_lock:
                if not any(c.busy for c in h.conns):
                    break
            time.sleep(0.01)
        with h.conns_lock:
            for c in list(h.conns):
                try:
                    c.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        h.server_close()
        self.thread.join(10)


def _stderr(line):
    print(line, file=sys.stderr, flush=True)


def make_server(engine, tok, model_name, host="127.0.0.1", port=0, max_queue=MAX_QUEUE, max_body=MAX_BODY,
                log=False, start=True, *, idle_timeout=IDLE_TIMEOUT, request_timeout=REQUEST_TIMEOUT,
                write_timeout=WRITE_TIMEOUT, poll_s=POLL_S, max_connections=MAX_CONNECTIONS, warn=_stderr):
    """
    建一个服务器 -> ServerHandle（start=True 时服务器和引擎线程都已经在跑）。port=0：系统给一个空闲的端口。
    engine：engine_lab.LLMEngine（之后只有引擎线程碰它；一直开着的服务器建引擎时给 max_step_history）；
    tok：bpe_lab.BPETokenizer（要有 <|im_start|>、<|im_end|>）。超时（秒）和连接上限见模块说明的【连接】；
    warn：一行字的日志（默认 stderr）：没用的字段、引擎出错、连接上的异常。
    """
    if tok.im_start_id is None or tok.im_end_id is None:
        raise ValueError("分词器没有 <|im_start|> / <|im_end|>：不是 ChatML 格式的模型，chat 接口用不了")
    for name, v in (("idle_timeout", idle_timeout), ("request_timeout", request_timeout),
                    ("write_timeout", write_timeout), ("poll_s", poll_s)):
        if not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"{name} 必须是 > 0 的秒数（收到 {v!r}）")
    tok.encode("warm up")                 # 第一次切词要先建预分词的正则（扫一遍 Unicode，约几秒）：别让第一个请求等
    httpd = Server((host, port), Handler, max_connections)
    loop = EngineLoop(engine, max_queue, log=warn)
    spec = getattr(engine, "spec", None)
    httpd.loop, httpd.tok, httpd.cfg, httpd.model_name = loop, tok, engine.cfg, model_name
    httpd.gamma = 0 if spec is None else int(spec.gamma_top)          # 投机：每个请求留 γ 个草稿位置
    httpd.tbytes, httpd.max_body, httpd.log, httpd.warn = token_bytes_table(tok), max_body, log, warn
    httpd.bound, httpd.lpfmt = TokenBound(tok, httpd.tbytes), LogprobFormat(tok, httpd.tbytes)
    httpd.idle_timeout, httpd.request_timeout, httpd.write_timeout = idle_timeout, request_timeout, write_timeout
    httpd.poll_s = poll_s
    httpd.created, httpd.counter, httpd.counter_lock = int(time.time()), 0, threading.Lock()
    h = ServerHandle(httpd, loop)
    if start:
        loop.start()
        h.thread.start()
    return h


def speculative_config_from_cli(text):
    """
    --speculative-config 的 JSON（vLLM 的写法）-> engine_lab 的 speculative_config dict，和一行说明（或 None）。
    只收 method "ngram"（prompt lookup：不要草稿模型）。vLLM 的 prompt_lookup_min：vLLM 从 prompt_lookup_max 往下
    试到 prompt_lookup_min 个 token 的匹配；这里的 prompt lookup（lookup_lab.PromptLookup）只试 n = prompt_lookup_max
    一种长度，所以 prompt_lookup_min 被收下、不用（它 ≤ prompt_lookup_max 才收），说明里说出来。
    【边界】不是 JSON 对象、method 不是 "ngram"、prompt_lookup_min 不是 ≤ prompt_lookup_max 的正整数：ValueError。
    """
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--speculative-config 不是合法的 JSON：{e}") from None
    if not isinstance(d, dict):
        raise ValueError("--speculative-config 要一个 JSON 对象，例如 "
                         "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 2}'")
    if d.get("method") != "ngram":
        raise ValueError(f"命令行只支持 method \"ngram\"（prompt lookup，不要草稿模型），收到 {d.get('method')!r}")
    note = None
    if "prompt_lookup_min" in d:
        lo, hi = d.pop("prompt_lookup_min"), d.get("prompt_lookup_max", 2)
        if not (isinstance(lo, int) and not isinstance(lo, bool) and 1 <= lo <= (hi if isinstance(hi, int) else lo)):
            raise ValueError(f"prompt_lookup_min 必须是 1..prompt_lookup_max 的整数（收到 {lo!r}）")
        note = (f"prompt_lookup_min = {lo} 收下、不用：这里的 prompt lookup 只找 n = prompt_lookup_max = {hi} 个 token "
                f"的匹配（vLLM 从 {hi} 往下试到 {lo}），找不到就这一轮不草稿")
    return d, note


def parse_pd(text):
    """--pd 的 "P:D" -> (P, D)，两个都是 ≥ 1 的整数。【边界】别的写法：ValueError。"""
    try:
        p, d = (int(x) for x in str(text).split(":"))
    except ValueError:
        p = d = 0
    if p < 1 or d < 1:
        raise ValueError(f"--pd 要写成 P:D（prefill 和 decode 的 worker 数，各 ≥ 1），收到 {text!r}")
    return p, d


def load_router(recipe, block_size, nb, max_num_batched_tokens, max_num_seqs, replicas=1, routing="round_robin",
                pd=None):
    """
    按配方起 worker 进程，建路由器 -> router_lab.Router（replicas 个副本、routing 策略）或 PDRouter（pd = (P, D)）。
    每个 worker 一份权重（SmolLM2 float32 约 0.5 GB 一份）；路由器的 close() 结束它们。
    """
    from router_lab import PDRouter, Router
    from worker_lab import start_worker
    kw = dict(num_blocks=nb, block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
              max_num_seqs=max_num_seqs, clock="wall", max_step_history=STEP_HISTORY)
    n = replicas if pd is None else pd[0] + pd[1]
    ws = []
    try:
        for _ in range(n):
            ws.append(start_worker(recipe, **kw))
    except BaseException:
        for w in ws:
            w.close()
        raise
    if pd is None:
        return Router(ws, routing)
    return PDRouter(ws[:pd[0]], ws[pd[0]:], via="shm")


def load_server(host="127.0.0.1", port=0, dtype="float32", num_blocks=None, max_num_seqs=16,
                max_num_batched_tokens=256, max_queue=MAX_QUEUE, log=False, speculative_config=None,
                replicas=1, routing="round_robin", pd=None):
    """
    装真实模型（real_model_lab.load_gguf：CS349E_GGUF 或缓存的 SmolLM2）、建引擎、开服务器 -> ServerHandle。
    replicas > 1 或 pd = (P, D)：引擎换成 worker 进程前面的路由器（load_router）；pd 和 speculative_config 不能一起
    （ValueError：交接只带目标模型的 KV）。
    """
    import numpy as np
    from engine_lab import LLMEngine
    from real_model_lab import load_gguf
    from hub_lab import gguf_path
    if pd is not None and speculative_config is not None:
        raise ValueError("--pd 不能和 --speculative-config 一起用：交接只带目标模型的 KV / "
                         "--pd cannot be combined with --speculative-config")
    if (replicas > 1 or pd is not None) and speculative_config is not None:
        raise ValueError("--replicas > 1 时不支持 --speculative-config")
    params, cfg, tok = load_gguf(dtype=np.dtype(dtype))
    block_size = 16
    nb = 2 * blocks_for(cfg.max_seq, block_size) if num_blocks is None else num_blocks
    if replicas > 1 or pd is not None:
        del params
        router = load_router(("gguf", gguf_path(), dtype), block_size, nb, max_num_batched_tokens, max_num_seqs,
                             replicas, routing, pd)
        h = make_server(router, tok, cfg.name, host, port, max_queue, log=log)
        close = h.close

        def close_all(*a, **k):
            try:
                close(*a, **k)
            finally:
                router.close()
        h.close = close_all
        return h
    kw = {} if speculative_config is None else {"speculative_config": speculative_config}
    engine = LLMEngine(params, cfg, nb, block_size, max_num_batched_tokens, max_num_seqs, clock="wall",
                       max_step_history=STEP_HISTORY, **kw)
    return make_server(engine, tok, cfg.name, host, port, max_queue, log=log)


def main(argv=None):
    ap = argparse.ArgumentParser(description="CS349E：OpenAI 兼容的服务器（引擎 = lecture05/engine_lab）")
    ap.add_argument("--host", default="127.0.0.1", help="听哪个地址（默认只听本机；0.0.0.0 = 所有网卡，小心）")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--num-blocks", type=int, default=None, help="KV 块池的块数（每块 16 个 token；默认两个满上下文）")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=MAX_QUEUE)
    ap.add_argument("--speculative-config", default=None,
                    help="vLLM 的写法，只支持 prompt lookup："
                         "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 2}'")
    ap.add_argument("--replicas", type=int, default=1, help="几个引擎进程（colocated 副本），路由器在前面分请求")
    ap.add_argument("--routing", choices=("round_robin", "least_loaded", "prefix"), default="round_robin",
                    help="--replicas > 1 时的路由策略")
    ap.add_argument("--pd", default=None, help="P:D = P 个 prefill 进程 + D 个 decode 进程（解耦；KV 经共享内存交接）")
    ap.add_argument("--log", action="store_true", help="每个 HTTP 请求往 stderr 打一行")
    a = ap.parse_args(argv)
    pd = None
    if a.pd is not None:
        try:
            pd = parse_pd(a.pd)
        except ValueError as e:
            ap.error(str(e))
        if a.speculative_config is not None:
            ap.error("--pd 不能和 --speculative-config 一起用（交接只带目标模型的 KV）")
    if a.replicas < 1:
        ap.error(f"--replicas 必须 ≥ 1（收到 {a.replicas}）")
    if a.replicas > 1 and a.speculative_config is not None:
        ap.error("--replicas > 1 时不支持 --speculative-config")
    spec = None
    if a.speculative_config is not None:
        try:
            spec, note = speculative_config_from_cli(a.speculative_config)
        except ValueError as e:
            ap.error(str(e))
        if note:
            print(note, file=sys.stderr, flush=True)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"装模型（{a.dtype}）……", file=sys.stderr, flush=True)
        kw = {} if spec is None else {"speculative_config": spec}
        h = load_server(a.host, a.port, a.dtype, a.num_blocks, a.max_num_seqs, max_queue=a.max_queue, log=a.log,
                        replicas=a.replicas, routing=a.routing, pd=pd, **kw)
        print(f"模型 {h.httpd.model_name} 在 {h.url}/v1 上服务（Ctrl-C 停）", file=sys.stderr, flush=True)
        try:
            while not stop.wait(0.2) and h.thread.is_alive() and h.loop.is_alive():
                pass
            if stop.is_set():
                print("\n停下：中止还在跑的请求……", file=sys.stderr, flush=True)
        finally:
            h.close()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())

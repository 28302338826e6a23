"""
=============================================================================
CS349E · 第 5 讲 · serve.py —— 把引擎开成一个服务：OpenAI 兼容的 HTTP 接口（只用标准库）
=============================================================================

一个能跑的工具（不是实验模块，也不是编号脚本：没有模块 import 它，测试按路径加载）。

【运行】python3 lecture05/serve.py [--port 8000] [--host 127.0.0.1] [--dtype float32|float64]
  默认服务 SmolLM2-135M-Instruct（或环境变量 CS349E_GGUF 指的 GGUF），float32，只听本机 127.0.0.1。
  模型只装一次（约几秒）；Ctrl-C 干净地停下（中止所有请求、等所有线程结束）。然后在另一个终端：
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 20}'

【接口】（OpenAI 的格式：platform.openai.com/docs/api-reference 的 chat 和 completions）
- POST /v1/chat/completions：messages（role 是 system / user / assistant，content 是字符串或 [{"type": "text", ...}]），
  按 ChatML 拼成提示：每条消息 <|im_start|>{role}\\n{content}<|im_end|>\\n，最后 <|im_start|>assistant\\n（只有一条
  user 消息时就是 bpe_lab 的 chat(text)：没有 system 轮，除非消息里带了）。消息的文字按普通文本切词（里面写的
  "<|im_end|>" 不会变成特殊 token）。
- POST /v1/completions：prompt（字符串，其中的特殊 token 字符串照样切成特殊 id；或 token id 的列表）。
- 两者都有 stream（false：一个 JSON；true：server-sent events，每块一行 "data: {json}" 加一个空行，最后 "data: [DONE]"）、
  max_tokens（默认：上下文剩下的全部）、temperature（默认 1，OpenAI 的默认；0 = 贪心）、seed（不给时随机抽一个）、
  stop（字符串或最多 4 个字符串；文字里不含它）、stop_token_ids（vLLM 的扩展：token id）、ignore_eos（vLLM 的扩展：
  不在 <|im_end|> 停，压测要固定的输出长度时用）、stream_options.include_usage（流的最后一块带 usage）、n（只能是 1）。
  默认在 <|im_end|>（和文件的 eos）停，它不放进文字里；finish_reason 是 "stop" 或 "length"。
- GET /v1/models、GET /health。
【文字】每个 token 是一串字节（特殊 token 不进文字，同 vLLM 的 skip_special_tokens）。一个汉字是 3 个字节、可能被切在
  两个 token 里：流式输出时，不完整的字节先留着，凑齐了再发（增量 UTF-8 解码），不会在中途冒出替换字符 U+FFFD；
  可能是停止串开头的文字也先留着。生成结束时还不完整的字节按 UTF-8 的规则换成一个 U+FFFD（和不流式时整段解码一样）。
  所以流式的各块拼起来 == 不流式的文字（测试核对）。usage：prompt_tokens = 提示的 token 数，completion_tokens = 生成
  的 token 数（含停下来的那个停止 token；停止串时数到凑齐它的那个 token）。
【出错】OpenAI 的错误体 {"error": {"message", "type", "param", "code"}}：JSON 坏了、字段缺了或类型不对、max_tokens < 1
  或超过上下文、T 不在 [0, 2]、提示超过模型的上下文或整个 KV 块池：400，param 说是哪个字段；模型名不对：404；
  请求体超过上限：413；排着的请求到了上限：503（而不是无限地占内存）。客户端中途断开：请求中止、块放回块池。
【结构】http.server 的多线程服务器（一个连接一个线程）；引擎只在一个线程里跑（EngineLoop），别的线程经一个线程安全的
  队列把请求和中止交给它，它把每步的新 token 放进每个请求自己的队列。切词、解码、停止串在连接的线程里做。
【依赖】只用标准库和 numpy；本目录的 engine_lab（LLMEngine）、block_manager_lab（blocks_for）；../lecture02 的
  real_model_lab（load_gguf）、bpe_lab（分词器）。
"""
import os
import sys

import argparse  # noqa: E402
import codecs  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import secrets  # noqa: E402
import select  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (HERE, os.path.join(HERE, "..", "lecture02"), os.path.join(HERE, "..", "lecture01")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import blas_threads  # noqa: E402  （lecture01：一个 BLAS 线程，除非你设了线程变量；README 的"一个 BLAS 线程"）

blas_threads.apply_rule()

from block_manager_lab import blocks_for  # noqa: E402
from bpe_lab import SPECIAL_TOKEN_TYPES  # noqa: E402

MAX_BODY = 1 << 20          # 请求体的上限（字节）：1 MiB 装得下任何放得进上下文的提示
MAX_QUEUE = 64              # 同时在服务器里（排着或在跑）的请求数上限，再多就 503
MAX_STOP = 4                # stop 最多几个字符串（OpenAI 的上限）
STEP_HISTORY = 1000         # load_server 的引擎只留最近这么多步的记录（engine_lab 的 max_step_history）
POLL_S = 0.5               # 连接线程等新 token 时每隔多久看一眼客户端断了没有（醒得太勤会和引擎线程抢 GIL）


# ---------------------------------------------------------------------------
# 错误
# ---------------------------------------------------------------------------
class ApiError(Exception):
    """一个要回给客户端的错误：HTTP 状态码 + OpenAI 的错误体。"""

    def __init__(self, status, message, param=None, type_="invalid_request_error", code=None):
        if param is not None and param not in message:
            message = f"{param}：{message}"               # 消息里点名是哪个字段
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ---------------------------------------------------------------------------
# 文字：token 的字节、增量 UTF-8、停止串
# ---------------------------------------------------------------------------
def token_bytes_table(tok):
    """每个 id 进文字的字节 -> list[bytes]：普通 token 按 GPT-2 的字节表换回字节，特殊 token 是 b""（不进文字）。"""
    out = []
    for i, t in enumerate(tok.tokens):
        if tok.token_types[i] in SPECIAL_TOKEN_TYPES:
            out.append(b"")
        else:
            out.append(bytes(tok.char_to_byte[c] for c in t))
    return out


class TextStream:
    """
    一个请求的输出文字，一次喂几个 token：feed(ids) -> (现在可以发出去的新文字, 是否碰到了停止串)；finish() -> 最后一段。

    【规则】字节经增量 UTF-8 解码（errors="replace"）：不完整的尾巴留在解码器里。文字里第一次出现任何一个停止串时，
    文字截在它前面、停。没停时，文字末尾可能是某个停止串开头的那一段先留着，剩下的发出去。finish() 把解码器里剩下的字节
    按 final=True 解（不完整的变成一个 U+FFFD），再查一次停止串，发出剩下的全部。
    """

    def __init__(self, tbytes, stops=()):
        self.tbytes, self.stops = tbytes, [s for s in stops if s]
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.text, self.sent, self.stopped = "", 0, False

    def _emit(self, final):
        hit = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
        if hit >= 0:
            end, self.stopped = hit, True
            self.text = self.text[:hit]
        elif final:
            end = len(self.text)
        else:
            hold = 0
            for s in self.stops:
                for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                    if self.text.endswith(s[:k]):
                        hold = k
                        break
            end = len(self.text) - hold
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent:end], end
        return out

    def feed(self, ids):
        if self.stopped:
            return "", True
        self.text += self.dec.decode(b"".join(self.tbytes[i] for i in ids))
        return self._emit(False), self.stopped

    def finish(self):
        if self.stopped:
            return ""
        self.text += self.dec.decode(b"", final=True)
        return self._emit(True)


# ---------------------------------------------------------------------------
# 请求体 -> 一个生成请求
# ---------------------------------------------------------------------------
def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def chat_prompt_ids(tok, messages):
    """messages -> 提示的 id（ChatML，见模块说明）。格式不对抛 ApiError（param = "messages"）。"""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages 必须是一个不空的列表（每项 {\"role\": ..., \"content\": ...}）", "messages")
    ids = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ApiError(400, f"messages[{k}] 必须是一个对象，role 是 \"system\"、\"user\" 或 \"assistant\"", "messages")
        c = m.get("content")
        if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in c):
            c = "".join(p["text"] for p in c)
        if not isinstance(c, str):
            raise ApiError(400, f"messages[{k}].content 必须是字符串（或 type 为 \"text\" 的片段列表）", "messages")
        ids += [tok.im_start_id] + tok.encode(f"{m['role']}\n{c}", parse_special=False) + [tok.im_end_id]
        ids += tok.encode("\n")
    return ids + [tok.im_start_id] + tok.encode("assistant\n")


class GenRequest:
    """解析好的一个请求：prompt_ids、max_tokens、temperature、seed、stops（字符串）、stop_ids、stream、include_usage、chat。"""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def parse_request(body, chat, tok, cfg, num_blocks, block_size, model_name):
    """
    请求体（已解析的 JSON）-> GenRequest。哪里不对就抛 ApiError（400，模型名不对 404），param 是那个字段。
    """
    if not isinstance(body, dict):
        raise ApiError(400, "请求体必须是一个 JSON 对象")
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise ApiError(400, "model 必须是字符串", "model")
        if model != model_name:
            raise ApiError(404, f"没有模型 {model!r}：这个服务器只有 {model_name!r}", "model", code="model_not_found")
    if chat:
        if "messages" not in body:
            raise ApiError(400, "缺少字段 messages", "messages")
        prompt, pname = chat_prompt_ids(tok, body["messages"]), "messages"
    else:
        if "prompt" not in body:
            raise ApiError(400, "缺少字段 prompt", "prompt")
        p, pname = body["prompt"], "prompt"
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]
        if isinstance(p, str):
            prompt = tok.encode(p)
        elif isinstance(p, list) and p and all(_is_int(t) for t in p):
            if min(p) < 0 or max(p) >= cfg.vocab:
                raise ApiError(400, f"prompt 里的 token id 必须在 0..{cfg.vocab - 1} 之间", "prompt")
            prompt = list(p)
        else:
            raise ApiError(400, "prompt 必须是字符串、只有一个字符串的列表，或 token id 的列表", "prompt")
    if not prompt:
        raise ApiError(400, f"{pname}：提示是空的，至少要 1 个 token", pname)
    n_prompt = len(prompt)
    if n_prompt > cfg.max_seq:
        raise ApiError(400, f"{pname}：提示有 {n_prompt} 个 token，超过模型的上下文 {cfg.max_seq}", pname)
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    mt = body.get(name)
    room = cfg.max_seq - n_prompt + 1                  # 引擎的规则：提示 + max_tokens − 1 ≤ 上下文
    if mt is None:
        mt = room
    elif not _is_int(mt) or mt < 1:
        raise ApiError(400, f"{name} 必须是 ≥ 1 的整数（收到 {mt!r}）", name)
    elif mt > room:
        raise ApiError(400, f"{name} = {mt} 太大：提示 {n_prompt} 个 token，上下文 {cfg.max_seq}，最多还能生成 {room} 个",
                       name)
    if blocks_for(n_prompt + mt - 1, block_size) > num_blocks:
        p = pname if n_prompt > num_blocks * block_size else name
        raise ApiError(400, f"{p}：提示 {n_prompt} + {name} {mt} − 1 个位置要 {blocks_for(n_prompt + mt - 1, block_size)} "
                            f"个 KV 块，整个块池只有 {num_blocks} 块", p)
    temp = body.get("temperature")
    temp = 1.0 if temp is None else temp
    if not _is_num(temp) or not 0 <= temp <= 2:
        raise ApiError(400, f"temperature 必须是 0 到 2 之间的数（收到 {temp!r}）", "temperature")
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(2 ** 63)
    elif not _is_int(seed) or not 0 <= seed < 2 ** 63:
        raise ApiError(400, f"seed 必须是 0 到 2^63 − 1 之间的整数（收到 {seed!r}）", "seed")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP and all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, f"stop 必须是一个不空的字符串或最多 {MAX_STOP} 个不空字符串的列表", "stop")
    sids = body.get("stop_token_ids")
    sids = [] if sids is None else sids
    if not (isinstance(sids, list) and all(_is_int(t) and 0 <= t < cfg.vocab for t in sids)):
        raise ApiError(400, f"stop_token_ids 必须是 0..{cfg.vocab - 1} 之间的整数的列表", "stop_token_ids")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError(400, "ignore_eos 必须是 true 或 false", "ignore_eos")
    eos = {t for t in (tok.im_end_id, tok.eos_id) if t is not None}
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream 必须是 true 或 false", "stream")
    so = body.get("stream_options")
    if so is not None and not stream:
        raise ApiError(400, "stream_options 只能和 stream: true 一起用", "stream_options")
    if so is not None and not (isinstance(so, dict) and isinstance(so.get("include_usage", False), bool)):
        raise ApiError(400, "stream_options 必须是 {\"include_usage\": true/false}", "stream_options")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ApiError(400, "n 只能是 1（一个请求一个回答）", "n")
    return GenRequest(prompt_ids=prompt, max_tokens=mt, temperature=float(temp), seed=seed, stops=stops,
                      stop_ids=sorted(set(sids) | (set() if ignore_eos else eos)), stream=stream,
                      include_usage=bool(so and so.get("include_usage")), chat=chat)


# ---------------------------------------------------------------------------
# 引擎线程
# ---------------------------------------------------------------------------
class QueueFull(Exception):
    pass


class Job:
    """一个在服务器里的请求：引擎线程往 events 里放 (新 token 的 list, finish_reason)；关机时放 (None, "shutdown")。"""

    def __init__(self, req):
        self.req, self.events, self.rid = req, queue.Queue(), None


class EngineLoop(threading.Thread):
    """
    引擎只在这一个线程里跑。submit(job) 和 abort(job) 可以从任何线程调：它们只往收件箱（线程安全的队列）里放东西。
    循环：收件箱里的都处理掉（加请求 / 中止）；引擎有活就 step() 一次，把新 token 分给各个请求；没活就在收件箱上等。
    同时在服务器里的请求数（排着的 + 在跑的）到了 max_queue 时 submit 抛 QueueFull。
    一个请求的结束（"stop" / "length" / "abort"）交给它的连接之后，engine.release(id) 忘掉它；引擎的步记录有多长由建
    引擎时的 max_step_history 定（load_server 用 STEP_HISTORY）。
    """

    def __init__(self, engine, max_queue=MAX_QUEUE):
        super().__init__(name="engine-loop", daemon=True)
        self.engine, self.max_queue = engine, max_queue
        self.inbox, self.jobs = queue.Queue(), {}
        self.lock, self.n_live = threading.Lock(), 0
        self._halt = threading.Event()
        self.error = None

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
                job.rid = eng.add_request(r.prompt_ids, r.max_tokens, r.temperature, r.seed, r.stop_ids)
            except ValueError as e:                          # parse_request 已经查过；这里是最后一道
                job.events.put((None, "error:" + str(e)))
                self._done(job)
                return
            self.jobs[job.rid] = job
        elif kind == "abort" and job.rid in self.jobs:
            eng.abort_request(job.rid)                       # 块马上放回块池；下一次 step() 报告 (id, [], "abort")

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
                for rid, toks, reason in eng.step():
                    job = self.jobs.get(rid)
                    if job is None:
                        continue
                    job.events.put((toks, reason))
                    if reason is not None:                   # 结束（含中止）已经报告：引擎忘掉它，requests 不会无限长
                        del self.jobs[rid]
                        eng.release(rid)
                        self._done(job)
        except Exception as e:                               # 引擎坏了：让每个请求都知道，不挂住
            self.error = e
            raise
        finally:
            self._halt.set()
            while True:                                      # 收件箱里还没处理的加请求
                try:
                    kind, job = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if kind == "add":
                    job.events.put((None, "shutdown"))
            for rid, job in list(self.jobs.items()):
                eng.abort_request(rid)                       # 已经结束的：引擎什么都不做
                job.events.put((None, "shutdown"))
            self.jobs.clear()

    def stop(self, timeout=10.0):
        self._halt.set()
        self.inbox.put(("noop", None))
        self.join(timeout)


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------
class Handler(BaseHTTPRequestHandler):
    server_version = "CS349E-serve/1.0"
    protocol_version = "HTTP/1.0"           # 一个连接一个请求；流式响应的结尾就是连接关闭

    def log_message(self, fmt, *args):      # 默认每个请求往 stderr 打一行；--log 时才打
        if self.server.log:
            super().log_message(fmt, *args)

    # ---- 回应 ----
    def _json(self, status, obj):
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, e):
        self._json(e.status, e.body())

    def do_GET(self):
        s = self.server
        if self.path == "/health":
            self._json(200, {"status": "ok" if s.loop.is_alive() else "engine stopped"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": s.model_name, "object": "model", "created": s.created,
                                                         "owned_by": "cs349e", "max_model_len": s.cfg.max_seq}]})
        else:
            self._error(ApiError(404, f"没有这个地址：GET {self.path}", type_="not_found_error"))

    def do_POST(self):
        try:
            self._post()
        except ApiError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _read_body(self):
        n = self.headers.get("Content-Length")
        if n is None or not n.isdigit():
            raise ApiError(400, "要有 Content-Length 头（不支持分块传输的请求体）")
        if int(n) > self.server.max_body:
            self.close_connection = True
            raise ApiError(413, f"请求体 {int(n)} 字节，超过上限 {self.server.max_body} 字节", type_="request_too_large")
        raw = self.rfile.read(int(n))
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"请求体不是合法的 JSON：{e}") from None

    def _post(self):
        s = self.server
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            raise ApiError(404, f"没有这个地址：POST {self.path}", type_="not_found_error")
        chat = self.path == "/v1/chat/completions"
        body = self._read_body()
        req = parse_request(body, chat, s.tok, s.cfg, s.loop.engine.num_blocks, s.loop.engine.block_size,
                            s.model_name)
        job = Job(req)
        try:
            s.loop.submit(job)
        except QueueFull:
            raise ApiError(503, f"服务器忙：已经有 {s.loop.max_queue} 个请求在排队或在跑，请稍后再试",
                           type_="server_error", code="overloaded") from None
        with s.counter_lock:
            s.counter += 1
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{s.counter}"
        try:
            self._respond(job, req, rid)
        except (BrokenPipeError, ConnectionResetError, _ClientGone):
            s.loop.abort(job)                                # 客户端走了：中止，块放回块池

    def _client_gone(self):
        """客户端关了连接吗（发完请求后，连接上再有可读的东西只能是关闭：读到 0 字节）。"""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            return bool(r) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _events(self, job):
        """按顺序给出引擎送来的 (token 的 list, finish_reason)，直到 finish_reason 不是 None。客户端断了抛 _ClientGone。"""
        while True:
            try:
                toks, reason = job.events.get(timeout=POLL_S)
            except queue.Empty:
                if self._client_gone():
                    raise _ClientGone() from None
                continue
            yield toks, reason
            if reason is not None:
                return

    def _respond(self, job, req, rid):
        s = self.server
        ts = TextStream(s.tbytes, req.stops)
        created, n_out, reason = int(time.time()), 0, None
        obj = "chat.completion" if req.chat else "text_completion"
        stop_ids = set(req.stop_ids)

        def chunk(text=None, finish=None, usage=False, role=False):
            if req.chat:
                delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            c = {"id": rid, "object": obj + ".chunk" if req.chat else obj, "created": created, "model": s.model_name,
                 "choices": [] if usage else [choice]}
            if req.include_usage:
                c["usage"] = usage_obj() if usage else None
            return c

        def usage_obj():
            return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": n_out,
                    "total_tokens": len(req.prompt_ids) + n_out}

        def send(c):
            self.wfile.write(b"data: " + json.dumps(c, ensure_ascii=False).encode("utf-8") + b"\n\n")

        if req.stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.close_connection = True
            if req.chat:
                send(chunk(role=True))
        parts = []
        for toks, r in self._events(job):
            if toks is None:                                 # 关机或引擎拒收
                e = (ApiError(400, r[6:]) if r.startswith("error:") else
                     ApiError(503, "服务器正在关机，这个请求被中止了", type_="server_error"))
                if not req.stream:
                    raise e
                send(e.body())                               # 头已经发了：流里发一个错误事件，再正常结束
                self.wfile.write(b"data: [DONE]\n\n")
                return
            if r == "stop" and toks and toks[-1] in stop_ids:
                feed = toks[:-1]
            else:
                feed = toks
            text, hit = "", False
            for k, t in enumerate(feed):                     # 一个一个喂：停止串凑齐时知道是第几个 token
                piece, hit = ts.feed([t])
                text += piece
                if hit:
                    n_out += k + 1
                    break
            if hit:
                reason = "stop"
                s.loop.abort(job)                            # 引擎不知道停止串：叫它停、放掉块
            else:
                n_out += len(toks)
                reason = r
                if r is not None:
                    text += ts.finish()
            if text and req.stream:
                send(chunk(text))
            parts.append(text)
            if reason is not None:
                break
        if req.stream:
            send(chunk(finish=reason))
            if req.include_usage:
                send(chunk(usage=True))
            self.wfile.write(b"data: [DONE]\n\n")
            return
        text = "".join(parts)
        msg = {"role": "assistant", "content": text} if req.chat else None
        choice = ({"index": 0, "message": msg, "logprobs": None, "finish_reason": reason} if req.chat
                  else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        self._json(200, {"id": rid, "object": obj, "created": created, "model": s.model_name, "choices": [choice],
                         "usage": usage_obj()})


class _ClientGone(Exception):
    pass


class Server(ThreadingHTTPServer):
    daemon_threads = False          # 关机时等每个连接的线程结束（server_close 里 join）
    block_on_close = True
    allow_reuse_address = True


class ServerHandle:
    """一个在后台线程里跑着的服务器：url、port、loop（EngineLoop）、close()（停服务、停引擎、等所有线程）。"""

    def __init__(self, httpd, loop):
        self.httpd, self.loop = httpd, loop
        self.port = httpd.server_address[1]
        self.url = f"http://{httpd.server_address[0]}:{self.port}"
        self.thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="http-server", daemon=True)

    def close(self):
        self.httpd.shutdown()
        self.loop.stop()
        self.httpd.server_close()
        self.thread.join(10)


def make_server(engine, tok, model_name, host="127.0.0.1", port=0, max_queue=MAX_QUEUE, max_body=MAX_BODY,
                log=False, start=True):
    """
    建一个服务器 -> ServerHandle（start=True 时服务器和引擎线程都已经在跑）。port=0：系统给一个空闲的端口。
    engine：engine_lab.LLMEngine（之后只有引擎线程碰它；结束了的请求由引擎线程 release；一直开着的服务器建引擎时
    给 max_step_history，步的记录才有界）；tok：bpe_lab.BPETokenizer（要有 <|im_start|>、<|im_end|>）。
    """
    if tok.im_start_id is None or tok.im_end_id is None:
        raise ValueError("分词器没有 <|im_start|> / <|im_end|>：不是 ChatML 格式的模型，chat 接口用不了")
    tok.encode("warm up")                 # 第一次切词要先建预分词的正则（扫一遍 Unicode，约几秒）：别让第一个请求等
    httpd = Server((host, port), Handler)
    loop = EngineLoop(engine, max_queue)
    httpd.loop, httpd.tok, httpd.cfg, httpd.model_name = loop, tok, engine.cfg, model_name
    httpd.tbytes, httpd.max_body, httpd.log = token_bytes_table(tok), max_body, log
    httpd.created, httpd.counter, httpd.counter_lock = int(time.time()), 0, threading.Lock()
    h = ServerHandle(httpd, loop)
    if start:
        loop.start()
        h.thread.start()
    return h


def load_server(host="127.0.0.1", port=0, dtype="float32", num_blocks=None, max_num_seqs=16,
                max_num_batched_tokens=256, max_queue=MAX_QUEUE, log=False):
    """装真实模型（real_model_lab.load_gguf：CS349E_GGUF 或缓存的 SmolLM2）、建引擎、开服务器 -> ServerHandle。"""
    import numpy as np
    from engine_lab import LLMEngine
    from real_model_lab import load_gguf
    params, cfg, tok = load_gguf(dtype=np.dtype(dtype))
    block_size = 16
    nb = 2 * blocks_for(cfg.max_seq, block_size) if num_blocks is None else num_blocks
    engine = LLMEngine(params, cfg, nb, block_size, max_num_batched_tokens, max_num_seqs, clock="wall",
                       max_step_history=STEP_HISTORY)
    return make_server(engine, tok, cfg.name, host, port, max_queue, log=log)


def main(argv=None):
    ap = argparse.ArgumentParser(description="CS349E：OpenAI 兼容的服务器（引擎 = lecture05/engine_lab）")
    ap.add_argument("--host", default="127.0.0.1", help="听哪个地址（默认只听本机；0.0.0.0 = 所有网卡，小心）")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--num-blocks", type=int, default=None, help="KV 块池的块数（每块 16 个 token；默认两个满上下文）")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=MAX_QUEUE)
    ap.add_argument("--log", action="store_true", help="每个 HTTP 请求往 stderr 打一行")
    a = ap.parse_args(argv)
    print(f"装模型（{a.dtype}）……", file=sys.stderr, flush=True)
    h = load_server(a.host, a.port, a.dtype, a.num_blocks, a.max_num_seqs, max_queue=a.max_queue, log=a.log)
    print(f"模型 {h.httpd.model_name} 在 {h.url}/v1 上服务（Ctrl-C 停）", file=sys.stderr, flush=True)
    try:
        while h.thread.is_alive() and h.loop.is_alive():
            h.thread.join(0.5)
    except KeyboardInterrupt:
        print("\n停下：中止还在跑的请求……", file=sys.stderr, flush=True)
    finally:
        h.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""
lecture05/serve.py 像一个真的服务器那样扛得住（issue 37 的每一条各有一个测试；旧的 serve.py 上每个都红）：
坏输入不掉连接、超时和连接上限、SIGINT / SIGTERM、断开的客户端（流式和不流式）、便宜的长度下界、step() 出错、
top_p / top_k / min_p / logprobs 不再被悄悄忽略、不支持的字段只收默认值、角色、路由和 keep-alive、英文的错误消息；
还有停止 token 正好是第 max_tokens 个、max_tokens = −1、投机解码给草稿留位置。
服务器都开在 127.0.0.1 的临时端口上（小模型或按剧本出 token 的引擎），超时是毫秒级的构造参数；每个等待都有上限。
"""
import http.client
import json
import re
import socket
import threading
import time

import numpy as np
import pytest

from test_serve import (BS, CFG, MODEL, MSG, NB, PARAMS, TOK, Background, GatedRunner, byte_ids, post, record_releases,
                        early_signal_runs, scripted, selected, serve, signal_runs, start, stream_text, wait_until)
from bpe_lab import BPETokenizer, bytes_to_unicode
from decode_lab import autoregressive_generate
from engine_lab import LLMEngine, ReplayRunner
from transformer_lab import LMConfig

FAST = dict(idle_timeout=0.3, request_timeout=0.3, write_timeout=2.0, poll_s=0.02)


def raw(port, data, timeout=5.0, shut=False):
    """发原始的字节，读到对方关连接或超时 -> (状态码, 解析后的 JSON 体)；一个字节都没回：(None, None)。"""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            try:
                more = s.recv(65536)
            except socket.timeout:
                break
            if not more:
                break
            got += more
            if b"\r\n\r\n" in got:
                head, _, body = got.partition(b"\r\n\r\n")
                m = re.search(rb"Content-Length: (\d+)", head)
                if m and len(body) >= int(m.group(1)):
                    break
    finally:
        s.close()
    if not got:
        return None, None
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body.decode("utf-8"))


def request(port, method, path, body=None, headers=None):
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    h = {"Content-Type": "application/json", "Content-Length": str(len(data))}
    h.update(headers or {})
    lines = [f"{method} {path} HTTP/1.1", "Host: x"] + [f"{k}: {v}" for k, v in h.items()]
    return raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + data)


def is_error_body(b, status=None):
    return isinstance(b, dict) and set(b.get("error", {})) == {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def _shared_server():
    logged = []
    h = start(warn=logged.append, **FAST)
    h.logged = logged
    yield h
    h.close()


def _use(h, capsys):
    """用一个共用的服务器跑一个测试：开始时清空 logged；结束时等到这个测试的连接都关完（连接线程都走完了 finish）、
    引擎里没有请求，再看 stderr：服务器从不打 traceback。"""
    h.logged.clear()
    yield h

    def quiet():
        with h.httpd.conns_lock:
            n = len(h.httpd.conns)
        return n == 0 and h.loop.n_live == 0
    assert wait_until(quiet, 10)
    assert "Traceback" not in capsys.readouterr().err          # 服务器从不打 traceback


@pytest.fixture
def server(_shared_server, capsys):
    """
    本文件里共用的一个服务器（用它的测试只发请求：不改它的设置、不关它；关机本身由自己开服务器的测试核对）。
    省下每个测试开一次、关一次服务器的时间。见 _use。
    """
    yield from _use(_shared_server, capsys)


# 只收超时探针的服务器的超时（秒）：探针等的就是这个超时，短一点测试就短；别的测试用 FAST 的 0.3 s，免得一个
# 慢一点才发完的正常请求被当成超时。探针一次发完它要发的字节，到得早晚和这个超时无关。
PROBE_TIMEOUT = 0.05


@pytest.fixture(scope="module")
def _probe_server():
    logged = []
    h = start(warn=logged.append, **dict(FAST, idle_timeout=PROBE_TIMEOUT, request_timeout=PROBE_TIMEOUT))
    h.logged = logged
    yield h
    h.close()


@pytest.fixture
def probe_server(_probe_server, capsys):
    """超时是 PROBE_TIMEOUT 的共用服务器（同 server，见 _use）。"""
    yield from _use(_probe_server, capsys)


# ---------------------------------------------------------------------------
# 1–4：坏输入决不掉连接
# ---------------------------------------------------------------------------
def test_lone_surrogate_gets_a_400_naming_the_field_not_a_dropped_connection(server):
    """回归：{"content": "a\\ud800b"} 曾经让连接线程抛 UnicodeEncodeError、连接断掉、日志里一个 traceback。"""
    for path, body, param in [("/v1/chat/completions", '{"messages":[{"role":"user","content":"a\\ud800b"}]}',
                               "messages"),
                              ("/v1/completions", '{"prompt":"a\\udc00b"}', "prompt"),
                              ("/v1/completions", '{"prompt":"ab","stop":"\\ud800"}', "stop")]:
        st, b = request(server.port, "POST", path, body.encode())
        assert st == 400 and b["error"]["param"] == param and "surrogate" in b["error"]["message"]


_B2U = bytes_to_unicode()
GAPS = (0x04, 0x06)                                          # SmolLM2 的词表也没有这两个字节的 token
TOK_GAP = BPETokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [_B2U[b] for b in range(256) if b not in GAPS],
                       [], [3, 3, 3] + [1] * 254, eos_id=2)


@pytest.mark.parametrize("ch", ["\u0006", "\u0004"])
def test_bytes_missing_from_the_vocabulary_never_drop_the_connection(capsys, ch):
    """回归：词表里没有单字节 token 的控制字符（SmolLM2 缺 21 个字节值）曾经让分词器抛异常、连接断掉。
    现在 bpe_lab 丢掉这个字节（HF tokenizers 的做法）：两个接口都 200，提示是 "xy" 的 token。"""
    cfg = LMConfig(vocab=len(TOK_GAP), max_seq=64)
    eng = LLMEngine(None, cfg, NB, BS, runner=ReplayRunner({k: [5, 6, 2] for k in range(4)}))
    h = serve.make_server(eng, TOK_GAP, "tiny", **FAST)
    try:
        for path, body, param in [("/v1/completions", {"prompt": f"x{ch}y", "max_tokens": 3}, "prompt"),
                                  ("/v1/chat/completions", {"messages": [{"role": "user", "content": f"x{ch}y"}],
                                                            "max_tokens": 3}, "messages")]:
            st, b = request(h.port, "POST", path, body)
            assert st == 200, b
            want = TOK_GAP.encode("xy") if param == "prompt" else TOK_GAP.chat("xy")
            assert b["usage"]["prompt_tokens"] == len(want)
    finally:
        h.close()
    assert "Traceback" not in capsys.readouterr().err


class PickyTok(BPETokenizer):
    """一个拒收 BEL（0x07）的分词器（旧的 bpe_lab 对词表缺的字节就这样抛 ValueError）。"""

    def encode(self, text, parse_special=True):
        if "\x07" in text:
            raise ValueError("0x07 不在词表里")
        return super().encode(text, parse_special)


def test_a_tokenizer_that_refuses_the_text_gives_a_400_naming_the_field(capsys):
    tok = PickyTok(TOK.tokens, [], TOK.token_types, eos_id=2)
    h = serve.make_server(LLMEngine(PARAMS, CFG, NB, BS), tok, "tiny", **FAST)
    try:
        for path, body, param in [("/v1/completions", {"prompt": "x\x07y"}, "prompt"),
                                  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\x07"}]},
                                   "messages")]:
            st, b = request(h.port, "POST", path, body)
            assert st == 400 and b["error"]["param"] == param and "tokenized" in b["error"]["message"]
    finally:
        h.close()
    assert "Traceback" not in capsys.readouterr().err


def test_deeply_nested_json_is_a_400_not_a_recursion_error(server):
    """回归：100,000 层 [（200 KB 的请求体）让 json.loads 抛 RecursionError、连接断掉。"""
    st, b = request(server.port, "POST", "/v1/completions", b"[" * 100_000 + b"]" * 100_000)
    assert st == 400 and "nested" in b["error"]["message"]


@pytest.mark.parametrize("value", ["\u00b2", "1\u00b2", "-5", "0x10"])
def test_content_length_that_is_not_ascii_digits_is_a_400(server, value):
    """回归："Content-Length: ²"（str.isdigit 认它）让 int() 抛 ValueError、连接断掉。头按 Latin-1 解码（http.client
    的做法），所以 "²" 作为一个字节 0xB2 发出去。"""
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {value}\r\n\r\n".encode("latin-1")
    st, b = raw(server.port, head + b'{"prompt": "q"}', shut=True)
    assert st == 400 and is_error_body(b) and "Content-Length" in b["error"]["message"]


# ---------------------------------------------------------------------------
# 5：超时、连接上限、关机不被客户端拖住
# ---------------------------------------------------------------------------
def test_a_body_that_never_arrives_gets_a_408_within_the_request_timeout(probe_server):
    """回归：Content-Length 100、只发 2 个字节、连接不放：连接线程一直等（没有超时）。"""
    t0 = time.monotonic()
    st, b = raw(probe_server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}",
                timeout=5)
    assert st == 408 and is_error_body(b) and "2 of 100" in b["error"]["message"]
    assert time.monotonic() - t0 < 3


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(probe_server):
    s = socket.create_connection(("127.0.0.1", probe_server.port), timeout=5)
    try:
        t0 = time.monotonic()
        assert s.recv(1) == b""                              # 服务器关了它（idle_timeout = PROBE_TIMEOUT）
        assert time.monotonic() - t0 < 3
    finally:
        s.close()


def test_connections_past_the_limit_get_an_immediate_503():
    h = start(max_connections=2, **dict(FAST, idle_timeout=10))
    idle = [socket.create_connection(("127.0.0.1", h.port), timeout=5) for _ in range(2)]
    try:
        assert wait_until(lambda: len(h.httpd.conns) == 2, 5)
        st, b = request(h.port, "POST", "/v1/completions", {"prompt": "q", "max_tokens": 2})
        assert st == 503 and b["error"]["code"] == "overloaded"
        idle[0].close()
        assert wait_until(lambda: len(h.httpd.conns) == 1, 5)
        assert request(h.port, "POST", "/v1/completions", {"prompt": "q", "max_tokens": 2})[0] == 200
    finally:
        for s in idle:
            s.close()
        h.close()


def test_close_is_prompt_even_with_an_idle_connection_open():
    """回归：一个什么都不发的 TCP 连接让关机等了 20 多秒（连接线程没有超时、关机要 join 它）。"""
    h = start(**dict(FAST, idle_timeout=30, request_timeout=30))
    s = socket.create_connection(("127.0.0.1", h.port), timeout=5)
    try:
        assert wait_until(lambda: len(h.httpd.conns) == 1, 5)
        t = threading.Thread(target=h.close)
        t0 = time.monotonic()
        t.start()
        t.join(10)
        assert not t.is_alive() and time.monotonic() - t0 < 5
    finally:
        s.close()


# ---------------------------------------------------------------------------
# 在后台跑的：断开的两次运行（7）和 SIGINT / SIGTERM 的两个子进程（6，信号测试在文件最后）
# ---------------------------------------------------------------------------
DISCONNECT = "disconnect-run"  # 后台跑断开测试的线程名的开头
_DISCONNECT_BG = []            # 本模块的一个 Background（两种模式的 _disconnect_run），见 disconnect_runs


@pytest.fixture(scope="module", autouse=True)
def _early_background_runs(request):
    """
    模块一开始就在后台开始两件几乎全是等的事，读结果的测试到时候多半不用再等：断开的两次运行（两个服务器，每步
    20 ms，要等到请求跑出 token、断开、中止，约 0.2 s）和信号测试的两个子进程（启动 Python、numpy、各个 lab 要半秒
    多，见 test_serve.early_signal_runs）。信号测试放在文件最后，它前面的测试都和子进程同时跑。断开测试量的是
    "断开到中止"的秒数，和主线程在跑什么无关（上限 0.6 s 是 30 步，实际约 0.1 s）；模块结束时两件都等到跑完。
    """
    if selected(request, {"test_a_client_that_disconnects_is_aborted_promptly_in_both_modes"}) and not _DISCONNECT_BG:
        _DISCONNECT_BG.append(Background(_both_disconnect_runs, DISCONNECT))
    try:
        yield from early_signal_runs(request, {"test_signal_ends_streams_with_an_error_event_and_done_and_exits_"
                                               "promptly"})
    finally:
        for bg in _DISCONNECT_BG:
            bg.thread.join(60)


# ---------------------------------------------------------------------------
# 7：断开的客户端，流式和不流式
# ---------------------------------------------------------------------------
def _disconnect_run(stream):
    """一个客户端发一个 60 个 token 的请求（stream 流式或不流式），读到 5 个 token 后断开 -> 看到的一切（dict）。
    一步 20 ms、poll_s 0.1 s：token 一直来，队列从不空 0.1 s；停止串的开头把流式的文字留着（没有写，写不出错）。"""
    gate = threading.Event()
    gate.set()
    eng = LLMEngine(None, CFG, NB, BS, runner=GatedRunner({0: byte_ids("a" * 60)}, gate, delay=0.02))
    released = record_releases(eng)
    out = {"logged": []}                                   # 服务器的日志行留在这里（后台跑：不写进别的测试的 stderr）
    h = serve.make_server(eng, TOK, "tiny", warn=out["logged"].append, **dict(FAST, poll_s=0.1))
    try:
        s = socket.create_connection(("127.0.0.1", h.port), timeout=10)
        body = json.dumps({"prompt": "q", "max_tokens": 60, "stream": stream, "stop": ["a" * 70]}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
                  + b"\r\n\r\n" + body)
        out["flowing"] = wait_until(lambda: any(len(r.output) >= 5 for r in list(eng.requests)), 10)
        s.close()
        t0 = time.monotonic()
        out["aborted"] = wait_until(lambda: released, 10)
        out["seconds"] = time.monotonic() - t0
        out["released"] = list(released)
        out["clean"] = wait_until(lambda: eng.num_free_blocks == NB and h.loop.n_live == 0)
    finally:
        h.close()
    return out


def _both_disconnect_runs():
    """两种模式的 _disconnect_run 同时跑（各自一个服务器和引擎，时间几乎全是等）-> {stream: 结果}。"""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2, thread_name_prefix=DISCONNECT) as ex:
        return dict(zip((False, True), ex.map(_disconnect_run, (False, True))))


@pytest.fixture(scope="module")
def disconnect_runs():
    """两种模式的断开运行的结果（_early_background_runs 在模块一开始就让它们在后台跑了；没开始就现在跑）。"""
    if not _DISCONNECT_BG:
        _DISCONNECT_BG.append(Background(_both_disconnect_runs, DISCONNECT))
    return _DISCONNECT_BG[0].result(60)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_is_aborted_promptly_in_both_modes(disconnect_runs, stream):
    """回归：不流式的客户端走了，请求照样跑完（50 ms 一步、400 个 token：多跑了 20 s）；流式的也只在 0.5 s 没有新
    token 时才看一眼。这里 token 一直来、流式的文字被一个停止串的开头留着（没有写，写不出错）：两种都要在几步里中止。"""
    r = disconnect_runs[stream]
    assert r["flowing"] and r["aborted"]
    assert r["seconds"] < 0.6                                # 30 步要 0.6 s 以上：几步之内就中止了
    assert r["released"][0][1] == "abort" and r["released"][0][2] < 40
    assert r["clean"]


# ---------------------------------------------------------------------------
# 8：切词之前的便宜下界；切词不在引擎线程里
# ---------------------------------------------------------------------------
class SpyTok(BPETokenizer):
    def encode(self, text, parse_special=True):
        self.calls.append((len(text), threading.current_thread().name))
        return super().encode(text, parse_special)


def test_a_prompt_that_cannot_fit_is_rejected_before_tokenizing_and_never_on_the_engine_thread():
    """回归：~960 KB 的提示要先切 ~2 s 的词才被拒（上下文只有 8192）。现在按字节数的下界先拒，不切词。"""
    tok = SpyTok(TOK.tokens, [], TOK.token_types, eos_id=2)
    tok.calls = []
    h = serve.make_server(LLMEngine(PARAMS, CFG, NB, BS), tok, "tiny", **FAST)
    try:
        long = "w " * 20_000                                   # 40,000 字节，上下文 64
        st, b = request(h.port, "POST", "/v1/completions", {"prompt": long})
        assert st == 400 and b["error"]["param"] == "prompt"
        st, b = request(h.port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})
        assert st == 400 and b["error"]["param"] == "messages"
        assert all(n < 1000 for n, _ in tok.calls)            # 长的那段一次都没切
        assert request(h.port, "POST", "/v1/completions", {"prompt": "short", "max_tokens": 2})[0] == 200
    finally:
        h.close()
    assert tok.calls and all(name != "engine-loop" for _, name in tok.calls)


def test_token_bound_is_a_lower_bound_on_the_real_tokenizer():
    from conftest import real_model_path
    from test_engine_script import gguf_info
    tok = gguf_info(real_model_path(), "tok")                # 会话里只建一次（test_engine_script 也用它）
    tbytes = serve.token_bytes_table(tok)
    ours, theirs = serve.TokenBound(tok, tbytes), serve.TokenBound(tok, tbytes)
    ours.min_tokens = None                                     # 本模块自己的下界（分词器没有 min_tokens 时用）
    for text in ["hello world", "你好，世界", "<|im_end|>" * 3, "x\u0006y", " " * 50, "abc123" * 40]:
        n = len(tok.encode(text))
        assert 1 <= ours(text) <= n and 1 <= theirs(text) <= n, text


# ---------------------------------------------------------------------------
# 9：step() 里的异常
# ---------------------------------------------------------------------------
class FaultyRunner(ReplayRunner):
    """第 fail_at 次 run 抛 RuntimeError（注入的故障），其余照 ReplayRunner。"""

    def __init__(self, streams, fail_at):
        super().__init__(streams)
        self.n, self.fail_at = 0, fail_at

    def run(self, chunks):
        self.n += 1
        if self.n == self.fail_at:
            raise RuntimeError("injected fault")
        time.sleep(0.005)
        return super().run(chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_an_exception_in_step_fails_that_request_and_the_server_keeps_serving(capsys, stream):
    """回归：step() 里的一个异常杀掉引擎线程，之后每个请求都挂住或 503。"""
    eng = LLMEngine(None, CFG, NB, BS, runner=FaultyRunner({0: byte_ids("abcdefgh"), 1: byte_ids("fine")}, 3))
    logged = []
    h = serve.make_server(eng, TOK, "tiny", warn=logged.append, **FAST)
    try:
        st, b = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 8, "stream": stream})
        if stream:
            assert st == 200 and b[-1]["error"]["type"] == "server_error"    # 错误事件，post 核对了 [DONE]
        else:
            assert st == 500 and b["error"]["type"] == "server_error"
        assert wait_until(lambda: eng.num_free_blocks == NB and h.loop.n_live == 0)
        st, b = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 4})
        assert st == 200 and b["choices"][0]["text"] == "fine"
        assert h.loop.is_alive()
    finally:
        h.close()
    assert any("injected fault" in line for line in logged)
    assert "Traceback" not in capsys.readouterr().err


def test_an_engine_whose_step_raises_is_survived_by_the_loop(capsys):
    """引擎自己没接住的异常（step() 直接抛）：EngineLoop 中止那一步的请求、回 500，接着服务。"""
    eng = scripted([byte_ids("abcdefgh"), byte_ids("fine")])
    step, calls = eng.step, []

    def flaky():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("raised out of step")
        return step()
    eng.step = flaky
    logged = []
    h = serve.make_server(eng, TOK, "tiny", warn=logged.append, **FAST)
    try:
        st, b = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 8})
        assert st == 500 and "RuntimeError" in b["error"]["message"]
        assert wait_until(lambda: eng.num_free_blocks == NB and h.loop.n_live == 0)
        st, b = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 4, "top_k": -1})
        assert st == 200 and b["choices"][0]["text"] == "fine"
    finally:
        h.close()
    assert any("raised out of step" in line for line in logged)
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------
# 10：top_p / top_k / min_p / logprobs 不再被忽略；不支持的字段只收默认值
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_server():
    h = start(**FAST)
    yield h
    h.close()


def greedy(prompt, n):
    return autoregressive_generate(MODEL, prompt, n, 0.0, np.random.default_rng(0), stop=[0, 2])


@pytest.fixture(scope="module")
def filter_baseline(model_server):
    """三个过滤器共用的对照（和过滤器无关，算一次）：贪心的回答，和不加过滤器时 T = 1、种子 0、1 的两个回答。"""
    want = b"".join(bytes([i - 3]) for i in greedy(TOK.encode("filters"), 12) if i >= 3).decode("utf-8", "replace")
    free = [post(model_server, "/v1/completions", {"prompt": "filters", "max_tokens": 12, "temperature": 1.0,
                                                   "seed": s})[1]["choices"][0]["text"] for s in range(2)]
    return want, free


@pytest.mark.parametrize("knob", [{"top_k": 1}, {"top_p": 1e-9}, {"min_p": 1.0}])
def test_sampling_filters_reach_the_engine(model_server, filter_baseline, knob):
    """T = 1 时 top_k = 1、极小的 top_p、min_p = 1 都只剩最大的那个 token：回答 == 贪心的（旧的服务器忽略它们）。"""
    want, free = filter_baseline
    assert want not in free                                  # 不加过滤器时 T = 1 的回答不是贪心的（这个测试才有用）
    for seed in range(2):
        st, b = post(model_server, "/v1/completions", dict(knob, prompt="filters", max_tokens=12, temperature=1.0,
                                                            seed=seed))
        assert st == 200 and b["choices"][0]["text"] == want


def log_softmax_rows(prompt, out):
    """独立的神谕：整段（提示 + 输出）一次前向，每个输出位置的 log-softmax（float64）。"""
    logits = MODEL.full_logits(np.array([list(prompt) + list(out)]))[0].astype(np.float64)
    rows = logits[len(prompt) - 1:len(prompt) - 1 + len(out)]
    m = rows.max(axis=1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=1, keepdims=True))


def id_of(entry):
    """一项 logprobs（token 的字符串和字节）-> id：特殊 token 按名字，其余是单字节 token 3 + 字节。"""
    return TOK.tokens.index(entry["token"]) if entry["token"] in TOK.tokens[:3] else 3 + entry["bytes"][0]


def tok_str(i):
    return bytes([i - 3]).decode("utf-8", "replace") if i >= 3 else TOK.tokens[i]


def test_chat_logprobs_have_the_openai_shape_and_the_raw_log_softmax(model_server):
    body = {"messages": [{"role": "user", "content": "lp"}], "max_tokens": 6, "temperature": 0.7, "seed": 3,
            "logprobs": True, "top_logprobs": 3, "ignore_eos": True}
    st, one = post(model_server, "/v1/chat/completions", body)
    st2, chunks = post(model_server, "/v1/chat/completions", dict(body, stream=True))
    assert st == st2 == 200
    content = one["choices"][0]["logprobs"]["content"]
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content and len(content) == 6
    out = [None] * 6
    for k, e in enumerate(content):
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 3
        assert all(set(t) == {"token", "logprob", "bytes"} for t in e["top_logprobs"])
        out[k] = id_of(e)
        assert e["token"] == tok_str(out[k])
    lsm = log_softmax_rows(TOK.chat("lp"), out)
    for k, e in enumerate(content):
        assert abs(e["logprob"] - lsm[k, out[k]]) < 1e-9     # float64：只差求和的舍入
        order = np.argsort(-lsm[k], kind="stable")[:3]
        assert [id_of(t) for t in e["top_logprobs"]] == [int(i) for i in order]
        assert [t["logprob"] for t in e["top_logprobs"]] == pytest.approx(lsm[k, order], abs=1e-9)


def test_completion_logprobs_have_the_legacy_shape(model_server):
    body = {"prompt": "lp", "max_tokens": 5, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    st, one = post(model_server, "/v1/completions", body)
    assert st == 200
    lp, text = one["choices"][0]["logprobs"], one["choices"][0]["text"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    out = [int(i) for i in greedy(TOK.encode("lp"), 5)]
    assert lp["tokens"] == [tok_str(i) for i in out]
    lsm = log_softmax_rows(TOK.encode("lp"), out)
    assert lp["token_logprobs"] == pytest.approx([lsm[k, t] for k, t in enumerate(out)], abs=1e-9)
    assert all(len(d) == 2 and max(d.values()) == pytest.approx(lsm[k].max(), abs=1e-9)   # 贪心：抽中的就是最大的
               for k, d in enumerate(lp["top_logprobs"]))
    assert lp["text_offset"][0] == 0 and all(a <= b for a, b in zip(lp["text_offset"], lp["text_offset"][1:]))
    assert lp["text_offset"][-1] <= len(text)
    _, chunks = post(model_server, "/v1/completions", dict(body, stream=True))
    joined = {k: [x for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                  for x in c["choices"][0]["logprobs"][k]] for k in lp}
    assert joined == lp


UNSUPPORTED_BAD = [("n", 2), ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
                   ("response_format", {"type": "json_object"}), ("logit_bias", {"5": 10}),
                   ("presence_penalty", 0.5), ("frequency_penalty", -1), ("best_of", 3), ("echo", True),
                   ("suffix", "end"), ("repetition_penalty", 1.2), ("n", True)]
UNSUPPORTED_DEFAULT = {"n": 1, "tools": None, "tool_choice": None, "response_format": {"type": "text"},
                       "logit_bias": None, "presence_penalty": 0, "frequency_penalty": 0.0, "best_of": 1,
                       "echo": False, "suffix": None, "user": "someone"}


@pytest.mark.parametrize("field,value", UNSUPPORTED_BAD, ids=[f"{f}={v!r}"[:30] for f, v in UNSUPPORTED_BAD])
def test_unsupported_fields_other_than_their_default_are_a_400_naming_the_field(model_server, field, value):
    path = "/v1/completions" if field in ("best_of", "echo", "suffix") else "/v1/chat/completions"
    base = {"prompt": "q"} if path == "/v1/completions" else {"messages": MSG}
    st, b = post(model_server, path, dict(base, max_tokens=2, **{field: value}))
    assert st == 400 and b["error"]["param"] == field and "not supported" in b["error"]["message"]


def test_default_values_of_unsupported_fields_are_accepted_and_unknown_fields_are_logged(server):
    st, _ = post(server, "/v1/completions", dict(UNSUPPORTED_DEFAULT, prompt="q", max_tokens=2))
    assert st == 200
    st, _ = post(server, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2, "my_knob": 1, "zzz": None})
    assert st == 200
    assert any("my_knob" in line and "zzz" in line and "ignored" in line for line in server.logged)


BAD_SAMPLING = [("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("top_k", 1.5), ("min_p", -0.1), ("min_p", 2),
                ("top_logprobs", 21), ("logprobs", 3)]


@pytest.mark.parametrize("field,value", BAD_SAMPLING, ids=[f"{f}={v}" for f, v in BAD_SAMPLING])
def test_sampling_and_logprobs_ranges_are_checked(server, field, value):
    body = {"messages": MSG, "max_tokens": 2, field: value}
    if field == "top_logprobs":
        body["logprobs"] = True
    st, b = post(server, "/v1/chat/completions", body)
    assert st == 400 and b["error"]["param"] == field


# ---------------------------------------------------------------------------
# 11：角色
# ---------------------------------------------------------------------------
def test_developer_is_system_assistant_content_may_be_null_and_tool_is_refused(server):
    dev = serve.chat_prompt_ids(TOK, [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "x"}])
    assert dev == TOK.chat("x", system="be brief")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}, {"role": "user", "content": "b"}]
    assert post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})[0] == 200
    st, b = post(server, "/v1/chat/completions", {"messages": MSG + [{"role": "tool", "content": "42",
                                                                      "tool_call_id": "c1"}], "max_tokens": 2})
    assert st == 400 and b["error"]["param"] == "messages" and "tool calling" in b["error"]["message"]


# ---------------------------------------------------------------------------
# 12：路由、方法、JSON 的错误体、keep-alive
# ---------------------------------------------------------------------------
def test_routes_query_strings_and_wrong_methods_all_answer_json(server):
    p = server.port
    st, b = request(p, "GET", "/v1/models/tiny")
    assert st == 200 and b["id"] == "tiny" and b["object"] == "model"
    st, b = request(p, "GET", "/v1/models/other")
    assert st == 404 and b["error"]["code"] == "model_not_found"
    assert request(p, "GET", "/v1/models?limit=3")[0] == 200
    assert request(p, "POST", "/v1/completions?x=1", {"prompt": "q", "max_tokens": 2})[0] == 200
    for method, path, status in [("GET", "/v1/chat/completions", 405), ("PUT", "/v1/models", 405),
                                 ("DELETE", "/v1/completions", 405), ("POST", "/health", 405),
                                 ("PATCH", "/nowhere", 404), ("BREW", "/v1/models", 405)]:
        st, b = request(p, method, path, {"prompt": "q"})       # 带一个请求体：读掉它，立刻回答
        assert st == status and is_error_body(b), (method, path)


def test_a_bad_request_line_gets_a_json_body_not_the_stdlib_html_page(server):
    st, b = raw(server.port, b"GARBAGE\r\n\r\n")
    assert st == 400 and is_error_body(b)
    st, b = raw(server.port, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")
    assert st == 414 and is_error_body(b)


def test_an_http_1_0_client_gets_its_stream_unchunked_then_the_connection_closes(server):
    body = json.dumps({"prompt": "q", "max_tokens": 3, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while True:
            more = s.recv(65536)
            if not more:
                break
            got += more
    finally:
        s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and rest.startswith(b"data: {") and rest.endswith(b"data: [DONE]\n\n")


def test_a_client_reuses_one_connection_for_plain_and_streamed_requests(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        socks = []
        for body in [{"prompt": "q", "max_tokens": 3}, {"prompt": "q", "max_tokens": 3, "stream": True},
                     {"prompt": "q", "max_tokens": 3}]:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read().decode()
            assert r.status == 200 and (data.endswith("data: [DONE]\n\n") if body.get("stream") else json.loads(data))
            socks.append(conn.sock)
        assert socks[0] is not None and all(s is socks[0] for s in socks)
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# 13：英文的错误消息
# ---------------------------------------------------------------------------
ENGLISH_CASES = [("/v1/chat/completions", {"messages": "hi"}), ("/v1/completions", {"prompt": 5}),
                 ("/v1/chat/completions", {"messages": MSG, "max_tokens": 0}),
                 ("/v1/chat/completions", {"messages": MSG, "temperature": 9}),
                 ("/v1/chat/completions", {"messages": MSG, "model": "gpt-4"}),
                 ("/v1/chat/completions", {"messages": MSG, "stop": 3}),
                 ("/v1/completions", {"prompt": "x" * 70})]


def test_every_error_message_starts_with_an_english_sentence(server):
    for path, body in ENGLISH_CASES:
        _, b = post(server, path, body)
        english = b["error"]["message"].split(" / ")[0]
        assert english.isascii() and len(re.findall(r"[a-z]{2,}", english)) >= 4, b["error"]["message"]


# ---------------------------------------------------------------------------
# issue 35 的 26、27：停止 token 正好是第 max_tokens 个；max_tokens = −1
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("engine_says", ["stop", "length"])
def test_a_stop_token_that_is_the_last_allowed_token_is_not_in_the_text(stream, engine_says):
    """回归：stop_token_ids 是 " "、max_tokens 6（"hello " 的第 6 个 token 是空格）：曾经回 'hello ' / length。
    引擎报告 "stop"（scheduler_lab 先查停止 token）或 "length"（旧的调度器先查长度）时，服务器都不把它放进文字。"""
    ids = byte_ids("hello world")
    eng = scripted([ids])
    if engine_says == "length":
        step = eng.step
        eng.step = lambda: [(r, t, "length" if why == "stop" and len(eng.requests[r].output) == 6 else why)
                            for r, t, why in step()]
    h = start(eng, **FAST)
    try:
        st, b = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 6, "stream": stream,
                                            "stop_token_ids": [byte_ids(" ")[0]]})
    finally:
        h.close()
    assert st == 200
    if stream:
        text, finish = stream_text(b, False)[1], [c for c in b if c["choices"]][-1]["choices"][0]["finish_reason"]
    else:
        text, finish = b["choices"][0]["text"], b["choices"][0]["finish_reason"]
    assert (text, finish) == ("hello", "stop")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
def test_negative_max_tokens_is_a_400_before_any_stream_starts(server, stream, name):
    path = "/v1/chat/completions" if name == "max_completion_tokens" else "/v1/completions"
    base = {"messages": MSG} if name == "max_completion_tokens" else {"prompt": "q"}
    st, b = post(server, path, dict(base, stream=stream, **{name: -1}))
    assert st == 400 and b["error"]["param"] == name and name in b["error"]["message"]


def test_a_request_the_engine_refuses_is_a_400_even_when_streaming(capsys):
    """引擎的最后一道检查（这里：replay 引擎不给 logprobs）在发响应头之前：400，不是一个带错误事件的 200 流。"""
    h = start(scripted([byte_ids("x")]), **FAST)
    try:
        st, b = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 2, "stream": True, "logprobs": 1})
    finally:
        h.close()
    assert st == 400 and b["error"]["type"] == "invalid_request_error"
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------
# 投机解码：--speculative-config，请求的检查给 γ 个草稿位置留地方
# ---------------------------------------------------------------------------
def test_speculative_server_reserves_room_for_the_drafts():
    """回归：检查没留 γ 个草稿位置：上下文边上的请求（max_tokens 不给 = 剩下的全部）过了检查，又被引擎拒掉。"""
    eng = LLMEngine(PARAMS, CFG, NB, BS, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    h = serve.make_server(eng, TOK, "tiny", **FAST)
    try:
        prompt = "ab" * 25                                     # 50 个 token，上下文 64：最多生成 64 − 50 + 1 − 3 = 12 个
        st, b = post(h, "/v1/completions", {"prompt": prompt, "temperature": 0, "ignore_eos": True})
        assert st == 200 and b["usage"]["completion_tokens"] == 12
        st, b = post(h, "/v1/completions", {"prompt": prompt, "max_tokens": 13})
        assert st == 400 and b["error"]["param"] == "max_tokens" and "draft" in b["error"]["message"]
    finally:
        h.close()


def test_speculative_config_from_the_command_line_takes_vllms_spelling():
    d, note = serve.speculative_config_from_cli(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}')
    assert d == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert "prompt_lookup_min" in note
    assert serve.speculative_config_from_cli('{"method": "ngram", "num_speculative_tokens": 2}') == (
        {"method": "ngram", "num_speculative_tokens": 2}, None)
    for bad in ['{"method": "eagle"}', "[1]", "{",
                '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 3}']:
        with pytest.raises(ValueError):
            serve.speculative_config_from_cli(bad)


# ---------------------------------------------------------------------------
# 6：SIGINT / SIGTERM（放在最后：两个子进程从模块一开始就在后台跑，见 _early_background_runs）
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_ends_streams_with_an_error_event_and_done_and_exits_promptly(sig):
    """回归：SIGTERM 直接杀掉进程，流没有错误事件、没有 [DONE]；SIGINT 时一个空闲的 TCP 连接让进程多活了 20 多秒。
    现在两个信号一样：在跑的流收到错误事件和 [DONE]，空闲的连接被关掉，退出码 0，没有 traceback。
    子进程（python3 serve.py 的 main，小引擎一步 50 ms）由 test_serve.signal_runs 在后台起：两个信号的两个子进程同时跑，
    test_serve 的 Ctrl-C 测试读同一次运行；流出了第一个字才发信号（post_stream 边读边看）。"""
    r = signal_runs()[sig]
    assert r["rc"] == 0 and "停下" in r["err"] and "Traceback" not in r["err"]
    assert r["elapsed"] < 5
    status, chunks = r["stream"]                             # post_stream 核对了流以 data: [DONE] 结尾
    assert status == 200 and chunks[-1]["error"]["type"] == "server_error"
    assert any(c.get("choices") and c["choices"][0]["text"] for c in chunks[:-1])

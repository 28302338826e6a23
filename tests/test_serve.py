"""
lecture05/serve.py（OpenAI 兼容的服务器）：在 127.0.0.1 的临时端口上开，小的随机模型（float64）或按剧本出 token 的
"模型"（测 UTF-8：随机模型吐的字节多半不是合法的 UTF-8）。

- 神谕：几个客户端（线程）同时发，流式和不流式：每个回答的文字 == 单独生成（decode_lab.autoregressive_generate、同一个种子）
  的 token 按字节一次解码；流式的块拼起来 == 同一段文字；usage 的数对；
- 汉字切在几个 token 里：流里没有 U+FFFD；结束时不完整的字节：一个 U+FFFD，流式和不流式一样；停止串不进文字、不提前漏出；
- 坏输入：状态码和点名字段；客户端中途断开：请求中止、块全回块池；超过排队上限：503，其余照常；关机后没有线程剩下；
- 真实模型一次（SmolLM2，float32：serve.py 默认的 dtype）。
每个等待都有次数和时间的上限。
"""
import atexit
import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest

from conftest import ROOT, load_script
from smollm2_models import new_token_logits, smollm2_lm
from bpe_lab import BPETokenizer, bytes_to_unicode
from decode_lab import TransformerLM, autoregressive_generate
from engine_lab import LLMEngine, ReplayRunner
from transformer_lab import LMConfig, init_params

serve = load_script("lecture05/serve.py")

_B2U = bytes_to_unicode()
# 小分词器：三个特殊 token + 256 个单字节 token（没有 merge）：每个字节一个 token，汉字一定切在 3 个 token 里
TOK = BPETokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [_B2U[b] for b in range(256)], [],
                   [3, 3, 3] + [1] * 256, eos_id=2)
CFG = LMConfig(vocab=len(TOK), max_seq=64)
PARAMS = init_params(CFG, 3)
MODEL = TransformerLM(PARAMS, CFG)
NB, BS = 12, 16


def byte_ids(text):
    return [3 + b for b in text.encode("utf-8")]


def start(engine=None, **kw):
    engine = engine or LLMEngine(PARAMS, CFG, NB, BS, max_num_batched_tokens=32, max_num_seqs=4)
    return serve.make_server(engine, TOK, "tiny", **kw)


def post(h, path, body, raw=None, timeout=20):
    """-> (状态码, 解析后的 JSON 或 SSE 的 data 列表)。"""
    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=timeout)
    try:
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode("utf-8")
    finally:
        conn.close()
    if r.getheader("Content-Type", "").startswith("text/event-stream"):
        events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and text.endswith("data: [DONE]\n\n")
        return r.status, [json.loads(e) for e in events[:-1]]
    return r.status, json.loads(text)


def stream_text(chunks, chat):
    pieces = [c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"]
              for c in chunks if c["choices"]]
    return pieces, "".join(pieces)


def oracle_text(out_ids, stop_ids=(0, 2)):
    """单独生成的 token -> 文字：去掉结尾的停止 token，剩下的字节（特殊 token 不算）一次按 UTF-8 解码（坏字节换成 U+FFFD）。"""
    ids = list(out_ids)
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return b"".join(bytes([i - 3]) for i in ids if i >= 3).decode("utf-8", "replace")


def wait_until(cond, seconds=10.0):
    """cond() 成真 -> True；seconds 秒后还不成真 -> False。先密后疏地看：间隔 1 ms 起、每次翻倍、最多 10 ms
    （多半几毫秒内就成真的条件——连接线程走完、引擎放掉块——不必每次多等一个 10 ms 的间隔）。"""
    t, pause = time.monotonic() + seconds, 0.001
    while time.monotonic() < t:
        if cond():
            return True
        time.sleep(pause)
        pause = min(2 * pause, 0.01)
    return cond()


@pytest.fixture
def server():
    h = start()
    yield h
    h.close()


@pytest.fixture(scope="module")
def shared_server():
    """本文件里只发会被拒绝（或只读）的请求的测试共用的一个服务器：那些请求到不了引擎，开一个新的和共用一个
    回答一样；省下每个测试关一次服务器的时间（关机要等 serve_forever 的一次轮询）。"""
    h = start()
    yield h
    h.close()


# ---------------------------------------------------------------------------
# 神谕
# ---------------------------------------------------------------------------
def test_chat_prompt_equals_bpe_lab_chat_for_one_user_turn():
    ids = serve.chat_prompt_ids(TOK, [{"role": "user", "content": "hi there"}])
    assert ids == TOK.chat("hi there")
    two = serve.chat_prompt_ids(TOK, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}])
    assert two == TOK.chat("x", system="be brief")


def test_concurrent_clients_get_the_solo_generation_text_streamed_or_not(server):
    """6 个线程同时发（流式 / 不流式、chat / completions、T = 0 / 1）：文字 == 单独生成的，usage 对。"""
    cases = []
    for i in range(6):
        chat, stream, T = i % 2 == 0, i % 3 != 0, [0.0, 1.0][i // 3]
        content = f"req {i}: " + "ab" * i
        body = {"max_tokens": 10 + i, "temperature": T, "seed": 100 + i, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if chat:
            body["messages"] = [{"role": "user", "content": content}]
            prompt = TOK.chat(content)
        else:
            body["prompt"] = content
            prompt = TOK.encode(content)
        cases.append((chat, stream, body, prompt, T))
    results = [None] * len(cases)

    def go(k):
        chat, stream, body, _, _ = cases[k]
        results[k] = post(server, "/v1/chat/completions" if chat else "/v1/completions", body)
    threads = [threading.Thread(target=go, args=(k,)) for k in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for (chat, stream, body, prompt, T), (status, resp) in zip(cases, results):
        assert status == 200
        want_ids = autoregressive_generate(MODEL, prompt, body["max_tokens"], T, np.random.default_rng(body["seed"]),
                                           stop=[0, 2])
        want = oracle_text(want_ids)
        if stream:
            _, got = stream_text(resp, chat)
            usage, finish = resp[-1]["usage"], [c for c in resp if c["choices"]][-1]["choices"][0]["finish_reason"]
            assert all(c["usage"] is None for c in resp[:-1])
        else:
            ch = resp["choices"][0]
            got, usage, finish = (ch["message"]["content"] if chat else ch["text"]), resp["usage"], ch["finish_reason"]
        assert got == want
        assert usage == {"prompt_tokens": len(prompt), "completion_tokens": len(want_ids),
                         "total_tokens": len(prompt) + len(want_ids)}
        assert finish == ("stop" if want_ids[-1] in (0, 2) else "length")
    assert wait_until(lambda: server.loop.engine.num_free_blocks == NB)


def test_streamed_chunks_join_to_the_non_streamed_text(server):
    for seed in range(3):
        body = {"prompt": "xyz", "max_tokens": 30, "temperature": 1.0, "seed": seed, "ignore_eos": True}
        _, one = post(server, "/v1/completions", body)
        _, chunks = post(server, "/v1/completions", dict(body, stream=True))
        assert stream_text(chunks, False)[1] == one["choices"][0]["text"]
        assert one["usage"]["completion_tokens"] == 30 and one["choices"][0]["finish_reason"] == "length"


# ---------------------------------------------------------------------------
# 按剧本出 token：UTF-8 与停止串
# ---------------------------------------------------------------------------
def scripted(streams):
    """一个引擎，第 k 个请求按 streams[k] 出 token（ReplayRunner）。"""
    return LLMEngine(None, CFG, NB, BS, runner=ReplayRunner(dict(enumerate(streams))))


def test_cjk_split_across_tokens_streams_without_replacement_characters():
    text = "你好，世界 ok"
    ids = byte_ids(text) + [2]
    h = start(scripted([ids, ids]))
    try:
        _, chunks = post(h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}], "stream": True,
                                                      "max_tokens": 40})
        pieces, joined = stream_text(chunks, True)
        _, one = post(h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}], "max_tokens": 40})
    finally:
        h.close()
    assert joined == text == one["choices"][0]["message"]["content"]
    assert all("\ufffd" not in p for p in pieces)
    assert "你" in pieces and "好" in pieces          # 每个汉字凑齐 3 个字节时才发，而且一凑齐就发


def test_incomplete_bytes_at_the_end_become_one_replacement_character_in_both_modes():
    ids = byte_ids("ok 你")[:-1]                      # 最后一个汉字少一个字节，然后到了 max_tokens
    h = start(scripted([ids, ids]))
    try:
        _, chunks = post(h, "/v1/completions", {"prompt": "q", "max_tokens": len(ids), "stream": True})
        _, one = post(h, "/v1/completions", {"prompt": "q", "max_tokens": len(ids)})
    finally:
        h.close()
    assert stream_text(chunks, False)[1] == one["choices"][0]["text"] == "ok \ufffd"
    assert one["choices"][0]["finish_reason"] == "length"


def test_stop_string_is_cut_out_never_leaks_and_counts_tokens_to_its_end():
    text = "abc STOP and more"
    ids = byte_ids(text)
    h = start(scripted([ids, ids]))
    try:
        body = {"prompt": "q", "max_tokens": len(ids), "stop": ["STOP", "zzz"], "stream": True,
                "stream_options": {"include_usage": True}}
        _, chunks = post(h, "/v1/completions", body)
        _, one = post(h, "/v1/completions", dict(body, stream=False, stream_options=None))
        assert wait_until(lambda: h.loop.engine.num_free_blocks == NB and not h.loop.engine.has_unfinished_requests())
    finally:
        h.close()
    pieces, joined = stream_text(chunks, False)
    assert joined == one["choices"][0]["text"] == "abc "
    assert not any("S" in p for p in pieces)             # "S"、"ST"、"STO" 都可能是停止串的开头：先留着
    assert one["choices"][0]["finish_reason"] == "stop"
    n = len("abc STOP")                                  # 凑齐停止串的那个 token 是第 8 个
    assert one["usage"]["completion_tokens"] == n == chunks[-1]["usage"]["completion_tokens"]


def test_stop_token_ids_end_generation_and_are_not_in_the_text():
    ids = byte_ids("hello world")
    h = start(scripted([ids]))
    try:
        _, one = post(h, "/v1/completions", {"prompt": "q", "max_tokens": len(ids),
                                             "stop_token_ids": [byte_ids(" ")[0]]})
    finally:
        h.close()
    assert one["choices"][0]["text"] == "hello" and one["choices"][0]["finish_reason"] == "stop"
    assert one["usage"]["completion_tokens"] == 6


# ---------------------------------------------------------------------------
# 坏输入
# ---------------------------------------------------------------------------
MSG = [{"role": "user", "content": "hi"}]
BAD = [
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x" * 70}, 400, "prompt"),               # 超过上下文 64
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 60}, 400, "max_tokens"),   # 过了上下文
    ("/v1/chat/completions", {"messages": MSG, "temperature": -0.5}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": MSG, "seed": -1}, 400, "seed"),
    ("/v1/chat/completions", {"messages": MSG, "stop": 3}, 400, "stop"),
    ("/v1/chat/completions", {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/chat/completions", {"messages": MSG, "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("/v1/chat/completions", {"messages": MSG, "stream": "yes"}, 400, "stream"),
    ("/v1/chat/completions", {"messages": MSG, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/chat/completions", {"messages": MSG, "n": 2}, 400, "n"),
    ("/v1/chat/completions", {"messages": MSG, "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"messages": MSG, "model": 7}, 400, "model"),
]


@pytest.mark.parametrize("path,body,status,param", BAD, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_gets_its_status_and_names_the_field(shared_server, path, body, status, param):
    got, resp = post(shared_server, path, body)
    assert got == status
    err = resp["error"]
    assert err["param"] == param and param in err["message"]
    assert set(err) == {"message", "type", "param", "code"}


def test_malformed_json_unknown_path_and_oversized_body(shared_server):
    got, resp = post(shared_server, "/v1/completions", None, raw=b"{not json")
    assert got == 400 and "JSON" in resp["error"]["message"]
    got, resp = post(shared_server, "/v1/nothing", {"prompt": "x"})
    assert got == 404
    h = start(max_body=100)
    try:
        got, resp = post(h, "/v1/completions", {"prompt": "x" * 200})
        assert got == 413 and "100" in resp["error"]["message"]
        got, _ = post(h, "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert got == 200
    finally:
        h.close()


def test_prompt_larger_than_the_kv_pool_is_400():
    cfg = LMConfig(vocab=len(TOK), max_seq=64)
    eng = LLMEngine(PARAMS, cfg, 5, BS)                  # 80 个槽 ≥ 上下文 64；提示 + max_tokens 装得下
    h = serve.make_server(eng, TOK, "tiny")
    try:
        got, resp = post(h, "/v1/completions", {"prompt": "x" * 60, "max_tokens": 5})
        assert got == 200
    finally:
        h.close()
    with pytest.raises(serve.ApiError) as e:              # 块池只有 2 块（32 个槽）的引擎：同一个请求放不进
        serve.parse_request({"prompt": "x" * 40, "max_tokens": 1}, False, TOK, cfg, 2, BS, "tiny")
    assert e.value.status == 400 and e.value.param == "prompt" and "块池" in e.value.message


def test_models_and_health(shared_server):
    conn = http.client.HTTPConnection("127.0.0.1", shared_server.port, timeout=10)
    conn.request("GET", "/v1/models")
    models = json.loads(conn.getresponse().read())
    conn.close()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    conn = http.client.HTTPConnection("127.0.0.1", shared_server.port, timeout=10)
    conn.request("GET", "/health")
    assert json.loads(conn.getresponse().read()) == {"status": "ok"}
    conn.close()


# ---------------------------------------------------------------------------
# 断开、排队上限、关机
# ---------------------------------------------------------------------------
class GatedRunner(ReplayRunner):
    """每一步等一下 gate（测试放行之前，请求一直在跑）；出 token 的规则同 ReplayRunner。"""

    def __init__(self, streams, gate, delay=0.0):
        super().__init__(streams)
        self.gate, self.delay = gate, delay

    def run(self, chunks):
        self.gate.wait(20)
        time.sleep(self.delay)
        return super().run(chunks)


def record_releases(eng):
    """让 eng.release 先记下 (id, finish_reason, 生成了几个 token) 再放掉 -> 记录的 list。"""
    got, release = [], eng.release

    def rec(rid):
        r = eng.requests[rid]
        got.append((rid, r.finish_reason, len(r.output)))
        release(rid)
    eng.release = rec
    return got


def test_engine_loop_gets_an_abort_from_step_and_releases_every_finished_request():
    """回归：EngineLoop 曾经自己收尾中止（引擎不报告最后一个请求的中止），结束了的请求只把 token 清空、留在
    engine.requests 里，还自己剪 engine.steps。现在中止由 step() 报告，每个结束了的请求都 release。"""
    gate = threading.Event()
    gate.set()
    eng = LLMEngine(None, CFG, NB, BS, runner=GatedRunner({0: byte_ids("b" * 60), 1: byte_ids("ok")}, gate,
                                                          delay=0.01))
    stepped = []
    step = eng.step
    eng.step = lambda: stepped.append(step()) or stepped[-1]
    loop = serve.EngineLoop(eng)
    loop.start()
    try:
        job = serve.Job(serve.GenRequest(prompt_ids=[5], max_tokens=60, temperature=0.0, seed=0, stop_ids=[]))
        loop.submit(job)
        assert job.events.get(timeout=10).tokens == [byte_ids("b")[0]]
        loop.abort(job)
        evs = []
        while not evs or evs[-1].reason is None:
            evs.append(job.events.get(timeout=10))
        assert (evs[-1].tokens, evs[-1].reason) == ([], "abort")
        assert any((0, [], "abort") in out for out in stepped)          # 来自 step()，不是 EngineLoop 自己
        done = serve.Job(serve.GenRequest(prompt_ids=[5], max_tokens=2, temperature=0.0, seed=0, stop_ids=[]))
        loop.submit(done)
        while done.events.get(timeout=10).reason is None:
            pass
        assert wait_until(lambda: loop.n_live == 0)
        assert len(eng.requests) == 0 and eng.num_free_blocks == NB    # 两个都 release 了
    finally:
        loop.stop()
    assert not loop.is_alive()


def test_load_server_bounds_the_step_history(monkeypatch):
    import real_model_lab
    monkeypatch.setattr(real_model_lab, "load_gguf", lambda dtype=None: (PARAMS, CFG, TOK))
    h = serve.load_server(num_blocks=NB)
    try:
        assert h.loop.engine.steps.maxlen == serve.STEP_HISTORY
        assert post(h, "/v1/completions", {"prompt": "q", "max_tokens": 3})[0] == 200
        assert wait_until(lambda: len(h.loop.engine.requests) == 0)
    finally:
        h.close()


def test_client_disconnect_mid_stream_aborts_and_frees_every_block():
    gate = threading.Event()
    gate.set()
    eng = LLMEngine(None, CFG, NB, BS, runner=GatedRunner({0: byte_ids("a" * 60)}, gate, delay=0.01))
    released = record_releases(eng)
    h = serve.make_server(eng, TOK, "tiny")
    try:
        s = socket.create_connection(("127.0.0.1", h.port), timeout=10)
        body = json.dumps({"prompt": "q", "max_tokens": 60, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b'"text": "a' not in got:                  # 读到第一块文字
            more = s.recv(4096)
            assert more
            got += more
        s.close()
        assert wait_until(lambda: not eng.has_unfinished_requests() and eng.num_free_blocks == NB)
        assert wait_until(lambda: h.loop.n_live == 0)
        assert [(rid, why) for rid, why, _ in released] == [(0, "abort")]
        assert released[0][2] < 60                              # 没跑完就中止了
    finally:
        h.close()


def test_burst_past_the_queue_limit_gets_503_and_the_rest_are_served():
    gate = threading.Event()
    streams = {k: byte_ids("fine") for k in range(10)}
    eng = LLMEngine(None, CFG, NB, BS, runner=GatedRunner(streams, gate))
    h = serve.make_server(eng, TOK, "tiny", max_queue=2)
    out = {}

    def go(k):
        out[k] = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 4})
    try:
        first = [threading.Thread(target=go, args=(k,)) for k in range(2)]
        for t in first:
            t.start()
        assert wait_until(lambda: h.loop.n_live == 2)
        burst = [post(h, "/v1/completions", {"prompt": "q", "max_tokens": 4}) for _ in range(3)]
        gate.set()
        for t in first:
            t.join(20)
        after = post(h, "/v1/completions", {"prompt": "q", "max_tokens": 4})
    finally:
        gate.set()
        h.close()
    assert [b[0] for b in burst] == [503] * 3
    assert all(b[1]["error"]["type"] == "server_error" for b in burst)
    assert [out[k][0] for k in range(2)] == [200, 200] and out[0][1]["choices"][0]["text"] == "fine"
    assert after[0] == 200


def test_shutdown_with_a_request_in_flight_leaves_no_thread_running():
    before = set(threading.enumerate())
    gate = threading.Event()
    gate.set()
    eng = LLMEngine(None, CFG, NB, BS, runner=GatedRunner({0: byte_ids("x" * 60)}, gate, delay=0.05))  # ≥ 3 s 才跑完
    h = serve.make_server(eng, TOK, "tiny")
    res = {}
    t = threading.Thread(target=lambda: res.update(r=post(h, "/v1/completions", {"prompt": "q", "max_tokens": 60,
                                                                                  "stream": True})))
    t.start()
    assert wait_until(lambda: h.loop.n_live == 1)
    h.close()
    t.join(20)
    assert not t.is_alive()
    status, chunks = res["r"]
    assert status == 200 and chunks[-1]["error"]["type"] == "server_error"     # 流里最后是一个错误事件
    others = lambda: {th for th in threading.enumerate() if not th.name.startswith(HARNESS)}  # noqa: E731
    assert wait_until(lambda: others() <= before, 5)        # 不数后台跑信号测试的线程：它们不是这个服务器的
    assert eng.num_free_blocks == NB


# ---------------------------------------------------------------------------
# 真实模型一次
# ---------------------------------------------------------------------------
def test_smollm2_answers_like_the_offline_engine():
    """
    SmolLM2（float32，serve.py 默认的 dtype；30 层：要答得出 Paris）经服务器、T = 0、流式：文字 == 贪心的 token
    （停在第一个 <|im_end|>）按字节解码。贪心的定义逐位核对：服务器生成的每个 token 都是它的前缀上模型的 argmax——
    提示 + 输出整段一次前向（不再一步一步 decode 出参考序列）。两条前向（服务器的增量 decode、这里的整段）只差
    float32 的舍入：粗估按线性累加，30 层 × 每个点积 576 项 × 2^-24 × |logit| ≤ 35 ≈ 0.04；所以还断言每个位置
    第一名比第二名高出 0.1 以上（并列不会因为走哪条路而翻转），且 |logit| ≤ 35。
    """
    model, cfg, tok = smollm2_lm("float32")              # 会话共用的 float32 模型（tests/smollm2_models.py）
    eng = LLMEngine(model, cfg, 2 * (cfg.max_seq // BS), BS)
    outs, release = {}, eng.release                      # 服务器结束一个请求就 release 它：先记下它的 token

    def keep(rid):
        outs[rid] = [int(t) for t in eng.requests[rid].output]
        release(rid)
    eng.release = keep
    h = serve.make_server(eng, tok, cfg.name)
    try:
        q = "What is the capital of France?"
        got, resp = post(h, "/v1/chat/completions", {"messages": [{"role": "user", "content": q}], "max_tokens": 12,
                                                     "temperature": 0, "stream": True}, timeout=120)
    finally:
        h.close()
    assert got == 200 and list(outs) == [0]
    ids, prompt = outs[0], tok.chat(q)
    logits = new_token_logits(model, prompt, ids)          # 整段一次前向，lm_head 只乘输出的那几个位置
    assert [int(t) for t in logits.argmax(-1)] == ids
    two = np.sort(logits, axis=-1)[:, -2:]
    assert np.all(two[:, 1] - two[:, 0] > 0.1) and np.abs(logits).max() <= 35
    assert tok.im_end_id not in ids[:-1] and (ids[-1] == tok.im_end_id or len(ids) == 12)
    text = stream_text(resp, True)[1]
    assert text == tok.decode(ids[:-1] if ids[-1] == tok.im_end_id else ids)
    assert "Paris" in text


_SIGNAL_CHILD = r"""
import importlib.util, sys, threading
sys.path[:0] = {paths!r}
spec = importlib.util.spec_from_file_location("serve", {path!r})
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)
import bpe_lab
_RANGES = {ranges!r}
bpe_lab._unicode_ranges = lambda: _RANGES            # 父进程算好的字符区间（同一个 Python）：不再扫一遍 Unicode
import test_serve
from engine_lab import LLMEngine
gate = threading.Event(); gate.set()
def fake(host, port, *a, **k):                     # 小模型代替 SmolLM2：每步 50 ms，60 个 token 的请求要跑 3 s
    eng = LLMEngine(None, test_serve.CFG, test_serve.NB, test_serve.BS,
                    runner=test_serve.GatedRunner({{i: test_serve.byte_ids("z" * 60) for i in range(8)}}, gate, 0.05))
    return serve.make_server(eng, test_serve.TOK, "tiny", port=port, idle_timeout=60, request_timeout=60)
serve.load_server = fake
sys.exit(serve.main(["--port", "0"]))
"""


def post_stream(h, path, body, started, timeout=20):
    """同 post（流式），但一边读一边看：第一个带文字的块到了就 started.set()（流真的开始了）。"""
    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.getheader("Content-Type", "").startswith("text/event-stream")
        lines = []
        while True:
            line = r.readline().decode("utf-8")
            if not line:
                break
            lines.append(line)
            if line.startswith("data: {") and any(c["text"] for c in json.loads(line[6:]).get("choices") or []):
                started.set()
    finally:
        conn.close()
    text = "".join(lines)
    events = [line[6:].rstrip("\n") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and text.endswith("data: [DONE]\n\n")
    return r.status, [json.loads(e) for e in events[:-1]]


SIGNALS = ("SIGINT", "SIGTERM")
HARNESS = "signal-run"  # 后台跑信号测试的线程名的开头（数线程的测试不数它们：它们不是服务器的线程）
_SIGNAL_BG = []         # 这次 pytest 会话里唯一的一个 Background（两个信号的运行），见 signal_runs
_LIVE = set()           # 启动了、还没收尾的子进程（测试进程提前结束时 _kill_live 结束它们，不留孤儿）


class Background:
    """fn() 在一个后台线程里跑，测试进程接着跑别的测试；result() 等它跑完 -> 它的返回值（它抛的异常在这里重新抛）。"""

    def __init__(self, fn, name):
        self.out = {}
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.out["value"] = fn()
        except BaseException as e:                       # noqa: BLE001  交给 result() 的调用者
            self.out["error"] = e

    def result(self, timeout=180):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"后台的 {self.thread.name} 没有在 {timeout} 秒内跑完"
        if "error" in self.out:
            raise self.out["error"]
        return self.out["value"]


def _spawn_signal_child():
    """启动一个子进程：python3 serve.py 的 main，load_server 换成 _SIGNAL_CHILD 里的小引擎 -> Popen。"""
    import os
    import subprocess
    import sys
    import bpe_lab
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [here] + [os.path.join(ROOT, d) for d in ("lecture01", "lecture02", "lecture05", "lecture06")]
    # 子进程的 make_server 要切一次词（预分词的正则）：建正则的字符区间要按 unicodedata 扫一遍全部码位（零点几秒 CPU，
    # 两个子进程各一遍，和测试进程抢那两个核）。父进程早就算好了（同一个 Python、同一个 unicodedata）：传过去
    code = _SIGNAL_CHILD.format(paths=paths, path=os.path.join(ROOT, "lecture05", "serve.py"),
                                ranges=bpe_lab._unicode_ranges())
    p = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    _LIVE.add(p)
    return p


def _signal_run(sig):
    """启动一个子进程，等它起来，先回答一个不流式的请求，再开一个空闲的 TCP 连接和一个 60 个 token 的流；
    流出了第一个字就发信号 sig。-> 这次运行看到的一切（dict）。"""
    import re
    import signal
    p = _spawn_signal_child()
    idle, res, out = None, {}, {}
    try:
        line, t = b"", time.monotonic() + 60
        while b"/v1" not in line and time.monotonic() < t:
            line = p.stderr.readline()
            assert line, "服务器没有起来"
        port = int(re.search(rb"127\.0\.0\.1:(\d+)", line).group(1))

        class H:
            pass
        H.port = port
        out["plain"] = post(H, "/v1/completions", {"prompt": "q", "max_tokens": 3})
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = threading.Event()
        th = threading.Thread(target=lambda: res.update(r=post_stream(H, "/v1/completions", {
            "prompt": "q", "max_tokens": 60, "stream": True}, started)), name=f"{HARNESS}-stream-{sig}")
        th.start()
        assert started.wait(20), "流没有开始"                   # 第一个字到了（60 个 token 要 3 s）
        t0 = time.monotonic()
        p.send_signal(getattr(signal, sig))
        out["rc"] = p.wait(20)
        out["elapsed"] = time.monotonic() - t0
        th.join(20)
        out["err"] = p.stderr.read().decode("utf-8")
    finally:
        if idle is not None:
            idle.close()
        _end(p)
    out["stream"] = res["r"]
    return out


def _end(p):
    if p.poll() is None:
        p.kill()
        p.wait(10)
    p.stderr.close()
    _LIVE.discard(p)


@atexit.register
def _kill_live():
    for p in list(_LIVE):
        _end(p)


def _both_signal_runs():
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(SIGNALS), thread_name_prefix=HARNESS) as ex:
        futs = {sig: ex.submit(_signal_run, sig) for sig in SIGNALS}
        return {sig: f.result() for sig, f in futs.items()}


def start_signal_runs():
    """SIGINT、SIGTERM 各一次 _signal_run（两个子进程同时跑）在后台开始，这次 pytest 会话里只开始一次。"""
    if not _SIGNAL_BG:
        _SIGNAL_BG.append(Background(_both_signal_runs, HARNESS))


def signal_runs():
    """
    两个信号的运行的结果（还没开始就现在开始，等它们跑完）：test_ctrl_c_stops_the_command_line_server_cleanly 和
    test_serve_hardening 的信号测试读同一份。-> {"SIGINT": {...}, "SIGTERM": {...}}
    """
    start_signal_runs()
    return _SIGNAL_BG[0].result()


def selected(request, names):
    """这个模块里有没有选中的、名字在 names 里的测试（-k、--deselect 去掉的不算）。"""
    return any(getattr(it, "module", None) is request.module and getattr(it, "originalname", None) in names
               for it in request.session.items)


def early_signal_runs(request, names):
    """
    模块级 autouse 夹具的身体（本文件和 test_serve_hardening 各有一个）：这个模块里选中了读 signal_runs 的测试（names）
    时，模块一开始就在后台开始两个信号的运行。子进程启动要半秒多（Python、numpy、各个 lab），每次运行再等几个 50 ms 的
    步：都和它前面的测试同时进行，轮到读结果的测试时多半已经跑完了。
    """
    if selected(request, names):
        start_signal_runs()
    yield
    if _SIGNAL_BG:                                       # 模块结束（含 -x 提前停）：等它跑完，不留子进程
        _SIGNAL_BG[0].thread.join(120)
    _kill_live()


@pytest.fixture(scope="module", autouse=True)
def _early_signal_runs(request):
    yield from early_signal_runs(request, {"test_ctrl_c_stops_the_command_line_server_cleanly"})


def test_ctrl_c_stops_the_command_line_server_cleanly():
    """python3 serve.py 的 main：收到 SIGINT（Ctrl-C）时中止请求、等线程结束、退出码 0（模型换成小引擎；
    和 test_serve_hardening 的信号测试共用一次运行，见 signal_runs）。"""
    r = signal_runs()["SIGINT"]
    assert r["plain"][0] == 200 and r["plain"][1]["choices"][0]["text"] == "zzz"
    assert r["rc"] == 0 and "停下" in r["err"] and "Traceback" not in r["err"]

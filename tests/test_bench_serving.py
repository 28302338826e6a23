"""
lecture05/bench_serving.py（压测工具）：对着一个延迟已知的桩服务器、用一个假时钟量（不是计时的测试：没有一个数取决于
这台机器多快）。桩服务器每写一行 data: 之前把假时钟拨快这一行的延迟，并等客户端读过一次时钟（客户端每收到一行读一次）
才写下一行：所以客户端量到的 TTFT、ITL、TPOT、端到端正好是桩给的延迟，分位数正好是手算的线性插值。
"""
import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from conftest import load_script
from workload_lab import poisson_arrivals

bench = load_script("lecture05/bench_serving.py")


class LockstepClock:
    """假时钟：clock() 读数（并记下读了几次），sleep(dt) 直接拨快；桩服务器用 advance_after_read 和客户端一步一步走。"""

    def __init__(self):
        self.t, self.reads, self.cv = 0.0, 0, threading.Condition()

    def __call__(self):
        with self.cv:
            self.reads += 1
            self.cv.notify_all()
            return self.t

    def sleep(self, dt):
        with self.cv:
            self.t += max(dt, 0.0)

    def advance_after_read(self, since, dt):
        """等到读数次数 > since（客户端读过了上一行），再拨快 dt -> 现在的读数次数。"""
        with self.cv:
            assert self.cv.wait_for(lambda: self.reads > since, timeout=10), "客户端没有读时钟"
            self.t += dt
            return self.reads


# 桩服务器的 serve_forever 每隔多久看一眼关机请求：httpd.shutdown() 要等到下一次，短一点每个测试的收尾就短
STUB_POLL_S = 0.005

# 桩的剧本：每个请求（按 max_tokens 认）→ (TTFT, [之后每个 token 的间隔])；每行一个 token，最后报 usage
SCRIPT = {3: (0.5, [0.1, 0.1, 0.2]), 4: (1.0, [0.05, 0.05, 0.05, 0.05]), 5: (2.0, [0.3, 0.3, 0.3, 0.3, 0.3])}


def stub_server(clock, script=SCRIPT):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            data = json.dumps({"data": [{"id": "stub"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"]
            ttft, gaps = script[body["max_tokens"]]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            seen = clock.reads - 1                      # 客户端发出前读过一次
            lines = [({"choices": [{"index": 0, "text": f"t{k}", "finish_reason": None}]}, d)
                     for k, d in enumerate([ttft] + gaps)]
            lines.append(({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}, 0.0))
            lines.append(({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": len(gaps) + 1}}, 0.0))
            for obj, d in lines:
                seen = clock.advance_after_read(seen, d)
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            clock.advance_after_read(seen, 0.0)
            self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": STUB_POLL_S}, daemon=True)
    t.start()
    return httpd, t


REQS = [{"prompt": "a", "max_tokens": m} for m in (3, 4, 5)]


@pytest.fixture(scope="module")
def serial_run():
    """
    REQS 一起到达、一次一个（max_concurrency=1）发给 SCRIPT 的桩 -> run_benchmark 的结果。假时钟和桩一步一步走，
    所以这次运行的每个数都是确定的：下面两个测试（量到的延迟；分位数、吞吐、达标）读同一次运行，不各跑一遍。
    """
    clock = LockstepClock()
    httpd, t = stub_server(clock)
    try:
        return bench.run_benchmark(f"http://127.0.0.1:{httpd.server_address[1]}", REQS, math.inf, model="stub",
                                   max_concurrency=1, clock=clock, sleep=clock.sleep, timeout=20)
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(5)


def test_measured_latencies_equal_the_delays_the_stub_served(serial_run):
    res = serial_run
    recs = res["records"]
    assert all(r["error"] is None for r in recs)
    ms = [bench.request_metrics(r) for r in recs]
    # 手算：TTFT 是第一个间隔；TPOT = 后面的间隔之和 / (token 数 − 1)；端到端 = 所有间隔之和（后面几行没有延迟）
    assert [m[0] for m in ms] == [0.5, 1.0, 2.0]
    assert [m[1] for m in ms] == pytest.approx([0.4 / 3, 0.2 / 4, 1.5 / 5], abs=1e-12)
    assert [m[2] for m in ms] == pytest.approx([0.9, 1.2, 3.5], abs=1e-12)
    assert [m[3] for m in ms] == [pytest.approx(g, abs=1e-12) for g in ([0.1, 0.1, 0.2], [0.05] * 4, [0.3] * 5)]
    assert [r["n_out"] for r in recs] == [4, 5, 6] and [r["prompt_tokens"] for r in recs] == [7, 7, 7]
    # 一次一个（max_concurrency=1）、一起到达：一个接一个，整个压测 = 三个端到端之和
    assert res["duration"] == pytest.approx(0.9 + 1.2 + 3.5, abs=1e-12)


def test_percentiles_throughputs_and_attainment_by_hand(serial_run):
    s = bench.summarize(serial_run, ttft_slo=1.0, tpot_slo=0.2)
    # 线性插值：排好序的 x，位置 q·(n − 1)
    assert s["ttft"]["p50"] == pytest.approx(1.0) and s["ttft"]["p90"] == pytest.approx(1.0 + 0.8 * 1.0)
    assert s["ttft"]["p99"] == pytest.approx(1.0 + 0.98 * 1.0) and s["ttft"]["mean"] == pytest.approx(3.5 / 3)
    itl = sorted([0.1, 0.1, 0.2] + [0.05] * 4 + [0.3] * 5)           # 12 个间隔放在一起
    assert s["itl"]["p50"] == pytest.approx((itl[5] + itl[6]) / 2)
    assert s["itl"]["p90"] == pytest.approx(itl[9] + 0.9 * (itl[10] - itl[9]))
    assert s["e2e"]["p50"] == pytest.approx(1.2)
    dur = 5.6
    assert s["request_throughput"] == pytest.approx(3 / dur) and s["output_throughput"] == pytest.approx(15 / dur)
    assert s["total_throughput"] == pytest.approx((15 + 21) / dur)
    # 达标：TTFT ≤ 1 且 TPOT ≤ 0.2：第 1 个（0.5, 0.133）和第 2 个（1.0, 0.05）；第 3 个 TTFT 2.0 不达标
    assert s["attainment"] == pytest.approx(2 / 3) and s["good_throughput"] == pytest.approx(2 / dur)


def test_poisson_dispatch_starts_each_request_at_its_arrival():
    """桩不加延迟时，一次一个的请求也各自在泊松到达的时刻发出（假的 sleep 拨到那一刻）。"""
    clock = LockstepClock()
    httpd, t = stub_server(clock, {3: (0.0, [0.0, 0.0])})
    try:
        reqs = [{"prompt": "a", "max_tokens": 3}] * 5
        res = bench.run_benchmark(f"http://127.0.0.1:{httpd.server_address[1]}", reqs, 2.0, model="stub", seed=7,
                                  max_concurrency=1, clock=clock, sleep=clock.sleep, timeout=20)
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(5)
    want = poisson_arrivals(2.0, 5, 7)
    assert [r["start"] for r in res["records"]] == pytest.approx(list(want), abs=1e-12)
    assert [r["arrival"] for r in res["records"]] == list(want)


def test_failed_requests_count_against_attainment():
    recs = [{"start": 0.0, "stamps": [0.1, 0.2], "end": 0.2, "n_out": 2, "prompt_tokens": 1, "error": None},
            {"start": 0.0, "stamps": [], "end": 0.1, "n_out": 0, "prompt_tokens": None, "error": "HTTP 503: busy"}]
    s = bench.summarize({"records": recs, "duration": 1.0, "rate": 1.0}, 1.0, 1.0)
    assert s["completed"] == 1 and s["failed"] == 1 and s["attainment"] == 0.5


def test_goodput_is_the_highest_tested_rate_meeting_the_goal():
    sums = [{"rate": r, "attainment": a} for r, a in ((0.5, 1.0), (1.0, 0.95), (2.0, 0.6), (4.0, 0.1))]
    assert bench.goodput_over(sums, 0.9)["goodput"] == 1.0
    assert bench.goodput_over(sums, 0.99)["goodput"] == 0.5


def test_requests_are_seeded_and_lengths_in_range():
    a = bench.make_requests(30, (5, 9), (2, 4), seed=3)
    assert a == bench.make_requests(30, (5, 9), (2, 4), seed=3)
    assert a != bench.make_requests(30, (5, 9), (2, 4), seed=4)
    assert all(len(r["prompt"].split()) == r["input_words"] and 5 <= r["input_words"] < 9 for r in a)
    assert {r["max_tokens"] for r in a} == {2, 3}
    with pytest.raises(ValueError, match="input_range"):
        bench.make_requests(3, (5, 5), (2, 4))
    with pytest.raises(ValueError, match="base_url"):
        bench.run_benchmark("localhost:8000", a, 1.0, model="x")
    with pytest.raises(ValueError, match="到达率"):
        bench.run_benchmark("http://127.0.0.1:1", a, 0.0, model="x")


def test_against_the_real_server_over_http_with_the_wall_clock():
    """真的服务器（小模型）、真的时钟、并发：每个请求都完成，输出 token 数 = max_tokens（ignore_eos），文字 == 服务器的。"""
    from test_serve import serve, start                  # test_serve 装好的 serve.py（不再装一遍）
    h = start()
    try:
        reqs = bench.make_requests(6, (2, 6), (3, 8), seed=1)
        res = bench.run_benchmark(h.url, reqs, 500.0, timeout=20)    # 泊松到达只跨十几毫秒：测的是路径，不是等
    finally:
        h.close()
    assert serve.MAX_QUEUE >= 6
    assert all(r["error"] is None for r in res["records"])
    assert [r["n_out"] for r in res["records"]] == [q["max_tokens"] for q in reqs]
    s = bench.summarize(res, 10.0, 10.0)
    assert s["completed"] == 6 and np.isfinite(s["ttft"]["p99"])


# ---------------------------------------------------------------------------
# 和 vllm bench serve 对齐的部分：--burstiness、每个率一批新提示、--header、采样参数和 --extra-body、
# --percentile-metrics / --metric-percentiles、标准差、峰值并发、vLLM 的 goodput、进度
# ---------------------------------------------------------------------------
class Recorder:
    """桩服务器收到的每个请求：(方法, 路径, 头的 dict, 体的 dict 或 None)。"""

    def __init__(self):
        self.seen, self.lock = [], threading.Lock()

    def posts(self):
        return [s for s in self.seen if s[0] == "POST"]


def recording_server(rec):
    """马上回答的桩：每个请求回 max_tokens 个一个字的块，usage 报 prompt_tokens = 提示的词数。"""
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            with rec.lock:
                rec.seen.append(("GET", self.path, dict(self.headers), None))
            data = json.dumps({"data": [{"id": "rec"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with rec.lock:
                rec.seen.append(("POST", self.path, dict(self.headers), body))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            n = body["max_tokens"]
            for k in range(n):
                obj = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            usage = {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": n}
            self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": STUB_POLL_S}, daemon=True)
    t.start()
    return httpd, t


@pytest.fixture
def recorder():
    rec = Recorder()
    httpd, t = recording_server(rec)
    yield rec, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    t.join(5)


def test_gamma_arrivals_have_mean_one_over_rate_and_shape_burstiness():
    """
    间隔 ~ Gamma(k, θ = 1/(率·k))：均值 1/率，变异系数的平方 CV² = 1/k（vLLM 的 --burstiness）。n = 20000 个间隔、
    固定种子，按矩核对，容差 4 个标准误：均值的标准误 = σ/√n = (1/率)·√(1/k)/√n；样本方差的相对标准误
    ≈ √((2 + 6/k)/n)（Gamma 的超额峰度是 6/k），CV² 的容差按它放。
    """
    n, rate = 20000, 4.0
    for k in (0.25, 0.5, 4.0):
        gaps = np.diff(np.concatenate([[0.0], bench.arrival_times(rate, n, 11, k)]))
        assert np.all(gaps >= 0)                        # 递增（k 小时有的间隔小到累加后差不出来）
        se_mean = (1 / rate) * math.sqrt(1 / k) / math.sqrt(n)
        assert abs(gaps.mean() - 1 / rate) < 4 * se_mean, k
        cv2 = gaps.var() / gaps.mean() ** 2
        assert abs(cv2 - 1 / k) < 4 * math.sqrt((2 + 6 / k) / n) * (1 / k), k
    # k = 1 是泊松过程：和 workload_lab 的到达一个字节都不差；k = inf 等间隔；率 inf 一起发
    assert np.array_equal(bench.arrival_times(2.0, 9, 7), poisson_arrivals(2.0, 9, 7))
    assert np.allclose(bench.arrival_times(2.0, 4, 7, math.inf), [0.5, 1.0, 1.5, 2.0], rtol=0, atol=1e-15)
    assert list(bench.arrival_times(math.inf, 3, 7, 0.5)) == [0.0, 0.0, 0.0]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="burstiness"):
            bench.arrival_times(1.0, 3, 0, bad)


def test_dispatch_follows_the_gamma_arrivals():
    """burstiness = 0.5：一次一个的请求也各自在 Gamma 到达的时刻发出（假的 sleep 拨到那一刻）。"""
    clock = LockstepClock()
    httpd, t = stub_server(clock, {3: (0.0, [0.0, 0.0])})
    try:
        reqs = [{"prompt": "a", "max_tokens": 3}] * 5
        res = bench.run_benchmark(f"http://127.0.0.1:{httpd.server_address[1]}", reqs, 2.0, model="stub", seed=7,
                                  max_concurrency=1, clock=clock, sleep=clock.sleep, timeout=20, burstiness=0.5)
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(5)
    want = np.cumsum(np.random.default_rng(7).gamma(0.5, 1 / (2.0 * 0.5), 5))
    assert [r["start"] for r in res["records"]] == pytest.approx(list(want), abs=1e-12)
    assert res["burstiness"] == 0.5


def test_every_rate_gets_fresh_prompts_of_the_same_lengths():
    """make_rounds：每批长度一样、词不一样；所有提示两两不同（1 个词的提示只有 59 种：要重抽；超过 59 个：ValueError）。"""
    rounds = bench.make_rounds(5, 3, (4, 9), (2, 5), seed=1)
    assert rounds[0] == bench.make_requests(5, (4, 9), (2, 5), seed=1)
    assert all([(r["input_words"], r["max_tokens"]) for r in b] ==
               [(r["input_words"], r["max_tokens"]) for r in rounds[0]] for b in rounds)
    prompts = [r["prompt"] for b in rounds for r in b]
    assert len(set(prompts)) == 15
    one = bench.make_rounds(25, 2, (1, 2), (2, 3), seed=0)            # 50 个 1 个词的提示：按生日问题必有重复，要重抽
    assert len({r["prompt"] for b in one for r in b}) == 50
    assert all(len(r["prompt"].split()) == 1 for b in one for r in b)
    with pytest.raises(ValueError, match="重复"):
        bench.make_rounds(30, 2, (1, 2), (2, 3), seed=0)             # 60 > 59 种


def run_main(url, *extra, capsys=None):
    rc = bench.main(["--base-url", url, "--num-prompts", "4", "--request-rate", "1000,2000", "--input-len", "1", "3",
                     "--output-len", "2", "4", "--seed", "3", "--timeout", "10"] + list(extra))
    assert rc == 0


def test_main_sends_no_prompt_twice_across_rates_and_warmups(recorder, tmp_path, capsys):
    """两个率、每个 4 个请求、3 个预热：11 个 POST，每个率一批新提示（1–2 个词的短提示，重复要靠重抽避开）。"""
    rec, url = recorder
    out = tmp_path / "r.json"
    run_main(url, "--num-warmups", "3", "--save-json", str(out))
    posts = [b["prompt"] for _, _, _, b in rec.posts()]
    assert len(posts) == 3 + 8
    warm, measured = posts[:3], posts[3:]
    assert len(set(measured)) == 8 and not set(warm) & set(measured)
    rounds = bench.make_rounds(4, 3, (1, 3), (2, 4), seed=3)
    assert sorted(measured) == sorted(r["prompt"] for b in rounds[:2] for r in b)
    assert sorted(warm) == sorted(r["prompt"] for r in rounds[2][:3])
    runs = json.loads(out.read_text())["runs"]
    for k, run in enumerate(runs):                                   # 总数：桩在 usage 里报的词数、max_tokens
        s = run["summary"]
        assert s["total_input_tokens"] == sum(r["input_words"] for r in rounds[k])
        assert s["input_token_source"] == "server"
        assert s["total_output_tokens"] == sum(r["max_tokens"] for r in rounds[k])
        assert 1 <= s["peak_concurrency"] <= 4
    text = capsys.readouterr().out
    for head in ("时长 s", "输入 tok", "输出 tok", "峰值并发", "goodput"):
        assert head in text


def test_headers_sampling_flags_and_extra_body_reach_every_request(recorder, monkeypatch):
    """--header 在第一个 '=' 处分开、每个请求（连 GET /v1/models）都带；OPENAI_API_KEY 给一个 Bearer，--header 盖过它；
    采样参数给了才放，--extra-body 最后合并（盖过 --temperature，vLLM 的顺序）。"""
    rec, url = recorder
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    run_main(url, "--header", "X-Trace=a=b", "--temperature", "0.5", "--top-k", "5",
             "--extra-body", '{"temperature": 0.7, "foo": {"bar": 1}}')
    assert [s[0] for s in rec.seen].count("GET") == 1 and len(rec.posts()) == 8
    for _, _, h, b in rec.seen:
        assert h["X-Trace"] == "a=b" and h["Authorization"] == "Bearer sk-env"
    for _, _, _, b in rec.posts():
        assert b["temperature"] == 0.7 and b["top_k"] == 5 and b["foo"] == {"bar": 1}
        assert "top_p" not in b and "min_p" not in b and b["stream"] is True
    rec.seen.clear()
    run_main(url, "--header", "Authorization=Bearer sk-flag")
    assert {h["Authorization"] for _, _, h, _ in rec.seen} == {"Bearer sk-flag"}
    assert {b["temperature"] for _, _, _, b in rec.posts()} == {0.0}          # 没给：贪心
    for bad in (["novalue"], ["Bad Name=1"], ["X=a\r\nY: z"]):
        with pytest.raises(ValueError, match="header"):
            bench.parse_headers(bad)
    for bad in ('{"stream": false}', "[1]", "not json"):
        with pytest.raises(ValueError, match="extra-body"):
            bench.check_extra_body(bad)


def hand_records():
    """六个请求（手算每个的 TTFT、TPOT、端到端）+ 一个出错的；时长 2 s。"""
    def r(start, stamps, end, n_out=None, error=None):
        return {"start": start, "stamps": stamps, "end": end, "n_out": len(stamps) if n_out is None else n_out,
                "prompt_tokens": 4, "error": error}
    return [r(0.0, [0.25, 0.375, 0.5], 0.5),           # TTFT 0.25、TPOT 0.125、端到端 0.5：全达标
            r(0.0, [0.75, 0.875], 1.0),                 # TTFT 0.75 > 0.5
            r(0.5, [0.75, 1.25], 1.25),                 # TPOT 0.5 > 0.25
            r(1.0, [1.125], 2.0),                       # 1 个 token：TPOT 记 0；端到端 1.0 > 0.875
            r(1.0, [1.25, 1.375, 1.5], 1.625),          # TTFT 0.25、TPOT 0.125、端到端 0.625：全达标
            r(1.5, [1.75, 1.875], 1.875),               # TTFT 0.25、TPOT 0.125、端到端 0.375：全达标
            r(0.0, [], 0.125, error="HTTP 503: busy")]


def test_vllm_goodput_counts_requests_meeting_every_slo_by_hand():
    """
    --goodput ttft:500 tpot:250 e2el:875：达标的是第 1、5、6 个 -> 3 个 / 2 s = 1.5 req/s，达标率 3/7（出错的算不达标）；
    不给 e2el 时第 4 个（1 个 token、端到端 1 s）也达标：2.0 req/s。目标正好等于值时算达标（≤）。
    """
    slos = bench.parse_goodput(["ttft:500", "tpot:250", "e2el:875"])
    assert slos == {"ttft": 0.5, "tpot": 0.25, "e2el": 0.875}
    res = {"records": hand_records(), "duration": 2.0, "rate": 1.0}
    s = bench.summarize(res, slos=slos)
    assert s["request_goodput"] == 1.5 and s["attainment"] == 3 / 7 and s["good_throughput"] == 1.5
    s2 = bench.summarize(res, slos={"ttft": 0.5, "tpot": 0.25})
    assert s2["request_goodput"] == 2.0 and s2["attainment"] == 4 / 7
    assert bench.summarize(res, slos={"ttft": 0.25})["request_goodput"] == 2.5   # 第 1、3、4、5、6 个：TTFT ≤ 0.25（等号算）
    assert bench.summarize(res)["request_goodput"] is None
    for bad in (["ttft=500"], ["foo:1"], ["ttft:-1"], ["ttft:nan"], ["ttft:1", "ttft:2"], ["ttft:"]):
        with pytest.raises(ValueError, match="goodput"):
            bench.parse_goodput(bad)


def test_std_median_selected_percentiles_and_peak_concurrency_by_hand():
    """标准差是总体标准差（除以 n，同 np.std / vLLM）；选了的分位数按线性插值；峰值并发按区间数（同一时刻先结束后发出）。"""
    res = {"records": hand_records(), "duration": 2.0, "rate": 1.0}
    s = bench.summarize(res, percentiles=(25, 99.9))
    ttft = [0.25, 0.75, 0.25, 0.125, 0.25, 0.25]
    m = sum(ttft) / 6
    assert s["ttft"]["mean"] == pytest.approx(m, abs=1e-15)
    assert s["ttft"]["std"] == pytest.approx(math.sqrt(sum((x - m) ** 2 for x in ttft) / 6), abs=1e-15)
    assert s["ttft"]["median"] == 0.25
    srt = sorted(ttft)                                    # 25%：位置 1.25；99.9%：位置 4.995
    assert s["ttft"]["p25"] == pytest.approx(srt[1] + 0.25 * (srt[2] - srt[1]), abs=1e-15)
    assert s["ttft"]["p99.9"] == pytest.approx(srt[4] + 0.995 * (srt[5] - srt[4]), abs=1e-15)
    assert {"p50", "p90", "p99"} <= set(s["ttft"])                  # 09 读的键还在
    # 区间 [0,0.5) [0,1) [0.5,1.25) [1,2) [1,1.625) [1.5,1.875) [0,0.125)：t = 0、1.5 时各 3 个；t = 1 时第 2 个
    # 结束、第 4、5 个发出：先算结束是 3 个（先算发出会数成 4 个）
    assert s["peak_concurrency"] == 3
    two = [{"start": a, "end": b} for a, b in ((0.0, 1.0), (1.0, 2.0))]
    assert bench.peak_concurrency(two) == 1
    assert s["total_input_tokens"] == 24 and s["input_token_source"] == "server"


def summaries_at(rates, attainments):
    out = []
    for r, a in zip(rates, attainments):
        recs = hand_records()[:1] * 10                    # 10 个全达标的请求，按 a 把后面的换成出错的
        bad = round((1 - a) * 10)
        recs = recs[:10 - bad] + hand_records()[-1:] * bad
        out.append(bench.summarize({"records": recs, "duration": 1.0, "rate": r}, 1.0, 1.0))
    return out


def test_highest_rate_meeting_the_goal_says_when_it_is_only_a_lower_bound(capsys):
    sums = summaries_at([1.0, 2.0, 4.0], [1.0, 1.0, 0.9])
    g = bench.goodput_over(sums, 0.9)
    assert g["goodput"] == 4.0 and g["lower_bound"]
    bench.print_summary(sums, 0.9)
    text = capsys.readouterr().out
    assert "≥ 4 req/s" in text and "下界" in text
    sums = summaries_at([1.0, 2.0, 4.0], [1.0, 0.9, 0.8])
    g = bench.goodput_over(sums, 0.9)
    assert g["goodput"] == 2.0 and not g["lower_bound"] and g["upper"] == 4.0
    bench.print_summary(sums, 0.9)
    text = capsys.readouterr().out
    assert "2 req/s" in text and "下界" not in text
    # 率 inf（一起发）不算一个到达率：最高的有限率达标时仍是下界
    sums = summaries_at([1.0, 2.0, math.inf], [1.0, 1.0, 0.0])
    assert bench.goodput_over(sums, 0.9)["lower_bound"]


def test_percentile_flags_choose_what_is_printed(recorder, capsys):
    rec, url = recorder
    run_main(url, "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "25,99.9")
    text = capsys.readouterr().out
    assert "TTFT：率 req/s" in text and "端到端：率 req/s" in text
    assert "ITL：率 req/s" not in text and "TPOT：率 req/s" not in text
    assert "P25" in text and "P99.9" in text and "P90" not in text and "标准差" in text
    for argv in (["--percentile-metrics", "ttft,foo"], ["--metric-percentiles", "101"], ["--burstiness", "0"],
                 ["--goodput", "ttft:x"], ["--extra-body", "[]"], ["--header", "novalue"]):
        with pytest.raises(SystemExit):
            run_main(url, *argv)


def test_progress_writes_carriage_returns_only_to_a_terminal(recorder, monkeypatch):
    """进度：stderr 不是终端（日志文件）时没有 '\\r'，只在结束时一行；是终端时用 '\\r' 刷新同一行。"""
    import io
    rec, url = recorder
    reqs = [{"prompt": "a b", "max_tokens": 2}] * 3

    class Tty(io.StringIO):
        def isatty(self):
            return True
    for stream, tty in ((io.StringIO(), False), (Tty(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        bench.run_benchmark(url, reqs, math.inf, model="rec", timeout=10, progress=True)
        text = stream.getvalue()
        assert ("\r" in text) == tty and text.count("\n") == 1 and "已完成 3/3" in text


class CharTokenizer:
    """一个字符一个 token 的分词器（测试用）：encode / decode 和 bpe_lab 的一样用法。"""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_prompt_lengths_are_in_tokens_only_with_a_tokenizer():
    """给了分词器：每个提示正好 input_tokens 个 token，在 [lo, hi) 里；服务器没报 usage 时输入 token 数用客户端数的。"""
    from workload_lab import uniform_ints
    reqs = bench.make_requests(12, (5, 30), (2, 4), seed=2, tokenizer=CharTokenizer())
    want = uniform_ints(5, 30, 12, 2)                   # 长度的种子是 seed：和不给分词器时的词数一样
    assert [len(r["prompt"]) for r in reqs] == [r["input_tokens"] for r in reqs] == list(want)
    assert "input_tokens" not in bench.make_requests(3, (5, 30), (2, 4), seed=2)[0]
    recs = [dict(r, prompt_tokens=None, input_tokens=7) for r in hand_records()[:2]]
    s = bench.summarize({"records": recs, "duration": 1.0, "rate": 1.0})
    assert s["total_input_tokens"] == 14 and s["input_token_source"] == "client"
    with pytest.raises(ValueError, match="GGUF"):
        bench.load_tokenizer("/nonexistent/model.gguf")

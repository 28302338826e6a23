"""
=============================================================================
CS349E · 第 5 讲 · bench_serving.py —— 压测任何一个 OpenAI 兼容的服务器：TTFT、TPOT、ITL、端到端、吞吐、goodput
=============================================================================

一个能跑的工具（不是实验模块，也不是编号脚本；测试和 09 按路径加载它）。对照 vLLM 的 benchmarks/benchmark_serving.py、
mini-sglang 的 benchmark/client.py：同样的量，只用标准库（和 numpy）。

【运行】先开一个服务器（python3 lecture05/serve.py），再：
  python3 lecture05/bench_serving.py --base-url http://127.0.0.1:8000 --num-prompts 20 --request-rate 0.5
  --request-rate 可以给几个（0.25,0.5,1）：每个率各跑一遍，最后按 goodput_lab 的定义给出 goodput。
  同一个命令也能压 vLLM 或 llama.cpp 的服务器（它们都认 ignore_eos；不认的服务器可能提前停，输出 token 数照实记）。
【工作负载】（固定、带种子：同样的参数、同样的请求）第 i 个请求的提示是从一张固定的英文单词表里按种子抽的
  input_len[i] 个词（长度单位是词，服务器切成多少 token 看它回报的 usage.prompt_tokens），max_tokens = output_len[i]，
  ignore_eos = true（vLLM 的 random 数据集也这样：输出长度固定，才好比较），temperature = 0。长度在给定的区间里均匀
  （workload_lab.uniform_ints）；到达是泊松过程（workload_lab.poisson_arrivals），率为 inf 时全部一起发。
【量什么】（都在客户端量：一个请求从发出到每个带文字的块到达）
  TTFT = 第一个带文字的块 − 发出；ITL = 相邻两个带文字的块之间（所有请求的间隔放在一起算分位数）；
  TPOT = (最后一个带文字的块 − 第一个) / (输出 token 数 − 1)（DistServe / goodput_lab 的定义；只有 1 个 token 时记 0）；
  端到端 = 收到 [DONE] − 发出。输出 token 数取流的最后一块的 usage（stream_options.include_usage），没有就数带文字的块。
  分位数是 numpy 的线性插值（p50、p90、p99）；吞吐 = 完成的请求数（或 token 数）/ 整个压测的时长（第一个请求发出到最后一个
  结束）。SLO 达标率 = 同时 TTFT ≤ 目标、TPOT ≤ 目标的请求所占比例（goodput_lab.slo_attainment；出错的请求算不达标）；
  goodput = 达标率 ≥ 门槛（默认 90%）的最高到达率（goodput_lab.find_goodput，DistServe 的定义，扫了几个率时才有）。
【时钟】clock（默认 time.perf_counter）和 sleep 可以换掉：测试用一个假时钟，对着一个延迟已知的桩服务器核对每个数。
  每个带 data: 的行到达时读一次时钟，发出前读一次，别的时候不读。
【依赖】numpy；本目录的 workload_lab、goodput_lab；../lecture01 的 console。
"""
import os
import sys

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (HERE, os.path.join(HERE, "..", "lecture01")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from console import print_note, print_table  # noqa: E402
from goodput_lab import find_goodput, slo_attainment  # noqa: E402
from workload_lab import poisson_arrivals, uniform_ints  # noqa: E402

# 提示用的词（固定的表：同样的种子、同样的提示）
WORDS = ("the time people way year work world life day hand part child eye woman place week case point number "
         "group problem fact water house river city story light music paper money road market garden morning "
         "question answer reason idea science history language family friend school country moment system "
         "kitchen window summer winter mountain island forest letter engine teacher student").split()
PERCENTILES = (50, 90, 99)


# ---------------------------------------------------------------------------
# 工作负载
# ---------------------------------------------------------------------------
def make_requests(n, input_range=(20, 60), output_range=(16, 48), seed=0):
    """
    n 个固定的请求 -> [{"prompt": 文字, "input_words": 词数, "max_tokens": 输出长度}]。
    长度在 [lo, hi) 里均匀（workload_lab.uniform_ints，种子 seed、seed + 1），词按种子 seed + 2 抽。
    【边界】n < 1、区间不是 1 ≤ lo < hi：ValueError。
    """
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"请求数必须是 ≥ 1 的整数（收到 {n!r}）")
    for name, (lo, hi) in (("input_range", input_range), ("output_range", output_range)):
        if not 1 <= lo < hi:
            raise ValueError(f"{name} 必须是 1 ≤ lo < hi（收到 [{lo}, {hi})）")
    ins = uniform_ints(*input_range, n, seed)
    outs = uniform_ints(*output_range, n, seed + 1)
    words = uniform_ints(0, len(WORDS), int(ins.sum()), seed + 2)
    reqs, k = [], 0
    for a, b in zip(ins, outs):
        reqs.append({"prompt": " ".join(WORDS[w] for w in words[k:k + a]), "input_words": int(a),
                     "max_tokens": int(b)})
        k += a
    return reqs


def payload(req, endpoint, model, temperature=0.0):
    """一个请求的 JSON 体（流式、带 usage、忽略 EOS）。"""
    body = {"model": model, "max_tokens": req["max_tokens"], "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req["prompt"]}]
    else:
        body["prompt"] = req["prompt"]
    return body


# ---------------------------------------------------------------------------
# 一个请求
# ---------------------------------------------------------------------------
def _split(base_url):
    u = urlsplit(base_url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"base_url 要像 http://127.0.0.1:8000 这样（只支持 http），收到 {base_url!r}")
    return u.hostname, u.port or 80, u.path.rstrip("/")


def get_models(base_url, timeout=10.0):
    """GET /v1/models -> 模型名的列表。"""
    host, port, prefix = _split(base_url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", prefix + "/v1/models")
        r = conn.getresponse()
        data = json.loads(r.read().decode("utf-8"))
    finally:
        conn.close()
    return [m["id"] for m in data.get("data", [])]


def one_request(base_url, endpoint, body, clock=time.perf_counter, timeout=600.0):
    """
    发一个流式请求、读完 -> 记录 dict：start、stamps（每个带文字的块到达的时刻）、end、n_out、prompt_tokens、text、
    error（None 或出错的说明）。时刻都是 clock() 的读数。
    """
    host, port, prefix = _split(base_url)
    path = prefix + ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    data = json.dumps(body).encode("utf-8")
    rec = {"start": None, "stamps": [], "end": None, "n_out": None, "prompt_tokens": None, "text": "", "error": None}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        rec["start"] = clock()
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:300].decode('utf-8', 'replace')}"
            rec["end"] = clock()
            return rec
        parts = []
        while True:
            line = r.readline()
            if not line:
                rec["error"] = "流在 [DONE] 之前断了"
                rec["end"] = clock()
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            t = clock()                                   # 每个 data: 行读一次时钟
            payload_ = line[5:].strip()
            if payload_ == b"[DONE]":
                rec["end"] = t
                break
            obj = json.loads(payload_.decode("utf-8"))
            if obj.get("usage"):
                rec["n_out"] = obj["usage"].get("completion_tokens")
                rec["prompt_tokens"] = obj["usage"].get("prompt_tokens")
            for ch in obj.get("choices") or []:
                text = ch.get("delta", {}).get("content") if endpoint == "chat" else ch.get("text")
                if text:
                    rec["stamps"].append(t)
                    parts.append(text)
        rec["text"] = "".join(parts)
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        if rec["end"] is None:
            rec["end"] = clock()
    finally:
        conn.close()
    if rec["n_out"] is None:
        rec["n_out"] = len(rec["stamps"])
    return rec


# ---------------------------------------------------------------------------
# 一次压测
# ---------------------------------------------------------------------------
def run_benchmark(base_url, reqs, rate, endpoint="completions", model=None, seed=0, max_concurrency=None,
                  clock=time.perf_counter, sleep=time.sleep, timeout=600.0, progress=False):
    """
    按泊松到达（率 rate 个请求/秒，种子 seed；rate = inf 时一起发）把 reqs 发给 base_url，等全部结束 ->
    {"records": [每个请求一个记录，按请求的顺序，加上 arrival（计划的到达，相对开始）], "duration": 秒, "rate": rate}。
    max_concurrency：同时最多几个请求在飞（None = 不限）；到了上限，后到的等前面的结束。progress=True 时在 stderr 上
    打一行进度。每个请求最多等 timeout 秒（socket 超时），所以整个压测有界。
    """
    if not (rate > 0):
        raise ValueError(f"到达率必须为正（每秒的请求数，或 inf；收到 {rate}）")
    if max_concurrency is not None and not (isinstance(max_concurrency, int) and max_concurrency >= 1):
        raise ValueError(f"max_concurrency 必须是 ≥ 1 的整数或 None（收到 {max_concurrency!r}）")
    _split(base_url)
    if model is None:
        model = get_models(base_url)[0]
    n = len(reqs)
    arrivals = np.zeros(n) if math.isinf(rate) else poisson_arrivals(rate, n, seed)
    records = [None] * n
    slots = threading.BoundedSemaphore(max_concurrency) if max_concurrency else None
    done = [0]
    lock = threading.Lock()

    def worker(i):
        try:
            records[i] = one_request(base_url, endpoint, payload(reqs[i], endpoint, model), clock, timeout)
        finally:
            with lock:
                done[0] += 1
            if slots:
                slots.release()

    stop_progress = threading.Event()

    def show():
        while not stop_progress.wait(1.0):
            print(f"\r  率 {rate:g} req/s：已完成 {done[0]}/{n}", end="", file=sys.stderr, flush=True)
        print(f"\r  率 {rate:g} req/s：已完成 {done[0]}/{n}", file=sys.stderr, flush=True)

    shower = threading.Thread(target=show, daemon=True) if progress else None
    if shower:
        shower.start()
    threads = []
    t0 = clock()
    for i in range(n):
        if slots:
            slots.acquire()
        wait = t0 + float(arrivals[i]) - clock()
        if wait > 0:
            sleep(wait)
        th = threading.Thread(target=worker, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout + 5)
    if shower:
        stop_progress.set()
        shower.join(2)
    for i, rec in enumerate(records):
        if rec is None:
            records[i] = {"start": None, "stamps": [], "end": None, "n_out": 0, "prompt_tokens": None, "text": "",
                          "error": "超时：线程没有结束"}
        records[i]["arrival"] = float(arrivals[i])
        records[i]["max_tokens"] = reqs[i]["max_tokens"]
    ends = [r["end"] for r in records if r["end"] is not None]
    duration = (max(ends) - t0) if ends else 0.0
    return {"records": records, "duration": duration, "rate": rate}


# ---------------------------------------------------------------------------
# 统计
# ---------------------------------------------------------------------------
def request_metrics(rec):
    """一个记录 -> (ttft, tpot, e2e, [itl...])；出错或没有文字的请求 -> None。"""
    if rec["error"] is not None or not rec["stamps"]:
        return None
    st = rec["stamps"]
    ttft = st[0] - rec["start"]
    tpot = (st[-1] - st[0]) / (rec["n_out"] - 1) if rec["n_out"] > 1 else 0.0
    return ttft, tpot, rec["end"] - rec["start"], [b - a for a, b in zip(st, st[1:])]


def summarize(result, ttft_slo, tpot_slo):
    """
    一次压测的结果 -> dict：completed、failed、duration、各量（ttft、tpot、itl、e2e）的 mean 和 p50/p90/p99、
    request_throughput、output_throughput（token/s）、total_throughput（含提示 token，服务器报了 usage 时）、
    attainment（SLO 达标率，出错的算不达标）、good_throughput（每秒达标的请求数，vLLM 的 request goodput）。
    """
    recs, dur = result["records"], result["duration"]
    ms = [request_metrics(r) for r in recs]
    ok = [m for m in ms if m is not None]
    out = {"rate": result["rate"], "n": len(recs), "completed": len(ok), "failed": len(recs) - len(ok),
           "duration": dur}
    series = {"ttft": [m[0] for m in ok], "tpot": [m[1] for m in ok], "e2e": [m[2] for m in ok],
              "itl": [g for m in ok for g in m[3]]}
    for k, v in series.items():
        a = np.asarray(v, dtype=float)
        out[k] = ({"mean": float(a.mean()), **{f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}}
                  if a.size else None)
    n_out = sum(r["n_out"] for r, m in zip(recs, ms) if m is not None)
    n_in = [r["prompt_tokens"] for r, m in zip(recs, ms) if m is not None]
    out["output_tokens"] = n_out
    out["request_throughput"] = len(ok) / dur if dur > 0 else 0.0
    out["output_throughput"] = n_out / dur if dur > 0 else 0.0
    out["total_throughput"] = ((n_out + sum(n_in)) / dur if dur > 0 and all(x is not None for x in n_in)
                               else None)
    inf = float("inf")
    res = {"ttft": [m[0] if m else inf for m in ms], "tpot": [m[1] if m else inf for m in ms]}
    out["ttft_slo"], out["tpot_slo"] = ttft_slo, tpot_slo
    out["attainment"] = slo_attainment(res, ttft_slo, tpot_slo)
    out["good_throughput"] = out["attainment"] * len(recs) / dur if dur > 0 else 0.0
    return out


def goodput_over(summaries, goal=0.9):
    """几个率的 summarize 结果 -> goodput_lab.find_goodput 的结果（达标率 ≥ goal 的最高到达率，只在测过的率里找）。"""
    att = {s["rate"]: s["attainment"] for s in summaries}
    return find_goodput(lambda r: att[r], sorted(att), n_refine=0, goal=goal)


def _ms(x):
    return f"{x * 1e3:.1f}"


def print_summary(summaries, goal=0.9):
    """打印每个率一行的表（毫秒）和 goodput。"""
    rows = []
    for s in summaries:
        row = [f"{s['rate']:g}", f"{s['completed']}/{s['n']}"]
        for k in ("ttft", "tpot", "itl", "e2e"):
            row += [_ms(s[k][f"p{p}"]) if s[k] else "-" for p in (50, 99)]
        row += [f"{s['request_throughput']:.2f}", f"{s['output_throughput']:.1f}", f"{s['attainment']:.0%}"]
        rows.append(row)
    print_table(["率 req/s", "完成", "TTFT p50", "p99", "TPOT p50", "p99", "ITL p50", "p99", "端到端 p50", "p99",
                 "req/s", "tok/s", "达标"], rows)
    s0 = summaries[0]
    print_note(f"时间单位 ms；SLO：TTFT ≤ {_ms(s0['ttft_slo'])} ms、TPOT ≤ {_ms(s0['tpot_slo'])} ms；"
               "TPOT = (最后一个 − 第一个带文字的块) / (输出 token − 1)；ITL = 相邻两个带文字的块")
    for s in summaries:
        means = "、".join(f"{name} {_ms(s[k]['mean'])}" for k, name in (("ttft", "TTFT"), ("tpot", "TPOT"),
                                                                       ("itl", "ITL"), ("e2e", "端到端")) if s[k])
        p90 = "、".join(f"{name} {_ms(s[k]['p90'])}" for k, name in (("ttft", "TTFT"), ("tpot", "TPOT"),
                                                                     ("itl", "ITL"), ("e2e", "端到端")) if s[k])
        print_note(f"率 {s['rate']:g} req/s：平均 {means}；p90 {p90}（ms）；每秒达标的请求 {s['good_throughput']:.2f}"
                   + (f"；失败 {s['failed']} 个" if s["failed"] else ""))
    if len(summaries) > 1:
        g = goodput_over(summaries, goal)
        print_note(f"goodput（达标率 ≥ {goal:.0%} 的最高到达率，只在测过的率里找）：{g['goodput']:g} req/s")


def _rates(text):
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"到达率要一个或几个用逗号隔开的数（或 inf），收到 {text!r}") from None
    if not rates or not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"到达率必须为正，收到 {text!r}")
    return rates


def main(argv=None):
    ap = argparse.ArgumentParser(description="CS349E：压测一个 OpenAI 兼容的服务器")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    ap.add_argument("--model", default=None, help="默认用 GET /v1/models 的第一个")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--request-rate", type=_rates, default=[1.0], help="每秒的请求数；几个用逗号隔开；inf = 一起发")
    ap.add_argument("--input-len", type=int, nargs=2, default=(20, 60), metavar=("LO", "HI"), help="提示的词数 [LO, HI)")
    ap.add_argument("--output-len", type=int, nargs=2, default=(16, 48), metavar=("LO", "HI"),
                    help="max_tokens [LO, HI)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--ttft-slo", type=float, default=2.0, help="TTFT 目标（秒）")
    ap.add_argument("--tpot-slo", type=float, default=0.25, help="TPOT 目标（秒）")
    ap.add_argument("--goal", type=float, default=0.9, help="达标率的门槛")
    ap.add_argument("--save-json", default=None, help="把每个请求的原始记录写到这个文件")
    ap.add_argument("--timeout", type=float, default=600.0, help="每个请求最多等几秒")
    a = ap.parse_args(argv)
    reqs = make_requests(a.num_prompts, tuple(a.input_len), tuple(a.output_len), a.seed)
    model = a.model or get_models(a.base_url)[0]
    print(f"压测 {a.base_url}（模型 {model}，/v1/{'chat/' if a.endpoint == 'chat' else ''}completions）："
          f"{a.num_prompts} 个请求，提示 {a.input_len[0]}–{a.input_len[1] - 1} 词，输出 {a.output_len[0]}–"
          f"{a.output_len[1] - 1} token，种子 {a.seed}", file=sys.stderr)
    results, summaries = [], []
    for rate in a.request_rate:
        r = run_benchmark(a.base_url, reqs, rate, a.endpoint, model, a.seed, a.max_concurrency, timeout=a.timeout,
                          progress=True)
        results.append(r)
        summaries.append(summarize(r, a.ttft_slo, a.tpot_slo))
    print_summary(summaries, a.goal)
    if a.save_json:
        with open(a.save_json, "w", encoding="utf-8") as f:
            json.dump({"base_url": a.base_url, "model": model, "endpoint": a.endpoint, "seed": a.seed,
                       "runs": [{"rate": r["rate"], "duration": r["duration"], "records": r["records"],
                                 "summary": s} for r, s in zip(results, summaries)]}, f, ensure_ascii=False, indent=1)
        print(f"原始记录写到了 {a.save_json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""
=============================================================================
CS349E · 第 5 讲 · bench_serving.py —— 压测任何一个 OpenAI 兼容的服务器：TTFT、TPOT、ITL、端到端、吞吐、goodput
=============================================================================

一个能跑的工具（不是实验模块，也不是编号脚本；测试和 09 按路径加载它）。旗标的名字和意思照 vLLM 的 `vllm bench serve`
（vllm-project/vllm 的 vllm/benchmarks/serve.py，commit def9ce85；发请求的部分在 vllm/benchmarks/lib/
endpoint_request_func.py，commit 3aee4a4f），只用标准库和 numpy。和它不一样的地方下面逐条写明。

【运行】先开一个服务器（python3 lecture05/serve.py），再：
  python3 lecture05/bench_serving.py --base-url http://127.0.0.1:8000 --num-prompts 20 --request-rate 0.5
  --request-rate 可以给几个（0.25,0.5,1）：每个率各跑一遍，最后给出"达标率 ≥ 门槛的最高到达率"。
  同一个命令也能压 vLLM 或 llama.cpp 的服务器（它们都认 ignore_eos；不认的服务器可能提前停，输出 token 数照实记）。
【旗标】（和 vLLM 同名同义的）
  --header KEY=VALUE …：每个请求（连 GET /v1/models）都带上这些 HTTP 头，例如 --header "Authorization=Bearer sk-…"；
    环境变量 OPENAI_API_KEY 设了时先放一个 Authorization: Bearer 头（vLLM 也这样），--header 的同名头盖过它。
  --num-warmups N：正式压测之前先一起发 N 个预热请求（受 --max-concurrency 限制），不计入任何统计。vLLM 重发第一个
    请求的提示；这里用另一批提示，免得预热替第一个正式请求把前缀缓存热好。
  --burstiness B：到达间隔是 Gamma 分布，形状 = B、均值 = 1/率（尺度 = 1/(率·B)）；B = 1 是泊松过程（默认，
    workload_lab.poisson_arrivals），B < 1 更扎堆，B > 1 更均匀，inf = 等间隔 1/率。vLLM 在不爬坡时还把累计的
    到达时刻整体缩放到最后一个正好落在 n/率；这里不缩放（每个间隔就是抽出来的那个）。
  --temperature（默认 0）、--top-p、--top-k、--min-p：给了才放进请求体；--extra-body '{"k": v}'：一个 JSON 对象，
    合并进每个请求体，和 vLLM 一样最后合并（盖过同名的采样参数和 max_tokens）；盖 stream、stream_options、prompt、
    messages 会让压测量不成，算错（ValueError）。
  --percentile-metrics ttft,tpot,itl,e2el（默认四个都打；vLLM 默认 ttft,tpot,itl）、--metric-percentiles 50,90,99
    （默认；vLLM 默认 99）：打印哪些量的哪些分位数；每个量另有均值、标准差（总体标准差，np.std）、中位数。
  --goodput ttft:毫秒 tpot:毫秒 e2el:毫秒（给几个算几个）：每个请求要同时满足给出的每个目标才算"好"；vLLM 的
    request goodput = 好请求数 / 压测时长（req/s）。这组目标同时用于下面的达标率；不给时用 --ttft-slo、--tpot-slo。
  --tokenizer 路径：用本项目的分词器（bpe_lab，从这个 GGUF 文件读词表）按 token 数造提示。要客户端也有这个 GGUF，
    而且只对用同一个分词器的服务器才准（别的模型切出来的 token 数不同），所以是可选的；不给时 --input-len 的单位是词，
    输入 token 数照服务器在 usage 里报的算。
【工作负载】（固定、带种子：同样的参数、同样的请求）第 i 个请求：提示从一张固定的英文单词表里按种子抽 input_len[i]
  个词（或凑到 input_len[i] 个 token），max_tokens = output_len[i]，ignore_eos = true（vLLM 的 random 数据集也这样：
  输出长度固定，才好比较），temperature = 0（除非给了 --temperature）。长度在给定的区间里均匀（workload_lab.uniform_ints）；
  每个率用一批新的提示（长度和别的率一样，词不一样，任何两个提示都不相同）：同一个提示在前一个率已经发过的话，
  服务器的前缀缓存是热的，高的率反而 TTFT 低。到达见 --burstiness；率为 inf 时全部一起发。
【量什么】（都在客户端量：一个请求从发出到每个带文字的块到达）
  TTFT = 第一个带文字的块 − 发出；ITL = 同一个请求相邻两个带文字的块之间（所有请求的间隔放在一起算分位数）；
  TPOT = (最后一个带文字的块 − 第一个) / (输出 token 数 − 1)（DistServe / goodput_lab 的定义；只有 1 个 token 时记 0；
  vLLM 用 (端到端 − TTFT) / (输出 token 数 − 1)，多算了最后一个 token 到流结束的那一段）；端到端（e2el）= 收到 [DONE]
  − 发出。输出 token 数取流的最后一块的 usage（stream_options.include_usage），没有就数带文字的块。
  分位数是 numpy 的线性插值；吞吐 = 完成的请求数（或 token 数）/ 整个压测的时长（第一个请求发出到最后一个结束）。
  峰值并发 = 同时在飞（已发出、还没结束）的请求数的最大值，按每个请求的发出、结束时刻精确地数（vLLM 按整秒分桶数，
  一秒里来过的都算，会比这个大）。SLO 达标率 = 满足每个目标的请求所占比例（出错的请求算不达标）。
  "达标率 ≥ 门槛（默认 90%）的最高到达率"（goodput_lab.find_goodput，DistServe 的定义，扫了几个率时才有）只在测过的
  率里找：最高的率也达标时它只是一个下界（真值可能更高），打印时会说。
【进度】stderr 是终端时每秒用 '\\r' 刷新一行；不是终端（重定向到文件、CI 的日志）时只在每个率结束时打一行。
【时钟】clock（默认 time.perf_counter）和 sleep 可以换掉：测试用一个假时钟，对着一个延迟已知的桩服务器核对每个数。
  每个带 data: 的行到达时读一次时钟，发出前读一次，别的时候不读。
【依赖】numpy；本目录的 workload_lab、goodput_lab；../lecture01 的 console；给了 --tokenizer 时 ../lecture02 的
  gguf_lab、bpe_lab。
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
from goodput_lab import find_goodput  # noqa: E402
from workload_lab import poisson_arrivals, uniform_ints  # noqa: E402

# 提示用的词（固定的表：同样的种子、同样的提示）
WORDS = ("the time people way year work world life day hand part child eye woman place week case point number "
         "group problem fact water house river city story light music paper money road market garden morning "
         "question answer reason idea science history language family friend school country moment system "
         "kitchen window summer winter mountain island forest letter engine teacher student").split()
PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")              # vLLM 的名字；summarize 的键里端到端叫 "e2e"
KEY = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
NAME = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "端到端"}
SLO_METRICS = ("ttft", "tpot", "e2el")                   # --goodput 认的（每个请求一个值的量）
BENCH_OWNS = ("stream", "stream_options", "prompt", "messages")   # --extra-body 不能盖的键


# ---------------------------------------------------------------------------
# 工作负载
# ---------------------------------------------------------------------------
class _WordStream:
    """按种子抽词的流：第 k 个词 = WORDS[floor(u_k · len(WORDS))]，u 来自 default_rng(seed).random()，一段一段地抽。"""

    def __init__(self, seed):
        self.rng, self.buf, self.k = np.random.default_rng(seed), np.zeros(0, dtype=np.int64), 0

    def take(self, m):
        while len(self.buf) - self.k < m:
            more = np.floor(self.rng.random(max(m, 256)) * len(WORDS)).astype(np.int64)
            self.buf = np.concatenate([self.buf[self.k:], more])
            self.k = 0
        out = self.buf[self.k:self.k + m]
        self.k += m
        return [WORDS[w] for w in out]


def _token_prompt(stream, n_tokens, tokenizer):
    """从词流里取词，凑一个正好 n_tokens 个 token 的提示 -> (文字, 词数, 重新切词数出的 token 数)。"""
    words = []
    for _ in range(4 * n_tokens + 16):                   # 每个词至少 1 个 token 时 n_tokens 个词就够；留足余量
        words += stream.take(1)
        ids = tokenizer.encode(" ".join(words))
        if len(ids) >= n_tokens:
            text = " ".join(words) if len(ids) == n_tokens else tokenizer.decode(ids[:n_tokens])
            return text, len(words), len(tokenizer.encode(text))
    raise ValueError(f"{4 * n_tokens + 16} 个词还凑不出 {n_tokens} 个 token：这个分词器把词表里的词合并得太厉害")


def make_rounds(n, rounds, input_range=(20, 60), output_range=(16, 48), seed=0, tokenizer=None):
    """
    rounds 批、每批 n 个请求 -> [[{"prompt", "input_words", "max_tokens"（, "input_tokens"）}, …], …]。每批的长度相同
    （[lo, hi) 里均匀，workload_lab.uniform_ints，种子 seed、seed + 1），词不同：所有批的词按顺序从同一个种子 seed + 2
    的流里取，所以第 0 批和 make_requests 的一样。任何两个提示都不相同：抽到重复的，从种子 seed + 3 的流里重抽。
    tokenizer（有 encode / decode）：input_range 的单位是 token，每个提示凑到正好那么多 token（input_tokens 是重新切词
    数出来的；词表里的词在 SmolLM2 的分词器里都是一个 token）。
    【边界】n、rounds < 1，区间不是 1 ≤ lo < hi：ValueError；提示太短、凑不出这么多不同的提示：ValueError。
    """
    for name, v in (("请求数", n), ("批数 rounds", rounds)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name}必须是 ≥ 1 的整数（收到 {v!r}）")
    for name, (lo, hi) in (("input_range", input_range), ("output_range", output_range)):
        if not 1 <= lo < hi:
            raise ValueError(f"{name} 必须是 1 ≤ lo < hi（收到 [{lo}, {hi})）")
    ins = uniform_ints(*input_range, n, seed)
    outs = uniform_ints(*output_range, n, seed + 1)
    stream, spare, seen, out = _WordStream(seed + 2), _WordStream(seed + 3), set(), []
    for _ in range(rounds):
        batch = []
        for a, b in zip(ins, outs):
            src = stream
            for _try in range(100):
                if tokenizer is None:
                    text, n_words, n_tok = " ".join(src.take(int(a))), int(a), None
                else:
                    text, n_words, n_tok = _token_prompt(src, int(a), tokenizer)
                if text not in seen:
                    break
                src = spare
            else:
                raise ValueError(f"{n} × {rounds} 个提示里总有重复的：提示太短（{input_range[0]} 个起），"
                                 "把 --input-len 调长或少发几个")
            seen.add(text)
            r = {"prompt": text, "input_words": n_words, "max_tokens": int(b)}
            if n_tok is not None:
                r["input_tokens"] = n_tok
            batch.append(r)
        out.append(batch)
    return out


def make_requests(n, input_range=(20, 60), output_range=(16, 48), seed=0, tokenizer=None):
    """
    n 个固定的请求 -> [{"prompt": 文字, "input_words": 词数, "max_tokens": 输出长度}]（make_rounds 的第 0 批）。
    长度在 [lo, hi) 里均匀（workload_lab.uniform_ints，种子 seed、seed + 1），词按种子 seed + 2 抽。
    【边界】n < 1、区间不是 1 ≤ lo < hi：ValueError。
    """
    return make_rounds(n, 1, input_range, output_range, seed, tokenizer)[0]


def load_tokenizer(path):
    """GGUF 文件里的分词器（bpe_lab.BPETokenizer；只读元数据，不装权重）。【边界】文件不存在：ValueError。"""
    if not os.path.isfile(path):
        raise ValueError(f"--tokenizer 要一个 GGUF 文件的路径（本项目的分词器从它读词表），{path!r} 不是文件")
    sys.path.insert(0, os.path.join(HERE, "..", "lecture02"))
    from bpe_lab import BPETokenizer
    from gguf_lab import read_gguf
    return BPETokenizer.from_gguf_metadata(read_gguf(path).metadata)


def arrival_times(rate, n, seed, burstiness=1.0):
    """
    n 个请求的到达时刻（秒，从压测开始算，递增）。间隔独立同分布：Gamma(形状 k = burstiness, 尺度 θ = 1/(rate·k))，
    均值 kθ = 1/rate、方差 kθ² = 1/(rate²·k)，所以变异系数的平方 = 1/k（vLLM 的 --burstiness）。
    【边界】rate = inf：全是 0（一起发）；k = 1：workload_lab.poisson_arrivals（指数间隔，和以前的字节一样）；
    k = inf：等间隔 1/rate；rate 或 k 不是正数：ValueError。
    """
    if not rate > 0:
        raise ValueError(f"到达率必须为正（每秒的请求数，或 inf；收到 {rate}）")
    if not burstiness > 0:
        raise ValueError(f"burstiness 必须为正（Gamma 分布的形状；1 = 泊松，inf = 等间隔），收到 {burstiness}")
    if math.isinf(rate):
        return np.zeros(n)
    if burstiness == 1.0:
        return poisson_arrivals(rate, n, seed)
    if math.isinf(burstiness):
        return np.arange(1, n + 1) / rate
    return np.cumsum(np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), n))


def sampling_params(temperature=None, top_p=None, top_k=None, min_p=None):
    """给了的采样参数 -> dict（没给 temperature 时是 0：贪心，vLLM 的压测也这样）。"""
    d = {k: v for k, v in (("top_p", top_p), ("top_k", top_k), ("min_p", min_p)) if v is not None}
    d["temperature"] = 0.0 if temperature is None else temperature
    return d


def check_extra_body(extra):
    """--extra-body 的 JSON -> dict。【边界】不是 JSON 对象、要盖 stream / stream_options / prompt / messages：ValueError。"""
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError as e:
            raise ValueError(f"--extra-body 要一个 JSON 对象，解析不了：{e}") from None
    if not isinstance(extra, dict):
        raise ValueError(f"--extra-body 要一个 JSON 对象（{{\"键\": 值}}），收到 {type(extra).__name__}")
    bad = sorted(set(extra) & set(BENCH_OWNS))
    if bad:
        raise ValueError(f"--extra-body 不能盖 {bad}：压测要流式、带 usage，提示由它自己造（能盖的是其余的键）")
    return extra


def payload(req, endpoint, model, temperature=0.0, sampling=None, extra_body=None):
    """
    一个请求的 JSON 体（流式、带 usage、忽略 EOS）。sampling（sampling_params 的 dict）盖过 temperature；extra_body
    最后合并，盖过同名的键（vLLM 的顺序）。
    """
    body = {"model": model, "max_tokens": req["max_tokens"], "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req["prompt"]}]
    else:
        body["prompt"] = req["prompt"]
    body.update(sampling or {})
    body.update(extra_body or {})
    return body


# ---------------------------------------------------------------------------
# 一个请求
# ---------------------------------------------------------------------------
def _split(base_url):
    u = urlsplit(base_url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"base_url 要像 http://127.0.0.1:8000 这样（只支持 http），收到 {base_url!r}")
    return u.hostname, u.port or 80, u.path.rstrip("/")


def parse_headers(items):
    """
    ["KEY=VALUE", …] -> {KEY: VALUE}（在第一个 '=' 处分开，两边去掉空白；vLLM 的 --header）。
    【边界】没有 '='、KEY 空或含空白和 ':'、含换行：ValueError（一个换行就能往请求里塞别的头）。
    """
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--header 要 KEY=VALUE 的形式，收到 {item!r}")
        k, v = (x.strip() for x in item.split("=", 1))
        if not k or any(c.isspace() or c == ":" for c in k) or any(c in "\r\n" for c in v):
            raise ValueError(f"--header {item!r}：头的名字不能空、不能有空白或 ':'，值里不能有换行")
        out[k] = v
    return out


def request_headers(headers=None):
    """每个请求带的头：Content-Type、OPENAI_API_KEY（设了时）的 Authorization: Bearer，再被 headers 盖。"""
    h = {"Content-Type": "application/json"}
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    return h


def get_models(base_url, timeout=10.0, headers=None):
    """GET /v1/models -> 模型名的列表。"""
    host, port, prefix = _split(base_url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", prefix + "/v1/models", headers=request_headers(headers))
        r = conn.getresponse()
        data = json.loads(r.read().decode("utf-8"))
    finally:
        conn.close()
    return [m["id"] for m in data.get("data", [])]


def one_request(base_url, endpoint, body, clock=time.perf_counter, timeout=600.0, headers=None):
    """
    发一个流式请求、读完 -> 记录 dict：start、stamps（每个带文字的块到达的时刻）、end、n_out、prompt_tokens、text、
    error（None 或出错的说明）。时刻都是 clock() 的读数。headers：另加的 HTTP 头（见 request_headers）。
    """
    host, port, prefix = _split(base_url)
    path = prefix + ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    data = json.dumps(body).encode("utf-8")
    rec = {"start": None, "stamps": [], "end": None, "n_out": None, "prompt_tokens": None, "text": "", "error": None}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        rec["start"] = clock()
        conn.request("POST", path, data, request_headers(headers))
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
                  clock=time.perf_counter, sleep=time.sleep, timeout=600.0, progress=False, *, burstiness=1.0,
                  headers=None, sampling=None, extra_body=None):
    """
    按 arrival_times(rate, n, seed, burstiness) 的到达（rate = inf 时一起发）把 reqs 发给 base_url，等全部结束 ->
    {"records": [每个请求一个记录，按请求的顺序，加上 arrival（计划的到达，相对开始）、max_tokens、input_tokens
    （客户端数的，没有时 None）], "duration": 秒, "rate": rate, "burstiness": burstiness}。
    max_concurrency：同时最多几个请求在飞（None = 不限）；到了上限，后到的等前面的结束。progress=True 时在 stderr 上
    报进度（是终端时每秒刷新一行，否则结束时一行）。headers、sampling、extra_body 见 one_request、payload。
    每个请求最多等 timeout 秒（socket 超时），所以整个压测有界。
    """
    if not (rate > 0):
        raise ValueError(f"到达率必须为正（每秒的请求数，或 inf；收到 {rate}）")
    if max_concurrency is not None and not (isinstance(max_concurrency, int) and max_concurrency >= 1):
        raise ValueError(f"max_concurrency 必须是 ≥ 1 的整数或 None（收到 {max_concurrency!r}）")
    _split(base_url)
    n = len(reqs)
    arrivals = arrival_times(rate, n, seed, burstiness)
    if model is None:
        model = get_models(base_url, headers=headers)[0]
    records = [None] * n
    slots = threading.BoundedSemaphore(max_concurrency) if max_concurrency else None
    done = [0]
    lock = threading.Lock()

    def worker(i):
        try:
            body = payload(reqs[i], endpoint, model, sampling=sampling, extra_body=extra_body)
            records[i] = one_request(base_url, endpoint, body, clock, timeout, headers)
        finally:
            with lock:
                done[0] += 1
            if slots:
                slots.release()

    err = sys.stderr
    live = progress and hasattr(err, "isatty") and err.isatty()
    stop_progress = threading.Event()

    def show():
        while not stop_progress.wait(1.0):
            print(f"\r  率 {rate:g} req/s：已完成 {done[0]}/{n}", end="", file=err, flush=True)

    shower = threading.Thread(target=show, daemon=True) if live else None
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
    if progress:
        print(("\r" if live else "") + f"  率 {rate:g} req/s：已完成 {done[0]}/{n}", file=err, flush=True)
    for i, rec in enumerate(records):
        if rec is None:
            records[i] = {"start": None, "stamps": [], "end": None, "n_out": 0, "prompt_tokens": None, "text": "",
                          "error": "超时：线程没有结束"}
        records[i]["arrival"] = float(arrivals[i])
        records[i]["max_tokens"] = reqs[i]["max_tokens"]
        records[i]["input_tokens"] = reqs[i].get("input_tokens")
    ends = [r["end"] for r in records if r["end"] is not None]
    duration = (max(ends) - t0) if ends else 0.0
    return {"records": records, "duration": duration, "rate": rate, "burstiness": burstiness}


def warm_up(base_url, reqs, endpoint="completions", model=None, max_concurrency=None, timeout=600.0, **kw):
    """预热：reqs 一起发（受 max_concurrency 限制），等它们结束 -> 成功的个数。结果不进任何统计。"""
    res = run_benchmark(base_url, reqs, math.inf, endpoint, model, max_concurrency=max_concurrency, timeout=timeout,
                        **kw)
    return sum(1 for r in res["records"] if r["error"] is None)


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


def peak_concurrency(records):
    """
    同时在飞的请求数的最大值：每个有发出、结束时刻的请求占 [start, end)；同一时刻先算结束、再算发出
    （一个刚结束、一个刚发出的不算重叠）。出错的请求也在飞过，一样算。
    """
    ev = sorted([(r["start"], 1) for r in records if r["start"] is not None and r["end"] is not None]
                + [(r["end"], -1) for r in records if r["start"] is not None and r["end"] is not None])
    cur = peak = 0
    for _, d in ev:
        cur += d
        peak = max(peak, cur)
    return peak


def pct_key(p):
    """分位数的键：99 -> "p99"，99.9 -> "p99.9"（vLLM 打印 P99、P99.9 的写法）。"""
    p = float(p)
    return f"p{int(p)}" if p == int(p) else f"p{p:g}"


def _stats(values, percentiles):
    a = np.asarray(values, dtype=float)
    if not a.size:
        return None
    out = {"mean": float(a.mean()), "std": float(a.std()), "median": float(np.median(a))}
    for p in sorted(set(PERCENTILES) | {float(q) for q in percentiles}):
        out[pct_key(p)] = float(np.percentile(a, p))
    return out


def parse_goodput(items):
    """
    ["ttft:500", "tpot:50", "e2el:2000"]（毫秒，vLLM 的 --goodput）-> {"ttft": 0.5, "tpot": 0.05, "e2el": 2.0}（秒）。
    【边界】不是 KEY:VALUE、名字不是 ttft / tpot / e2el、值不是 ≥ 0 的有限数、同一个名字给了两次：ValueError。
    """
    out = {}
    for item in items or []:
        k, sep, v = item.partition(":")
        try:
            ms = float(v)
        except ValueError:
            ms = None
        if not sep or ms is None:
            raise ValueError(f"--goodput 要 KEY:毫秒 的形式（例如 ttft:500），收到 {item!r}")
        if k not in SLO_METRICS:
            raise ValueError(f"--goodput 的名字只能是 {list(SLO_METRICS)}，收到 {k!r}")
        if not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"--goodput {k} 的目标要 ≥ 0 的有限毫秒数，收到 {v!r}")
        if k in out:
            raise ValueError(f"--goodput 里 {k} 给了两次")
        out[k] = ms / 1e3
    return out


def summarize(result, ttft_slo=None, tpot_slo=None, *, slos=None, percentiles=PERCENTILES):
    """
    一次压测的结果 -> dict：n、completed、failed、duration、各量（ttft、tpot、itl、e2e）的 mean、std（总体标准差）、
    median 和 p50 / p90 / p99 以及 percentiles 里的（键见 pct_key）、output_tokens（= total_output_tokens）、
    total_input_tokens（服务器给每个完成的请求报了 usage 时用它的数，input_token_source = "server"；否则客户端用
    --tokenizer 数的，"client"；都没有：None）、peak_concurrency、request_throughput、output_throughput（token/s）、
    total_throughput（含输入 token，知道输入 token 数时）、slos、attainment（满足每个目标的请求占全部请求的比例，
    出错的算不达标）、request_goodput（vLLM：满足每个目标的请求数 / 时长）和它的旧名 good_throughput。
    目标：slos（{"ttft" / "tpot" / "e2el": 秒}，parse_goodput 的结果）；不给时 {"ttft": ttft_slo, "tpot": tpot_slo}；
    都没有：attainment、request_goodput 是 None。
    """
    recs, dur = result["records"], result["duration"]
    ms = [request_metrics(r) for r in recs]
    ok = [m for m in ms if m is not None]
    out = {"rate": result["rate"], "n": len(recs), "completed": len(ok), "failed": len(recs) - len(ok),
           "duration": dur, "burstiness": result.get("burstiness", 1.0)}
    series = {"ttft": [m[0] for m in ok], "tpot": [m[1] for m in ok], "e2e": [m[2] for m in ok],
              "itl": [g for m in ok for g in m[3]]}
    for k, v in series.items():
        out[k] = _stats(v, percentiles)
    done = [r for r, m in zip(recs, ms) if m is not None]
    n_out = sum(r["n_out"] for r in done)
    out["output_tokens"] = out["total_output_tokens"] = n_out
    n_in, src = None, None
    if done and all(r["prompt_tokens"] is not None for r in done):
        n_in, src = sum(r["prompt_tokens"] for r in done), "server"
    elif done and all(r.get("input_tokens") is not None for r in done):
        n_in, src = sum(r["input_tokens"] for r in done), "client"
    out["total_input_tokens"], out["input_token_source"] = n_in, src
    out["peak_concurrency"] = peak_concurrency(recs)
    out["request_throughput"] = len(ok) / dur if dur > 0 else 0.0
    out["output_throughput"] = n_out / dur if dur > 0 else 0.0
    out["total_throughput"] = (n_out + n_in) / dur if dur > 0 and n_in is not None else None
    if slos is None and ttft_slo is not None and tpot_slo is not None:
        slos = {"ttft": ttft_slo, "tpot": tpot_slo}
    out["slos"] = dict(slos) if slos else None
    out["ttft_slo"] = (slos or {}).get("ttft")
    out["tpot_slo"] = (slos or {}).get("tpot")
    if slos:
        col = {"ttft": 0, "tpot": 1, "e2el": 2}
        good = sum(1 for m in ms if m is not None and all(m[col[k]] <= v for k, v in slos.items()))
        out["attainment"] = good / len(recs) if recs else 0.0
        out["request_goodput"] = good / dur if dur > 0 else 0.0
    else:
        out["attainment"] = out["request_goodput"] = None
    out["good_throughput"] = out["request_goodput"]
    return out


def goodput_over(summaries, goal=0.9):
    """
    几个率的 summarize 结果 -> goodput_lab.find_goodput 的结果（达标率 ≥ goal 的最高到达率，只在测过的有限的率里找；
    率 inf 是"一起发"，不是一个到达率，不参加）加上 lower_bound：测过的最高的有限率也达标时为 True（upper = inf）：
    这时 goodput 只是一个下界，真值可能更高。【边界】没有有限的率：ValueError。
    """
    att = {s["rate"]: s["attainment"] for s in summaries if math.isfinite(s["rate"])}
    if not att:
        raise ValueError("goodput 要至少一个有限的到达率（inf 是一起发）")
    g = find_goodput(lambda r: att[r], sorted(att), n_refine=0, goal=goal)
    g["lower_bound"] = math.isinf(g["upper"])
    return g


def _ms(x):
    return f"{x * 1e3:.1f}"


def _slo_text(slos):
    return "、".join(f"{NAME[k]} ≤ {_ms(v)} ms" for k, v in slos.items())


def print_summary(summaries, goal=0.9, metrics=METRICS, percentiles=PERCENTILES):
    """
    打印：每个率一行的总表（时长、输入 / 输出 token、峰值并发、吞吐、达标率、vLLM 的 request goodput），再每个选了的量
    一张表（均值、标准差、中位数、选了的分位数，毫秒），最后是达标率 ≥ goal 的最高到达率（最高的率也达标时说它是下界）。
    """
    rows = []
    for s in summaries:
        rows.append([f"{s['rate']:g}", f"{s['completed']}/{s['n']}", f"{s['duration']:.2f}",
                     "-" if s["total_input_tokens"] is None else str(s["total_input_tokens"]),
                     str(s["total_output_tokens"]), str(s["peak_concurrency"]), f"{s['request_throughput']:.2f}",
                     f"{s['output_throughput']:.1f}",
                     "-" if s["total_throughput"] is None else f"{s['total_throughput']:.1f}",
                     "-" if s["attainment"] is None else f"{s['attainment']:.0%}",
                     "-" if s["request_goodput"] is None else f"{s['request_goodput']:.2f}"])
    print_table(["率 req/s", "完成", "时长 s", "输入 tok", "输出 tok", "峰值并发", "req/s", "输出 tok/s", "总 tok/s",
                 "达标", "goodput req/s"], rows)
    s0 = summaries[0]
    src = {"server": "服务器在 usage 里报的", "client": "客户端用 --tokenizer 数的", None: "服务器没报"}
    b = s0.get("burstiness", 1.0)
    print_note(f"输入 token 是{src[s0['input_token_source']]}；峰值并发 = 同时在飞的请求数的最大值；到达："
               + ("泊松过程" if b == 1.0 else ("等间隔" if math.isinf(b) else f"Gamma 间隔（形状 {b:g}）"))
               + "，率为 inf 时一起发")
    if s0["slos"]:
        print_note(f"达标 = 满足 {_slo_text(s0['slos'])} 的请求占全部请求的比例（出错的算不达标）；")
        print_note("goodput = 这样的请求数 / 时长（vLLM 的 request goodput）")
    pk = [pct_key(p) for p in percentiles]
    for m in metrics:
        k = KEY[m]
        rows = [[f"{s['rate']:g}"] + ([_ms(s[k][c]) for c in ["mean", "std", "median"] + pk] if s[k] else
                                     ["-"] * (3 + len(pk))) for s in summaries]
        print_table([f"{NAME[m]}：率 req/s", "均值 ms", "标准差", "中位数"] + [c.upper() for c in pk], rows)
    print_note("TPOT = (最后一个 − 第一个带文字的块) / (输出 token − 1)；ITL = 同一个请求相邻两个带文字的块；"
               "标准差是总体标准差")
    finite = sorted(s["rate"] for s in summaries if math.isfinite(s["rate"]))
    if len(finite) > 1 and s0["slos"]:
        g = goodput_over(summaries, goal)
        if g["lower_bound"]:
            print_note(f"达标率 ≥ {goal:.0%} 的最高到达率：≥ {g['goodput']:g} req/s。测过的最高的率 {finite[-1]:g} 也达标，"
                       "所以这只是一个下界：真值要再试更高的率才知道")
        elif g["goodput"] == 0:
            print_note(f"达标率 ≥ {goal:.0%} 的最高到达率：测过的率里没有（最低的 {finite[0]:g} req/s 也不达标），"
                       "要试更低的率")
        else:
            print_note(f"达标率 ≥ {goal:.0%} 的最高到达率（只在测过的率里找）：{g['goodput']:g} req/s；"
                       f"{g['upper']:g} req/s 不达标")


# ---------------------------------------------------------------------------
# 命令行
# ---------------------------------------------------------------------------
def _rates(text):
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"到达率要一个或几个用逗号隔开的数（或 inf），收到 {text!r}") from None
    if not rates or not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"到达率必须为正，收到 {text!r}")
    return rates


def _metric_list(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in METRICS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--percentile-metrics 是用逗号隔开的 {','.join(METRICS)} 里的名字，收到 {text!r}")
    return tuple(dict.fromkeys(names))


def _percentile_list(text):
    try:
        ps = [float(x) for x in text.split(",")]
    except ValueError:
        ps = []
    if not ps or not all(0 <= p <= 100 for p in ps):
        raise argparse.ArgumentTypeError(f"--metric-percentiles 是用逗号隔开的 [0, 100] 里的数，收到 {text!r}")
    return tuple(dict.fromkeys(ps))


def _burstiness(text):
    try:
        b = float(text)
    except ValueError:
        b = float("nan")
    if not b > 0:
        raise argparse.ArgumentTypeError(f"--burstiness 要一个正数（1 = 泊松，< 1 更扎堆，> 1 更均匀，inf = 等间隔），"
                                         f"收到 {text!r}")
    return b


def build_parser():
    ap = argparse.ArgumentParser(description="CS349E：压测一个 OpenAI 兼容的服务器（旗标同 vllm bench serve）")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    ap.add_argument("--model", default=None, help="默认用 GET /v1/models 的第一个")
    ap.add_argument("--header", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="每个请求另带的 HTTP 头，例如 Authorization=Bearer sk-…（可以给几个）")
    ap.add_argument("--num-prompts", type=int, default=20, help="每个率发几个请求")
    ap.add_argument("--num-warmups", type=int, default=0, help="正式压测前的预热请求数（不计入统计）")
    ap.add_argument("--request-rate", type=_rates, default=[1.0], help="每秒的请求数；几个用逗号隔开；inf = 一起发")
    ap.add_argument("--burstiness", type=_burstiness, default=1.0,
                    help="到达间隔的 Gamma 形状（均值 1/率）：1 = 泊松，< 1 更扎堆，> 1 更均匀")
    ap.add_argument("--input-len", type=int, nargs=2, default=(20, 60), metavar=("LO", "HI"),
                    help="提示长度 [LO, HI)：词数；给了 --tokenizer 时是 token 数")
    ap.add_argument("--output-len", type=int, nargs=2, default=(16, 48), metavar=("LO", "HI"),
                    help="max_tokens [LO, HI)")
    ap.add_argument("--tokenizer", default=None, metavar="GGUF",
                    help="按这个 GGUF 的分词器（本项目的 bpe_lab）数提示的 token；不给时按词数")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=None, help="默认 0（贪心）")
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--min-p", type=float, default=None)
    ap.add_argument("--extra-body", default=None, help="一个 JSON 对象，合并进每个请求体（最后合并）")
    ap.add_argument("--percentile-metrics", type=_metric_list, default=METRICS,
                    help="打印分位数的量：ttft,tpot,itl,e2el 里的几个")
    ap.add_argument("--metric-percentiles", type=_percentile_list, default=PERCENTILES, help="分位数，例如 50,90,99")
    ap.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                    help="SLO（毫秒）：ttft:… tpot:… e2el:…；goodput = 每秒满足全部目标的请求数")
    ap.add_argument("--ttft-slo", type=float, default=2.0, help="TTFT 目标（秒；没给 --goodput 时用）")
    ap.add_argument("--tpot-slo", type=float, default=0.25, help="TPOT 目标（秒；没给 --goodput 时用）")
    ap.add_argument("--goal", type=float, default=0.9, help="达标率的门槛")
    ap.add_argument("--save-json", default=None, help="把每个请求的原始记录写到这个文件")
    ap.add_argument("--timeout", type=float, default=600.0, help="每个请求最多等几秒")
    return ap


def main(argv=None):
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        headers = parse_headers(a.header)
        extra = check_extra_body(a.extra_body) if a.extra_body is not None else None
        slos = parse_goodput(a.goodput) if a.goodput else {"ttft": a.ttft_slo, "tpot": a.tpot_slo}
        if a.num_warmups < 0 or a.num_prompts < 1:
            raise ValueError(f"--num-prompts 要 ≥ 1、--num-warmups 要 ≥ 0（收到 {a.num_prompts}、{a.num_warmups}）")
        tok = load_tokenizer(a.tokenizer) if a.tokenizer else None
        rounds = make_rounds(a.num_prompts, len(a.request_rate) + (1 if a.num_warmups else 0), tuple(a.input_len),
                             tuple(a.output_len), a.seed, tok)
    except ValueError as e:
        ap.error(str(e))
    sampling = sampling_params(a.temperature, a.top_p, a.top_k, a.min_p)
    kw = dict(headers=headers, sampling=sampling, extra_body=extra)
    model = a.model or get_models(a.base_url, headers=headers)[0]
    unit = "token" if tok else "词"
    print(f"压测 {a.base_url}（模型 {model}，/v1/{'chat/' if a.endpoint == 'chat' else ''}completions）："
          f"每个率 {a.num_prompts} 个请求（每个率一批新的提示），提示 {a.input_len[0]}–{a.input_len[1] - 1} {unit}，"
          f"输出 {a.output_len[0]}–{a.output_len[1] - 1} token，种子 {a.seed}", file=sys.stderr)
    if a.num_warmups:
        warm = [rounds[-1][i % a.num_prompts] for i in range(a.num_warmups)]
        ok = warm_up(a.base_url, warm, a.endpoint, model, a.max_concurrency, a.timeout, **kw)
        print(f"预热：{ok}/{a.num_warmups} 个请求完成（不计入统计）", file=sys.stderr)
    results, summaries = [], []
    for k, rate in enumerate(a.request_rate):
        r = run_benchmark(a.base_url, rounds[k], rate, a.endpoint, model, a.seed, a.max_concurrency,
                          timeout=a.timeout, progress=True, burstiness=a.burstiness, **kw)
        results.append(r)
        summaries.append(summarize(r, slos=slos, percentiles=a.metric_percentiles))
    print_summary(summaries, a.goal, a.percentile_metrics, a.metric_percentiles)
    if a.save_json:
        with open(a.save_json, "w", encoding="utf-8") as f:
            json.dump({"base_url": a.base_url, "model": model, "endpoint": a.endpoint, "seed": a.seed,
                       "burstiness": a.burstiness, "sampling": sampling, "extra_body": extra,
                       "runs": [{"rate": r["rate"], "duration": r["duration"], "records": r["records"],
                                 "summary": s} for r, s in zip(results, summaries)]}, f, ensure_ascii=False, indent=1)
        print(f"原始记录写到了 {a.save_json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

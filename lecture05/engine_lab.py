"""
engine_lab —— 第 5 讲的 numpy 推理引擎：连续批处理、分页的 KV 块、自动前缀缓存、分块 prefill、挤出重算。

【外观】（vLLM 的名字）LLMEngine(params, cfg, num_blocks, block_size=16, max_num_batched_tokens=256, max_num_seqs=16,
enable_prefix_caching=True, speculative_config=None)；add_request(prompt_ids, max_tokens, temperature=0.0, seed=0, stop=None,
*, top_p=1.0, top_k=0, min_p=0.0, logprobs=None) -> request_id；
step() -> [(request_id, 新 token 的 list, finish_reason)]（一次调度、一次前向；finish_reason 运行中是 None，
之后是 "stop"、"length"、"abort" 或 "error"）；has_unfinished_requests()；abort_request(id)；num_free_blocks；
generate(prompts, max_tokens, temperature=0.0, seed=0, stop=None, *, top_p=1.0, top_k=0, min_p=0.0) -> 每个提示的 token list。
【采样】top_p、top_k、min_p 是 decode_lab.adjust 的过滤器（vLLM V1 的顺序：温度、min_p、top-k、top-p；并列的规则见 adjust），
默认全关。过滤器开着时精确也成立：float64 下引擎里的请求 == autoregressive_generate(…, top_p=…, top_k=…, min_p=…)。
【logprobs】add_request(…, logprobs=k)（k = 0..MAX_LOGPROBS，None = 不要）：requests[id].logprobs 每个生成的 token
一项 (抽到的 token 的 logprob, [(token_id, logprob)] × k)，k 个按 logprob 从大到小、并列时 id 小的在前。logprob 是
**原始 logits** 的 log-softmax（温度和过滤器之前，float64），同 vLLM 的默认（logprobs_mode="raw_logprobs"）：T = 0 时
调整过的分布只有 0 和 1，log 是 −inf，不是合法的 JSON（vllm/v1/sample/sampler.py @3e34265：raw_logprobs 在温度和
logits processor 之前算）。postprocess 之后只从抽样的那一行算（不留整行，keep_logits 才留）。
投机解码也能给：一轮留下的每个 token 用目标在那个位置的 logits 行（抽出它的 p 就来自这一行）。
【出错】一步里模型（runner）抛异常：引擎不死。这一步里的每个请求结束，step() 报告 (request_id, [], "error")，
requests[id].error 是一句中英文的说明，块放掉（测试：num_free_blocks 回到总数），异常本身留在 last_error（服务器写日志用）；
之后来的请求照常服务。
【一步】schedule（scheduler_lab）→ run（runner_lab：一次前向 + 每个请求用自己的种子抽样）→ postprocess（追加 token、
登记写满的块、结束的放掉块）。三间小屋各做一件事：块（block_manager_lab）、调度（scheduler_lab）、模型（runner_lab）。
【精确】float64 下，引擎里每个请求的 token 等于它单独用 decode_lab.autoregressive_generate、同一个种子生成的
（测试：任意到达顺序、预算小到每步 1 个 token、块池小到要挤出、前缀缓存开或关、T = 0 和 T = 1）。
float32 下矩阵乘不是批不变的，同一个请求的 logits 随批里有谁而差 ~1e-5：见 batch_invariant。
【投机解码】speculative_config（vLLM 的名字，spec_engine_lab）：每一步一轮——草稿、一次前向验证、verify_chain、还块；
γ 固定、开关关着时第 i 个请求 == decode_lab.speculative_generate(…, default_rng(seed + i))（tests/test_spec_engine.py）。
【时间】默认按模型时间走（runner_lab.modelled_step_time：这一步的账按 lecture05/cpu_calibration.json 里标定的 CPU
代价模型算），所以打印的数字每次都一样；clock="wall" 用真实的时钟。每个请求记下到达、每个 token 的时间；每步记下 token 数、序列数、
用着的块、前缀缓存命中的块、挤出次数、引擎自己的开销（调度、块的账、建下标数组）。
【解耦】export_request(id) -> handoff_lab.KVHandoff：prefill 那边在抽出第一个 token 的那一步之后把请求交出去（token、
采样设置、随机数发生器的状态、时间戳、KV），放掉它的块（共享的前缀块还有别的主人）；import_request(h, reservation=None)
-> id：decode 那边把它直接收进运行队列（Scheduler.admit），KV 写进新块，下一步就是 decode（实现在 handoff_lab）。
【记录有界】默认 requests 留着每个请求、steps 留着每一步（脚本和测试要看）。一直开着的服务器两样都不能无限长：
release(id) 忘掉一个已经结束、结束也已经由 step() 报告过的请求（它的 token、时间、logits 一起放掉）；
max_step_history=n 时 steps 只留最近的 n 步（collections.deque）。serve.py 两样都用。
"""
import collections
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from block_manager_lab import BlockManager, blocks_for, chain_hash  # noqa: E402
from scheduler_lab import Request, Scheduler  # noqa: E402
from runner_lab import ModelRunner, modelled_step_time, step_counts  # noqa: E402
from decode_lab import adjust  # noqa: E402
from spec_engine_lab import SpecReplay, SpecRunner, init_request, parse_speculative_config, spec_step_time  # noqa: E402
from handoff_lab import export_request, import_request  # noqa: E402

__all__ = ["LLMEngine", "ReplayRunner", "RequestLog", "run_trace", "MAX_LOGPROBS", "top_logprobs"]

MAX_LOGPROBS = 20        # 每个 token 最多要几个 top logprobs：OpenAI 的 top_logprobs 的上限（0..20）


def _is_int(x, lo):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= lo


def top_logprobs(logits_row, token, k):  # [V], int, int -> (float, [(int, float)] × k)
    """
    一个生成的 token 的 logprobs -> (token 的 logprob, 最大的 k 个 (token_id, logprob))。

    【推导】logprob = log softmax(logits) = logits − max − log Σ exp(logits − max)，在 float64 里算（原始 logits：温度和
    过滤器之前）。k 个按 logprob 从大到小，并列时 id 小的在前：先用 np.partition 找出第 k 大的值，只把 ≥ 它的候选排序
    （不排整个词表）。
    【边界】k = 0：空 list；k 超过词表：整个词表。
    """
    z = np.asarray(logits_row, dtype=np.float64)
    m = z.max()
    lp = z - m - np.log(np.exp(z - m).sum())
    k = min(int(k), len(lp))
    if k == 0:
        return float(lp[token]), []
    kth = np.partition(lp, len(lp) - k)[len(lp) - k]
    cand = np.flatnonzero(lp >= kth)
    cand = cand[np.lexsort((cand, -lp[cand]))][:k]              # 先按 logprob 降序，再按 id 升序
    return float(lp[token]), [(int(i), float(lp[i])) for i in cand]


class ReplayRunner:
    """
    不跑模型的"模型"：按事先算好的 token 流回答（streams[request_id] = 那个请求的输出）。
    扫一个旋钮（预算、块池、到达率）时用：float64、T = 0 下一个请求的 token 和它跟谁一批无关，算一次，之后只重跑调度和模型时间。
    """

    def __init__(self, streams):
        self.streams = streams

    def run(self, chunks):
        return [self.streams[c.req.id][len(c.req.output)] if c.sample else None for c in chunks], None


class RequestLog:
    """
    引擎记下的请求，用起来像一个按 id 排的 list：log[id]、log[a:b]（区间里还在的）、按 id 的顺序迭代、len。
    release 过的 id 不在里面（log[id] 抛 KeyError），所以内存只跟还没放掉的请求数走。
    """

    def __init__(self):
        self._d, self.n_issued = {}, 0

    def add(self, req):
        self._d[req.id] = req
        self.n_issued = max(self.n_issued, req.id + 1)

    def pop(self, rid):
        return self._d.pop(rid)

    def get(self, rid):
        return self._d.get(rid)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self._d[i] for i in range(*k.indices(self.n_issued)) if i in self._d]
        if isinstance(k, (int, np.integer)) and k < 0:
            k += self.n_issued
        return self._d[k]

    def __contains__(self, rid):
        return rid in self._d

    def __iter__(self):
        return iter(self._d.values())              # dict 按插入的顺序 = id 的顺序

    def __len__(self):
        return len(self._d)


class LLMEngine:
    """
    引擎（见模块说明）。params 是 init_params / load_gguf 的参数 dict，也可以是一个现成的 NumpyTransformer（例如
    decode_lab.TransformerLM：和单独生成共用一份融合好的权重）。关键字参数之外：speculative_config（vLLM 的名字）：
    None = 不投机；一个 dict（method、draft_model、num_speculative_tokens、disable_by_batch_size……）= 投机解码，
    见 spec_engine_lab（每一步一轮：草稿 γ 个、一次前向验证、verify_chain、还块）；
    batch_invariant（runner_lab）；clock="model"（默认）或 "wall"；keep_logits=True 时每个请求记下每个抽样位置的 logits
    （测试拿它和单独生成的比）；keep_hidden=True 时每个请求还记下 req.hidden：和 req.output 一一对应的 [d] 向量，
    抽出那个 token 的一行过了最后的 RMSNorm（不乘权重 g：g 已并进 lm_head，所以 lm_head(h) 就是那一行的 logits），
    同一次前向、不跑第二遍（第 6 讲 train_draft_heads.py 的训练数据；投机解码时不支持）；hash_fn 换掉前缀缓存的哈希（测试用一个很小的哈希强行碰撞）；max_step_history
    （None = steps 留每一步，默认；n = 只留最近 n 步，一直开着的服务器用，见模块说明的【记录有界】）；sample_threads：
    一步要抽的行够多时分给几个线程抽（runner_lab.ModelRunner.run；默认 1，抽出的 token 和线程数无关）。
    【边界】块数、块大小、两个预算、sample_threads、max_step_history（不是 None 时）不是正整数；块池放不下一个用满模型上下文（max_seq）的请求：ValueError。
    """

    def __init__(self, params, cfg, num_blocks, block_size=16, max_num_batched_tokens=256, max_num_seqs=16,
                 enable_prefix_caching=True, *, speculative_config=None, batch_invariant=False, clock="model",
                 keep_logits=False, hash_fn=chain_hash, runner=None, max_step_history=None, keep_hidden=False,
                 sample_threads=1):
        knobs = [("num_blocks", num_blocks), ("block_size", block_size),
                 ("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)]
        if max_step_history is not None:
            knobs.append(("max_step_history", max_step_history))
        knobs.append(("sample_threads", sample_threads))
        for name, v in knobs:
            if not _is_int(v, 1):
                raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")
        if num_blocks * block_size < cfg.max_seq:
            raise ValueError(f"块池 num_blocks × block_size = {num_blocks} × {block_size} = {num_blocks * block_size} 个 "
                             f"token，放不下一个用满模型上下文 max_seq = {cfg.max_seq} 的请求：至少要 "
                             f"{blocks_for(cfg.max_seq, block_size)} 块")
        self.spec = None if speculative_config is None else parse_speculative_config(speculative_config, cfg)
        if self.spec is not None and max_num_batched_tokens < self.spec.gamma_top + 1:
            raise ValueError(f"投机解码一轮要 1 + γ = {1 + self.spec.gamma_top} 个 token 的预算，"
                             f"max_num_batched_tokens = {max_num_batched_tokens} 放不下")
        if clock not in ("model", "wall"):
            raise ValueError(f"clock 只能是 'model'（模型时间，默认）或 'wall'（真实时钟），收到 {clock!r}")
        self.cfg, self.num_blocks, self.block_size = cfg, int(num_blocks), int(block_size)
        self.bm = BlockManager(self.num_blocks, self.block_size, enable_prefix_caching, hash_fn)
        self.scheduler = Scheduler(self.bm, int(max_num_batched_tokens), int(max_num_seqs))
        self.runner = runner if runner is not None else ModelRunner(params, cfg, self.num_blocks, self.block_size,
                                                                    batch_invariant, int(sample_threads))
        if self.spec is not None and runner is None:
            self.runner = SpecRunner(self.runner, self.spec, self.num_blocks, self.block_size)
        self.draft_cfg = self.spec.draft.cfg if self.spec is not None and self.spec.paged else None
        self.clock, self.keep_logits = clock, keep_logits
        self.keep_hidden = bool(keep_hidden)
        if self.keep_hidden:
            if self.spec is not None or not hasattr(self.runner, "keep_hidden"):
                raise ValueError("keep_hidden=True 只用于普通的 ModelRunner（不投机、不是重放的引擎）")
            self.runner.keep_hidden = True
        self.requests, self.now = RequestLog(), 0.0
        self.steps = [] if max_step_history is None else collections.deque(maxlen=int(max_step_history))
        self._pending = []                                   # 中止了、下一次 step 要报告的
        self.last_error = None                               # 最近一次出错的一步抛出的异常（step 的【出错】）

    @classmethod
    def replay(cls, streams, cfg, num_blocks, agree=None, **kw):
        """
        用事先算好的 token 流（streams[i] = 第 i 个请求的输出）代替模型的引擎：只跑调度、块和模型时间。
        投机解码（kw 里有 speculative_config，T = 0）：agree[i] = spec_engine_lab.greedy_agreement 在第 i 个请求输出上的值
        （草稿模型）；prompt lookup 不用它。
        """
        if kw.get("speculative_config") is None:
            return cls(None, cfg, num_blocks, runner=ReplayRunner(streams), **kw)
        eng = cls(None, cfg, num_blocks, runner=ReplayRunner(streams), **kw)
        eng.runner = SpecReplay(eng.spec, streams, agree)
        return eng

    # ---- 请求 ----
    def add_request(self, prompt_ids, max_tokens, temperature=0.0, seed=0, stop=None, *, top_p=1.0, top_k=0, min_p=0.0,
                    logprobs=None):
        """
        排进一个请求 -> request_id（0, 1, 2, …）。

        【参数】top_p、top_k、min_p：decode_lab.adjust 的过滤器（默认关；T = 0 时不改变贪心的选择）；logprobs：None（不要）
        或 0..MAX_LOGPROBS 的整数 k：每个生成的 token 记下它的 logprob 和最大的 k 个（见模块说明的【logprobs】）。
        【边界】（ValueError）空提示、token 越界；max_tokens 不是 ≥ 1 的整数；提示 + max_tokens − 1 超过上下文 max_seq
        （decode_lab 的规则：最后抽出的 token 不用再喂）或超过整个块池；T < 0；seed 不是 ≥ 0 的整数；停止 token 不是 id；
        top_p 不在 (0, 1]、top_k 不是 ≥ −1 的整数、min_p 不在 [0, 1]；logprobs 不是 None 或 0..MAX_LOGPROBS 的整数；
        不跑模型的引擎（replay）要 logprobs。
        """
        cfg = self.cfg
        prompt = [int(t) for t in np.asarray(prompt_ids).ravel()]
        if not prompt:
            raise ValueError("提示至少要有 1 个 token")
        if min(prompt) < 0 or max(prompt) >= cfg.vocab:
            raise ValueError(f"提示里的 token 必须在 0..{cfg.vocab - 1} 之间（收到 {min(prompt)}..{max(prompt)}）")
        if not _is_int(max_tokens, 1):
            raise ValueError(f"max_tokens 必须是 ≥ 1 的整数（收到 {max_tokens!r}）")
        g = 0 if self.spec is None else self.spec.gamma_top        # 投机：最后一轮还多 γ 个草稿位置
        need = len(prompt) + int(max_tokens) - 1 + g
        if need > cfg.max_seq:
            raise ValueError(f"提示 {len(prompt)} + max_tokens {max_tokens} − 1" + (f" + 草稿 {g}" if g else "")
                             + f" = {need} 个位置，超过模型的上下文 max_seq = {cfg.max_seq}")
        if blocks_for(need, self.block_size) > self.num_blocks:
            raise ValueError(f"这个请求最多要 {blocks_for(need, self.block_size)} 块，整个块池只有 {self.num_blocks} 块："
                             "它永远放不进来")
        if not (isinstance(temperature, (int, float, np.floating, np.integer)) and np.isfinite(temperature)
                and temperature >= 0):
            raise ValueError(f"温度 temperature 必须是 ≥ 0 的有限数（0 = 贪心），收到 {temperature!r}")
        if not _is_int(seed, 0):
            raise ValueError(f"seed 必须是 ≥ 0 的整数（收到 {seed!r}）")
        adjust(np.zeros(1), 0.0, top_p=top_p, top_k=top_k, min_p=min_p)      # 检查三个过滤器（ValueError）
        if logprobs is not None:
            if not (_is_int(logprobs, 0) and logprobs <= MAX_LOGPROBS):
                raise ValueError(f"logprobs 必须是 None 或 0..{MAX_LOGPROBS} 的整数，收到 {logprobs!r} / "
                                 f"logprobs must be None or an integer in 0..{MAX_LOGPROBS}")
            if isinstance(self.runner, (ReplayRunner, SpecReplay)):
                raise ValueError("不跑模型的引擎（replay）没有 logits，给不了 logprobs / a replay engine has no logits")
        ids = [] if stop is None else ([stop] if isinstance(stop, (int, np.integer)) else list(stop))
        for t in ids:
            if not _is_int(t, 0):
                raise ValueError(f"停止 token 必须是 ≥ 0 的整数 id（收到 {t!r}）")
        rid = self.requests.n_issued
        req = Request(rid, prompt, int(max_tokens), float(temperature), int(seed), frozenset(int(t) for t in ids),
                      np.random.default_rng(int(seed)), arrival=self.now)
        req.logits = [] if self.keep_logits else None
        req.filters = {"top_p": float(top_p), "top_k": int(top_k), "min_p": float(min_p)}
        if logprobs is not None:
            req.num_logprobs, req.logprobs = int(logprobs), []
        req.hidden = [] if self.keep_hidden else None
        if self.spec is not None:
            init_request(req, self.spec)
        self.requests.add(req)
        self.scheduler.add(req)
        return rid

    def _check_id(self, request_id):
        n = self.requests.n_issued
        if not (_is_int(request_id, 0) and request_id < n):
            raise ValueError(f"没有这个请求 id：{request_id!r}（发过的是 0..{n - 1}）")

    def abort_request(self, request_id):
        """中止一个请求：放掉它的块，下一次 step 报告 (id, [], "abort")（在那之前 has_unfinished_requests() 是 True）。
        已经结束（或已经 release）的请求：什么都不做。
        【边界】从没发过的 id：ValueError。"""
        self._check_id(request_id)
        req = self.requests.get(request_id)
        if req is None or req.finish_reason is not None:
            return
        req.finish_reason = "abort"
        self.scheduler.finish(req)
        self._pending.append((req.id, [], "abort"))

    def has_unfinished_requests(self):
        """还有请求在等、在跑，或者有中止还没由 step() 报告 -> True（所以 while 它: step() 的循环收得到每个结束）。"""
        return bool(self.scheduler.waiting or self.scheduler.running or self._pending)

    def release(self, request_id):
        """
        忘掉一个请求：它的记录（token、时间、logits）从 requests 里拿掉，之后 requests[id] 抛 KeyError、
        abort_request(id) 什么都不做。一直开着的服务器在把结束告诉客户端之后调它，requests 才不会无限长。
        【边界】（ValueError）从没发过的 id；请求还没结束，或结束还没由 step() 报告（中止了、还没 step）；
        已经 release 过的：什么都不做。
        """
        self._check_id(request_id)
        req = self.requests.get(request_id)
        if req is None:
            return
        if req.finish_reason is None or any(e[0] == request_id for e in self._pending):
            raise ValueError(f"请求 {request_id} 还没结束（或它的结束还没由 step() 报告）：不能 release")
        self.requests.pop(request_id)

    @property
    def num_free_blocks(self):
        """空闲的块（引用计数为 0 的缓存块也算：所有请求都结束后，每一块都空闲）。"""
        return self.bm.num_free_blocks

    # ---- 一步 ----
    def step(self):
        """
        一次调度、一次前向 -> [(request_id, 这一步的新 token, finish_reason)]（只列有新 token 或刚结束的请求）。
        没有可算的（只剩待报告的中止，或什么都没有）：不跑模型、不记一步，只报告中止。
        【出错】前向（runner.run）抛 Exception：这一步的每个请求以 "error" 结束（_fail），不记一步，引擎接着能用。
        """
        sch, t0 = self.scheduler, time.perf_counter()
        hits0, pre0 = self.bm.hits, sch.n_preemptions
        spec = self.spec
        spec_on = spec is not None and spec.on(min(len(sch.running) + len(sch.waiting), sch.max_seqs))
        chunks = sch.schedule((spec.gamma_of if spec_on else None) if spec is not None else None)
        if not chunks:
            out, self._pending = self._pending, []
            return out
        t1 = time.perf_counter()
        hid = None
        try:
            if spec is None:
                sampled, logits = self.runner.run(chunks)
                k = np.cumsum([c.sample for c in chunks])          # 第 j 段抽样时用 logits 的第 k[j] − 1 行
                rows = [logits[k[j] - 1:k[j]] if c.sample and logits is not None else None
                        for j, c in enumerate(chunks)]
                if self.keep_hidden:                            # 每段抽样的那一行的隐状态（同 logits 的行）
                    hid = [self.runner.hidden[k[j] - 1] if c.sample else None for j, c in enumerate(chunks)]
            else:
                sampled, rows = self.runner.run(chunks, spec_on)
        except Exception as e:                                 # 模型这一步出错：这一步的请求结束，引擎不死
            return self._fail(chunks, e)
        t2 = time.perf_counter()
        n0 = [len(c.req.tokens) for c in chunks]
        sch.postprocess(chunks, sampled)
        freed = 0
        for c in chunks:                                 # 投机：确认长度以外的整块还给块池
            if c.gamma and c.req.finish_reason is None:
                freed += self.bm.truncate(c.req, len(c.req.tokens))
        t3 = time.perf_counter()
        plan = getattr(self.runner, "plan", None) if spec is not None else None
        if plan is None:
            counts = step_counts(self.cfg, [(c.n, c.start, c.sample) for c in chunks])
            dt = modelled_step_time(counts)
        else:
            dt, counts = spec_step_time(plan, self.cfg, self.draft_cfg)
        prep = getattr(self.runner, "prepare_s", 0.0)
        wall = t3 - t0
        self.now += dt if self.clock == "model" else wall
        rec = {"t": self.now, "dt": dt, "wall": wall, "overhead": (t1 - t0) + (t3 - t2) + prep,
               "tokens": counts["tokens"], "seqs": counts["seqs"],
               "prefill": sum(c.n for c in chunks if not c.decode),
               "decodes": sum(1 for c in chunks if c.decode),
               "chunks": [(c.req.id, c.n, c.decode) for c in chunks],
               "blocks_used": self.num_blocks - self.bm.num_free_blocks,
               "hits": self.bm.hits - hits0, "preempted": sch.n_preemptions - pre0}
        if spec is not None:
            rec.update(spec=spec_on, verified=plan["verified"], wasted=plan["wasted"], freed=freed,
                       draft_passes=len(plan["draft"]))
        self.steps.append(rec)
        out = self._pending
        self._pending = []
        for j, (c, k0, lg) in enumerate(zip(chunks, n0, rows)):
            new = c.req.tokens[k0:]
            if not c.sample or not new:
                continue
            c.req.token_times.extend([self.now] * len(new))
            if self.keep_logits and lg is not None:
                c.req.logits.extend(np.array(lg[i]) for i in range(len(new)))
            if c.req.num_logprobs is not None:                 # 只用抽样的那几行：第 i 个新 token 来自第 i 行
                c.req.logprobs.extend(top_logprobs(lg[i], t, c.req.num_logprobs) for i, t in enumerate(new))
            if hid is not None:
                c.req.hidden.append(np.array(hid[j]))
            out.append((c.req.id, list(new), c.req.finish_reason))
        return out

    def _fail(self, chunks, exc):
        """
        一步的前向抛了异常 -> 这一步要报告的：待报告的中止 + 这一步的每个请求 (id, [], "error")。
        每个请求：finish_reason = "error"，error = 一句中英文的说明（只有异常的类型名：异常的文字可能带着内部的细节，
        服务器把它写进日志，不发给客户端），块放掉、离开队列（scheduler.finish）。这一步写进块里的 KV 只在这些请求自己的
        新块里（命中的前缀块只读不写，没写满的块还没登记进前缀缓存），所以放掉就干净了。
        """
        self.last_error = exc
        out, self._pending = self._pending, []
        msg = (f"engine error in the model step ({type(exc).__name__}); the request was stopped / "
               f"引擎在模型这一步出错（{type(exc).__name__}），请求被中止")
        for c in chunks:
            req = c.req
            if req.finish_reason is not None:
                continue
            req.finish_reason, req.error = "error", msg
            self.scheduler.finish(req)
            out.append((req.id, [], "error"))
        return out

    def generate(self, prompts, max_tokens, temperature=0.0, seed=0, stop=None, *, top_p=1.0, top_k=0, min_p=0.0):
        """
        所有提示一起跑到完 -> 每个提示的新 token 的 list（按提示的顺序）。第 i 个请求的种子是 seed + i：和
        decode_lab.autoregressive_generate(…, np.random.default_rng(seed + i)) 单独生成的抽到同样的 token；投机解码
        （γ 固定、开关关着）时和 speculative_generate(target, draft, prompt, n, γ, T, default_rng(seed + i)) 的相同。
        max_tokens：一个整数，或每个提示一个；top_p、top_k、min_p：每个请求一样的过滤器（add_request）。
        """
        prompts = list(prompts)
        mts = list(max_tokens) if isinstance(max_tokens, (list, tuple, np.ndarray)) else [max_tokens] * len(prompts)
        if len(mts) != len(prompts):
            raise ValueError(f"max_tokens 要么是一个整数，要么每个提示一个（{len(prompts)} 个提示，收到 {len(mts)} 个）")
        ids = [self.add_request(p, m, temperature, seed + i, stop, top_p=top_p, top_k=top_k, min_p=min_p)
               for i, (p, m) in enumerate(zip(prompts, mts))]
        while self.has_unfinished_requests():
            self.step()
        return [list(self.requests[i].output) for i in ids]


def run_trace(engine, trace):
    """
    按到达时间把请求喂进引擎，跑到全部结束 -> 请求 id 的 list。trace：[(到达时间 s, prompt, max_tokens, 其余关键字 dict)]，
    按到达时间排好。引擎空着、下一个请求还没到时，时钟直接跳到它的到达时间。
    """
    ids, i = [], 0
    while i < len(trace) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests() and i < len(trace) and engine.now < trace[i][0]:
            engine.now = trace[i][0]
        while i < len(trace) and trace[i][0] <= engine.now:
            arr, prompt, mt, kw = trace[i]
            rid = engine.add_request(prompt, mt, **kw)
            engine.requests[rid].arrival = arr
            ids.append(rid)
            i += 1
        engine.step()
    return ids


# 解耦的交接（handoff_lab：export_request / import_request 的实现在那里，这里挂到引擎上）
LLMEngine.export_request = export_request
LLMEngine.import_request = import_request

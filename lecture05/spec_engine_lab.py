"""
spec_engine_lab —— 引擎里的投机解码：每个运行中的请求草稿 γ 个 token，一次目标前向验证整个不规则的批，
decode_lab.verify_chain 逐个请求决定接受几个；被拒绝的位置作废、整块还给块池；草稿太贵时按批大小关掉。

【一轮】（engine_lab.LLMEngine(…, speculative_config=…) 每一步调 SpecRunner.run）
  1. 草稿：带 KV 的草稿模型（TransformerLM，例如 drafts_lab 的自草稿）先把这一步各段的 token 补喂进它自己的缓存
     （prefill 的各段、上一轮全部接受时还没喂的最后一个草稿），然后一步一个 token 地草稿 γ 个（各请求一起，一个批）；
     二元语法表（NGramLM）查表；prompt lookup（lookup_lab.PromptLookup）从请求自己的上下文里抄，最多 γ 个。
  2. 验证：目标模型一次前向，每个请求 γ + 1 个位置（上一个 token + γ 个草稿；第一轮是整个提示 + γ 个草稿，
     同 speculative_generate：没有单独的 prefill 抽样）。
  3. 接受 / 拒绝：decode_lab.verify_chain（唯一的一处），每个请求用它自己的随机数发生器。
  4. 回滚：请求的 n_computed 只前进到被接受的长度，后面槽里的 KV 作废（下一轮覆盖）；块表里超出确认长度的整块还给
     块池（BlockManager.truncate：它们从没登记进前缀缓存）；前缀缓存只登记确认过、两个模型的 KV 都写好了的满块。
【和 speculative_generate 逐个 token 相同】γ 固定、开关关着时，每个请求消耗随机数的顺序和 decode_lab.speculative_generate
  一样（γ 个草稿各一个，验证时每检查一个一个，最后一个抽修正 / 额外的 token），每轮都草稿 γ 个（最后一轮也是，
  输出截到 max_tokens），所以 float64 下第 i 个请求的输出等于 speculative_generate(target, draft, prompt, n, γ, T,
  default_rng(seed + i))（测试：T = 0 和 T = 1、几个请求一步、挤出、前缀缓存、停止 token 落在被接受的一段里）。
  prompt lookup 和自适应 γ 对应的是 lookup_lab.speculative_generate_adaptive。
【草稿的缓存为什么用同一张块表】（vLLM 的做法）草稿模型有自己的 K、V 数组（它的层数），按目标的块表、同样的槽写：
  一块同时装着两个模型在这些位置的 KV，块管理器只有一个，引用计数、挤出、前缀缓存、还块都只算一遍，不会出现
  一边有块一边没有。代价：草稿的 KV 和目标的一样按块付内存（块池的块数不变，每块多草稿那几层的字节）。
【开关】disable_by_batch_size = N：这一步的批（运行 + 等待的请求，不超过 max_num_seqs）≥ N 时这一步不投机，
  普通 decode（vLLM v0 的 speculative_disable_by_batch_size，它比的是运行队列的长度）。关掉的那几步草稿模型不跑，
  它的缓存落后，下次投机时补喂；落后期间新写满的块等补上了才登记进前缀缓存。
【自适应 γ】num_speculative_tokens_max 不是 None 时按 lookup_lab 的规则（Hugging Face 的 "heuristic"）：一轮全部接受
  γ + 2（不超过上限），有拒绝 γ − 1（不少于 1），这一轮没有草稿（prompt lookup 找不到）不变。
【统计】每个请求：accepted（每轮接受几个）、drafted（每轮草稿几个）、target_calls（抽过 token 的目标前向次数，
  投机的轮和普通的步都算）；accept_counts 是 gpt-fast 的直方图。每一步：verified（验证的位置 Σ(k + 1)）、
  wasted（被拒绝的草稿位置 Σ(k − n)）、freed（还回去的块）、草稿的几次前向的账（模型时间用）。
【采样的过滤器】请求的 top_p、top_k、min_p 只作用在 p（目标的分布，decode_lab.adjust）上；q 是草稿真正抽样用的分布
  （温度 T，不过滤），接受 / 拒绝和残差都用它，所以输出的分布是过滤过的 p，和 decode_lab.speculative_generate 的规则一样。
p = 目标、q = 草稿（decode_lab 的约定）。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture02", "lecture06"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from transformer_lab import NumpyTransformer, sample_inverse_cdf  # noqa: E402
from decode_lab import NGramLM, adjust, verify_chain  # noqa: E402
from lookup_lab import PromptLookup  # noqa: E402
from runner_lab import ModelRunner, modelled_step_time, step_counts  # noqa: E402

__all__ = ["SpecConfig", "parse_speculative_config", "SpecRunner", "SpecReplay", "accept_counts", "spec_step_time",
           "greedy_agreement"]

KEYS = ("method", "draft_model", "num_speculative_tokens", "disable_by_batch_size", "num_speculative_tokens_max",
        "prompt_lookup_max")


def _is_int(x, lo):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= lo


class SpecConfig:
    """
    解析过的 speculative_config：method（"draft" 或 "ngram"）、draft（草稿模型或 PromptLookup）、gamma（起始 / 固定的 γ）、
    gamma_max（自适应的上限；None = 固定）、disable_by_batch_size（N 或 None）、paged（草稿有自己的分页 KV）。
    """

    def __init__(self, method, draft, gamma, gamma_max, disable_by_batch_size):
        self.method, self.draft, self.gamma, self.gamma_max = method, draft, gamma, gamma_max
        self.disable_by_batch_size = disable_by_batch_size
        self.paged = isinstance(draft, NumpyTransformer)

    @property
    def gamma_top(self):
        """一轮最多几个草稿（块和上下文按它留）。"""
        return self.gamma if self.gamma_max is None else self.gamma_max

    def gamma_of(self, req):
        """
        这一轮给 req 留几个草稿位置：草稿模型是 req.gamma；prompt lookup 先找一遍，找到几个留几个（找不到是 0：
        这一轮是普通的一步，不多占槽和预算——vLLM 也是先算 n-gram 的提议再排这一步）。
        """
        if isinstance(self.draft, PromptLookup):
            return len(self.draft.propose(req.tokens, req.gamma))
        return req.gamma

    def on(self, batch):
        """这一步的批有 batch 个请求时投机吗（开关）。"""
        return self.disable_by_batch_size is None or batch < self.disable_by_batch_size


def parse_speculative_config(d, cfg):
    """
    vLLM 的 speculative_config dict -> SpecConfig。键：method（"draft"：draft_model 是一个模型——TransformerLM（例如
    drafts_lab 的自草稿，可以和目标共用权重）或 NGramLM；"ngram"：prompt lookup，prompt_lookup_max = 匹配的 n，默认 2，
    不要 draft_model）、num_speculative_tokens（γ ≥ 1）、disable_by_batch_size（N ≥ 1 或 None，默认 None）、
    num_speculative_tokens_max（自适应 γ 的上限 ≥ γ，或 None = 固定 γ，默认）。
    【边界】不是 dict、不认识的键、缺 method 或 γ、method 不对、草稿不是模型、词表和目标不同、数不是正整数：ValueError。
    """
    if not isinstance(d, dict):
        raise ValueError(f"speculative_config 必须是 dict 或 None（收到 {type(d).__name__}）")
    bad = sorted(set(d) - set(KEYS))
    if bad:
        raise ValueError(f"speculative_config 里不认识的键 {bad}；能用的是 {list(KEYS)}")
    method = d.get("method")
    if method not in ("draft", "ngram"):
        raise ValueError(f"speculative_config['method'] 只能是 'draft'（草稿模型）或 'ngram'（prompt lookup），收到 {method!r}")
    g = d.get("num_speculative_tokens")
    if not _is_int(g, 1):
        raise ValueError(f"num_speculative_tokens（γ）必须是 ≥ 1 的整数（收到 {g!r}）")
    gmax = d.get("num_speculative_tokens_max")
    if gmax is not None and not (_is_int(gmax, 1) and gmax >= g):
        raise ValueError(f"num_speculative_tokens_max 必须是 None 或 ≥ γ = {g} 的整数（收到 {gmax!r}）")
    n_off = d.get("disable_by_batch_size")
    if n_off is not None and not _is_int(n_off, 1):
        raise ValueError(f"disable_by_batch_size 必须是 None 或 ≥ 1 的整数（收到 {n_off!r}）")
    if method == "ngram":
        if d.get("draft_model") is not None:
            raise ValueError("method 'ngram'（prompt lookup）不用 draft_model：草稿从请求自己的上下文里抄")
        n = d.get("prompt_lookup_max", 2)
        if not _is_int(n, 1):
            raise ValueError(f"prompt_lookup_max 必须是 ≥ 1 的整数（收到 {n!r}）")
        draft = PromptLookup(int(n))
    else:
        if "prompt_lookup_max" in d:
            raise ValueError("prompt_lookup_max 只用于 method 'ngram'")
        draft = d.get("draft_model")
        if not isinstance(draft, (NumpyTransformer, NGramLM)):
            raise ValueError("method 'draft' 要一个 draft_model：TransformerLM（例如 drafts_lab 的草稿）或 NGramLM，"
                             f"收到 {type(draft).__name__}")
        V = draft.cfg.vocab if isinstance(draft, NumpyTransformer) else draft.table.shape[-1]
        if V != cfg.vocab:
            raise ValueError(f"草稿的词表 {V} 和目标的 {cfg.vocab} 不同")
        if isinstance(draft, NumpyTransformer) and draft.cfg.max_seq < cfg.max_seq:
            raise ValueError(f"草稿的上下文 max_seq = {draft.cfg.max_seq} 比目标的 {cfg.max_seq} 短")
    return SpecConfig(method, draft, int(g), None if gmax is None else int(gmax), n_off)


def init_request(req, spec):
    """一个新请求的投机状态：γ、草稿缓存的位置、统计。"""
    req.gamma = spec.gamma
    req.d_computed = 0 if spec.paged else None
    req.accepted, req.drafted, req.target_calls = [], [], 0


def accept_counts(req, gamma_max):
    """一个请求每轮接受几个的直方图（gpt-fast 的 accept_counts）-> int 数组 [gamma_max + 1]。"""
    return np.bincount(np.asarray(req.accepted, dtype=np.int64), minlength=gamma_max + 1)


class _Piece:
    """交给 ModelRunner.forward 的一段：req（用它的块表）、start、n、自带的 toks、要最后 n_out 行的 logits。"""
    __slots__ = ("req", "start", "n", "toks", "n_out", "sample")

    def __init__(self, req, start, toks, n_out):
        self.req, self.start, self.n, self.toks, self.n_out = req, start, len(toks), toks, n_out
        self.sample = n_out > 0


class SpecRunner:
    """
    目标的 ModelRunner + 草稿。run(chunks, spec_on) -> (每段的结果, 每段的 logits 行)：结果是 None（不抽样）、一个 token
    （普通的一步）或一轮留下的 token 的 list；logits 行是抽出那几个 token 时目标的 logits [m, V]（不抽样是 None）。
    self.plan：这一步的账（target：目标前向的各段 (n, start, 行数)；draft：草稿每次前向的各段；verified、wasted）。
    """

    def __init__(self, target_runner, spec, num_blocks, block_size):
        self.target, self.spec = target_runner, spec
        self.draft = ModelRunner(spec.draft, spec.draft.cfg, num_blocks, block_size) if spec.paged else None
        self.plan = None

    # ---- 草稿 ----
    def _draft_model(self, chunks, act):
        """带 KV 的草稿：补喂各段，然后一步一个 token 草稿 -> {段号: (草稿, q 的 list)}。"""
        out = {k: ([], []) for k in act}
        pieces, owners, subs = [], [], []
        for k, c in enumerate(chunks):
            req, end = c.req, c.start + c.n
            if end > req.d_computed:
                pieces.append(_Piece(req, req.d_computed, req.tokens[req.d_computed:end], 1 if k in act else 0))
                if k in act:
                    owners.append(k)
            req.d_computed = end
        j = 0
        while pieces:
            subs.append([(p.n, p.start, p.n_out) for p in pieces])
            logits = self.draft.forward(pieces)
            pieces, nxt = [], []
            for k, row in zip(owners, logits):
                c = chunks[k]
                q = adjust(row, c.req.temperature)
                x = int(sample_inverse_cdf(q, c.req.rng.random()))
                out[k][0].append(x)
                out[k][1].append(q)
                if j + 1 < act[k]:                     # 还要草稿：把 x 喂进去
                    pos = c.start + c.n + j
                    pieces.append(_Piece(c.req, pos, [x], 1))
                    c.req.d_computed = pos + 1
                    nxt.append(k)
            owners, j = nxt, j + 1
        return out, subs

    def _draft_table(self, chunks, act):
        """二元语法表：q = table[上一个 token] -> {段号: (草稿, q 的 list)}。"""
        out = {}
        for k, g in act.items():
            c, xs, qs = chunks[k], [], []
            for _ in range(g):
                q = adjust(self.spec.draft.table[xs[-1] if xs else c.req.tokens[-1]], c.req.temperature)
                xs.append(int(sample_inverse_cdf(q, c.req.rng.random())))
                qs.append(q)
            out[k] = (xs, qs)
        return out

    def _draft_lookup(self, chunks, act, V):
        """prompt lookup：最多 γ 个抄来的 token，q 是 one-hot（不用随机数）。"""
        out = {}
        for k, g in act.items():                       # 调度时已经找过一遍（gamma_of），同样的上下文、同样的结果
            xs = self.spec.draft.propose(chunks[k].req.tokens, g)
            out[k] = (xs, [np.eye(1, V, x)[0] for x in xs])
        return out

    # ---- 一步 ----
    def run(self, chunks, spec_on=True):
        V = self.target.cfg.vocab
        act = {k: c.gamma for k, c in enumerate(chunks) if c.sample and c.gamma}
        subs = []
        if self.draft is not None and spec_on:
            drafts, subs = self._draft_model(chunks, act)
        elif isinstance(self.spec.draft, NGramLM):
            drafts = self._draft_table(chunks, act)
        else:
            drafts = self._draft_lookup(chunks, act, V)
        pieces = []
        for k, c in enumerate(chunks):
            xs = drafts[k][0] if k in act else []
            pieces.append(_Piece(c.req, c.start, c.req.tokens[c.start:c.start + c.n] + xs,
                                 len(xs) + 1 if c.sample else 0))
        logits = self.target.forward(pieces)
        results, rows, r = [], [], 0
        verified = wasted = 0
        for k, (c, p) in enumerate(zip(chunks, pieces)):
            if not c.sample:
                results.append(None)
                rows.append(None)
                continue
            lg, r = logits[r:r + p.n_out], r + p.n_out
            ps = adjust(lg, c.req.temperature, **c.req.filters)       # 过滤器只作用在 p 上；q 是草稿自己的
            c.req.target_calls += 1
            if k not in act:                           # 普通的一步：同 runner_lab 的抽样（= verify_chain 在 k = 0 时）
                results.append(int(sample_inverse_cdf(ps[0], c.req.rng.random())))
                rows.append(lg)
                if spec_on:                            # 投机开着、prompt lookup 没找到：记一轮（草稿 0 个）
                    self._after_round(c.req, 0, 0)
                continue
            xs, qs = drafts[k]
            n, tok = verify_chain(ps, qs, xs, c.req.rng)
            results.append(xs[:n] + [tok])
            rows.append(lg[:n + 1])
            self._after_round(c.req, len(xs), n)
            verified, wasted = verified + len(xs) + 1, wasted + len(xs) - n
        self.plan = {"target": [(p.n, p.start, p.n_out) for p in pieces], "draft": subs,
                     "verified": verified, "wasted": wasted}
        return results, rows

    def _after_round(self, req, k, n):
        """记下一轮，按自适应规则定下一轮的 γ。"""
        req.accepted.append(n)
        req.drafted.append(k)
        gmax = self.spec.gamma_max
        if gmax is not None and k > 0:
            req.gamma = min(req.gamma + 2, gmax) if n == k else max(req.gamma - 1, 1)


def greedy_agreement(target_logits, draft_logits):  # [L, V], [L, V] -> [L] bool
    """
    T = 0 时草稿在每个位置的"命中"：a[t] = 草稿在真实前缀 t 上的 argmax == 目标的（贪心序列的下一个 token）。

    【推导】T = 0 时草稿从前缀 t 开始的 γ 个 token 里，前 m 个都等于目标的贪心 token，当且仅当 a[t..t+m−1] 全为真
    （第一个对了，草稿的第二步看到的前缀就是真实的前缀 t + 1，依此类推）。所以一轮接受几个 = 从当前位置起连续为真的
    个数（不超过 γ）：目标和草稿各在贪心序列上前向一次，就定下了任何 γ、任何批、任何到达时刻下每一轮的结果。
    """
    return np.asarray(target_logits).argmax(-1) == np.asarray(draft_logits).argmax(-1)


class SpecReplay:
    """
    不跑模型的投机引擎（T = 0）：streams[id] = 请求的贪心输出；agree[id] = greedy_agreement 在输出各位置的值
    （草稿模型），或 None（prompt lookup：在请求自己的 token 上调 propose，和流比）。一轮接受几个由它们定下，
    账（plan）和 SpecRunner 一样算，所以扫到达率时只重跑调度、块和模型时间。测试断言它和真的 SpecRunner 一步一步相同。
    流要比 max_tokens 长 γ 个：最后一轮也验证 γ 个草稿（输出截到 max_tokens），它接受几个要看后面的 token；
    流不够长时只有最后一轮的 accepted / wasted 少记（token、块、时间都不变）。
    """

    def __init__(self, spec, streams, agree=None):
        self.spec, self.streams, self.agree = spec, streams, agree
        self.plan = None

    def run(self, chunks, spec_on=True):
        results, subs = [], []
        act = {k: c.gamma for k, c in enumerate(chunks) if c.sample and c.gamma}
        if self.spec.paged and spec_on:                # 草稿的几次前向：形状同 SpecRunner._draft_model
            first = []
            for k, c in enumerate(chunks):
                end = c.start + c.n
                if end > c.req.d_computed:
                    first.append((end - c.req.d_computed, c.req.d_computed, 1 if k in act else 0))
                c.req.d_computed = end
            subs = [first] if first else []
            for j in range(1, max(act.values(), default=0)):
                subs.append([(1, chunks[k].start + chunks[k].n + j - 1, 1) for k, g in act.items() if j < g])
            for k, g in act.items():
                chunks[k].req.d_computed = chunks[k].start + chunks[k].n + g - 1
        target, verified, wasted = [], 0, 0
        for k, c in enumerate(chunks):
            req, o = c.req, len(c.req.output)
            s = self.streams[req.id]
            if not c.sample:
                results.append(None)
                target.append((c.n, c.start, 0))
                continue
            req.target_calls += 1
            if k not in act:
                results.append(s[o])
                target.append((c.n, c.start, 1))
                if spec_on:
                    SpecRunner._after_round(self, req, 0, 0)
                continue
            if self.agree is None:
                xs = self.spec.draft.propose(req.tokens, act[k])
                kk = len(xs)
                n = next((i for i, x in enumerate(xs) if o + i >= len(s) or x != s[o + i]), kk)
            else:
                kk, a = act[k], self.agree[req.id]
                n = next((i for i in range(kk) if o + i >= len(a) or not a[o + i]), kk)
            results.append(list(s[o:o + n + 1]))
            target.append((c.n + kk, c.start, kk + 1))
            SpecRunner._after_round(self, req, kk, n)
            verified, wasted = verified + kk + 1, wasted + kk - n
        self.plan = {"target": target, "draft": subs, "verified": verified, "wasted": wasted}
        return results, [None] * len(chunks)


def spec_step_time(plan, cfg, draft_cfg=None, cost=None):
    """
    一步投机的模型时间（秒）= 草稿每次前向的 runner_lab.modelled_step_time + 目标一次前向的 -> (秒, 目标的账 dict)。
    草稿没有模型（prompt lookup、二元语法表）时草稿不计时间（查表、找匹配比一次前向小几个数量级：假设）。
    """
    counts = step_counts(cfg, plan["target"])
    dt = modelled_step_time(counts, cost)
    if draft_cfg is not None:
        dt += sum(modelled_step_time(step_counts(draft_cfg, sub), cost) for sub in plan["draft"])
    return dt, counts

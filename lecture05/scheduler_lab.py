"""
scheduler_lab —— 引擎的调度：等待队列和运行队列（先来先服务）、每步的 token 预算和并发上限、分块 prefill 和 decode
混在同一步（Sarathi-Serve）、块不够时挤出最后进来的请求、回来再算（vLLM 的默认做法）、停止 token、max_tokens、中止。

【一步的规则】（schedule）预算 = max_num_batched_tokens 个 token：
  1. 先给运行中的请求，按进来的先后：每个要算 len(tokens) − n_computed 个（decode 是 1 个；prefill 没算完的是剩下的
     提示，截到剩下的预算——分块 prefill）。块不够时挤出运行队列里最后进来的请求（放掉它的块，它带着已经生成的
     token 回到等待队列的最前面，n_computed 归 0，之后再 prefill 一遍）；挤到的是自己就停。再 prefill 要算多少看前缀
     缓存：关着时全部重算；开着时（默认）它放掉的块里写满的那些仍带着键留在空闲表里（block_manager_lab），
     没被别人拿走的在它回来时照样命中，只重算其余的——08 演示 3 量了开和关。vLLM V1 也这样：挤出
     （vllm/v1/core/sched/scheduler.py 的 _preempt_request）调 kv_cache_manager.free，块回到空闲队列、哈希留着，
     直到被拿去重用。
  2. 这一步没有挤出过请求、运行的请求数 < max_num_seqs 时，再从等待队列头按先后放人：前缀缓存命中的满块不用算；
     剩下的截到预算；块不够就停（不插队）。
  postprocess 收下这一步抽出的 token：追加、登记写满的块、按停止 token / max_tokens 结束并放掉块。
【投机解码】（spec_engine_lab）schedule(gamma_of) 时，要抽样的段（decode，或 prefill 的最后一段）多算 γ 个草稿位置：
  块表补到 n_computed + n + γ，预算扣 n + γ；一整轮放不进预算时，先算 prefill 的一段（不含最后一个 token），
  连最后一个也放不下就停（不插队）。postprocess 收下一轮的几个 token（被接受的草稿 + 修正 / 额外的 token）。
【出处】Sarathi-Serve（Agrawal et al., OSDI 2024, arXiv 2403.02310）；vLLM 的 recompute 挤出（V1 的 _preempt_request）；
nano-vllm scheduler.py。
"""
from collections import deque

from block_manager_lab import BlockManager

__all__ = ["Request", "Scheduler", "ScheduledChunk"]


class Request:
    """
    一个请求自己的状态：tokens（提示 + 已生成）、n_prompt、n_computed（KV 已写进块里的 token 数）、block_table、
    max_tokens、temperature、seed 和它自己的随机数发生器、stop（停止 token 的集合）、时间戳（到达、每个 token 的时间）；
    filters：decode_lab.adjust 的过滤器 {"top_p", "top_k", "min_p"}（默认全关）；num_logprobs：每个生成的 token 要几个
    top logprobs（None = 不要）、logprobs：记下的 logprobs（engine_lab 填）；error：出错时的一句话（engine_lab 填）。
    """

    def __init__(self, rid, prompt, max_tokens, temperature, seed, stop, rng, arrival=0.0):
        self.id, self.tokens, self.n_prompt = rid, list(prompt), len(prompt)
        self.max_tokens, self.temperature, self.seed, self.stop, self.rng = max_tokens, temperature, seed, stop, rng
        self.n_computed, self.block_table, self.n_cached_blocks = 0, [], 0
        self.d_computed = None          # 草稿模型的 KV 已写到哪（没有带缓存的草稿时是 None；spec_engine_lab）
        self.gamma = 0                  # 下一轮草稿几个（0 = 不投机）
        self.finish_reason = None
        self.arrival, self.token_times = arrival, []
        self.n_preempted = 0
        self.filters = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}
        self.num_logprobs, self.logprobs, self.error = None, None, None

    @property
    def output(self):
        return self.tokens[self.n_prompt:]

    @property
    def max_len(self):
        """这个请求最多同时存着 KV 的 token 数：提示 + max_tokens − 1（最后一个 token 不用再喂）。"""
        return self.n_prompt + self.max_tokens - 1


class ScheduledChunk:
    """
    一步里一个请求要算的一段：req、start（= 它的 n_computed）、n（token 数）；sample = 这一段算完后要不要抽下一个 token；
    gamma = 这一段后面再接几个草稿位置一起验证（投机解码；0 = 不投机）。
    """
    __slots__ = ("req", "start", "n", "sample", "decode", "gamma")

    def __init__(self, req, start, n, gamma=0):
        self.req, self.start, self.n, self.gamma = req, start, n, gamma
        self.sample = start + n == len(req.tokens)
        self.decode = n == 1 and self.sample and start >= req.n_prompt          # decode：喂上一步抽出的 token


class Scheduler:
    """等待 / 运行两个队列 + 一个 BlockManager。schedule() -> 这一步的 ScheduledChunk 列表；postprocess() 收尾。"""

    def __init__(self, block_manager: BlockManager, max_num_batched_tokens, max_num_seqs):
        self.bm, self.budget, self.max_seqs = block_manager, max_num_batched_tokens, max_num_seqs
        self.waiting, self.running = deque(), []
        self.n_preemptions = 0

    def add(self, req):
        self.waiting.append(req)

    def can_admit(self):
        """还有一个序列的空位（运行的请求数 < max_num_seqs）-> True。"""
        return len(self.running) < self.max_seqs

    def admit(self, req):
        """
        一个 KV 已经在块里的请求（解耦：从 prefill 那边交过来的，LLMEngine.import_request）直接进运行队列的尾部
        （它是最新的：块不够时最先被挤出）；下一步它是一个 decode。不挤出别人、不插队：没有空位就不收。
        -> True（收下）/ False（没有序列的空位）。调用者先填好 req.block_table、n_computed。
        """
        if not self.can_admit():
            return False
        assert req.n_computed == len(req.tokens) - 1 and req.block_table
        self.running.append(req)
        return True

    def _preempt(self, req):
        """挤出：放掉块，n_computed 归零，带着已生成的 token 回到等待队列最前面（之后重算）。"""
        self.bm.free(req)
        req.n_computed = 0
        if req.d_computed is not None:
            req.d_computed = 0
        req.n_preempted += 1
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.n_preemptions += 1

    @staticmethod
    def _fit(req, start, budget, g):
        """这一步算几个 token、接几个草稿 -> (n, γ)；n = 0：这个请求这一步放不下。"""
        rem = len(req.tokens) - start
        if g and rem + g > budget:                     # 一整轮放不下：先算 prefill 的一段，留下最后一个 token
            return min(rem - 1, budget), 0
        return min(rem, budget), (g if rem <= budget else 0)

    def schedule(self, gamma_of=None):
        """
        一步要算的段（先运行中的，再新放进来的）-> list[ScheduledChunk]；预算和块都按上面的规则扣。
        gamma_of(req) -> 这一步它草稿几个（None = 都不投机）。
        """
        bm, budget, out = self.bm, self.budget, []
        g_of = gamma_of or (lambda r: 0)
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n, g = self._fit(req, req.n_computed, budget, g_of(req))
            if n == 0:
                break                                  # 预算放不下它的一整轮：不插队
            while bm.slots_needed(req, req.n_computed + n + g) > bm.num_free_blocks:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                bm.append_slots(req, req.n_computed + n + g)
                out.append(ScheduledChunk(req, req.n_computed, n, g))
                budget -= n + g
                i += 1
                continue
            break                                      # 挤到了自己
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_seqs:
            req = self.waiting[0]
            hits = bm.match_prefix(req.tokens)
            start = len(hits) * bm.block_size
            n, g = self._fit(req, start, budget, g_of(req))
            if n == 0 or not bm.can_allocate(hits, start + n + g):
                break
            self.waiting.popleft()
            bm.allocate(req, hits, start + n + g)
            req.n_computed = start
            if req.d_computed is not None:
                req.d_computed = start                 # 命中的块里草稿的 KV 也在（只登记两边都写好的块）
            self.running.append(req)
            out.append(ScheduledChunk(req, start, n, g))
            budget -= n + g
        return out

    def postprocess(self, chunks, sampled):
        """
        收下一步的结果：sampled[k] = 第 k 段抽出的 token（不抽的段是 None；投机的一轮是几个 token 的 list：被接受的草稿
        + 修正 / 额外的 token）。-> 结束了的请求的 list。

        n_computed 前进 n（一轮投机再加被接受的草稿数：它们的 KV 这一步已经写好）；抽出的 token 追加到 tokens（逐个：
        抽到停止 token 结束（"stop"，它是返回的最后一个 token），生成满 max_tokens 个结束（"length"），后面的丢掉）；
        写满的块登记进前缀缓存（有带缓存的草稿时只登记两边的 KV 都写好了的）；结束的放掉块、离开运行队列。
        """
        done = []
        for c, got in zip(chunks, sampled):
            req = c.req
            toks = [] if got is None else ([got] if isinstance(got, int) else list(got))
            req.n_computed += c.n + max(0, len(toks) - 1)
            for tok in toks:
                req.tokens.append(int(tok))
                if tok in req.stop:                    # 先查停止 token：它正好是第 max_tokens 个时也是 "stop"
                    req.finish_reason = "stop"
                elif len(req.tokens) - req.n_prompt >= req.max_tokens:
                    req.finish_reason = "length"
                if req.finish_reason is not None:
                    break
            req.n_computed = min(req.n_computed, len(req.tokens) - 1 if toks else req.n_computed)   # 截掉的不算
            if req.d_computed is not None:
                req.d_computed = min(req.d_computed, req.n_computed)   # 草稿被拒绝的位置作废
            self.bm.commit_full(req, req.tokens, req.n_computed if req.d_computed is None
                                else req.d_computed)
            if req.finish_reason is not None:
                self.finish(req)
                done.append(req)
        return done

    def finish(self, req):
        """放掉块、离开它所在的队列。"""
        self.bm.free(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

"""
scheduler_lab —— 引擎的调度：等待队列和运行队列（先来先服务）、每步的 token 预算和并发上限、分块 prefill 和 decode
混在同一步（Sarathi-Serve）、块不够时挤出最后进来的请求重算（vLLM 的默认做法）、停止 token、max_tokens、中止。

【一步的规则】（schedule）预算 = max_num_batched_tokens 个 token：
  1. 先给运行中的请求，按进来的先后：每个要算 len(tokens) − n_computed 个（decode 是 1 个；prefill 没算完的是剩下的
     提示，截到剩下的预算——分块 prefill）。块不够时挤出运行队列里最后进来的请求（放掉它的块，它带着已经生成的
     token 回到等待队列的最前面，之后从头 prefill：重算）；挤到的是自己就停。
  2. 这一步没有挤出过请求、运行的请求数 < max_num_seqs 时，再从等待队列头按先后放人：前缀缓存命中的满块不用算；
     剩下的截到预算；块不够就停（不插队）。
  postprocess 收下这一步抽出的 token：追加、登记写满的块、按停止 token / max_tokens 结束并放掉块。
【出处】Sarathi-Serve（Agrawal et al., OSDI 2024, arXiv 2403.02310）；vLLM 的 recompute 挤出；nano-vllm scheduler.py。
"""
from collections import deque

from block_manager_lab import BlockManager

__all__ = ["Request", "Scheduler", "ScheduledChunk"]


class Request:
    """
    一个请求自己的状态：tokens（提示 + 已生成）、n_prompt、n_computed（KV 已写进块里的 token 数）、block_table、
    max_tokens、temperature、seed 和它自己的随机数发生器、stop（停止 token 的集合）、时间戳（到达、每个 token 的时间）。
    """

    def __init__(self, rid, prompt, max_tokens, temperature, seed, stop, rng, arrival=0.0):
        self.id, self.tokens, self.n_prompt = rid, list(prompt), len(prompt)
        self.max_tokens, self.temperature, self.seed, self.stop, self.rng = max_tokens, temperature, seed, stop, rng
        self.n_computed, self.block_table, self.n_cached_blocks = 0, [], 0
        self.finish_reason = None
        self.arrival, self.token_times = arrival, []
        self.n_preempted = 0

    @property
    def output(self):
        return self.tokens[self.n_prompt:]

    @property
    def max_len(self):
        """这个请求最多同时存着 KV 的 token 数：提示 + max_tokens − 1（最后一个 token 不用再喂）。"""
        return self.n_prompt + self.max_tokens - 1


class ScheduledChunk:
    """一步里一个请求要算的一段：req、start（= 它的 n_computed）、n（token 数）；sample = 这一段算完后要不要抽下一个 token。"""
    __slots__ = ("req", "start", "n", "sample", "decode")

    def __init__(self, req, start, n):
        self.req, self.start, self.n = req, start, n
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

    def _preempt(self, req):
        """挤出：放掉块，n_computed 归零，带着已生成的 token 回到等待队列最前面（之后重算）。"""
        self.bm.free(req)
        req.n_computed = 0
        req.n_preempted += 1
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.n_preemptions += 1

    def schedule(self):
        """一步要算的段（先运行中的，再新放进来的）-> list[ScheduledChunk]；预算和块都按上面的规则扣。"""
        bm, budget, out = self.bm, self.budget, []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(len(req.tokens) - req.n_computed, budget)
            while bm.slots_needed(req, req.n_computed + n) > bm.num_free_blocks:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                bm.append_slots(req, req.n_computed + n)
                out.append(ScheduledChunk(req, req.n_computed, n))
                budget -= n
                i += 1
                continue
            break                                      # 挤到了自己
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_seqs:
            req = self.waiting[0]
            hits = bm.match_prefix(req.tokens)
            start = len(hits) * bm.block_size
            n = min(len(req.tokens) - start, budget)
            if not bm.can_allocate(hits, start + n):
                break
            self.waiting.popleft()
            bm.allocate(req, hits, start + n)
            req.n_computed = start
            self.running.append(req)
            out.append(ScheduledChunk(req, start, n))
            budget -= n
        return out

    def postprocess(self, chunks, sampled):
        """
        收下一步的结果：sampled[k] = 第 k 段抽出的 token（不抽的段是 None）。-> 结束了的请求的 list。

        n_computed 前进 n；抽出的 token 追加到 tokens；写满的块登记进前缀缓存；抽到停止 token 结束（"stop"，
        它是返回的最后一个 token），生成满 max_tokens 个结束（"length"）；结束的放掉块、离开运行队列。
        """
        done = []
        for c, tok in zip(chunks, sampled):
            req = c.req
            req.n_computed += c.n
            self.bm.commit_full(req, req.tokens, req.n_computed)
            if tok is None:
                continue
            req.tokens.append(tok)
            if tok in req.stop:
                req.finish_reason = "stop"
            elif len(req.tokens) - req.n_prompt >= req.max_tokens:
                req.finish_reason = "length"
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

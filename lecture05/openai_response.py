"""
openai_response —— serve.py 的 OpenAI 回答：引擎给的 token（和 log-probabilities）进来，OpenAI 的 JSON 出去。

token_bytes_table（每个 id 进文字的字节）、TextStream（增量 UTF-8 和停止串）、LogprobFormat（两个接口的 logprobs 形状）、
Completion（一个请求的回答：流式的块、不流式的整个 JSON、usage、finish_reason）。不碰网络、不碰引擎线程。
"""
import codecs

from bpe_lab import SPECIAL_TOKEN_TYPES


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
# 回答的形状：log-probabilities
# ---------------------------------------------------------------------------
class LogprobFormat:
    """引擎的 (chosen_logprob, [(id, logprob) …前 k 个]) -> OpenAI 的两种形状。token 的字符串：它的字节按 UTF-8 解
    （不完整的字节是 U+FFFD；确切的字节在 chat 的 bytes 里）；特殊 token 用它的名字（例如 "<|im_end|>"）。"""

    def __init__(self, tok, tbytes):
        self.tok, self.tbytes = tok, tbytes

    def token_str(self, i):
        b = self.tbytes[i]
        return b.decode("utf-8", "replace") if b else self.tok.tokens[i]

    def _one(self, i, lp):
        return {"token": self.token_str(i), "logprob": float(lp), "bytes": list(self.tbytes[i] or
                                                                                 self.token_str(i).encode("utf-8"))}

    def chat(self, ids, entries):
        """-> choices[].logprobs.content 的一段：[{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]。"""
        return [dict(self._one(i, lp), top_logprobs=[self._one(j, v) for j, v in top])
                for i, (lp, top) in zip(ids, entries)]

    def completion(self, ids, entries, offsets):
        """-> choices[].logprobs：{tokens, token_logprobs, top_logprobs（每个位置一个 {token: logprob}，前 k 个 + 抽中的）,
        text_offset（每个 token 在回答文字里从第几个字符开始）}。"""
        tops = []
        for i, (lp, top) in zip(ids, entries):
            d = {self.token_str(j): float(v) for j, v in top}
            d.setdefault(self.token_str(i), float(lp))
            tops.append(d)
        return {"tokens": [self.token_str(i) for i in ids], "token_logprobs": [float(e[0]) for e in entries],
                "top_logprobs": tops, "text_offset": list(offsets)}


# ---------------------------------------------------------------------------
# 一个请求的回答
# ---------------------------------------------------------------------------
class Completion:
    """
    一个请求的回答。feed(tokens, reason, logprobs) 每次喂引擎的一个事件 -> (流式要发的块或 None, 是否碰到了停止串)；
    之后 reason 是 finish_reason（None = 还没完）。opening() / closing() 是流开头和结尾的块；final() 是不流式的 JSON。

    【规则】停止 token 不进文字：事件结束（"stop" 或 "length"）、最后一个 token 是停止 token 时去掉它，finish_reason 是
    "stop"（第 max_tokens 个正好是停止 token 时，调度器先查长度的话会说 "length"：这里一样是 "stop"）。停止串凑齐时，
    文字截在它前面、finish_reason "stop"、token 数到凑齐它的那个（调用者要叫引擎中止）。usage 的 completion_tokens 含
    停止 token。logprobs 每个进了文字的 token 一项；completions 的 text_offset 是它之前的文字有几个字符。
    """

    def __init__(self, req, rid, model_name, created, tbytes, lpfmt):
        self.req, self.rid, self.model, self.created, self.lpfmt = req, rid, model_name, created, lpfmt
        self.ts, self.stop_ids = TextStream(tbytes, req.stops), set(req.stop_ids)
        self.obj = "chat.completion" if req.chat else "text_completion"
        self.n_out, self.reason = 0, None
        self.ids, self.lps, self.offs = [], [], []

    def _logprobs(self, ids, lps, offs):
        if self.req.logprobs is None:
            return None
        return {"content": self.lpfmt.chat(ids, lps)} if self.req.chat else self.lpfmt.completion(ids, lps, offs)

    def usage(self):
        n = len(self.req.prompt_ids)
        return {"prompt_tokens": n, "completion_tokens": self.n_out, "total_tokens": n + self.n_out}

    def chunk(self, text=None, finish=None, usage=False, role=False, lp=None):
        """一个流式的块（chat.completion.chunk 或 text_completion）。"""
        if self.req.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
        c = {"id": self.rid, "object": self.obj + ".chunk" if self.req.chat else self.obj, "created": self.created,
             "model": self.model, "choices": [] if usage else [choice]}
        if self.req.include_usage:
            c["usage"] = self.usage() if usage else None
        return c

    def opening(self):
        return [self.chunk(role=True)] if self.req.chat else []

    def closing(self):
        return [self.chunk(finish=self.reason)] + ([self.chunk(usage=True)] if self.req.include_usage else [])

    def feed(self, tokens, reason, logprobs=None):
        toks, ts = list(tokens), self.ts
        lps = logprobs if logprobs is not None else [None] * len(toks)
        feed = toks
        if reason in ("stop", "length") and toks and toks[-1] in self.stop_ids:
            feed, reason = toks[:-1], "stop"                  # 停止 token 不进文字
        text, hit, ids, k_lps, offs = "", False, [], [], []
        for k, t in enumerate(feed):                         # 一个一个喂：停止串凑齐时知道是第几个 token
            offs.append(len(ts.text))
            piece, hit = ts.feed([t])
            text += piece
            ids.append(t)
            k_lps.append(lps[k])
            if hit:
                break
        if hit:
            self.n_out += len(ids)
            self.reason = "stop"
        else:
            self.n_out += len(toks)
            self.reason = reason
            if reason is not None:
                text += ts.finish()
        self.ids += ids
        self.lps += k_lps
        self.offs += offs
        piece = None
        if self.req.stream and (text or (self.req.logprobs is not None and ids)):
            piece = self.chunk(text, lp=self._logprobs(ids, k_lps, offs))
        return piece, hit

    def final(self):
        """不流式的整个回答（chat.completion 或 text_completion）。"""
        text, lp = self.ts.text, self._logprobs(self.ids, self.lps, self.offs)
        if self.req.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                      "finish_reason": self.reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": self.reason}
        return {"id": self.rid, "object": self.obj, "created": self.created, "model": self.model, "choices": [choice],
                "usage": self.usage()}

"""
openai_protocol —— serve.py 的 OpenAI 请求：请求体的解析和检查、错误体（回答的形状在 openai_response）。

不碰网络、不碰引擎线程：一个请求体（已解析的 JSON）进来，一个 GenRequest（或一个 ApiError）出去。

【支持的字段】model、messages（role：system / developer（当 system）/ user / assistant（content 可以是 null））、
prompt（字符串或 token id 的列表）、max_tokens / max_completion_tokens、temperature、top_p、top_k、min_p（vLLM 的扩展）、
seed、stop、stop_token_ids、ignore_eos（vLLM 的扩展）、stream、stream_options.include_usage、logprobs（chat：true/false，
配 top_logprobs 0..20；completions：0..20 的整数）、user（不影响输出）。
【认识但不支持的字段】（UNSUPPORTED）只收它们的默认值（n: 1、tools: null、response_format: {"type": "text"}……），别的值
400、点名字段——决不假装做了。【不认识的字段】收下、不用，记进 GenRequest.ignored（服务器的日志点名，同 vLLM）。
【错误】ApiError 的 message 先英文、再中文（OpenAI 的客户端把 message 原样打印给用户）。
"""
import math
import secrets

from block_manager_lab import blocks_for
from bpe_lab import SPECIAL_TOKEN_TYPES

MAX_STOP = 4                # stop 最多几个字符串（OpenAI 的上限）
MAX_TOP_LOGPROBS = 20       # top_logprobs / logprobs 的上限（OpenAI chat 的上限 20；vLLM 的默认上限也是 20）


# ---------------------------------------------------------------------------
# 错误
# ---------------------------------------------------------------------------
class ApiError(Exception):
    """一个要回给客户端的错误：HTTP 状态码 + OpenAI 的错误体。message = 英文 + " / " + 中文，前面点名字段。"""

    def __init__(self, status, en, zh="", param=None, type_="invalid_request_error", code=None):
        message = en + (f" / {zh}" if zh else "")
        if param is not None and not message.startswith(param):
            message = f"{param}: {message}"
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ---------------------------------------------------------------------------
# 提示：文字的检查、一个便宜的 token 数下界、ChatML
# ---------------------------------------------------------------------------
def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_text(s, where, param):
    """s 能编成 UTF-8 吗（JSON 的 "\\ud800" 解出来是一个孤立代理，不是合法的 Unicode）-> s；不能：ApiError 400。"""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{where} has a lone surrogate U+{ord(s[e.start]):04X} at character {e.start}: "
                            "not valid Unicode text",
                       f"{where} 第 {e.start} 个字符是孤立代理，不是合法的 Unicode 文本", param) from None
    return s


class TokenBound:
    """
    一段文字至少切成几个 token 的便宜下界（不切词，O(字节数)）：分词器有 min_tokens（bpe_lab：按字节的类别算，更紧）
    就用它，否则用下面这个。
    【推导】每个 token 最多 max_len 个字节（特殊 token 按它的字符串算）；词表里没有单字节 token 的字节切词时被丢掉
    （HF tokenizers 没有 unk_token 时的做法），不算。所以 token 数 ≥ ⌈(字节数 − 丢掉的字节数) / max_len⌉。
    chat 的消息按普通文本切（特殊 token 的字符串不变成一个 id），切出来只会更多：下界照样成立。
    """

    def __init__(self, tok, tbytes):
        self.min_tokens = getattr(tok, "min_tokens", None)
        self.max_len = max(max(len(b) for b in tbytes),
                           max((len(t.encode("utf-8")) for i, t in enumerate(tok.tokens)
                                if tok.token_types[i] in SPECIAL_TOKEN_TYPES), default=1))
        self.dropped = bytes(getattr(tok, "missing_bytes", ()) or ())

    def __call__(self, text):
        if self.min_tokens is not None:
            return self.min_tokens(text)
        b = text.encode("utf-8", "replace")
        n = len(b) - (len(b) - len(b.translate(None, self.dropped)) if self.dropped else 0)
        return -(-n // self.max_len)


def chat_prompt_ids(tok, messages):
    """messages -> 提示的 id（ChatML：每条 <|im_start|>{role}\\n{content}<|im_end|>\\n，最后 <|im_start|>assistant\\n）。"""
    ids = []
    for role, c in check_messages(messages):
        ids += [tok.im_start_id] + tok.encode(f"{role}\n{c}", parse_special=False) + [tok.im_end_id]
        ids += tok.encode("\n")
    return ids + [tok.im_start_id] + tok.encode("assistant\n")


def check_messages(messages):
    """messages -> [(ChatML 的 role, 文字)]。developer 当 system；assistant 的 content 可以是 null（当空串）；
    tool / function 的消息 400（这个服务器不调工具）。格式不对抛 ApiError（param = "messages"）。"""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {\"role\": ..., \"content\": ...}",
                       "messages 必须是一个不空的列表（每项 {\"role\": ..., \"content\": ...}）", "messages")
    out = []
    for k, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role in ("tool", "function"):
            raise ApiError(400, f"messages[{k}] has role {role!r}: this server does not support tool calling, "
                                "so there are no tool results to send back",
                           f"messages[{k}] 的 role 是 {role!r}：这个服务器不支持调用工具，没有工具的结果可回", "messages")
        if role not in ("system", "developer", "user", "assistant"):
            raise ApiError(400, f"messages[{k}] must be an object whose role is \"system\", \"developer\", \"user\" "
                                f"or \"assistant\" (got {role!r})",
                           f"messages[{k}] 必须是一个对象，role 是 system、developer、user 或 assistant", "messages")
        if m.get("tool_calls") is not None:
            raise ApiError(400, f"messages[{k}].tool_calls: tool calling is not supported",
                           "不支持调用工具", "messages")
        c = m.get("content")
        if c is None and role == "assistant":
            c = ""
        if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in c):
            c = "".join(p["text"] for p in c)
        if not isinstance(c, str):
            raise ApiError(400, f"messages[{k}].content must be a string or a list of {{\"type\": \"text\"}} parts "
                                "(this model reads text only)",
                           f"messages[{k}].content 必须是字符串或 type 为 text 的片段列表（模型只读文字）", "messages")
        out.append(("system" if role == "developer" else role, check_text(c, f"messages[{k}].content", "messages")))
    return out


# ---------------------------------------------------------------------------
# 认识但不支持的字段：只收默认值
# ---------------------------------------------------------------------------
def _none_or(*ok):
    return lambda v: v is None or any(type(v) is type(o) and v == o for o in ok)


UNSUPPORTED = {   # 字段 -> (收哪些值, 说给客户端听的默认值)
    "n": (_none_or(1), "1"),
    "best_of": (_none_or(1), "1"),
    "echo": (_none_or(False), "false"),
    "suffix": (_none_or(""), "null"),
    "tools": (_none_or([]), "null"),
    "tool_choice": (_none_or("none"), "null or \"none\""),
    "functions": (_none_or([]), "null"),
    "function_call": (_none_or("none"), "null or \"none\""),
    "response_format": (_none_or({"type": "text"}), "{\"type\": \"text\"}"),
    "logit_bias": (_none_or({}), "null"),
    "presence_penalty": (_none_or(0, 0.0), "0"),
    "frequency_penalty": (_none_or(0, 0.0), "0"),
    "repetition_penalty": (_none_or(1, 1.0), "1"),
    "min_tokens": (_none_or(0), "0"),
    "use_beam_search": (_none_or(False), "false"),
    "include_stop_str_in_output": (_none_or(False), "false"),
    "skip_special_tokens": (_none_or(True), "true"),
    "modalities": (_none_or(["text"]), "[\"text\"]"),
    "audio": (_none_or(), "null"),
    "prediction": (_none_or(), "null"),
    "reasoning_effort": (_none_or(), "null"),
    "web_search_options": (_none_or(), "null"),
    "guided_json": (_none_or(), "null"),
    "guided_regex": (_none_or(), "null"),
    "guided_choice": (_none_or(), "null"),
    "guided_grammar": (_none_or(), "null"),
    "structured_outputs": (_none_or(), "null"),
    "prompt_logprobs": (_none_or(), "null"),
}
HANDLED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
           "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "stream", "stream_options", "logprobs",
           "top_logprobs", "user", "parallel_tool_calls", "store", "metadata", "service_tier"}   # 后五个：不影响输出


class GenRequest:
    """解析好的一个请求：prompt_ids、max_tokens、temperature、top_p、top_k、min_p、seed、stops（字符串）、stop_ids、
    logprobs（None 或每个 token 的 top-k 个数）、stream、include_usage、chat、ignored（不认识、没用的字段名）。"""

    def __init__(self, **kw):
        self.__dict__.update(top_p=1.0, top_k=0, min_p=0.0, logprobs=None, stops=[], stop_ids=[], stream=False,
                             include_usage=False, chat=False, ignored=[])
        self.__dict__.update(kw)

    def engine_kwargs(self):
        """add_request 的关键字参数：只给和默认值不同的（top_p 1、top_k 0、min_p 0、logprobs None 都是"关"）。"""
        kw = {"top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p, "logprobs": self.logprobs}
        off = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "logprobs": None}
        return {k: v for k, v in kw.items() if v != off[k]}          # logprobs 0 != None：给


def _prompt(body, chat, tok, cfg, bound):
    """-> (提示的 id, 字段名)。先用便宜的下界挡掉放不进上下文的长文字（不切词），再切词。"""
    if chat:
        if "messages" not in body:
            raise ApiError(400, "missing field messages", "缺少字段 messages", "messages")
        msgs = check_messages(body["messages"])
        if bound is not None:
            low = sum(bound(c) for _, c in msgs)
            if low > cfg.max_seq:
                raise ApiError(400, f"the messages take at least {low} tokens, more than the model's context "
                                    f"{cfg.max_seq}", f"消息至少 {low} 个 token，超过上下文 {cfg.max_seq}", "messages")
        return chat_prompt_ids(tok, body["messages"]), "messages"
    if "prompt" not in body:
        raise ApiError(400, "missing field prompt", "缺少字段 prompt", "prompt")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str):
        check_text(p, "prompt", "prompt")
        if bound is not None and bound(p) > cfg.max_seq:
            raise ApiError(400, f"the prompt takes at least {bound(p)} tokens, more than the model's context "
                                f"{cfg.max_seq}", f"提示至少 {bound(p)} 个 token，超过上下文 {cfg.max_seq}", "prompt")
        return tok.encode(p), "prompt"
    if isinstance(p, list) and p and all(_is_int(t) for t in p):
        if min(p) < 0 or max(p) >= cfg.vocab:
            raise ApiError(400, f"token ids in prompt must be in 0..{cfg.vocab - 1}",
                           f"prompt 里的 token id 必须在 0..{cfg.vocab - 1} 之间", "prompt")
        return list(p), "prompt"
    raise ApiError(400, "prompt must be a string, a list of one string, or a list of token ids",
                   "prompt 必须是字符串、只有一个字符串的列表，或 token id 的列表", "prompt")


def _sampling(body):
    """-> (temperature, top_p, top_k, min_p)，范围同 vLLM 的 SamplingParams。"""
    temp = body.get("temperature")
    temp = 1.0 if temp is None else temp
    if not _is_num(temp) or not 0 <= temp <= 2:
        raise ApiError(400, f"temperature must be a number in [0, 2] (got {temp!r})",
                       "temperature 必须是 0 到 2 之间的数", "temperature")
    top_p = body.get("top_p")
    top_p = 1.0 if top_p is None else top_p
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise ApiError(400, f"top_p must be a number in (0, 1] (got {top_p!r})", "top_p 必须在 (0, 1] 里", "top_p")
    top_k = body.get("top_k")
    top_k = 0 if top_k is None else top_k
    if not _is_int(top_k) or top_k < -1:
        raise ApiError(400, f"top_k must be an integer: -1 or 0 (off) or >= 1 (got {top_k!r})",
                       "top_k 必须是整数：-1 或 0（不限）或 ≥ 1", "top_k")
    min_p = body.get("min_p")
    min_p = 0.0 if min_p is None else min_p
    if not _is_num(min_p) or not 0 <= min_p <= 1:
        raise ApiError(400, f"min_p must be a number in [0, 1] (got {min_p!r})", "min_p 必须在 [0, 1] 里", "min_p")
    return float(temp), float(top_p), (0 if top_k == -1 else int(top_k)), float(min_p)


def _logprobs(body, chat):
    """-> None（不要）或 k（每个生成的 token 给它自己的 log-prob 和前 k 个）。"""
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if chat:
        if lp is not None and not isinstance(lp, bool):
            raise ApiError(400, f"logprobs must be true or false in chat completions (got {lp!r})",
                           "chat 的 logprobs 必须是 true 或 false", "logprobs")
        if top is not None and not (_is_int(top) and 0 <= top <= MAX_TOP_LOGPROBS):
            raise ApiError(400, f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS} (got {top!r})",
                           f"top_logprobs 必须是 0..{MAX_TOP_LOGPROBS} 的整数", "top_logprobs")
        if top is not None and not lp:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs 要和 logprobs: true 一起用",
                           "top_logprobs")
        return (top or 0) if lp else None
    if top is not None:
        raise ApiError(400, "top_logprobs is a chat completions field; completions take logprobs: <int>",
                       "completions 用 logprobs: 整数，不用 top_logprobs", "top_logprobs")
    if lp is not None and not (_is_int(lp) and 0 <= lp <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"logprobs must be null or an integer in 0..{MAX_TOP_LOGPROBS} (got {lp!r})",
                       f"logprobs 必须是 null 或 0..{MAX_TOP_LOGPROBS} 的整数", "logprobs")
    return lp


def parse_request(body, chat, tok, cfg, num_blocks, block_size, model_name, gamma=0, bound=None):
    """
    请求体（已解析的 JSON）-> GenRequest。哪里不对就抛 ApiError（400，模型名不对 404），param 是那个字段。
    gamma：投机解码每轮最多的草稿数 γ：提示 + max_tokens − 1 + γ 要放得进上下文和块池（最后一轮还要 γ 个草稿位置；
    同 engine_lab.add_request 的规则）。bound：TokenBound（有它时，长得放不进上下文的文字不切词就 400）。
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "请求体必须是一个 JSON 对象")
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise ApiError(400, "model must be a string", "model 必须是字符串", "model")
        if model != model_name:
            raise ApiError(404, f"the model {model!r} does not exist: this server has {model_name!r}",
                           f"没有这个模型：这个服务器只有 {model_name!r}", "model", code="model_not_found")
    for name, (ok, default) in UNSUPPORTED.items():
        if name in body and not ok(body[name]):
            raise ApiError(400, f"{name} is not supported by this server: only its default {default} is accepted "
                                f"(got {body[name]!r})", f"这个服务器不支持 {name}，只收默认值 {default}", name)
    ignored = sorted(k for k in body if k not in HANDLED and k not in UNSUPPORTED
                     and k not in ("messages" if chat else "prompt",))
    prompt, pname = _prompt(body, chat, tok, cfg, bound)
    if not prompt:
        raise ApiError(400, "the prompt is empty: it needs at least 1 token", "提示是空的，至少要 1 个 token", pname)
    n_prompt = len(prompt)
    if n_prompt + gamma > cfg.max_seq:
        raise ApiError(400, f"the prompt has {n_prompt} tokens" + (f" (+ {gamma} draft positions)" if gamma else "")
                       + f", more than the model's context {cfg.max_seq}",
                       f"提示 {n_prompt} 个 token" + (f"（+ 草稿 {gamma}）" if gamma else "") + f"，超过上下文 {cfg.max_seq}",
                       pname)
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    mt = body.get(name)
    room = cfg.max_seq - n_prompt + 1 - gamma          # 引擎的规则：提示 + max_tokens − 1 + γ ≤ 上下文
    if mt is None:
        mt = room
    elif not _is_int(mt) or mt < 1:
        raise ApiError(400, f"{name} must be an integer >= 1 (got {mt!r})", f"{name} 必须是 ≥ 1 的整数", name)
    elif mt > room:
        raise ApiError(400, f"{name} = {mt} is too large: the prompt has {n_prompt} tokens and the context is "
                            f"{cfg.max_seq}" + (f" with {gamma} draft positions reserved" if gamma else "")
                       + f", so at most {room} more can be generated",
                       f"{name} 太大：最多还能生成 {room} 个", name)
    need = blocks_for(n_prompt + mt - 1 + gamma, block_size)
    if need > num_blocks:
        p = pname if blocks_for(n_prompt + gamma, block_size) > num_blocks else name
        raise ApiError(400, f"the prompt ({n_prompt}) + {name} ({mt}) - 1" + (f" + {gamma} drafts" if gamma else "")
                       + f" positions need {need} KV blocks; the whole pool has {num_blocks}",
                       f"要 {need} 个 KV 块，整个块池只有 {num_blocks} 块", p)
    temp, top_p, top_k, min_p = _sampling(body)
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(2 ** 63)
    elif not _is_int(seed) or not 0 <= seed < 2 ** 63:
        raise ApiError(400, f"seed must be an integer in 0..2^63-1 (got {seed!r})",
                       "seed 必须是 0 到 2^63 − 1 之间的整数", "seed")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP and all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} non-empty strings",
                       f"stop 必须是一个不空的字符串或最多 {MAX_STOP} 个不空字符串的列表", "stop")
    for s in stops:
        check_text(s, "stop", "stop")
    sids = body.get("stop_token_ids")
    sids = [] if sids is None else sids
    if not (isinstance(sids, list) and all(_is_int(t) and 0 <= t < cfg.vocab for t in sids)):
        raise ApiError(400, f"stop_token_ids must be a list of integers in 0..{cfg.vocab - 1}",
                       f"stop_token_ids 必须是 0..{cfg.vocab - 1} 之间的整数的列表", "stop_token_ids")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError(400, "ignore_eos must be true or false", "ignore_eos 必须是 true 或 false", "ignore_eos")
    eos = {t for t in (tok.im_end_id, tok.eos_id) if t is not None}
    stream = body.get("stream", False)
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", "stream 必须是 true 或 false", "stream")
    so = body.get("stream_options")
    if so is not None and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true",
                       "stream_options 只能和 stream: true 一起用", "stream_options")
    if so is not None and not (isinstance(so, dict) and isinstance(so.get("include_usage", False), bool)):
        raise ApiError(400, "stream_options must be {\"include_usage\": true/false}",
                       "stream_options 必须是 {\"include_usage\": true/false}", "stream_options")
    return GenRequest(prompt_ids=prompt, max_tokens=mt, temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                      seed=seed, stops=stops, stop_ids=sorted(set(sids) | (set() if ignore_eos else eos)),
                      logprobs=_logprobs(body, chat), stream=stream, include_usage=bool(so and so.get("include_usage")),
                      chat=chat, ignored=ignored)

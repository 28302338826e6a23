"""
bpe_lab —— SmolLM2 的分词器：GPT-2 式字节级 BPE（byte-level BPE），从 GGUF 元数据里的词表和 merge 表搭起来。

【流水线】（和 Hugging Face 的 tokenizer.json、llama.cpp 的 "smollm" 预分词器一致，见下面的出处）
1. 特殊 token：文本里出现的特殊 token 字符串（文件里类型为 CONTROL / USER_DEFINED 的每个 token，
   SmolLM2 是 id 0–16：<|endoftext|>、<|im_start|>、<|im_end|>、<repo_name>……）先整段切出来，直接变成它的 id；
   其余文本一段一段地走下面几步（特殊 token 两边的空格留在两边的文本里，不吃掉）。
2. 数字单切（Digits, individual_digits）：每个 Unicode 数字字符（类别 Nd、Nl、No：0–9、٣、Ⅻ、①、²、½……）
   单独成一段。
3. GPT-2 的预分词正则，在第 2 步切出的每一段里各自跑：
   's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
   （缩写只认小写：'S 不算；空白串在下一个非空白字符前留下最后一个空白字符，是空格时它和后面的词连成 " word"）。
4. 字节级：每一片（piece）编成 UTF-8 字节，每个字节按 GPT-2 的 bytes_to_unicode 表换成一个可见字符
   （空格 → "Ġ"，换行 → "Ċ"），于是 BPE 在"字节"上做：词表有全部 256 个单字节 token 时，任何文本都编得出来。
5. BPE：从单字节符号开始，反复找相邻两个符号里 merge 表中排名最靠前（rank 最小）的一对，把这一对在整片里从左到右
   全部合并；没有可合并的一对时停。rank = merges 列表里的下标（列表顺序就是训练时学到 merge 的顺序）。
   每片的结果按片缓存（同一片永远得到同样的 id）；缓存有上限（cache_size 片，默认 CACHE_SIZE），满了丢掉最久没用过的
   一片（LRU）：一直开着的服务器不会因为见过的片越来越多而越占越多内存。
解码：id → token 字符串 → 按 bytes_to_unicode 的逆表变回字节，拼起来按 UTF-8 解码（切在半个字符上的字节
换成 U+FFFD）；特殊 id 解成它自己的字符串（"<|im_end|>"）。

【\\p{L} / \\p{N} / \\s 怎么来】Python 的 re 没有 \\p{...} 类（也不用第三方 regex 包）：本模块扫一遍 0..U+10FFFF，
按 unicodedata.category 建出三组字符区间，拼进 re 的字符类：
- 字母 L = Lu Ll Lt Lm Lo；数字 N = Nd Nl No（Rust 的 char::is_numeric 也正是这三类，HF 的 Digits 用它）；
- 空白 = U+0009–000D、U+0085，加上 Zs Zl Zp 三类（Oniguruma 的 Unicode \\s，也就是 Unicode 的 White_Space
  属性）。不用 re 自带的 \\s：它按 str.isspace()，多算了 U+001C–001F 四个控制字符。
组合附加符（Mn，如 U+0301）不是字母：e + U+0301 切成 "e" 和 "\\u0301" 两片（HF 也这样）。

【特殊 token 在文本里】encode(text) 默认把文本里的特殊 token 字符串解析成它的 id：encode("<|im_end|>") == [2]。
这和 Hugging Face 的默认一样（tokenizers 的 AddedVocabulary 在预分词之前就把 added token 切出来；
transformers 的 split_special_tokens 默认 False）。llama.cpp 的默认不一样：llama_tokenize 有个 parse_special 参数，
common/common.h 的 common_tokenize 默认 parse_special = false，这时 "<|im_end|>" 当普通文本切成好几个 token；
encode(text, parse_special=False) 就是这个行为。llama.cpp 解码时 CONTROL token 也只在 special = true 时才出字符串
（common_token_to_piece 默认 true）。本模块的 decode 总是给出特殊 token 的字符串。
注意：默认行为下，用户文本里写的 "<|im_end|>" 会真的结束一个对话轮——把不可信文本放进 chat() 前想清楚。

【词表缺的字节】SmolLM2 的词表只有 235 个单字节 token，缺 21 个：0x04 0x06 0x13 0x14 0x16 0x1D 六个控制字符，
UTF-8 里永远不出现的 0xC0 0xC1 0xF5–0xFF，和只出现在 U+40000–U+BFFFF（未分配的第 4–11 平面）里的 0xF1 0xF2
（属性 missing_bytes）。和参考实现（HF tokenizers 的 BPE，unk_token 为空；vLLM 用它）一样，这些字节在每一片里
**悄悄丢掉**，同一片里剩下的字节照常合并："x\x06y" 编成 "x"、"y"，0xF1 开头的四字节字符只丢首字节
（tests/fixtures/smollm2_missing_bytes_ids.json）。含它们的文本解码回来少了它们；其余文本 decode(encode(text)) == text。
【孤立代理】str 可以含孤立代理（U+D800–DFFF，例如 json.loads('"a\\ud800b"')），编不成 UTF-8。参考实现不收（HF
tokenizers 抛 TypeError，fixture 里记着）：encode 默认（errors="strict"）抛 ValueError，说出位置；errors="replace"
时换成 U+FFFD（decode 对切坏的字节也这样），从不抛错。
【token 数的上下界】token_bounds(text)、min_tokens(text)：不分词（几遍 bytes.translate），服务器用它在分词之前
拒绝太长的提示。推导见 token_bounds；SmolLM2 上一个 token 最多 25 个 ASCII 字母、1 个数字、24 个 ≥ 0x80 的字节、
81 个空白——只用"最长的 token 81 个字节"一个数，一段英文的下界要松三倍多。

【和参考实现逐 id 对过】tests/fixtures/smollm2_tokenizer_ids.json：用 tokenizers 包（HF）按 SmolLM2 的 tokenizer.json
的配置、同一份词表和 merge 表编码的一批难文本（CJK、各类数字、组合附加符、emoji 和 ZWJ 序列、空白串、缩写、
特殊 token、仓库自己的文件），做法见 tests/fixtures/make_tokenizer_fixture.py。

【出处】
- llama.cpp src/llama-vocab.cpp：LLAMA_VOCAB_PRE_TYPE_SMOLLM 的 regex_exprs = { "\\p{N}", 上面的 GPT-2 正则
  （少了最后的 |\\s+；unicode.cpp 认出这条正则，交给手写的 unicode_regex_split_custom_gpt2，不剩下没切的字符）}，
  第二条只在第一条切出的段里匹配；BPE 合并按 rank 用优先队列；
- Hugging Face tokenizers：pre_tokenizers/digits.rs（individual_digits 时按 char::is_numeric 单切，Isolated）、
  pre_tokenizers/byte_level.rs（GPT-2 正则 + bytes_to_unicode）；SmolLM2 的 tokenizer.json：
  normalizer null，pre_tokenizer Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false,
  trim_offsets=true, use_regex=true)]，模型 BPE（dropout、unk_token、continuing_subword_prefix、end_of_word_suffix
  都是 null，fuse_unk、byte_fallback、ignore_merges 都是 false），17 个 added token 都是 special、不 strip、
  不 normalize（tokenizer.json 本身没能下载到，这组设置取自公开代码里照它写死的校验，和 llama.cpp 的 smollm 一致）；
- GPT-2 的 bytes_to_unicode：openai/gpt-2 src/encoder.py。
"""
import bisect
import collections
import operator
import re
import unicodedata
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["BPETokenizer", "bytes_to_unicode", "pre_tokenize", "bpe_merge", "char_class",
           "TOKEN_TYPES", "SPECIAL_TOKEN_TYPES", "GPT2_PATTERN_TEXT", "CACHE_SIZE"]

CACHE_SIZE = 1 << 16     # 每个分词器最多缓存多少片（LRU）：英文文本的常见片远少于这个数，缓存照样几乎全中

# llama.cpp 的 llama_token_type（gguf-py constants.py 的 TokenType）
TOKEN_TYPES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED", 5: "UNUSED", 6: "BYTE"}
SPECIAL_TOKEN_TYPES = (3, 4)    # CONTROL、USER_DEFINED：文本里出现时整段切出来，解码时给出它们的字符串

# GPT-2 的预分词正则（\p{...} 的写法，仅作说明；真正编译的是下面 _regexes() 里换成字符区间的版本）
GPT2_PATTERN_TEXT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_SPACE_EXTRA = (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85)


def bytes_to_unicode() -> Dict[int, str]:
    """返回 GPT-2 的字节 → 可见字符表（256 项，一一对应）。

    【推导】可打印的 "!".."~"、"¡".."¬"、"®".."ÿ"（188 个字节）映射到同码位的字符；其余 68 个字节（控制字符、
    空格、0x7F–0xA0、0xAD）按字节顺序依次映射到 U+0100 起的字符：0x00 → "Ā"，空格 0x20 → "Ġ"，换行 0x0A → "Ċ"。
    这样每个 token 都是一串可见字符，merge 表能写成 "Ġ t" 这样的文本（openai/gpt-2 encoder.py）。
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(table.items()))


def _merge_ranges(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """把按起点排好的闭区间 [(lo, hi), ...] 里相接或重叠的并起来。"""
    out: List[Tuple[int, int]] = []
    for lo, hi in ranges:
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def _class_body(ranges: List[Tuple[int, int]]) -> str:
    """把区间写成 re 字符类的内容（不带方括号），每个端点都用 \\U 转义，不怕 ] - ^ \\ 这些字符。"""
    return "".join(f"\\U{lo:08X}" if lo == hi else f"\\U{lo:08X}-\\U{hi:08X}" for lo, hi in ranges)


@lru_cache(maxsize=None)
def _unicode_ranges() -> Dict[str, Tuple[Tuple[int, int], ...]]:
    """返回 {"L": 字母区间, "N": 数字区间, "S": 空白区间}，按本机 unicodedata 的类别扫一遍全部码位。

    【边界】unicodedata 的 Unicode 版本跟着 Python 走（3.9: 13.0，3.11: 14.0，3.13: 15.1）；HF（Rust、Oniguruma）
    的版本更新。只有之后新分配的字符会分类不同（例如 Unicode 16/17 新加的数字 U+11DE0–11DE9 在这里还是未分配）。
    """
    # 每个码位的类别写成 "Lu,Ll,Nd,..."（每个码位 3 个字符），再用 re 找连续的 L* / N* / Z[slp] 段：
    # 大写字母只出现在每 3 个字符的第一个位置，所以匹配一定从某个码位的开头开始
    cats = ",".join(map(unicodedata.category, map(chr, range(0x110000)))) + ","

    def spans(pattern: str) -> List[Tuple[int, int]]:
        return [(m.start() // 3, m.end() // 3 - 1) for m in re.finditer(pattern, cats)]

    letters = spans(r"(?:L[ultmo],)+")
    numbers = spans(r"(?:N[dlo],)+")
    spaces = sorted(spans(r"(?:Z[slp],)+") + [(cp, cp) for cp in _SPACE_EXTRA])
    return {"L": tuple(letters), "N": tuple(numbers), "S": tuple(_merge_ranges(spaces))}


def char_class(ch: str) -> str:
    """返回一个字符在预分词里的类："L"（字母）、"N"（数字）、"S"（空白）或 "other"。

    【参数】ch：一个字符。给测试和讲义看类别用；encode 不逐字符调用它（它用编译好的正则）。
    """
    if len(ch) != 1:
        raise ValueError(f"char_class 要一个字符，收到长度 {len(ch)} 的 {ch!r}")
    cp = ord(ch)
    for name, ranges in _unicode_ranges().items():
        i = bisect.bisect_right(ranges, (cp, 0x10FFFF)) - 1
        if i >= 0 and ranges[i][0] <= cp <= ranges[i][1]:
            return name
    return "other"


@lru_cache(maxsize=None)
def _regexes() -> Tuple["re.Pattern", "re.Pattern"]:
    """返回 (单个数字字符的正则, GPT-2 预分词正则)，\\p{L} \\p{N} \\s 换成了 unicodedata 建出的字符区间。"""
    r = _unicode_ranges()
    letter, number, space = _class_body(list(r["L"])), _class_body(list(r["N"])), _class_body(list(r["S"]))
    gpt2 = (f"'s|'t|'re|'ve|'m|'ll|'d| ?[{letter}]+| ?[{number}]+| ?[^{space}{letter}{number}]+"
            f"|[{space}]+(?![^{space}])|[{space}]+")
    return re.compile(f"[{number}]"), re.compile(gpt2)


def pre_tokenize(text: str) -> List[str]:
    """返回 SmolLM2 预分词切出的片（拼起来正好是 text）：先每个数字字符单切，再在每段里跑 GPT-2 正则。

    【推导】HF 的 Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]：Digits 把文本切成
    "不含数字的一段"和"单个数字"交替的若干段，ByteLevel 的正则只在每段内部匹配——所以 "abc 2026" 是
    ["abc", " ", "2", "0", "2", "6"]：空格到了段尾，和后面的 "2" 分开了（GPT-2 原版会切成 " 2026"）。
    llama.cpp 的 smollm 是同一件事：regex_exprs 的第二条正则只在第一条（"\\p{N}"）切出的段内匹配。
    【边界】空串 → []。字母、数字、空白、其他四类字符各有一支能匹配它，findall 不会跳过字符，所以不会丢字符。
    """
    digit_re, gpt2_re = _regexes()
    pieces: List[str] = []
    start = 0
    for m in digit_re.finditer(text):
        if m.start() > start:
            pieces.extend(gpt2_re.findall(text, start, m.start()))
        pieces.append(m.group())
        start = m.end()
    if start < len(text):
        pieces.extend(gpt2_re.findall(text, start))
    return pieces


def bpe_merge(symbols: Sequence[str], ranks: Dict[Tuple[str, str], int]) -> List[str]:
    """返回一片按 merge 表合并完的符号列表。

    【推导】GPT-2 的 bpe()：在所有相邻的一对里挑 rank 最小的一对 (a, b)，把它在整片里从左到右、不重叠地全部换成
    a + b；重复，直到没有一对在 ranks 里。HF 和 llama.cpp 用优先队列一次合并一处（同 rank 先合左边的）；
    只要每条 merge 用到的符号都由更早的 merge（或单字节）造出来——训练出来的表都是这样，SmolLM2 的 48900 条也是——
    两种做法给出同样的结果。
    【参数】symbols：这一片的单字节符号（bytes_to_unicode 的字符）；ranks：{(左, 右): rank}。
    【边界】0 或 1 个符号原样返回。
    """
    word = list(symbols)
    while len(word) > 1:
        best_rank, best = None, None
        for pair in zip(word, word[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best = rank, pair
        if best is None:
            break
        a, b = best
        merged, out, i = a + b, [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                out.append(merged)
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


def _parse_merge(i: int, merge) -> Tuple[str, str]:
    """把 merges[i] 解析成 (左, 右)：GGUF 的 "Ġ t"（一个空格分开的两段），或新版 tokenizer.json 的 ["Ġ", "t"]。"""
    if isinstance(merge, str):
        parts = merge.split(" ")
        if len(parts) == 2 and parts[0] and parts[1]:
            return parts[0], parts[1]
    elif isinstance(merge, (list, tuple)) and len(merge) == 2 and all(isinstance(p, str) and p for p in merge):
        return merge[0], merge[1]
    raise ValueError(f"merges[{i}] = {merge!r}：不认识的 merge 格式；允许的是 \"左 右\"（一个空格分开的两个"
                     f"非空符号，GGUF 的写法）或 [\"左\", \"右\"]")


# token_bounds 的字节类（词表缺的字节不属于任何类：它们不进 token）
_BYTE_CLASSES = {"letter": bytes(range(0x41, 0x5B)) + bytes(range(0x61, 0x7B)), "digit": b"0123456789",
                 "high": bytes(range(0x80, 0x100)), "space": b" \t\n\r\x0b\x0c"}
_BYTE_CLASSES["other"] = bytes(b for b in range(0x80) if not any(b in v for v in _BYTE_CLASSES.values()))

_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _replace_surrogates(text: str) -> str:
    """每个孤立代理（U+D800–DFFF）换成 U+FFFD（json.loads 已经把成对的 \\ud83d\\ude00 合成一个字符）。"""
    return _SURROGATE_RE.sub("\ufffd", text)


class BPETokenizer:
    """SmolLM2 的字节级 BPE 分词器：encode / decode / chat。

    【参数】
    - tokens：词表，tokens[id] 是 token 的字符串（普通 token 用 bytes_to_unicode 的字符写，特殊 token 原样）。
    - merges：merge 表，rank = 列表下标；每项 "左 右" 或 [左, 右]；左、右和左 + 右都必须在词表里。
    - token_types：每个 token 的类型（llama.cpp 的编号，见 TOKEN_TYPES）；None 表示全是 NORMAL。
      类型 3（CONTROL）和 4（USER_DEFINED）的 token 是特殊 token。
    - bos_id / eos_id：记下来给调用方用（eos_id 是一轮对话结束的 id）；encode 不自动加 BOS（SmolLM2 的
      add_bos_token 是 false）。
    - cache_size：按片缓存的上限（≥ 0 的整数，0 = 不缓存），满了丢掉最久没用过的片（LRU）。
    属性：tokens、merges（(左, 右) 的列表）、ranks、token_types、special_ids（{字符串: id}）、vocab（{字符串: id}）、
    bos_id、eos_id、im_start_id / im_end_id（词表里有 "<|im_start|>" / "<|im_end|>" 时的 id，否则 None）、
    missing_bytes（词表里没有单字节 token 的字节，升序；encode 悄悄丢掉它们，同 HF）、max_token_bytes（最长的
    token 有几个字节，特殊 token 也算）、cache_size。
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence, token_types: Optional[Sequence[int]] = None,
                 bos_id: Optional[int] = None, eos_id: Optional[int] = None, cache_size: int = CACHE_SIZE):
        if not isinstance(tokens, (list, tuple)) or not tokens:
            raise ValueError(f"tokens 要一个非空的字符串列表，收到 {type(tokens).__name__}"
                             f"{'（空）' if isinstance(tokens, (list, tuple)) else ''}")
        if not isinstance(merges, (list, tuple)):
            raise ValueError(f"merges 要一个列表，收到 {type(merges).__name__}")
        self.tokens = list(tokens)
        self.vocab: Dict[str, int] = {}
        for i, tok in enumerate(self.tokens):
            if not isinstance(tok, str) or not tok:
                raise ValueError(f"tokens[{i}] = {tok!r}：token 必须是非空字符串")
            if tok in self.vocab:
                raise ValueError(f"tokens[{i}] = {tok!r} 和 tokens[{self.vocab[tok]}] 重复")
            self.vocab[tok] = i
        if token_types is None:
            token_types = [1] * len(self.tokens)
        if len(token_types) != len(self.tokens):
            raise ValueError(f"token_types 有 {len(token_types)} 项，tokens 有 {len(self.tokens)} 项：要一样多")
        unknown = sorted({int(t) for t in token_types} - set(TOKEN_TYPES))
        if unknown:
            raise ValueError(f"token_types 里有不认识的类型 {unknown}；认识的是 {TOKEN_TYPES}")
        self.token_types = [int(t) for t in token_types]
        self.special_ids = {tok: i for i, tok in enumerate(self.tokens) if self.token_types[i] in SPECIAL_TOKEN_TYPES}

        self.byte_to_char = bytes_to_unicode()
        self.char_to_byte = {c: b for b, c in self.byte_to_char.items()}
        # 每个 id 解码成的字节：普通 token 按逆表换回字节，特殊 token 用它字符串的 UTF-8
        self._id_bytes: List[bytes] = []
        for i, tok in enumerate(self.tokens):
            if self.token_types[i] in SPECIAL_TOKEN_TYPES:
                self._id_bytes.append(tok.encode("utf-8"))
                continue
            bad = [c for c in tok if c not in self.char_to_byte]
            if bad:
                raise ValueError(f"tokens[{i}] = {tok!r} 含不是字节级字符的 {bad[0]!r}（U+{ord(bad[0]):04X}），"
                                 f"它的类型又不是 CONTROL / USER_DEFINED：这不是 GPT-2 字节级词表")
            self._id_bytes.append(bytes(self.char_to_byte[c] for c in tok))

        self.merges: List[Tuple[str, str]] = []
        self.ranks: Dict[Tuple[str, str], int] = {}
        for i, m in enumerate(merges):
            pair = _parse_merge(i, m)
            for part in (pair[0], pair[1], pair[0] + pair[1]):
                if part not in self.vocab:
                    raise ValueError(f"merges[{i}] = {m!r} 用到的 {part!r} 不在词表里（词表 {len(self.tokens)} 个 token）")
            if pair in self.ranks:
                raise ValueError(f"merges[{i}] = {m!r} 和 merges[{self.ranks[pair]}] 重复")
            self.ranks[pair] = i
            self.merges.append(pair)

        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if value is not None and not 0 <= value < len(self.tokens):
                raise ValueError(f"{name} = {value} 不在 0..{len(self.tokens) - 1} 里")
        self.bos_id, self.eos_id = bos_id, eos_id
        self.missing_bytes = [b for b in range(256) if self.byte_to_char[b] not in self.vocab]
        self.im_start_id = self.special_ids.get("<|im_start|>")
        self.im_end_id = self.special_ids.get("<|im_end|>")
        # 特殊 token 的切分正则：按长度从长到短排，re 的"最左、先列出的先赢"就成了最左最长匹配（和 HF 一样）
        specials = sorted(self.special_ids, key=lambda s: (-len(s), s))
        self._special_re = re.compile("|".join(re.escape(s) for s in specials)) if specials else None
        if not (isinstance(cache_size, int) and not isinstance(cache_size, bool) and cache_size >= 0):
            raise ValueError(f"cache_size 要一个 ≥ 0 的整数（0 = 不缓存），收到 {cache_size!r}")
        self.cache_size = cache_size
        self._cache: "collections.OrderedDict[str, Tuple[int, ...]]" = collections.OrderedDict()
        self._keep = {b: self.byte_to_char[b] for b in range(256) if b not in self.missing_bytes}   # 留下的字节
        self._missing = bytes(self.missing_bytes)
        self.max_token_bytes = max(len(b) for b in self._id_bytes)
        # token_bounds 的字节类：(要删掉的其余字节, 一个 token 最多含几个这类字节)
        self._byte_classes = []
        for members in _BYTE_CLASSES.values():
            others = bytes(b for b in range(256) if b not in members)
            most = max(len(b.translate(None, others)) for b in self._id_bytes)
            if most:
                self._byte_classes.append((others, most))

    # ---------------------------------------------------------------- 构造
    @classmethod
    def from_gguf_metadata(cls, metadata: Dict) -> "BPETokenizer":
        """返回用 GGUF 元数据（gguf_lab.read_gguf(path).metadata）搭起来的分词器。

        【参数】metadata：键 → Python 值的 dict。用到 tokenizer.ggml.model（必须 "gpt2"）、tokenizer.ggml.pre
        （必须 "smollm"：别的预分词器切法不同）、tokens、merges、token_type（可缺，缺了全当 NORMAL）、
        bos_token_id、eos_token_id、add_bos_token（true 时报错：本模块的 encode 不加 BOS）。
        【边界】缺键、值不对都抛 ValueError，说出找到的是什么、允许的是什么。
        """
        if not isinstance(metadata, dict):
            raise ValueError(f"metadata 要一个 dict（gguf_lab.read_gguf(path).metadata），收到 {type(metadata).__name__}")
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model = {model!r}：本模块只做 GPT-2 字节级 BPE（\"gpt2\"）；"
                             f"\"llama\" 是 SentencePiece，另一种算法")
        pre = metadata.get("tokenizer.ggml.pre")
        if pre != "smollm":
            raise ValueError(f"tokenizer.ggml.pre = {pre!r}：本模块只实现 \"smollm\" 预分词（数字单切 + GPT-2 正则）；"
                             f"别的预分词器（\"llama-bpe\"、\"qwen2\"……）正则不同，编出来的 id 会错")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in metadata:
                found = sorted(k for k in metadata if k.startswith("tokenizer."))
                raise ValueError(f"元数据里没有 {key}；找到的 tokenizer.* 键：{found}")
            if not isinstance(metadata[key], list):
                raise ValueError(f"{key} 要一个列表，找到的是 {type(metadata[key]).__name__}")
        if metadata.get("tokenizer.ggml.add_bos_token", False):
            raise ValueError("tokenizer.ggml.add_bos_token = True：本模块的 encode 不加 BOS（SmolLM2 是 false）")
        return cls(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"],
                   metadata.get("tokenizer.ggml.token_type"),
                   bos_id=metadata.get("tokenizer.ggml.bos_token_id"),
                   eos_id=metadata.get("tokenizer.ggml.eos_token_id"))

    # ---------------------------------------------------------------- 编码
    def _encode_piece(self, piece: str) -> Tuple[int, ...]:
        """返回一片（预分词的结果）的 id；词表缺的字节丢掉（HF 的 BPE 在 unk_token 为空时的做法），剩下的照常合并；
        按片缓存（LRU，最多 cache_size 片）。"""
        cache = self._cache
        ids = cache.get(piece)
        if ids is not None:
            cache.move_to_end(piece)                 # 刚用过：最后才丢
            return ids
        keep = self._keep
        symbols = [keep[b] for b in piece.encode("utf-8") if b in keep]
        ids = tuple(self.vocab[s] for s in bpe_merge(symbols, self.ranks))
        if self.cache_size:
            cache[piece] = ids
            if len(cache) > self.cache_size:
                cache.popitem(last=False)            # 丢掉最久没用过的一片
        return ids

    def _utf8(self, text: str, errors: str) -> bytes:
        """text 的 UTF-8 字节；孤立代理按 errors 处理（"strict"：ValueError；"replace"：U+FFFD）。"""
        if errors not in ("strict", "replace"):
            raise ValueError(f"errors 只能是 'strict'（孤立代理抛 ValueError）或 'replace'（换成 U+FFFD），收到 {errors!r}")
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as e:
            if errors == "strict":
                raise ValueError(f"text 第 {e.start} 个字符是孤立代理 U+{ord(text[e.start]):04X}，不是合法的 Unicode "
                                 f"文本（编不成 UTF-8） / text has a lone surrogate U+{ord(text[e.start]):04X} at "
                                 f"index {e.start}: not valid Unicode") from None
            return _replace_surrogates(text).encode("utf-8")

    def token_bounds(self, text: str, errors: str = "strict") -> Tuple[int, int]:
        """返回 encode(text, errors=errors) 的 token 数的 (下界, 上界)，不分词。

        【推导】encode 的 token 正好把留下的字节（UTF-8 字节去掉 missing_bytes；特殊 token 的也在内）不重不漏地分完，
        每个至少 1 个字节：上界 = 留下的字节数 n。字节分几类（ASCII 字母、数字、≥ 0x80、空白、其余），一个 token
        最多含 M_c 个 c 类字节（按词表算，特殊 token 也算），文本有 n_c 个，所以 token 数 ≥ ⌈n_c / M_c⌉；下界取各类
        的最大值和 ⌈n / max_token_bytes⌉ 里大的。不跑正则、不跑 BPE。
        【边界】空串 → (0, 0)；孤立代理同 encode（errors）。
        """
        if not isinstance(text, str):
            raise ValueError(f"text 要一个 str，收到 {type(text).__name__}")
        data = self._utf8(text, errors).translate(None, self._missing)      # 缺的字节不进任何 token
        n = len(data)
        lo = -(-n // self.max_token_bytes)
        for others, most in self._byte_classes:
            lo = max(lo, -(-len(data.translate(None, others)) // most))
        return lo, n

    def min_tokens(self, text: str, errors: str = "strict") -> int:
        """返回 encode(text) 至少有几个 token（token_bounds 的下界）：服务器在分词之前用它拒绝放不进上下文的提示。"""
        return self.token_bounds(text, errors)[0]

    def encode(self, text: str, parse_special: bool = True, errors: str = "strict") -> List[int]:
        """返回 text 的 token id（不加 BOS / EOS）。

        【参数】parse_special：True（默认，和 HF 一样）时文本里的特殊 token 字符串变成它的 id；
        False（llama.cpp 的 common_tokenize 的默认）时它们也当普通文本切。errors：孤立代理怎么办（模块说明的
        【孤立代理】）："strict"（默认）抛 ValueError，"replace" 换成 U+FFFD。
        【边界】空串 → []。词表缺的字节（missing_bytes）悄悄丢掉（同 HF）。decode(encode(text)) == text 对其余任何
        文本成立。
        """
        if not isinstance(text, str):
            raise ValueError(f"text 要一个 str，收到 {type(text).__name__}")
        self._utf8(text, errors)
        if errors == "replace":
            text = _replace_surrogates(text)
        ids: List[int] = []
        segments = [text]
        if parse_special and self._special_re is not None:
            segments = self._special_re.split(text)
            specials = self._special_re.findall(text)
        for k, segment in enumerate(segments):
            if k > 0:
                ids.append(self.special_ids[specials[k - 1]])
            for piece in pre_tokenize(segment):
                ids.extend(self._encode_piece(piece))
        return ids

    def chat(self, text: str, system: Optional[str] = None) -> List[int]:
        """返回一条用户消息的对话格式的 id，停在助手开口之前：
        <|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n

        【参数】system：None（默认）时没有 system 轮——本课程用这个形式。文件的 tokenizer.chat_template 在第一条
        消息不是 system 时自己加一个默认 system 轮（"You are a helpful AI assistant named SmolLM, trained by
        Hugging Face"）；要和它逐 id 一样，把那句话作为 system 传进来，前面就多一段
        <|im_start|>system\\n{system}<|im_end|>\\n。
        【边界】text 和 system 按 encode 的默认规则编码：里面的特殊 token 字符串也会变成特殊 id。
        词表里没有 <|im_start|> / <|im_end|> 时抛 ValueError。
        """
        if self.im_start_id is None or self.im_end_id is None:
            raise ValueError("词表里没有特殊 token <|im_start|> / <|im_end|>，不是 ChatML 格式的模型，chat() 用不了")
        prompt = ""
        if system is not None:
            prompt += f"<|im_start|>system\n{system}<|im_end|>\n"
        prompt += f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        return self.encode(prompt)

    # ---------------------------------------------------------------- 解码
    def decode(self, ids: Sequence[int]) -> str:
        """返回 ids 解码成的文本：字节拼起来按 UTF-8 解码；特殊 id 给出它的字符串（"<|im_end|>"）。

        【边界】一串 id 切在一个多字节字符中间时（例如只解码 emoji 的第一个 token），不完整的字节换成 U+FFFD
        （和 HF 的 from_utf8_lossy 一样）。id 不在 0..词表大小-1 里时抛 ValueError。
        """
        out = bytearray()
        n = len(self.tokens)
        for i in ids:
            try:
                i = operator.index(i)       # int 或 numpy 的整数
            except TypeError:
                raise ValueError(f"id 要整数，收到 {i!r}") from None
            if not 0 <= i < n:
                raise ValueError(f"id {i} 不在 0..{n - 1} 里")
            out += self._id_bytes[i]
        return out.decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return (f"BPETokenizer({len(self.tokens)} tokens, {len(self.merges)} merges, "
                f"{len(self.special_ids)} special)")

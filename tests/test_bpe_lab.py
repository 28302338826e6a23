"""
bpe_lab 的测试：小词表上手算的 merge、预分词的切法、往返、错误信息；真文件上和 HF tokenizers 的参考 id 逐个对。

真文件（SmolLM2-135M-Instruct.Q4_1.gguf）由 conftest.smollm2_path() 给出（第一次用时下载；离线时跳过，
CI 里 CS349E_REQUIRE_MODEL=1 时失败；CS349E_GGUF 指向别的文件时这些钉死在 SmolLM2 上的测试跳过）。
"""
import json
import os

import numpy as np
import pytest

import bpe_lab
from bpe_lab import BPETokenizer, bpe_merge, bytes_to_unicode, char_class, pre_tokenize

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "smollm2_tokenizer_ids.json")
MISSING_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "smollm2_missing_bytes_ids.json")

# ---------------------------------------------------------------- 一个手算用的小词表
# id 0..255 是单字节 token，id = 字节值（"h" 是 104，空格 "Ġ" 是 32）；后面是合并出来的 token 和两个特殊 token。
# merge 的 rank 就是下面列表的下标。
_B = bytes_to_unicode()
TINY_MERGES = [
    "l l",        # 0 -> ll     256
    "h e",        # 1 -> he     257
    "he ll",      # 2 -> hell   258
    "hell o",     # 3 -> hello  259
    "Ġ w",        # 4 -> Ġw     260
    "o r",        # 5 -> or     261
    "Ġw or",      # 6 -> Ġwor   262
    "Ġwor l",     # 7 -> Ġworl  263
    "Ġworl d",    # 8 -> Ġworld 264
    "b c",        # 9 -> bc     265
    "a b",        # 10 -> ab    266
    "a bc",       # 11 -> abc   267
    "2 0",        # 12 -> 20    270（排在两个特殊 token 后面）：数字单切时它永远用不上
]
TINY_MERGED = ["ll", "he", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld", "bc", "ab", "abc"]
TINY_SPECIAL = ["<|im_end|>", "<|im_start|>"]          # 268, 269
TINY_TYPES = [1] * (256 + len(TINY_MERGED)) + [3] * len(TINY_SPECIAL) + [1]


def tiny_tokens():
    return [_B[b] for b in range(256)] + TINY_MERGED + TINY_SPECIAL + ["20"]


def tiny(merges=None, drop_bytes=()):
    """小词表分词器；drop_bytes 里的字节从词表里拿掉（换成一个不相干的占位 token，id 不变）。"""
    tokens = tiny_tokens()
    for b in drop_bytes:
        tokens[b] = f"<unused{b}>"
    types = list(TINY_TYPES)
    for b in drop_bytes:
        types[b] = 5        # UNUSED：不当特殊 token，也不参与解码以外的任何事
    return BPETokenizer(tokens, TINY_MERGES if merges is None else merges, types, eos_id=268)


def test_bytes_to_unicode_is_gpt2_table():
    """GPT-2 的表：可打印字节映射到自己，空格 -> Ġ（U+0120），换行 -> Ċ（U+010A），0 -> Ā（U+0100），一一对应。"""
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("a")] == "a" and table[ord("~")] == "~" and table[0xE9] == "é"
    assert table[0x00] == "\u0100" and table[0x20] == "\u0120" and table[0x0A] == "\u010a"
    assert table[0x7F] == "\u0121" and table[0xAD] == "\u0143"   # 第 34、68 个不可打印字节


# ---------------------------------------------------------------- 手算的 merge
def test_hand_worked_merges_on_tiny_vocab():
    """
    "hello"：h e l l o。相邻对的 rank：(h,e)=1，(l,l)=0，其余不在表里 -> 先合 ll：h e ll o；
    再 (h,e)=1 -> he ll o；再 (he,ll)=2 -> hell o；再 (hell,o)=3 -> hello = 259。
    " world"：Ġ w o r l d -> (Ġ,w)=4 与 (o,r)=5 里先 4：Ġw o r l d -> (o,r)=5：Ġw or l d -> 6：Ġwor l d
    -> 7：Ġworl d -> 8：Ġworld = 264。
    "abc"：(a,b)=10、(b,c)=9 -> 先 bc：a bc -> (a,bc)=11 -> abc = 267。
    "cab"：(c,a) 不在表里，(a,b)=10 -> c ab = [99, 266]。
    "lll"：(l,l)=0 在两处，从左到右不重叠地合：ll l = [256, 108]。
    "abcabc"：一片；两处 (b,c) 一起合，再两处 (a,bc)：[267, 267]。
    """
    tok = tiny()
    assert tok.encode("hello") == [259]
    assert tok.encode("hello world") == [259, 264]
    assert tok.encode("abc") == [267]
    assert tok.encode("cab") == [99, 266]
    assert tok.encode("lll") == [256, 108]
    assert tok.encode("abcabc") == [267, 267]
    assert tok.encode("hex") == [257, 120]           # he + x（x = 0x78 = 120）
    assert tok.encode("") == []


def test_digits_never_merge():
    """
    小词表里有 merge "2 0"（rank 12），但数字单切让每个数字自成一片，BPE 看不到 (2, 0) 这一对：
    "2026" = [50, 48, 50, 54]（'2' 0x32 = 50，'0' 48，'6' 54）；"a20" = [97, 50, 48]。
    同一对符号直接交给 bpe_merge 就会合成 "20"。
    """
    tok = tiny()
    assert tok.encode("2026") == [50, 48, 50, 54]
    assert tok.encode("a20") == [97, 50, 48]
    assert bpe_merge(["2", "0"], tok.ranks) == ["20"]


def test_bpe_merge_function_directly():
    """bpe_merge 本身：rank 小的先合；没有可合的一对就原样返回；0 / 1 个符号原样返回。"""
    ranks = {("b", "c"): 0, ("a", "b"): 1, ("a", "bc"): 2}
    assert bpe_merge(list("abc"), ranks) == ["abc"]
    assert bpe_merge(list("ab"), ranks) == ["ab"]
    assert bpe_merge(list("ca"), ranks) == ["c", "a"]
    assert bpe_merge([], ranks) == [] and bpe_merge(["a"], ranks) == ["a"]


def test_sorted_merges_give_different_ids():
    """
    回归：merge 的 rank 必须是文件里的顺序，不能排序（也不能过一遍 set 再排）。排序后 "a b" < "a bc" < "b c"：
    "abc" 先合 (a, b)，剩下的 (ab, c) 不在表里 -> [266, 99]，不再是 [267]。
    """
    good, bad = tiny(), tiny(sorted(TINY_MERGES))
    assert good.encode("abc") == [267]
    assert bad.encode("abc") == [266, 99]


def test_first_merge_must_not_be_skipped():
    """
    回归：GPT-2 的 merges.txt 第一行是 "#version: 0.2"，照那个习惯跳过第一项，在 GGUF 上就丢了 rank 0 的 merge
    （SmolLM2 的是 "Ġ t"）。小词表里丢掉 "l l"：hello 只能合到 he l l o = [257, 108, 108, 111]。
    """
    assert tiny().encode("hello") == [259]
    assert tiny(TINY_MERGES[1:]).encode("hello") == [257, 108, 108, 111]


# ---------------------------------------------------------------- 预分词
PRE_TOKENIZE_CASES = [
    ("Hello world", ["Hello", " world"]),
    ("I'm here", ["I", "'m", " here"]),
    ("they'll we're it's", ["they", "'ll", " we", "'re", " it", "'s"]),
    # 缩写只认小写：'S 是标点 "'" 加字母 "S"
    ("HE'S", ["HE", "'", "S"]),
    # 每个数字单独一片；段尾的空格不和后面的数字连
    ("2026", ["2", "0", "2", "6"]),
    ("3.14", ["3", ".", "1", "4"]),
    ("abc 2026", ["abc", " ", "2", "0", "2", "6"]),
    ("a1b", ["a", "1", "b"]),
    # 非 ASCII 的数字：No（① ² ½）、Nl（Ⅻ）、Nd（阿拉伯-印度数字 ٣）都单切；"一" 是字母 Lo（虽然有数值）
    ("①²½Ⅻ٣", ["①", "²", "½", "Ⅻ", "٣"]),
    ("x½y", ["x", "½", "y"]),
    ("一二三", ["一二三"]),
    # 空白：在下一个非空白字符前留下最后一个空白字符
    ("x  y", ["x", " ", " y"]),
    ("a\n\n\nb", ["a", "\n\n", "\n", "b"]),
    ("hi  ", ["hi", "  "]),
    (" \n", [" \n"]),
    ("\n\n\n", ["\n\n\n"]),
    ("a\t\tb", ["a", "\t", "\t", "b"]),
    ("   leading", ["  ", " leading"]),
    # 组合附加符（Mn）不是字母
    ("e\u0301", ["e", "\u0301"]),
    ("café", ["café"]),
    # CJK 是字母；全角逗号是标点
    ("你好，世界", ["你好", "，", "世界"]),
    # emoji（So）和肤色（Sk）、ZWJ（Cf）都是"其他"，连成一片，前面可以带一个空格
    ("a 😀👍🏽", ["a", " 😀👍🏽"]),
    ("👨\u200d👩\u200d👧", ["👨\u200d👩\u200d👧"]),
    # U+001C 不是空白（Python 的 str.isspace 说是，Unicode 的 White_Space 说不是）；NBSP、全角空格是空白
    ("a\x1cb", ["a", "\x1c", "b"]),
    ("x \x1cy", ["x", " \x1c", "y"]),        # 把 U+001C 当空白会切成 "x" " " "\x1c" "y"
    ("a\u00a0b", ["a", "\u00a0", "b"]),
    ("a\u3000 b", ["a", "\u3000", " b"]),
    ("", []),
]


@pytest.mark.parametrize("text,expected", PRE_TOKENIZE_CASES)
def test_pre_tokenize_splits(text, expected):
    assert pre_tokenize(text) == expected
    assert "".join(pre_tokenize(text)) == text


def test_char_classes_from_unicodedata():
    """\\p{L} = L*，\\p{N} = Nd Nl No，\\s = White_Space：逐个字符手写的类。"""
    expected = {"a": "L", "é": "L", "一": "L", "ǅ": "L", "ʰ": "L",
                "7": "N", "٣": "N", "Ⅻ": "N", "①": "N", "²": "N", "½": "N",
                " ": "S", "\t": "S", "\n": "S", "\x0b": "S", "\x85": "S", "\u00a0": "S", "\u2028": "S",
                "\u3000": "S",
                "\x1c": "other", "\u200b": "other", "\u0301": "other", "😀": "other", "!": "other", "_": "other"}
    assert {ch: char_class(ch) for ch in expected} == expected
    with pytest.raises(ValueError, match="一个字符"):
        char_class("ab")


# ---------------------------------------------------------------- 特殊 token
def test_special_tokens_in_text_are_parsed_by_default():
    """文本里的特殊 token 字符串切成它的 id（HF 的默认）；两边的空格留在两边；parse_special=False 时当普通文本。"""
    tok = tiny()
    assert tok.encode("<|im_end|>") == [268]
    assert tok.encode("hello<|im_end|>hello") == [259, 268, 259]
    assert tok.encode("hello <|im_start|> world") == [259, 32, 269, 264]
    assert tok.encode("<|im_end|><|im_end|>") == [268, 268]
    # 不解析：按字节切（"<" 60、"|" 124 ……没有 merge）
    assert tok.encode("<|im_end|>", parse_special=False) == [ord(c) for c in "<|im_end|>"]
    # 不完整的不是特殊 token
    assert tok.encode("<|im_end|", parse_special=True) == [ord(c) for c in "<|im_end|"]
    assert tok.decode([259, 268]) == "hello<|im_end|>"
    assert tok.special_ids == {"<|im_end|>": 268, "<|im_start|>": 269}


def test_tiny_chat_form():
    """chat 的格式：<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n，逐 id 手写。"""
    tok = tiny()
    nl = 0x0A
    user = [ord(c) for c in "user"]
    assistant = [ord(c) for c in "assistant"]
    assert tok.chat("hello") == [269] + user + [nl, 259, 268, nl, 269] + assistant + [nl]
    system = [269] + [ord(c) for c in "system"] + [nl] + [266, 267] + [268, nl]     # "ababc" -> ab abc
    assert tok.chat("hello", system="ababc") == system + [269] + user + [nl, 259, 268, nl, 269] + assistant + [nl]


# ---------------------------------------------------------------- 往返
ROUND_TRIP_TEXTS = [
    "", "hello world", "\x00", "a\x00b\x00", "\x04\x06\x13\x14\x16\x1d", "\x7f\x80\xff",
    "😀👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈", "你好，世界！大语言模型", "e\u0301\u0302", "①²½Ⅻ٣ 2026 3.14",
    "  \n\n\t \r\n", "trailing   ", "<|im_end|>x<|im_start|>", "\U0010ffff\U00040000\ue000", "\ufeff\u200b",
]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip_tiny(text):
    tok = tiny()
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, parse_special=False)) == text


def test_round_trip_random_code_points():
    """随机码位（排除代理 U+D800–DFFF），每串 1–40 个字符，200 串；用 rng.random() 反查均匀分布。"""
    tok = tiny()
    rng = np.random.default_rng(349)
    for _ in range(200):
        n = 1 + int(rng.random() * 40)
        cps = []
        while len(cps) < n:
            # 一半在 BMP 的常用段，一半在全范围，免得几乎全是未分配的高平面
            hi = 0x3000 if rng.random() < 0.5 else 0x110000
            cp = int(rng.random() * hi)
            if not 0xD800 <= cp <= 0xDFFF:
                cps.append(cp)
        text = "".join(map(chr, cps))
        assert tok.decode(tok.encode(text)) == text


def test_decode_partial_character_gives_replacement():
    """切在多字节字符中间：😀 = F0 9F 98 80，只解码前两个字节 -> 一个 U+FFFD；特殊 id 解成字符串。"""
    tok = tiny()
    assert tok.decode([0xF0, 0x9F]) == "\ufffd"
    assert tok.decode([0xF0, 0x9F, 0x98, 0x80]) == "😀"
    assert tok.decode([0xF0, 268]) == "\ufffd<|im_end|>"
    assert tok.decode(np.array([259, 264])) == "hello world"


# ---------------------------------------------------------------- 错误
def meta(**override):
    """一份最小的 GGUF 元数据（小词表），override 里的键覆盖或删除（值为 None 时删除）。"""
    m = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tiny_tokens(),
         "tokenizer.ggml.merges": list(TINY_MERGES),
         "tokenizer.ggml.token_type": list(TINY_TYPES),
         "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.bos_token_id": 269, "tokenizer.ggml.eos_token_id": 268}
    for k, v in override.items():
        key = "tokenizer.ggml." + k
        if v is None:
            m.pop(key, None)
        else:
            m[key] = v
    return m


def test_from_gguf_metadata_tiny():
    tok = BPETokenizer.from_gguf_metadata(meta())
    assert tok.encode("hello world") == [259, 264]
    assert (tok.bos_id, tok.eos_id, tok.im_start_id, tok.im_end_id) == (269, 268, 269, 268)


@pytest.mark.parametrize("override,message", [
    ({"model": "llama"}, "tokenizer.ggml.model = 'llama'"),
    ({"model": None}, "tokenizer.ggml.model = None"),
    ({"pre": "llama-bpe"}, "tokenizer.ggml.pre = 'llama-bpe'"),
    ({"pre": None}, "tokenizer.ggml.pre = None"),
    ({"tokens": None}, "没有 tokenizer.ggml.tokens"),
    ({"merges": None}, "没有 tokenizer.ggml.merges"),
    ({"merges": "l l"}, "tokenizer.ggml.merges 要一个列表，找到的是 str"),
    ({"merges": ["l l", "abc"]}, r"merges\[1\] = 'abc'：不认识的 merge 格式"),
    ({"merges": ["l l", "a b c"]}, r"merges\[1\] = 'a b c'：不认识的 merge 格式"),
    ({"merges": ["l  l"]}, r"merges\[0\] = 'l  l'：不认识的 merge 格式"),
    ({"merges": [7]}, r"merges\[0\] = 7：不认识的 merge 格式"),
    ({"merges": ["l l", "x y"]}, r"merges\[1\] = 'x y' 用到的 'xy' 不在词表里"),
    ({"merges": ["l l", "ll ☃"]}, r"merges\[1\] = 'll ☃' 用到的 '☃' 不在词表里"),
    ({"merges": ["l l", "l l"]}, r"merges\[1\] = 'l l' 和 merges\[0\] 重复"),
    ({"add_bos_token": True}, "add_bos_token = True"),
    ({"token_type": [1, 3]}, "token_type"),
])
def test_clear_errors(override, message):
    with pytest.raises(ValueError, match=message):
        BPETokenizer.from_gguf_metadata(meta(**override))


def test_merges_as_pairs_are_accepted():
    """新版 tokenizer.json 把 merge 写成 ["左", "右"]：同样的分词器。"""
    tok = tiny([m.split(" ") for m in TINY_MERGES])
    assert tok.encode("hello world abc") == [259, 264, 32, 267]


def test_missing_bytes_are_dropped_and_their_neighbours_in_the_piece_merge():
    """
    词表缺的字节在每一片里丢掉，同一片里剩下的字节照常合并（HF 的 BPE 在 unk_token 为空时的做法）：
    小词表拿掉 0x04 的单字节 token：0x04 是"其他"类，自成一片，丢掉后什么都不剩，两边的片各编各的。
    拿掉 "x"（0x78，字母，没有 merge 用到它）：它在字母片里，丢掉后同一片里两边的字节相邻、照常合并——
    "hxe" 剩 h e -> he = [257]；"hexllo" 剩 h e l l o -> hello = [259]。
    """
    tok = tiny(drop_bytes=(0x04,))
    assert tok.missing_bytes == [0x04] and tiny().missing_bytes == []
    assert tok.encode("a\x04b") == [97, 98]
    assert tok.encode("hello\x04 world") == [259, 264]
    assert tok.encode("\x04\x04") == []
    assert tok.encode("ab\x04c") == [266, 99]             # "ab"、"\x04"、"c" 三片：ab 合，c 不和 ab 连
    no_x = tiny(drop_bytes=(0x78,))
    assert no_x.encode("hxe") == [257] and no_x.encode("hexllo") == [259]
    assert no_x.encode("xxx") == [] and no_x.decode(no_x.encode("hexllo")) == "hello"


def test_encode_errors():
    tok = tiny(drop_bytes=(0x04,))
    with pytest.raises(ValueError, match="孤立代理 U\\+D800.*lone surrogate"):
        tok.encode("ok\ud800")
    with pytest.raises(ValueError, match="errors 只能是"):
        tok.encode("ok", errors="ignore")
    with pytest.raises(ValueError, match="cache_size"):
        BPETokenizer(tiny_tokens(), TINY_MERGES, TINY_TYPES, cache_size=-1)
    with pytest.raises(ValueError, match="要一个 str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="id 271 不在 0..270 里"):
        tok.decode([1, 271])
    with pytest.raises(ValueError, match="id 要整数"):
        tok.decode(["a"])
    with pytest.raises(ValueError, match="不是 ChatML"):
        BPETokenizer(tiny_tokens()[:256], []).chat("hi")
    with pytest.raises(ValueError, match="不是字节级字符"):
        BPETokenizer(tiny_tokens()[:256] + ["中"], [])
    with pytest.raises(ValueError, match=r"tokens\[256\] = 'a' 和 tokens\[97\] 重复"):
        BPETokenizer(tiny_tokens()[:256] + ["a"], [])


# ---------------------------------------------------------------- 真文件
def _gguf_path():
    from conftest import smollm2_path
    return smollm2_path()


@pytest.fixture(scope="module")
def smollm2():
    import gguf_lab
    return BPETokenizer.from_gguf_metadata(gguf_lab.read_gguf(_gguf_path()).metadata)


@pytest.fixture(scope="module")
def fixture_cases():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


def test_smollm2_vocab_facts(smollm2):
    """CURRICULUM §8：49152 个 token、48900 条 merge；id 0/1/2 = <|endoftext|> <|im_start|> <|im_end|>；17 个特殊。"""
    assert len(smollm2) == 49152 and len(smollm2.merges) == 48900
    assert smollm2.tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert sorted(smollm2.special_ids.values()) == list(range(17))
    assert (smollm2.im_start_id, smollm2.im_end_id, smollm2.eos_id) == (1, 2, 2)
    assert smollm2.merges[0] == ("Ġ", "t")
    assert smollm2.missing_bytes == [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                                     0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF]


def test_smollm2_matches_hf_ids(smollm2, fixture_cases):
    """
    每条参考文本：encode(text) == HF 的 ids（默认：特殊 token 字符串切成特殊 id），
    encode(text, parse_special=False) == HF 在 encode_special_tokens=True 时的 ids，decode 回原文，HF 也解码回原文。
    "unicode_version" 一条：HF（Rust 的 Unicode 表更新）把 U+11DE0 等当数字单切，这里的 unicodedata 还不认识它们
    （未分配，落进"其他"类）——片切得不同，但这几个字节之间没有 merge，id 仍然一样。
    词表缺字节的文本（hf_drops_bytes）不在这里：见下一个测试。
    """
    compared = 0
    for case in fixture_cases["cases"]:
        if case["hf_drops_bytes"]:
            continue
        text = case["text"]
        label = f"{case['group']}: {text[:40]!r}"
        assert smollm2.encode(text) == case["ids"], label
        as_text = case["ids_specials_as_text"] or case["ids"]
        assert smollm2.encode(text, parse_special=False) == as_text, label
        assert smollm2.decode(case["ids"]) == text == case["hf_decoded"], label
        compared += 1
    assert compared == 45
    for case in fixture_cases["decode_cases"]:
        assert smollm2.decode(case["ids"]) == case["hf_text"]


def test_smollm2_missing_bytes_are_dropped_like_hf(smollm2, fixture_cases):
    """
    SmolLM2 的词表缺 21 个字节的单字节 token（例如 0x04、0x1D、0xF1）。HF（unk_token 为空，vLLM 用它）在每一片里
    把这些字节悄悄丢掉；本模块一样：tests/fixtures/smollm2_missing_bytes_ids.json（make_missing_bytes_fixture.py
    生成）的每条文本逐 id 相等，解码出来也和 HF 的一样（少了那些字节）。旧的参考文件里三条 hf_drops_bytes 的文本
    同样逐 id 相等。回归：旧版本在这里抛 ValueError，serve.py 收到 "x\u0006y" 就断开连接。
    """
    with open(MISSING_FIXTURE, encoding="utf-8") as f:
        ref = json.load(f)
    assert len(ref["cases"]) == 13
    for case in ref["cases"]:
        assert smollm2.encode(case["text"]) == case["ids"], repr(case["text"])
        assert smollm2.decode(case["ids"]) == case["hf_decoded"]
    assert ref["cases"][0] == {"text": "x\x06y", "ids": [104, 105], "hf_decoded": "xy"}
    old = [c for c in fixture_cases["cases"] if c["hf_drops_bytes"]]
    assert len(old) == 3
    for case in old:
        assert smollm2.encode(case["text"]) == case["ids"]
        assert case["hf_decoded"] != case["text"]


def test_smollm2_lone_surrogates_are_refused_like_hf_or_replaced(smollm2):
    """
    参考实现不收孤立代理：HF tokenizers 对这样的 str 抛 TypeError（fixture 的 surrogates 记着）。encode 默认抛
    ValueError（说出位置，不是 UnicodeEncodeError 之类的意外）；errors="replace" 时换成 U+FFFD，和直接编码 U+FFFD 的
    文本逐 id 相同。token_bounds 用同样的规则。
    """
    with open(MISSING_FIXTURE, encoding="utf-8") as f:
        ref = json.load(f)
    assert len(ref["surrogates"]) == 4
    for case in ref["surrogates"]:
        assert case["ids"] is None and case["raises"].startswith("TypeError")
        text = case["text"]
        with pytest.raises(ValueError, match="孤立代理"):
            smollm2.encode(text)
        with pytest.raises(ValueError, match="孤立代理"):
            smollm2.token_bounds(text)
        fixed = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
        ids = smollm2.encode(text, errors="replace")
        assert ids == smollm2.encode(fixed) and smollm2.decode(ids) == fixed
        lo, hi = smollm2.token_bounds(text, errors="replace")
        assert lo <= len(ids) <= hi


def test_smollm2_chat_ids_by_hand(smollm2):
    """一条提示的 chat 形式，id 从词表里逐个查出来写在这里（"Ġ" 是空格，"Ċ" 是换行）。"""
    expected = [(1, "<|im_start|>"), (4093, "user"), (198, "Ċ"), (1780, "What"), (314, "Ġis"), (260, "Ġthe"),
                (3575, "Ġcapital"), (282, "Ġof"), (4649, "ĠFrance"), (47, "?"), (2, "<|im_end|>"), (198, "Ċ"),
                (1, "<|im_start|>"), (520, "ass"), (9531, "istant"), (198, "Ċ")]
    assert [smollm2.tokens[i] for i, _ in expected] == [s for _, s in expected]
    assert smollm2.chat("What is the capital of France?") == [i for i, _ in expected]


def test_smollm2_chat_matches_the_files_template(smollm2, fixture_cases):
    """
    文件的 tokenizer.chat_template（jinja2 渲染，add_generation_prompt=True）给的 HF id：
    只有 user 消息时模板自己加默认 system 轮 -> chat(text, system=那句默认话)；给了 system 消息 -> chat(text, system=它)。
    不给 system 的 chat(text)（本课程用的形式）正好是模板 id 去掉 system 轮的后半段。
    """
    default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    first, second = fixture_cases["chat_cases"]
    question = first["messages"][0]["content"]
    assert smollm2.chat(question, system=default_system) == first["ids"]
    assert smollm2.chat(question, system=second["messages"][0]["content"]) == second["ids"]
    plain = smollm2.chat(question)
    assert first["ids"][-len(plain):] == plain and first["ids"][-len(plain) - 2:-len(plain)] == [2, 198]


def test_smollm2_digits_are_single_tokens(smollm2):
    """
    数字单切：" 2026" = Ġ 2 0 2 6（id 216 34 32 34 38）。SmolLM2 就是这样训练的：词表里除了 0–9 本身，没有一个
    token 的字节里有 ASCII 数字（所以在这个词表上，少了数字单切，ASCII 数字串的 id 也不变——要靠小词表的
    test_digits_never_merge 和预分词的用例抓这个 bug）。
    """
    assert smollm2.encode(" 2026") == [216, 34, 32, 34, 38]
    assert [smollm2.tokens[i] for i in (216, 34, 32, 38)] == ["Ġ", "2", "0", "6"]
    table = bytes_to_unicode()
    digit_chars = {table[b] for b in b"0123456789"}
    with_digit = [t for t in smollm2.tokens if len(t) > 1 and any(c in digit_chars for c in t)
                  and t not in smollm2.special_ids]
    assert with_digit == []


def test_smollm2_round_trip_random_text(smollm2):
    """真词表上的随机文本往返（去掉词表缺的字节对应的字符：6 个控制字符、U+40000–U+BFFFF）。"""
    rng = np.random.default_rng(135)
    missing = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D}
    for _ in range(100):
        cps = []
        while len(cps) < 30:
            cp = int(rng.random() * (0x3000 if rng.random() < 0.7 else 0x110000))
            if not (0xD800 <= cp <= 0xDFFF or cp in missing or 0x40000 <= cp < 0xC0000):
                cps.append(cp)
        text = "".join(map(chr, cps))
        assert smollm2.decode(smollm2.encode(text)) == text


# ---------------------------------------------------------------- 缓存有界、token 数的上下界
def test_piece_cache_is_a_bounded_lru():
    """
    缓存最多 cache_size 片，满了丢最久没用过的：回归——旧版本的 dict 留着见过的每一片（issue 37：7 个各 ~960 KB 的
    提示让进程涨了 170 MB）。用过的片移到最后；cache_size = 0 不缓存；结果和不缓存时一样。
    """
    tok = BPETokenizer(tiny_tokens(), TINY_MERGES, TINY_TYPES, cache_size=3)
    words = ["hello", " world", " abc", " cab", " lll"]
    for w in words[:3]:
        tok.encode(w)
    assert list(tok._cache) == ["hello", " world", " abc"]
    tok.encode("hello")                                   # 用过：移到最后
    tok.encode(" cab")                                    # 满了：丢掉最久没用过的 " world"
    assert list(tok._cache) == [" abc", "hello", " cab"]
    for i in range(50):
        tok.encode(f" w{'a' * i}")
    assert len(tok._cache) == 3
    none = BPETokenizer(tiny_tokens(), TINY_MERGES, TINY_TYPES, cache_size=0)
    text = " ".join(words) * 3
    assert none.encode(text) == tok.encode(text) == tiny().encode(text)
    assert len(none._cache) == 0
    assert bpe_lab.CACHE_SIZE >= 1024 and tiny().cache_size == bpe_lab.CACHE_SIZE


def test_token_bounds_hold_and_are_tight_on_the_tiny_vocab():
    """
    小词表（去掉两个特殊 token 和 "20"：特殊 token 也算，<|im_start|> 有 7 个字母）：一个 token 最多 5 个字母
    （hello、Ġworld 的 world）、1 个数字。"hello" × 6 = 6 个 token，下界 ⌈30 / 5⌉ = 6 正好相等；"2026" 4 个数字
    4 个 token；上界 = 字节数。带特殊 token 的小词表上字母的 M 是 7，下界松一些，但照样成立（随机文本）。
    """
    plain = BPETokenizer(tiny_tokens()[:268], TINY_MERGES[:12])
    assert plain.token_bounds("hello" * 6) == (6, 30) and len(plain.encode("hello" * 6)) == 6
    assert plain.token_bounds("2026") == (4, 4) and len(plain.encode("2026")) == 4
    tok = tiny(drop_bytes=(0x04,))
    assert tok.token_bounds("hello" * 6) == (5, 30)
    assert tok.token_bounds("") == (0, 0)
    assert tok.token_bounds("a\x04\x04b") == (1, 2)         # 缺的字节不进 token：不算
    assert tok.token_bounds("\x04\x04") == (0, 0) and tok.encode("\x04\x04") == []
    assert tok.min_tokens("hello world " * 10) == tok.token_bounds("hello world " * 10)[0]
    rng = np.random.default_rng(37)
    alphabet = list("helowrdabc 2016\n\t<|>_") + ["<|im_end|>", "\x04", "é", "中"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        lo, hi = tok.token_bounds(text)
        assert lo <= len(tok.encode(text)) <= hi, repr(text)


def test_smollm2_token_bounds_hold_on_the_reference_texts(smollm2, fixture_cases):
    """
    真词表：下界 ≤ token 数 ≤ 上界，在每条参考文本（含仓库自己的文件）上。一个 token 最多 25 个 ASCII 字母、1 个
    数字、24 个 ≥ 0x80 的字节、81 个空白（"\n" + 80 个空格）：一段纯字母的文本下界是字母数 / 25，
    比只用"最长 81 字节"紧三倍多——服务器靠它在分词之前拒绝太长的提示。
    """
    assert smollm2.max_token_bytes == 81
    assert sorted(m for _, m in smollm2._byte_classes) == [1, 24, 25, 80, 81]
    for case in fixture_cases["cases"]:
        lo, hi = smollm2.token_bounds(case["text"])
        assert lo <= len(case["ids"]) <= hi, case["group"]
    words = " ".join(["abcdefghijklmnopqrstuvwxy"] * 400)        # 10,000 个字母
    assert smollm2.min_tokens(words) == 400
    assert smollm2.min_tokens(words) <= len(smollm2.encode(words))

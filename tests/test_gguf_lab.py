"""
gguf_lab：用 tests/gguf_writer.py 按格式说明拼出的小文件核对读取器——每种元数据类型、对齐补零、每种张量类型
（数据是手拼的块，期望值是手算的）、各种截断和损坏的文件给出清楚的 ValueError；真文件在机器上时再核对它的目录。
"""
import os
import struct

import numpy as np
import pytest

from gguf_lab import DEFAULT_ALIGNMENT, LOADABLE_TYPES, read_gguf
from gguf_writer import build_gguf, header_length

# 手写的 fp16 位型（小端两个字节）：0.5 = 0x3800，2.0 = 0x4000，0.25 = 0x3400，-1.0 = 0xBC00，1.0 = 0x3C00
H_HALF, H_TWO, H_QUARTER, H_MINUS1, H_ONE = b"\x00\x38", b"\x00\x40", b"\x00\x34", b"\x00\xbc", b"\x00\x3c"


def write(tmp_path, data, name="t.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


ALL_TYPES_META = [
    ("u8", "uint8", 255), ("i8", "int8", -128), ("u16", "uint16", 65535), ("i16", "int16", -32768),
    ("u32", "uint32", 2 ** 32 - 1), ("i32", "int32", -2 ** 31), ("f32", "float32", 1.5),
    ("f32_tenth", "float32", 0.1), ("yes", "bool", True), ("no", "bool", False),
    ("s", "string", "SmolLM2 · 你好"), ("empty", "string", ""),
    ("u64", "uint64", 2 ** 64 - 1), ("i64", "int64", -2 ** 63), ("f64", "float64", 0.1),
    ("arr_u8", "array", ("uint8", [1, 2, 255])), ("arr_f32", "array", ("float32", [0.5, -2.0])),
    ("arr_bool", "array", ("bool", [True, False, True])), ("arr_str", "array", ("string", ["a", "Ġt", "中"])),
    ("arr_empty", "array", ("int32", [])),
    ("nested", "array", ("array", [("int16", [1, -2]), ("string", ["x"]), ("array", [("uint8", [7])])])),
]


def test_every_metadata_type_reads_back_as_python_values(tmp_path):
    g = read_gguf(write(tmp_path, build_gguf(ALL_TYPES_META)))
    m = g.metadata
    assert g.version == 3 and len(m) == len(ALL_TYPES_META) and g.tensors == {}
    assert list(m) == [k for k, _, _ in ALL_TYPES_META]                  # 文件里的顺序
    assert (m["u8"], m["i8"], m["u16"], m["i16"]) == (255, -128, 65535, -32768)
    assert (m["u32"], m["i32"], m["u64"], m["i64"]) == (4294967295, -2147483648, 18446744073709551615,
                                                        -9223372036854775808)
    assert m["f32"] == 1.5 and m["f64"] == 0.1
    assert m["f32_tenth"] == 0.10000000149011612                          # 0.1 的 float32 值
    assert m["yes"] is True and m["no"] is False
    assert m["s"] == "SmolLM2 · 你好" and m["empty"] == ""
    assert m["arr_u8"] == [1, 2, 255] and m["arr_f32"] == [0.5, -2.0]
    assert m["arr_bool"] == [True, False, True] and all(type(b) is bool for b in m["arr_bool"])
    assert m["arr_str"] == ["a", "Ġt", "中"] and m["arr_empty"] == []
    assert m["nested"] == [[1, -2], ["x"], [[7]]]
    assert all(type(v) is int for v in m["arr_u8"])                       # Python 的 int，不是 numpy 标量
    assert g.alignment == DEFAULT_ALIGNMENT == 32


def test_version_2_reads_the_same_and_other_versions_are_refused(tmp_path):
    meta = [("k", "string", "v")]
    assert read_gguf(write(tmp_path, build_gguf(meta, version=2))).metadata == {"k": "v"}
    for v in (1, 4):
        with pytest.raises(ValueError, match=f"版本 {v} 不支持.*支持的版本：2, 3"):
            read_gguf(write(tmp_path, build_gguf(meta, version=v)))
    with pytest.raises(ValueError, match="大端"):                         # v3 的大端文件：版本号的字节是反的
        read_gguf(write(tmp_path, build_gguf(meta, version=3 << 24)))


def test_bad_magic(tmp_path):
    with pytest.raises(ValueError, match="不是 GGUF 文件.*b'GGML'"):
        read_gguf(write(tmp_path, build_gguf([("k", "uint8", 1)], magic=b"GGML")))
    with pytest.raises(ValueError, match="截断"):
        read_gguf(write(tmp_path, b"GG"))


# 手拼的块 ------------------------------------------------------------------------------------------
def q8_0_block():
    # d = 0.5；q = [-128, -1, 0, 1, 127, 2, 2, ..., 2]  ->  w = [-64, -0.5, 0, 0.5, 63.5, 1, ..., 1]
    q = [-128, -1, 0, 1, 127] + [2] * 27
    return H_HALF + struct.pack("<32b", *q), [-64.0, -0.5, 0.0, 0.5, 63.5] + [1.0] * 27


def q4_0_block():
    # d = 2；字节 0 = 0x1F：元素 0 = 15 -> 2·(15 − 8) = 14，元素 16 = 1 -> −14；其余字节 0x88：元素 = 8 -> 0
    # 字节 15 = 0x0F：元素 15 = 15 -> 14，元素 31 = 0 -> −16
    qs = bytes([0x1F] + [0x88] * 14 + [0x0F])
    want = [0.0] * 32
    want[0], want[16], want[15], want[31] = 14.0, -14.0, 14.0, -16.0
    return H_TWO + qs, want


def q4_1_block():
    # d = 0.25，m = −1；字节 0 = 0x2A：元素 0 = 10 -> 0.25·10 − 1 = 1.5，元素 16 = 2 -> −0.5；
    # 其余字节 0x40：低 4 位 0 -> −1，高 4 位 4 -> 0
    qs = bytes([0x2A] + [0x40] * 15)
    want = [1.5] + [-1.0] * 15 + [-0.5] + [0.0] * 15
    return H_QUARTER + H_MINUS1 + qs, want


def typed_tensors():
    """每种能反量化的类型一个张量，外加手算的期望值（numpy 形状，最外层在前）。"""
    f32 = np.arange(6, dtype="<f4").reshape(2, 3) - 2.5                 # 形状 (2, 3)：GGUF 里列成 [3, 2]
    f16 = H_ONE + H_MINUS1 + H_HALF + H_TWO                              # [1, −1, 0.5, 2]
    b8, w8 = q8_0_block()
    b40, w40 = q4_0_block()
    b41, w41 = q4_1_block()
    tensors = [("a.f32", (2, 3), "F32", f32.tobytes()), ("b.f16", (4,), "F16", f16),
               ("c.q8_0", (2, 32), "Q8_0", b8 + H_ONE + struct.pack("<32b", *range(-16, 16))),
               ("d.q4_0", (32,), "Q4_0", b40), ("e.q4_1", (1, 32), "Q4_1", b41)]
    want = {"a.f32": [[-2.5, -1.5, -0.5], [0.5, 1.5, 2.5]], "b.f16": [1.0, -1.0, 0.5, 2.0],
            "c.q8_0": [w8, [float(i) for i in range(-16, 16)]], "d.q4_0": w40, "e.q4_1": [w41]}
    return tensors, want


def test_each_tensor_type_dequantizes_to_hand_computed_values(tmp_path):
    tensors, want = typed_tensors()
    g = read_gguf(write(tmp_path, build_gguf([("general.name", "string", "t")], tensors)))
    assert list(g.tensors) == [t[0] for t in tensors]
    assert [g.tensors[n].type for n in g.tensors] == ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"]
    for name, shape, _, raw in tensors:
        info = g.tensors[name]
        assert info.shape == shape and info.n_bytes == len(raw)
        arr = g.load(name)
        assert arr.dtype == np.float32 and arr.shape == shape
        assert arr.tolist() == want[name], name
        assert g.load(name, dtype=np.float64).tolist() == want[name]
    assert g.n_parameters == 6 + 4 + 64 + 32 + 32


def test_shape_is_numpy_order_and_rows_are_contiguous(tmp_path):
    # GGUF 目录里写 [3, 2]（ne0 = 3 是连续的那维）：numpy 里是 (2, 3)，第 0 行是前 3 个数
    data = np.array([1, 2, 3, 4, 5, 6], dtype="<f4").tobytes()
    g = read_gguf(write(tmp_path, build_gguf([], [("m", (2, 3), "F32", data)])))
    raw_dims = struct.unpack_from("<QQ", (tmp_path / "t.gguf").read_bytes(), 24 + 8 + 1 + 4)
    assert raw_dims == (3, 2)
    assert g.load("m").tolist() == [[1, 2, 3], [4, 5, 6]]


def test_alignment_padding_and_absolute_offsets(tmp_path):
    meta = [("general.alignment", "uint32", 64), ("x", "string", "abc")]
    tensors = [("t1", (3,), "F32", np.array([1, 2, 3], "<f4").tobytes()),   # 12 字节 -> 下一个补到 64
               ("t2", (2,), "F32", np.array([7, 8], "<f4").tobytes())]
    data = build_gguf(meta, tensors, alignment=64)
    g = read_gguf(write(tmp_path, data))
    start = header_length(meta, tensors, alignment=64)
    assert g.alignment == 64 and g.data_offset == start and start % 64 == 0
    assert g.tensors["t1"].offset == start and g.tensors["t2"].offset == start + 64
    assert data[start + 12:start + 64] == b"\x00" * 52                     # 补的零
    assert g.load("t2").tolist() == [7.0, 8.0]
    assert isinstance(g.raw("t2"), np.memmap)                              # 数据是映射的，不是读进来的
    for bad in (0, 48, -1):
        m = [("general.alignment", "int32", bad)]
        with pytest.raises(ValueError, match="general.alignment"):
            read_gguf(write(tmp_path, build_gguf(m, alignment=32)))


def test_misaligned_offset_is_refused(tmp_path):
    tensors = [("t", (2,), "F32", b"\x00" * 8), ("u", (2,), "F32", b"\x00" * 8)]
    with pytest.raises(ValueError, match="'u' 的偏移 8 不是对齐数 32 的倍数"):
        read_gguf(write(tmp_path, build_gguf([], tensors, offsets=[0, 8])))


def test_overlapping_tensors_are_refused(tmp_path):
    tensors = [("t", (16,), "F32", b"\x00" * 64), ("u", (2,), "F32", b"\x00" * 8)]
    with pytest.raises(ValueError, match="重叠"):
        read_gguf(write(tmp_path, build_gguf([], tensors, offsets=[0, 32])))


def test_every_truncation_gives_a_clear_value_error(tmp_path):
    tensors, _ = typed_tensors()
    data = build_gguf(ALL_TYPES_META, tensors)
    start = header_length(ALL_TYPES_META, tensors)
    cuts = list(range(0, start, 3)) + [start + 1, len(data) - 1]
    for n in cuts:
        with pytest.raises(ValueError, match="截断|不是 GGUF|不支持"):
            read_gguf(write(tmp_path, data[:n]))
    assert len(read_gguf(write(tmp_path, data)).tensors) == 5


def test_truncated_string_array_names_the_key_and_element(tmp_path):
    data = build_gguf([("arr_str", "array", ("string", ["abc", "defg"]))])
    end = 24 + 8 + 7 + 4 + 4 + 8 + (8 + 3) + (8 + 4)         # 头 + 键 + 值类型 + 元素类型 + 个数 + 两个字符串
    for cut in (end - 2, end - 4 - 3):                        # 第 2 个字符串的字节里、它的长度里
        with pytest.raises(ValueError, match=r"截断.*'arr_str' \[1\]"):
            read_gguf(write(tmp_path, data[:cut]))


def test_tensor_data_past_the_end_names_the_tensor(tmp_path):
    tensors, _ = typed_tensors()
    data = build_gguf([], tensors)
    with pytest.raises(ValueError, match="截断：张量 'e.q4_1' 的数据到第 .* 字节，文件只有"):
        read_gguf(write(tmp_path, data[:-1]))


def test_corrupt_counts_strings_and_type_ids(tmp_path):
    with pytest.raises(ValueError, match="截断或已损坏"):                  # 元数据条数大得离谱
        read_gguf(write(tmp_path, build_gguf([("k", "uint8", 1)], n_kv=2 ** 40)))
    with pytest.raises(ValueError, match="UTF-8"):
        read_gguf(write(tmp_path, build_gguf([("k", "string", b"\xff\xfe")])))
    with pytest.raises(ValueError, match=r"'arr' \[1\] 不是合法的 UTF-8"):   # 词表那样的字符串数组
        read_gguf(write(tmp_path, build_gguf([("arr", "array", ("string", ["ok", b"\xc3"]))])))
    data = bytearray(build_gguf([("k", "uint8", 1)]))
    struct.pack_into("<I", data, 24 + 8 + 1, 13)                          # 值类型改成 13
    with pytest.raises(ValueError, match="值类型编号 13 不认识"):
        read_gguf(write(tmp_path, bytes(data)))
    with pytest.raises(ValueError, match="类型编号 99 不认识"):
        read_gguf(write(tmp_path, build_gguf([], [("t", (2,), "F32", b"\x00" * 8)], type_ids=[99])))
    with pytest.raises(ValueError, match="出现了两次"):
        read_gguf(write(tmp_path, build_gguf([("k", "uint8", 1), ("k", "uint8", 2)])))
    with pytest.raises(ValueError, match="出现了两次"):
        read_gguf(write(tmp_path, build_gguf([], [("t", (2,), "F32", b"\x00" * 8)] * 2)))
    with pytest.raises(ValueError, match="不是 32 的倍数"):                # Q8_0 的最内层维必须是整块
        read_gguf(write(tmp_path, build_gguf([], [("t", (16,), "Q8_0", b"\x00" * 17)])))


def test_unsupported_tensor_type_lists_but_refuses_to_load(tmp_path):
    # Q6_K：每块 256 个数 210 字节。目录照样能读（只看元数据的人，如分词器，也能用），load 时说清楚
    tensors = [("k6", (256,), "Q6_K", b"\x00" * 210), ("f", (2,), "F32", b"\x00" * 8)]
    g = read_gguf(write(tmp_path, build_gguf([("a", "uint8", 1)], tensors)))
    assert g.tensors["k6"].type == "Q6_K" and g.tensors["k6"].n_bytes == 210
    with pytest.raises(ValueError, match="Q6_K.*支持的类型：F32, F16, Q8_0, Q4_0, Q4_1"):
        g.load("k6")
    assert LOADABLE_TYPES == ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
    with pytest.raises(ValueError, match="没有名为 'nope' 的张量"):
        g.load("nope")
    with pytest.raises(ValueError, match="float32 或 float64"):
        g.load("f", dtype=np.int32)


# 真文件（在机器上时） ---------------------------------------------------------------------------------
def _real_path():
    from conftest import smollm2_path
    return smollm2_path()


def test_real_smollm2_file_directory_and_first_block():
    path = _real_path()
    g = read_gguf(path)
    assert g.version == 3 and len(g.metadata) == 33 and len(g.tensors) == 272
    assert "general.alignment" not in g.metadata and g.alignment == 32
    types = [t.type for t in g.tensors.values()]
    assert (types.count("Q4_1"), types.count("Q8_0"), types.count("F32")) == (210, 1, 61)
    assert g.n_parameters == 134_515_008 and "output.weight" not in g.tensors
    m = g.metadata
    assert (m["llama.block_count"], m["llama.embedding_length"], m["llama.feed_forward_length"]) == (30, 576, 1536)
    assert (m["llama.attention.head_count"], m["llama.attention.head_count_kv"]) == (9, 3)
    assert len(m["tokenizer.ggml.tokens"]) == 49152 and m["tokenizer.ggml.tokens"][2] == "<|im_end|>"
    shapes = {n: g.tensors[n].shape for n in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                              "blk.0.ffn_down.weight", "blk.29.ffn_up.weight", "output_norm.weight")}
    assert shapes == {"token_embd.weight": (49152, 576), "blk.0.attn_q.weight": (576, 576),
                      "blk.0.attn_k.weight": (192, 576), "blk.0.ffn_down.weight": (576, 1536),
                      "blk.29.ffn_up.weight": (1536, 576), "output_norm.weight": (576,)}
    # 词嵌入第 0 行的前 32 个数 = 第一个 Q8_0 块：手解 34 个字节（fp16 d 用 struct 的 'e'，q 是 int8）
    t = g.tensors["token_embd.weight"]
    with open(path, "rb") as f:
        f.seek(t.offset)
        block = f.read(34)
    (d,) = struct.unpack("<e", block[:2])
    q = struct.unpack("<32b", block[2:])
    want = [np.float32(d) * np.float32(v) for v in q]
    row0 = g.load("token_embd.weight")[0]
    assert row0.shape == (576,) and row0[:32].tolist() == want

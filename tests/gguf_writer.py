"""
gguf_writer —— 测试用的小 GGUF 写入器：按格式说明（llama.cpp 的 ggml/docs/gguf.md）逐字节拼出一个文件。

不经过 gguf_lab（它是被测的读取器），所以是独立的参照。只给测试用：文件名不以 test_ 开头，pytest 不收集它。

build_gguf(metadata, tensors, ...) -> bytes：
- metadata：[(键, 类型名, 值)]，类型名是 "uint8" … "float64"、"bool"、"string"、"array"；
  数组的值写成 (元素类型名, [元素…])，元素类型名也可以是 "array"（嵌套：每个元素又是 (类型名, [...])）。
- tensors：[(名字, numpy 形状, ggml 类型名, 数据字节)]；写进目录时各维**倒过来**（最内层在前）。
- alignment：数据区和每个张量的对齐（不写 general.alignment 键；要写就放进 metadata，并传同一个数）。
- 做坏文件用的开关：version、magic、offsets（直接给每个张量的相对偏移）、type_ids（直接给类型编号）。
"""
import struct

VALUE_TYPE_IDS = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5, "float32": 6,
                  "bool": 7, "string": 8, "array": 9, "uint64": 10, "int64": 11, "float64": 12}
_FMT = {"uint8": "<B", "int8": "<b", "uint16": "<H", "int16": "<h", "uint32": "<I", "int32": "<i",
        "float32": "<f", "bool": "<B", "uint64": "<Q", "int64": "<q", "float64": "<d"}
GGML_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q6_K": 14, "BF16": 30}


def gguf_string(s):
    raw = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(vtype, value):
    if vtype == "string":
        return gguf_string(value)
    if vtype == "array":
        etype, items = value
        out = struct.pack("<IQ", VALUE_TYPE_IDS[etype], len(items))
        return out + b"".join(gguf_value(etype, v) for v in items)
    return struct.pack(_FMT[vtype], int(value) if vtype == "bool" else value)


def _pad(n, align):
    return (-n) % align


def build_gguf(metadata=(), tensors=(), alignment=32, version=3, magic=b"GGUF", offsets=None, type_ids=None,
               n_kv=None, n_tensors=None):
    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors,
                        len(metadata) if n_kv is None else n_kv)
    for key, vtype, value in metadata:
        head += gguf_string(key) + struct.pack("<I", VALUE_TYPE_IDS[vtype]) + gguf_value(vtype, value)
    rel, data = [], b""
    for _, _, _, raw in tensors:
        data += b"\x00" * _pad(len(data), alignment)
        rel.append(len(data))
        data += raw
    if offsets is not None:
        rel = list(offsets)
    for i, (name, shape, tname, _) in enumerate(tensors):
        dims = list(reversed(shape))                  # GGUF：最内层的维在前
        tid = GGML_TYPE_IDS[tname] if type_ids is None else type_ids[i]
        head += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", tid, rel[i])
    head += b"\x00" * _pad(len(head), alignment)
    return head + data


def header_length(metadata=(), tensors=(), alignment=32):
    """数据区开头的字节位置（= 文件头 + 元数据 + 目录 + 补齐）。"""
    return len(build_gguf(metadata, [(n, s, t, b"") for n, s, t, _ in tensors], alignment))

"""
gguf_lab —— 用 numpy 读一个 GGUF 文件：版本、元数据、张量目录，以及把一个张量反量化成 numpy 数组。

【GGUF 的布局】（llama.cpp 的 ggml/docs/gguf.md；gguf-py 的 constants.py / gguf_reader.py。全部小端）
1. 文件头：4 字节魔数 b"GGUF"、uint32 版本、uint64 张量个数、uint64 元数据条数。
2. 元数据：每条 = 键（字符串）+ uint32 值类型 + 值。字符串 = uint64 字节数 + UTF-8 字节（没有结尾的 0）。
   值类型：0 uint8、1 int8、2 uint16、3 int16、4 uint32、5 int32、6 float32、7 bool（1 字节）、8 string、
   9 array（uint32 元素类型 + uint64 个数 + 元素；元素也可以是 array，即嵌套）、10 uint64、11 int64、12 float64。
3. 张量目录：每个张量 = 名字（字符串）+ uint32 维数 + 每维一个 uint64（**最内层的维在前**：ggml 的 ne[0] 是
   连续存放的那一维）+ uint32 ggml 类型 + uint64 偏移（相对数据区开头，必须是对齐数的倍数）。
4. 补零到 general.alignment（没有这个键时是 32）的倍数，然后是数据区。

【本模块的约定】
- 形状按 **numpy 的顺序**（最外层在前）：GGUF 里列成 [576, 49152] 的词嵌入，这里是 (49152, 576)；
  一个矩阵是 [out, in]（课程的 transformer_lab 存成 [in, out]，用时要转置）。
- 元数据的值变成 Python 的值：整数 → int，float32 / float64 → float（float32 先按 float32 读，所以 1e-5 读出来是
  9.99999974738e-06），bool → bool，字符串 → str，数组 → list（嵌套数组 → list 的 list）。
- 张量的数据**不在打开时读**：np.memmap 映射整个文件，load 时才按偏移取出那一段反量化（copy 出来，和文件无关）。
- 版本：支持 v2 和 v3（小端）。两者布局相同——v2 把个数和字符串长度改成 uint64（llama.cpp PR #2821；v1 是 uint32，
  不支持），v3 只是允许整个文件大端存（llama.cpp issue #3957）；大端文件（版本号读出来是 3 << 24）明确报错。
- 能反量化的类型：F32、F16、Q8_0、Q4_0、Q4_1（块格式的解码在 ../prereq3/numfmt 的 GGUF 一节）。别的类型
  （Q4_K、Q6_K、BF16……）照样列在目录里（能算出字节数的算出来），load 时抛 ValueError，说出类型和支持的类型。
- 坏文件一律抛 ValueError，说出哪里坏了：魔数不对、版本不支持、读元数据 / 目录时越过文件末尾、字符串不是 UTF-8、
  值类型或张量类型编号不认识、张量数据越过文件末尾、偏移没对齐、张量互相重叠、重复的键或张量名。
"""
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np

_PREREQ3 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prereq3")
if _PREREQ3 not in sys.path:
    sys.path.insert(0, _PREREQ3)

__all__ = ["read_gguf", "GGUFFile", "TensorInfo", "GGUF_MAGIC", "SUPPORTED_VERSIONS", "DEFAULT_ALIGNMENT",
           "VALUE_TYPES", "GGML_TYPES", "GGML_TYPE_SIZES", "LOADABLE_TYPES"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32          # gguf-py constants.py: GGUF_DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                    # ggml 的张量最多 4 维（GGML_MAX_DIMS）

# 元数据的值类型编号 -> (名字, struct 格式)；string / array 没有定长格式（gguf-py constants.py 的 GGUFValueType）
VALUE_TYPES = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
    4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"),
    8: ("string", None), 9: ("array", None), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
    12: ("float64", "<d"),
}
# 定长数值数组一次读出来用的 numpy dtype
_NP_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8", 11: "<i8",
              12: "<f8"}

# ggml 的张量类型编号 -> 名字（ggml.h 的 enum ggml_type；4、5 已删除，31–33 是已删除的重排版本）
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
    34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}
# 类型名 -> (每块几个数, 每块几个字节)（gguf-py constants.py 的 GGML_QUANT_SIZES；QK_K = 256）。
# 只列这些：目录里别的类型的张量字节数记作 None（不检查它的数据范围，load 也不支持）。
GGML_TYPE_SIZES = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "F64": (1, 8),
    "I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q8_1": (32, 40),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "Q8_K": (256, 292),
}
LOADABLE_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")


@dataclass(frozen=True)
class TensorInfo:
    """张量目录里的一项。shape 按 numpy 的顺序（最外层在前）；offset 是文件里的绝对字节位置。"""
    name: str
    shape: tuple
    type: str
    offset: int
    n_bytes: object   # int；类型的块大小不知道时是 None

    @property
    def n_elements(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
    """在映射好的文件上顺序读；越过文件末尾就抛 ValueError，说出在读什么。"""

    def __init__(self, buf, path):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def need(self, n, what):
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"GGUF 文件 {self.path} 被截断或已损坏：在第 {self.pos} 字节读{what}需要 {n} 字节，"
                             f"文件只有 {self.size} 字节")

    def scalar(self, fmt, what):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what):
        n = self.scalar("<Q", what + "的长度")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"GGUF 文件 {self.path} 已损坏：第 {self.pos} 字节起的{what}不是合法的 UTF-8（{e}）") from None
        self.pos += n
        return s

    def _strings(self, count, what):
        """count 个连着的字符串（词表有 49152 个：这个循环比逐个调 string() 快几倍）。"""
        buf, pos, size = self.buf, self.pos, self.size
        mv = memoryview(buf)
        unpack = struct.Struct("<Q").unpack_from
        out = []
        try:
            for i in range(count):
                if pos + 8 > size:
                    break
                (n,) = unpack(buf, pos)
                pos += 8
                if pos + n > size:
                    break
                out.append(str(mv[pos:pos + n], "utf-8"))
                pos += n
        except UnicodeDecodeError as e:
            raise ValueError(f"GGUF 文件 {self.path} 已损坏：{what}[{i}] 不是合法的 UTF-8（{e}）") from None
        self.pos = pos
        if len(out) < count:   # 越过了文件末尾：让 need 说出在哪里
            self.need(8 if pos + 8 > size else unpack(buf, pos - 8)[0], f"{what}[{len(out)}]")
        return out

    def value(self, vtype, what, depth=0):
        if vtype not in VALUE_TYPES:
            raise ValueError(f"GGUF 文件 {self.path} 已损坏：{what}的值类型编号 {vtype} 不认识"
                             f"（合法的是 0–12：{', '.join(n for n, _ in VALUE_TYPES.values())}）")
        name, fmt = VALUE_TYPES[vtype]
        if name == "string":
            return self.string(what)
        if name == "array":
            if depth > 16:
                raise ValueError(f"GGUF 文件 {self.path} 已损坏：{what}的数组嵌套超过 16 层")
            etype = self.scalar("<I", what + "的元素类型")
            count = self.scalar("<Q", what + "的元素个数")
            if etype in _NP_DTYPES:   # 定长数值：一次读出来
                item = np.dtype(_NP_DTYPES[etype]).itemsize
                self.need(count * item, f"{what}的 {count} 个元素")
                arr = np.frombuffer(self.buf, dtype=_NP_DTYPES[etype], count=count, offset=self.pos)
                self.pos += count * item
                return arr.tolist()
            if etype == 7:
                self.need(count, f"{what}的 {count} 个元素")
                arr = np.frombuffer(self.buf, dtype=np.uint8, count=count, offset=self.pos)
                self.pos += count
                return [bool(b) for b in arr]
            # 每个字符串至少 8 字节（长度），先粗查一下个数，免得损坏的个数让循环跑很久
            self.need(min(count, self.size) * 8 if etype in (8, 9) else 0, f"{what}的 {count} 个元素")
            if etype == 8:
                return self._strings(count, what)
            return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]
        v = self.scalar(fmt, what)
        return bool(v) if name == "bool" else v


class GGUFFile:
    """
    一个打开的 GGUF 文件：version、metadata（键 -> Python 值）、tensors（名字 -> TensorInfo，按文件里的顺序）、
    alignment、data_offset（数据区开头的绝对字节位置）、file_size；load(name) 反量化一个张量。
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        if size < 4:
            raise ValueError(f"GGUF 文件 {self.path} 被截断：只有 {size} 字节，连 4 字节的魔数都不够")
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.file_size = size
        cur = _Cursor(self._mm, self.path)
        magic = bytes(self._mm[:4])
        if magic != GGUF_MAGIC:
            raise ValueError(f"{self.path} 不是 GGUF 文件：开头 4 个字节是 {magic!r}，应当是 {GGUF_MAGIC!r}")
        cur.pos = 4
        version = cur.scalar("<I", "版本号")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            hint = "（看起来是大端文件：本读取器只读小端）" if swapped in SUPPORTED_VERSIONS else ""
            raise ValueError(f"GGUF 文件 {self.path} 的版本 {version} 不支持{hint}；"
                             f"支持的版本：{', '.join(map(str, SUPPORTED_VERSIONS))}")
        self.version = version
        n_tensors = cur.scalar("<Q", "张量个数")
        n_kv = cur.scalar("<Q", "元数据条数")
        # 每条元数据至少 8 + 4 字节，每个张量至少 8 + 4 + 4 + 8 字节：个数大得离谱就是坏文件
        cur.need(n_kv * 12 + n_tensors * 24, f"{n_kv} 条元数据和 {n_tensors} 个张量的目录")

        self.metadata = {}
        for i in range(n_kv):
            key = cur.string(f"第 {i} 条元数据的键")
            if key in self.metadata:
                raise ValueError(f"GGUF 文件 {self.path} 已损坏：元数据的键 {key!r} 出现了两次")
            vtype = cur.scalar("<I", f"元数据 {key!r} 的值类型")
            self.metadata[key] = cur.value(vtype, f"元数据 {key!r} ")

        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
            # llama.cpp 的 gguf.cpp 也拒绝不是 2 的幂的对齐数（"alignment %zu is not a power of 2"）
            raise ValueError(f"GGUF 文件 {self.path} 的 general.alignment = {align!r} 不合法：应当是 2 的正整数次幂")
        self.alignment = align

        raw_infos = []
        for i in range(n_tensors):
            name = cur.string(f"第 {i} 个张量的名字")
            n_dims = cur.scalar("<I", f"张量 {name!r} 的维数")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ValueError(f"GGUF 文件 {self.path} 已损坏：张量 {name!r} 有 {n_dims} 维（ggml 允许 1–{MAX_DIMS} 维）")
            cur.need(8 * n_dims, f"张量 {name!r} 的各维大小")
            dims = [cur.scalar("<Q", f"张量 {name!r} 的维") for _ in range(n_dims)]
            tid = cur.scalar("<I", f"张量 {name!r} 的类型")
            if tid not in GGML_TYPES:
                raise ValueError(f"GGUF 文件 {self.path} 里张量 {name!r} 的类型编号 {tid} 不认识"
                                 f"（文件损坏，或者比本读取器新）")
            rel = cur.scalar("<Q", f"张量 {name!r} 的偏移")
            raw_infos.append((name, dims, GGML_TYPES[tid], rel))
        self.data_offset = -(-cur.pos // align) * align
        if self.data_offset > size:
            raise ValueError(f"GGUF 文件 {self.path} 被截断：数据区应从第 {self.data_offset} 字节开始，文件只有 {size} 字节")

        self.tensors = {}
        for name, dims, tname, rel in raw_infos:
            if name in self.tensors:
                raise ValueError(f"GGUF 文件 {self.path} 已损坏：张量名 {name!r} 出现了两次")
            if rel % align:
                raise ValueError(f"GGUF 文件 {self.path} 已损坏：张量 {name!r} 的偏移 {rel} 不是对齐数 {align} 的倍数")
            n_bytes = None
            if tname in GGML_TYPE_SIZES:
                blk, tsize = GGML_TYPE_SIZES[tname]
                if dims[0] % blk:
                    raise ValueError(f"GGUF 文件 {self.path} 已损坏：张量 {name!r} 是 {tname}（每块 {blk} 个数），"
                                     f"最内层的维 {dims[0]} 不是 {blk} 的倍数")
                n_el = 1
                for d in dims:
                    n_el *= d
                n_bytes = n_el // blk * tsize
                end = self.data_offset + rel + n_bytes
                if end > size:
                    raise ValueError(f"GGUF 文件 {self.path} 被截断：张量 {name!r} 的数据到第 {end} 字节，"
                                     f"文件只有 {size} 字节")
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), tname, self.data_offset + rel, n_bytes)
        spans = sorted((t.offset, t.offset + t.n_bytes, t.name) for t in self.tensors.values() if t.n_bytes)
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise ValueError(f"GGUF 文件 {self.path} 已损坏：张量 {an!r} 和 {bn!r} 的数据重叠")

    @property
    def n_parameters(self):
        """全部张量的元素个数之和（共享的词嵌入只有一个张量，只算一次）。"""
        return sum(t.n_elements for t in self.tensors.values())

    def _info(self, name):
        if name not in self.tensors:
            some = ", ".join(list(self.tensors)[:3])
            raise ValueError(f"{self.path} 里没有名为 {name!r} 的张量（共 {len(self.tensors)} 个，例如 {some}）")
        return self.tensors[name]

    def raw(self, name):
        """张量在文件里的原始字节（uint8 的只读 memmap 切片，不复制）。"""
        t = self._info(name)
        if t.n_bytes is None:
            raise ValueError(f"张量 {name!r} 的类型 {t.type} 的块大小未知，取不出原始字节")
        return self._mm[t.offset:t.offset + t.n_bytes]

    def load(self, name, dtype=np.float32):
        """
        把张量 name 反量化成 numpy 数组 -> 形状 info.shape（numpy 顺序），dtype 默认 float32（新数组，不引用文件）。

        【推导】F32 直接读；F16 转 float32；Q8_0 / Q4_0 / Q4_1 用 numfmt.decode_blocks 按 llama.cpp 的公式在 float32 里算
        （w = d·q、d·(q − 8)、d·q + m），最后才转成 dtype（所以 float64 的结果是 float32 值的精确拷贝）。
        【参数】dtype：np.float32 或 np.float64。
        【边界】别的张量类型抛 ValueError，说出类型名和支持的类型。
        """
        t = self._info(name)
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype 只能是 float32 或 float64，不是 {dtype}")
        if t.type not in LOADABLE_TYPES:
            raise ValueError(f"张量 {name!r} 的类型是 {t.type}，本读取器不会反量化它；"
                             f"支持的类型：{', '.join(LOADABLE_TYPES)}")
        raw = self._mm[t.offset:t.offset + t.n_bytes]
        if t.type == "F32":
            return np.array(np.frombuffer(raw, dtype="<f4").reshape(t.shape), dtype=dtype)   # 复制出文件
        if t.type == "F16":
            flat = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            from numfmt import decode_blocks  # 块格式属于"数的格式"，住在 ../prereq3/numfmt
            flat = decode_blocks(raw, t.type)
        return flat.reshape(t.shape).astype(dtype, copy=False)       # flat 是新数组：float32 时不再复制

    def close(self):
        """放开文件映射（之后不能再 load；映射在没有别的引用时由 numpy 关闭）。"""
        self._mm = None

    def __repr__(self):
        return (f"GGUFFile({self.path!r}, v{self.version}, {len(self.metadata)} 条元数据, "
                f"{len(self.tensors)} 个张量, 对齐 {self.alignment})")


def read_gguf(path):
    """
    打开一个 GGUF 文件 -> GGUFFile（元数据和张量目录已读好，张量数据映射着、load 时才读）。

    【参数】path：文件路径（str 或 os.PathLike）。
    【边界】魔数、版本、截断、损坏、对齐不对都抛 ValueError（见模块说明）；不支持的张量类型到 load 时才报错，
    所以只想看元数据（例如分词器的词表）时，任何类型的文件都能打开。
    """
    return GGUFFile(path)

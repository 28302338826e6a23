"""
numfmt 的 GGUF 块格式（Q8_0、Q4_0、Q4_1）：手拼的块和手算的值；逐个数的标量解码（照格式说明写的循环，struct 读 fp16）
核对向量化的 decode_blocks；编码的舍入规则（roundf 远离 0、Q4_0 的截断 + 8.5、Q4_1 的 + 0.5）用手算的例子核对。
"""
import struct

import numpy as np
import pytest

from numfmt import GGUF_BITS_PER_WEIGHT, GGUF_BLOCK_BYTES, decode_blocks, encode_blocks, quantize_gguf

# 手写的 fp16 位型（小端）
H = {0.5: b"\x00\x38", 1.0: b"\x00\x3c", 2.0: b"\x00\x40", 0.25: b"\x00\x34", -1.0: b"\x00\xbc", 3.0: b"\x00\x42",
     0.199951171875: b"\x66\x32"}


def test_bits_per_weight_include_the_scales():
    # 每块 32 个数：Q8_0 = 2 + 32 字节，Q4_0 = 2 + 16，Q4_1 = 2 + 2 + 16
    assert GGUF_BLOCK_BYTES == {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
    assert GGUF_BITS_PER_WEIGHT == {"Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5.0}


def test_nibble_order_low_is_j_high_is_j_plus_16():
    # 字节 j = j | (15 − j) << 4：元素 0..15 = 0..15，元素 16..31 = 15..0（d = 1，Q4_1 的 m = 0）
    qs = bytes(j | ((15 - j) << 4) for j in range(16))
    q4_1 = decode_blocks(H[1.0] + b"\x00\x00" + qs, "Q4_1")
    assert q4_1.tolist() == list(range(16)) + list(range(15, -1, -1))
    q4_0 = decode_blocks(H[1.0] + qs, "Q4_0")
    assert q4_0.tolist() == [j - 8 for j in range(16)] + [7 - j for j in range(16)]


def test_hand_built_blocks_decode_to_hand_values():
    q = [-128, -1, 0, 1, 127] + [2] * 27
    assert decode_blocks(H[0.5] + struct.pack("<32b", *q), "Q8_0").tolist() == [-64, -0.5, 0, 0.5, 63.5] + [1] * 27
    # Q4_1：d = 0.25、m = −1，字节 0x2A（元素 0 = 10、元素 16 = 2），其余 0x40（低 0、高 4）
    got = decode_blocks(H[0.25] + H[-1.0] + bytes([0x2A] + [0x40] * 15), "Q4_1")
    assert got.tolist() == [1.5] + [-1.0] * 15 + [-0.5] + [0.0] * 15
    # 两块连着：第二块自己的 d
    two = decode_blocks(H[2.0] + bytes([0x88] * 16) + H[0.5] + bytes([0xF0] * 16), "Q4_0")
    assert two.tolist() == [0.0] * 32 + [-4.0] * 16 + [3.5] * 16
    assert decode_blocks(b"", "Q8_0").shape == (0,)


def test_q4_1_result_is_the_float32_rounding_of_d_q_plus_m():
    # d·q 在 float32 里是精确的，只有 + m 舍入一次。d = 2^-24（最小的 fp16 次正规数，位型 0x0001），m = 1，q = 15：精确值 1 + 15·2^-24 = 1 + 7.5·2^-23，
    # float32 里 1 附近的间隔是 2^-23：7.5 一样近地落在 7 和 8 之间，取偶 -> 1 + 8·2^-23 = 1 + 2^-20
    got = decode_blocks(b"\x01\x00" + H[1.0] + bytes([0x0F] * 16), "Q4_1")
    assert got.dtype == np.float32
    assert got[0] == np.float32(1 + 2.0 ** -20) and float(got[0]) != 1 + 15 * 2.0 ** -24
    assert got[16] == 1.0                                        # 高 4 位是 0：w = m


def scalar_decode(raw, kind):
    """照格式说明逐个数解码（struct 的 'e' 读 fp16，float32 标量运算），和向量化的实现无关。"""
    nb = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[kind]
    out = []
    for b in range(len(raw) // nb):
        blk = raw[b * nb:(b + 1) * nb]
        d = np.float32(struct.unpack("<e", blk[:2])[0])
        if kind == "Q8_0":
            out += [d * np.float32(v) for v in struct.unpack("<32b", blk[2:])]
            continue
        qs = blk[nb - 16:]
        q = [qs[j] & 15 for j in range(16)] + [qs[j] >> 4 for j in range(16)]
        if kind == "Q4_0":
            out += [d * np.float32(v - 8) for v in q]
        else:
            m = np.float32(struct.unpack("<e", blk[2:4])[0])
            out += [d * np.float32(v) + m for v in q]
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_vectorised_decode_matches_scalar_decode_on_random_bytes(kind):
    rng = np.random.default_rng(7)
    nb = GGUF_BLOCK_BYTES[kind]
    raw = bytearray((rng.random(nb * 40) * 256).astype(np.uint8).tobytes())
    scales = [0.0, 1e-3, -0.0625, 3.5, 2.0 ** -24, -7.25, 65504.0]
    for b in range(40):
        raw[b * nb:b * nb + 2] = struct.pack("<e", scales[b % len(scales)])
        if kind == "Q4_1":
            raw[b * nb + 2:b * nb + 4] = struct.pack("<e", scales[(3 * b + 1) % len(scales)])
    want = scalar_decode(bytes(raw), kind)
    got = decode_blocks(np.frombuffer(bytes(raw), np.uint8), kind)
    assert got.dtype == np.float32 and np.array_equal(got, want)


def test_q8_0_encode_rounds_half_away_from_zero():
    x = np.zeros(32, np.float32)
    x[:6] = [127, 2.5, -2.5, 0.5, -0.49, -127]                 # max|x| = 127 -> d = 1
    raw = encode_blocks(x, "Q8_0").tobytes()
    assert raw[:2] == H[1.0]
    assert list(struct.unpack("<6b", raw[2:8])) == [127, 3, -3, 1, 0, -127]   # np.round 会给 2、−2、0
    assert encode_blocks(np.zeros(32), "Q8_0").tobytes() == b"\x00" * 34      # 全 0 的块：d = 0
    # 比 0.5 小一个 float32 间隔的数：float32 里 0.49999997 + 0.5 会舍入成 1，roundf 要给 0
    x[1] = np.nextafter(np.float32(0.5), np.float32(0))
    assert struct.unpack("<b", encode_blocks(x, "Q8_0").tobytes()[3:4]) == (0,)


def test_q4_0_encode_puts_the_extreme_on_q0_and_clips_the_other_end():
    x = np.zeros(32, np.float32)
    x[:6] = [-16, 14, 15, 0, 1, -1]
    x[16] = -3
    raw = encode_blocks(x, "Q4_0").tobytes()
    assert raw[:2] == H[2.0]                                     # d = −16 / −8 = 2
    q = [raw[2 + j] & 15 for j in range(16)] + [raw[2 + j] >> 4 for j in range(16)]
    # ⌊x/2 + 8.5⌋：−16 -> 0，14 -> 15，15 -> 16 截到 15，0 -> 8，1 -> 9，−1 -> 8，−3 -> 7
    assert q[:6] == [0, 15, 15, 8, 9, 8] and q[16] == 7
    # 最大的数是正的：d 是负的（= 16 / −8），最大的数仍然落在 q = 0，解码回 +16
    y = np.zeros(32, np.float32)
    y[0] = 16
    raw = encode_blocks(y, "Q4_0").tobytes()
    assert struct.unpack("<e", raw[:2])[0] == -2.0 and raw[2] & 15 == 0
    assert decode_blocks(raw, "Q4_0")[0] == 16.0


def test_q4_1_encode_hand_worked_block():
    x = np.full(32, 0.5, np.float32)
    x[:3] = [-1, 2, 0]
    raw = encode_blocks(x, "Q4_1").tobytes()
    # d = (2 − (−1)) / 15 = 0.2 -> fp16 0.199951171875（0x3266）；m = −1；q = ⌊(x + 1)·5 + 0.5⌋
    assert raw[:2] == H[0.199951171875] and raw[2:4] == H[-1.0]
    q = [raw[4 + j] & 15 for j in range(16)] + [raw[4 + j] >> 4 for j in range(16)]
    assert q[:3] == [0, 15, 5] and q[3:] == [8] * 29            # 0.5 -> 8
    w = decode_blocks(raw, "Q4_1")
    assert w[:4].tolist() == [-1.0, 1.999267578125, -0.000244140625, 0.599609375]
    const = encode_blocks(np.full(32, 3.0), "Q4_1").tobytes()    # 常数块：d = 0、m = 3，解码回 3
    assert const[:4] == b"\x00\x00" + H[3.0] and decode_blocks(const, "Q4_1").tolist() == [3.0] * 32


@pytest.mark.parametrize("kind,levels", [("Q8_0", 127), ("Q4_0", 8), ("Q4_1", 15)])
def test_roundtrip_error_is_at_most_half_a_step(kind, levels):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((200, 32)) * (rng.random((200, 1)) * 4 + 0.01)).astype(np.float32)
    w = decode_blocks(encode_blocks(x, kind), kind).reshape(200, 32)
    if kind == "Q4_1":
        step = (x.max(1) - x.min(1)) / 15
    else:
        step = np.abs(x).max(1) / levels
    # 半个刻度，加上 fp16 存 d 的舍入（相对 2^-11，乘最多 levels 个刻度）；Q4_0 的另一端被截掉一格，误差到 1 个刻度
    half = 1.0 if kind == "Q4_0" else 0.5
    bound = step * (half + levels * 2.0 ** -11) + 1e-7
    assert np.all(np.abs(w - x).max(1) <= bound)


def test_quantize_gguf_blocks_run_along_the_input_dim():
    w = np.zeros((64, 2))
    w[:, 0] = np.linspace(-1, 1, 64)
    w[:, 1] = np.linspace(-1, 1, 64)
    w[0, 0] = 100.0                                              # 只让第 0 列的第一个块（行 0..31）变粗
    got = quantize_gguf(w, "Q8_0")
    assert got.shape == (64, 2) and got.dtype == np.float64
    err = np.abs(got - w)
    assert err[1:32, 0].max() > 0.05                             # 块的刻度 100/127 ≈ 0.79
    assert err[32:, 0].max() < 0.005 and err[:, 1].max() < 0.005  # 刻度 1/127 的块


def test_bad_arguments():
    with pytest.raises(ValueError, match="未知的 GGUF 块格式 'Q5_0'.*Q8_0, Q4_0, Q4_1"):
        decode_blocks(b"", "Q5_0")
    with pytest.raises(ValueError, match="每块 34 字节，33 字节不是整块"):
        decode_blocks(b"\x00" * 33, "Q8_0")
    with pytest.raises(ValueError, match="31 个数不是整块"):
        encode_blocks(np.zeros(31), "Q4_1")
    with pytest.raises(ValueError, match="输入维 48"):
        quantize_gguf(np.zeros((48, 2)), "Q4_0")

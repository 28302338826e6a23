"""hw_specs：每个硬件数字等于出处里的数据手册值（这里逐个写出来核对）；roofline 辅助函数。"""
import pytest

from hw_specs import A100, ALL_CHIPS, B200, CORSAIR, H100, H100_PCIE, H200, roofline_bound, roofline_time

# (芯片, 带宽 B/s, 容量 B, {dtype: 稠密 FLOP/s}) —— 数据手册值（NVIDIA H100 / H200 / A100 / B200 的数据手册，d-Matrix 的 Corsair 产品页）
# 数据手册印的是带 2:4 稀疏的数（H100 SXM5 BF16 1979、FP8/INT8 3958、TF32 989；PCIe BF16 1513、FP8/INT8 3026、
# TF32 756；A100 BF16 312（稠密）、INT8 624（稠密）、TF32 156；HGX B200 八卡 BF16 36、FP8 72、FP4 144 PFLOPS）：÷ 2 得稠密
DATASHEET = [
    (H100, 3.35e12, 80e9, {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp8": 1978.9e12,
                           "int8": 1978.9e12}),
    (H100_PCIE, 2.0e12, 80e9, {"bf16": 1513e12 / 2, "tf32": 756e12 / 2, "fp8": 3026e12 / 2, "int8": 3026e12 / 2}),
    (H200, 4.8e12, 141e9, {"bf16": 989.4e12, "fp8": 1978.9e12}),
    (A100, 2.039e12, 80e9, {"bf16": 312e12, "tf32": 156e12, "int8": 624e12}),
    (B200, 8.0e12, 180e9, {"bf16": 36e15 / 8 / 2, "fp8": 72e15 / 8 / 2, "fp4": 144e15 / 8 / 2}),
    (CORSAIR, 150e12, 2e9, {"mxint8": 2400e12, "mxint4": 9600e12}),
]


@pytest.mark.parametrize("chip,bw,cap,flops", DATASHEET, ids=[c[0].name for c in DATASHEET])
def test_chip_matches_datasheet(chip, bw, cap, flops):
    assert chip.mem_bw == pytest.approx(bw, rel=1e-12)
    assert chip.mem_bytes == pytest.approx(cap, rel=1e-12)
    for dt, f in flops.items():
        assert chip.peak_flops(dt) == pytest.approx(f, rel=1e-12)


def test_power_and_links():
    """板卡功耗（第 1 讲 04 的每瓦 token 用它们）：H100 SXM5 700 W、PCIe 350 W（数据手册 300–350 W 取上限）、
    H200 700 W、A100 SXM 400 W、B200 1000 W（近似）；NVLink 双向合计：H100/H200 900、A100/H100 PCIe 600、B200 1800 GB/s。"""
    power = {c.name: c.power_w for c in (H100, H100_PCIE, H200, A100, B200)}
    assert power == {"H100 SXM5": 700, "H100 PCIe": 350, "H200 SXM": 700, "A100 80GB SXM": 400, "B200": 1000}
    links = [c.link_bw for c in (H100, H200, A100, H100_PCIE, B200)]
    assert links == [900e9, 900e9, 600e9, 600e9, 1800e9]


def test_nvlink3_is_a100_datasheet_600_over_two():
    """A100 数据手册：NVLink 600 GB/s（双向合计）-> 单向 300 GB/s；它不在 ALL_LINKS 里（第 5 讲 03 的表不变）。"""
    from hw_specs import ALL_LINKS, NVLINK3
    assert NVLINK3.bw == 300e9 and NVLINK3.bidir_bw == 600e9 == A100.link_bw
    assert NVLINK3 not in ALL_LINKS


def test_corsair_capacity_tier_and_mx_only():
    assert CORSAIR.capacity_bytes == 256e9
    assert CORSAIR.capacity_bw == pytest.approx(0.4e12)
    with pytest.raises(ValueError, match="mxint4, mxint8"):
        CORSAIR.peak_flops("bf16")


def test_corsair_lpddr_bandwidth_is_labelled_an_assumption():
    """回归：0.4 TB/s 原来写成"二手来源"却没有出处；找不到公开的数，所以它是假设值，标在用到它的地方。"""
    import hw_specs
    assert "假设值" in CORSAIR.note and "二手" not in CORSAIR.note
    assert "假设值" in hw_specs.__doc__ and "二手来源" not in hw_specs.__doc__


def test_every_chip_has_a_source():
    assert all(c.source for c in ALL_CHIPS)


def test_unsupported_dtype_names_the_supported_ones():
    with pytest.raises(ValueError, match="A100.*fp8.*bf16"):
        A100.peak_flops("fp8")


def test_ridge_point_and_roofline():
    assert H100.ridge_point("bf16") == pytest.approx(989.4 / 3.35 * 1e0, rel=1e-12)
    assert roofline_time(1e12, 1e9, H100) == pytest.approx(1e12 / 989.4e12)
    assert roofline_bound(1e12, 1e9, H100) == "compute"
    assert roofline_bound(1e9, 1e9, H100) == "memory"
    with pytest.raises(ValueError):
        roofline_time(-1, 0, H100)

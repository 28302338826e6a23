"""
hw_specs —— 课程里用到的芯片：一张表，每个数旁边写着出处；外加 roofline 的时间估计。

【约定】
- 所有算力都是 **稠密（dense）** 峰值，单位 FLOP/s。数据手册上带星号的"with sparsity"数字是 2:4 稀疏的，
  正好是稠密的两倍，这里不用。
- 带宽是字节/秒、容量是字节，都按十进制（80 GB = 80 × 10⁹ 字节），照抄数据手册的写法。显存容量因此是
  **保守值**：80 GB 的卡实际的 HBM 接近 80 GiB（约多 7%），驱动报告的可用量也在两者之间。
- roofline：一个算子的时间下界 = max(FLOPs / 峰值算力, 字节 / 带宽)；哪一项大，就说它受哪一项限制。

【出处】
- H100 SXM5 / H100 PCIe：NVIDIA H100 Tensor Core GPU Datasheet（稀疏数字除以 2 得到稠密）。
- H200 SXM：NVIDIA H200 Tensor Core GPU 产品页（算力同 H100 SXM5）。
- A100 80GB SXM：NVIDIA A100 Tensor Core GPU Datasheet。
- B200：NVIDIA DGX B200 / HGX B200 公开规格，**近似值**（各代产品页的数字略有出入）。
- d-Matrix Corsair：d-Matrix 产品页与 Gimlet Labs 博客（2026）：每张卡 2 GB SRAM、150 TB/s，
  MXINT8 2.4 PFLOPS、MXINT4 9.6 PFLOPS（只有 MX 整数格式，没有 IEEE 浮点）；
  容量层 LPDDR5X 最多 256 GB（产品页）；它的带宽 0.4 TB/s 是**假设值**：找不到公开的出处（d-Matrix 只公布了
  容量），所以用到它的结论只留差一倍（0.2–0.8 TB/s）也成立的。
"""
from dataclasses import dataclass, field, replace

__all__ = ["Chip", "H100", "H100_PCIE", "H200", "A100", "B200", "CORSAIR", "ALL_CHIPS",
           "gang", "roofline_time", "roofline_bound"]


@dataclass(frozen=True)
class Chip:
    """一块芯片（或一张卡）：带宽、容量、各数据类型的稠密峰值算力，以及出处。"""
    name: str
    mem_bw: float                      # 字节/秒：模型权重放在这一层时 decode 读权重的带宽
    mem_bytes: float                   # 字节：这一层能放多少（Corsair 是 SRAM 的 2 GB）
    flops: dict = field(default_factory=dict)   # 数据类型 -> 稠密峰值 FLOP/s
    power_w: float = 0.0               # 板卡功耗（W）；0 表示没有公开数字
    link_bw: float = 0.0               # 卡间互联，数据手册的写法 = 双向合计（字节/秒）；单向是一半，见文件末尾的 Link 表；0 表示不适用
    source: str = ""
    capacity_bytes: float = 0.0        # 第二层（容量层）存储的字节数（只有 Corsair 有）
    capacity_bw: float = 0.0           # 第二层存储的带宽（字节/秒）
    note: str = ""

    def peak_flops(self, dtype):
        """dtype 的稠密峰值算力（FLOP/s）。芯片没有这种数据类型时抛 ValueError，列出它有的。"""
        if dtype not in self.flops:
            have = ", ".join(sorted(self.flops))
            raise ValueError(f"{self.name} 没有 {dtype!r} 的算力；它支持的数据类型：{have}")
        return self.flops[dtype]

    def ridge_point(self, dtype):
        """roofline 的拐点：算术强度（FLOP/字节）高于它就受算力限制，低于它受带宽限制。"""
        return self.peak_flops(dtype) / self.mem_bw


TB, GB, T = 1e12, 1e9, 1e12

H100 = Chip(
    "H100 SXM5", mem_bw=3.35 * TB, mem_bytes=80 * GB,
    flops={"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp8": 1978.9 * T, "int8": 1978.9 * T},
    power_w=700, link_bw=900 * GB,
    source="NVIDIA H100 Tensor Core GPU Datasheet（SXM5 栏；稀疏数字 ÷ 2）")
H100_PCIE = Chip(
    "H100 PCIe", mem_bw=2.0 * TB, mem_bytes=80 * GB,
    flops={"bf16": 756.5 * T, "fp16": 756.5 * T, "tf32": 378.0 * T, "fp8": 1513.0 * T, "int8": 1513.0 * T},
    power_w=350, link_bw=600 * GB,
    source="NVIDIA H100 Tensor Core GPU Datasheet（PCIe 栏；稀疏数字 ÷ 2）")
H200 = Chip(
    "H200 SXM", mem_bw=4.8 * TB, mem_bytes=141 * GB,
    flops={"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp8": 1978.9 * T, "int8": 1978.9 * T},
    power_w=700, link_bw=900 * GB,
    source="NVIDIA H200 Tensor Core GPU 产品页（算力同 H100 SXM5）")
A100 = Chip(
    "A100 80GB SXM", mem_bw=2.039 * TB, mem_bytes=80 * GB,
    flops={"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "int8": 624 * T},
    power_w=400, link_bw=600 * GB,
    source="NVIDIA A100 Tensor Core GPU Datasheet（80GB SXM 栏；没有 FP8）")
B200 = Chip(
    "B200", mem_bw=8.0 * TB, mem_bytes=180 * GB,
    flops={"bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T, "fp4": 9000 * T},
    power_w=1000, link_bw=1800 * GB,
    source="NVIDIA DGX/HGX B200 公开规格（近似值：带宽约 8 TB/s，容量 180–192 GB）",
    note="近似值")
CORSAIR = Chip(
    "d-Matrix Corsair", mem_bw=150 * TB, mem_bytes=2 * GB,
    flops={"mxint8": 2400 * T, "mxint4": 9600 * T},
    source="d-Matrix Corsair 产品页；Gimlet Labs 博客（2026）",
    capacity_bytes=256 * GB, capacity_bw=0.4 * TB,
    note="快层 = 2 GB SRAM @ 150 TB/s；容量层 LPDDR5X 256 GB @ 0.4 TB/s（带宽是假设值，没有公开出处）；只有 MX 整数格式")

ALL_CHIPS = (H100, H100_PCIE, H200, A100, B200, CORSAIR)


def gang(chip, n):
    """
    n 块同样的芯片当成一块用（理想张量并行）：带宽、容量、每种数据类型的算力、互联都乘 n。

    【边界】n < 1 抛 ValueError；卡间通信、负载不均都不算——这是上界（时间的下界）。
    """
    if n < 1:
        raise ValueError(f"卡数至少为 1（收到 {n}）")
    return replace(chip, name=f"{n}×{chip.name}" if n > 1 else chip.name, mem_bw=chip.mem_bw * n,
                   mem_bytes=chip.mem_bytes * n, flops={k: v * n for k, v in chip.flops.items()},
                   link_bw=chip.link_bw * n, capacity_bytes=chip.capacity_bytes * n,
                   capacity_bw=chip.capacity_bw * n)


def roofline_time(flops, nbytes, chip, dtype="bf16"):
    """
    一个算子在 chip 上的时间下界（秒）= max(flops / 峰值算力, nbytes / 带宽)。

    【参数】flops：要做的浮点运算数；nbytes：要搬的字节数；dtype：用哪种数据类型的峰值算力。
    【边界】flops 或 nbytes 为负抛 ValueError。
    """
    if flops < 0 or nbytes < 0:
        raise ValueError(f"FLOPs 和字节数都不能为负（收到 flops={flops}, bytes={nbytes}）")
    return max(flops / chip.peak_flops(dtype), nbytes / chip.mem_bw)


def roofline_bound(flops, nbytes, chip, dtype="bf16"):
    """这个算子受什么限制："compute"（算力）或 "memory"（带宽）。两者相等时算 "compute"。"""
    t_compute = flops / chip.peak_flops(dtype)
    t_memory = nbytes / chip.mem_bw
    return "compute" if t_compute >= t_memory else "memory"


# ---- 互联（第 5 讲用）----
# 一张表：每种互联的**单向**带宽（字节/秒，十进制），旁边写出处。链路都是全双工：两个方向各有这么多，
# 数据手册上常写的"双向合计"是它的两倍（NVLink 的 900 GB/s、PCIe Gen5 x16 的 128 GB/s 都是双向合计）。
# 搬 KV cache 是单向的，所以第 5 讲算传输时间用单向带宽。协议开销不在表里。
# hop_latency（每一跳的固定延迟）是**假设**：数据手册不给这个数，它取决于软件栈（NCCL 的算法、kernel 启动、同步）。
# 表里统一取 3 µs 作默认；第 1 讲 05 脚本把它在 1、3、10 µs 之间扫一遍，看结论怎么变。
@dataclass(frozen=True)
class Link:
    """一种互联：单向带宽（字节/秒）、双向合计、每跳延迟（假设）、出处。"""
    name: str
    bw: float                          # 单向带宽，字节/秒
    bidir_bw: float                    # 双向合计（数据手册常写这个），字节/秒
    source: str = ""
    note: str = ""
    hop_latency: float = 3e-6          # 秒：一次点到点发送的固定开销——**假设**，不是数据手册的数


NVLINK4 = Link(
    "NVLink 4（H100 SXM5，每块 GPU）", bw=450 * GB, bidir_bw=900 * GB,
    source="NVIDIA H100 Datasheet（NVLink 900 GB/s，双向合计）；NVIDIA NVLink 页面：第四代 18 条链路",
    note="每块 GPU 18 条链路 × 每条每方向 25 GB/s = 450 GB/s 单向")
NVLINK3 = Link(
    "NVLink 3（A100 SXM4，每块 GPU）", bw=300 * GB, bidir_bw=600 * GB,
    source="NVIDIA A100 Tensor Core GPU Datasheet（NVLink 600 GB/s，双向合计）",
    note="每块 GPU 12 条链路 × 每条每方向 25 GB/s = 300 GB/s 单向；不在 ALL_LINKS 里（第 5 讲比的是 H100 时代的互联）")
IB_NDR = Link(
    "InfiniBand NDR（一个 400 Gb/s 端口）", bw=400e9 / 8, bidir_bw=2 * 400e9 / 8,
    source="NVIDIA ConnectX-7 / Quantum-2 产品简介：NDR 每端口 400 Gb/s",
    note="400 Gb/s = 50 GB/s 每方向；DGX H100 每块 GPU 配一张 ConnectX-7")
PCIE5_X16 = Link(
    "PCIe Gen5 x16", bw=64 * GB, bidir_bw=128 * GB,
    source="PCI-SIG PCIe 5.0 规范：32 GT/s 每通道；NVIDIA H100 Datasheet：PCIe Gen5 128 GB/s（双向合计）",
    note="约 64 GB/s 每方向（扣掉 128b/130b 编码约 63 GB/s）；Corsair 卡的主机接口也是它")
ETH_100G = Link(
    "100 GbE 以太网", bw=100e9 / 8, bidir_bw=2 * 100e9 / 8,
    source="IEEE 802.3（100GBASE）：100 Gb/s 每方向",
    note="12.5 GB/s 每方向")
ETH_400G = Link(
    "400 GbE 以太网", bw=400e9 / 8, bidir_bw=2 * 400e9 / 8,
    source="IEEE 802.3bs（400GBASE）：400 Gb/s 每方向",
    note="50 GB/s 每方向（和 NDR 同速）")
ALL_LINKS = (NVLINK4, IB_NDR, PCIE5_X16, ETH_400G, ETH_100G)
__all__ += ["Link", "NVLINK3", "NVLINK4", "IB_NDR", "PCIE5_X16", "ETH_100G", "ETH_400G", "ALL_LINKS"]


def ring_allreduce(n_bytes, n, link, hop_latency=None):
    """
    n 块卡上对一份 n_bytes 字节的数据做环形 all-reduce 的时间估计 -> dict。

    【推导】环形算法 = reduce-scatter（n − 1 步，每步每块卡发 B/n 字节给下一块）+ all-gather（同样 n − 1 步）：
    每块卡一共发 2(n − 1)/n · B 字节，分 2(n − 1) 步；每步的时间 = 每跳延迟 + (B/n) / 单向带宽（链路全双工：
    发给下一块和收上一块同时进行）。所以 time = 2(n − 1) · (hop_latency + B / (n · bw))。
    返回：bytes_per_gpu（每块卡发的字节）、steps、t_latency（2(n−1) × 每跳延迟）、t_bandwidth、time。
    【参数】link：Link（用它的单向带宽 bw）；hop_latency：每跳延迟（秒），默认用 link.hop_latency（假设值）。
    【边界】n = 1 时不用通信，时间 0；n < 1、n_bytes < 0、hop_latency < 0 抛 ValueError。
    真实的服务框架对小消息常用别的算法（例如经 NVSwitch 的一步 all-reduce），延迟项比环形小：这里是教科书的环。
    """
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"卡数必须是正整数（收到 {n!r}）")
    if n_bytes < 0:
        raise ValueError(f"字节数不能为负（收到 {n_bytes}）")
    lat = link.hop_latency if hop_latency is None else hop_latency
    if not lat >= 0:
        raise ValueError(f"每跳延迟不能为负（收到 {hop_latency}）")
    steps = 2 * (n - 1)
    per_gpu = steps / n * n_bytes if n > 1 else 0.0
    t_lat = steps * lat
    t_bw = per_gpu / link.bw
    return {"bytes_per_gpu": per_gpu, "steps": steps, "t_latency": t_lat, "t_bandwidth": t_bw,
            "time": t_lat + t_bw}


__all__ += ["ring_allreduce"]

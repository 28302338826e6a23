"""
=============================================================================
CS349E · 第 1 讲 · 06_roofline_vs_measured.py —— 下界和实测之间：真实的系统离 roofline 有多远
=============================================================================

【这个脚本要回答的问题】
课程里打印的时间几乎都是 roofline 下界。下界不是答案：这个脚本把公开发表的实测数字放在同一件工作的下界旁边。
演示 1：计算型内核（大 GEMM、FlashAttention-2/3 的前向，FA-2 的前向 + 反向）实测能跑到数据手册峰值算力的几成。
演示 2：HBM 带宽和 8 块 H100 上的 all-reduce：实测带宽是手册的几成；hw_specs.ring_allreduce 的环形模型
（每跳延迟 3 µs 是假设）和实测的总线带宽（bus bandwidth，[A] 强制 NVLS 量的）对不对得上——机制不同，
数字接近也只是接近。
演示 3：整个系统——MLPerf Inference v4.1 的 Llama 2 70B（8 块 H100）：实测吞吐 ÷ 我们定义的 roofline 上界；
Server 的约束（第 99 百分位）还剩多少。
演示 4：整个系统——TensorRT-LLM 公布的 Llama 3.1 8B（1 块 H100、FP8、定长输入输出）：同样的上界、同样的比值。
演示 5：批大小 1 的 decode：gpt-fast 在 A100 上的每 token 时间（TPOT）÷ 读权重的下界。
演示 6（只在 python3 06_roofline_vs_measured.py --time 时运行）：在你自己的 CPU 上，numpy 模型 decode 一步的实测时间
÷ 它的字节和 FLOPs 在"numpy 在这台机器上实测到的带宽和矩阵乘速度"下的下界。

【怎么读输出】"实测÷峰值"= 公开的实测吞吐 ÷ 数据手册的稠密峰值（hw_specs）；"实测÷上界" = 公开的实测 token/s ÷
我们按 roofline 算的 token/s 上界（= 下界时间 ÷ 实测时间）。每个公开的数后面的方括号是出处代号，见每个演示末尾的
出处注和下面的出处表；"条件"列写精度、形状或序列长度、卡数。两个出处对同一件事给的数不一样时，两个都打印。

【出处表】（每个数照原文抄，条件和日期见各行；测量都不是本课程做的）
- [A] Microsoft Azure，Azure/AI-benchmarking-guide 仓库 Azure_Results/ND_H100_v5_results.md（2024-09-24，提交 ae0b6a7）：
  ND H100 v5 = 8 块 H100 80GB HBM3（SXM），CUDA 12.6、驱动 560.35.03、NCCL 2.18.5、PyTorch 2.4.0。
  cuBLASLt FP8 GEMM（随机初始化、预热 10,000 次）：1024³ 274.1、8192³ 1290.1、32768³ 1382.2 TFLOP/s；
  HBM 带宽 Copy 2.90、Triad 2.97、Dot 3.18 TB/s；FlashAttention 2.0（head_dim 128、批 2、序列 8192）327.9 TFLOP/s（同一提交的
  Benchmarks/FlashAttention.py 跑 flash-attention 仓库的 benchmarks/benchmark_flash_attention.py，取
  causal=False、headdim=128、batch_size=2、seqlen=8192 那一组：FP16、dim 2048 即 16 个头；那个脚本每组给每个方法打印
  一行，行里有前向、反向、前向 + 反向三个数，[A] 的脚本把整行存下，表里只有一个数，没说是哪个。结果表提交的第二天，
  提交 625c7d2（2024-09-25）把 grep 改成只匹配"batch_size=2, seqlen=8192"，取到的第一组就成了 causal=False、
  headdim=64；结果表提交时，仓库里的脚本取的还是 headdim 128 那一组）；
  NCCL AllReduce（NVLS 算法、in-place）的总线带宽，1K 到 8G 字节：1K 0.07、16K 0.95、65K 2.72、1M 43.70、
  16M 234.45、268M 423.38、8G 478.87 GB/s（表里的标签照抄）。同一提交的 Benchmarks/NCCLBandwidth.py 是这样量的：
  NCCL_ALGO=<Tree|Ring|NVLS|NVLSTree> ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40，取 in-place 的 busbw——
  算法是**强制**的（表里是 NVLS 那一次），消息从 8 字节起每次翻倍。
  同一仓库 ND_A100_v4_results.md（2024-09-25）：A100-SXM4-80GB 的 Copy 1.61、Triad 1.70 TB/s。
- [B] Shah 等，FlashAttention-3，arXiv 2407.08608（2024-07）：H100 80GB SXM5，FP16 前向、不带因果遮罩，
  批 × 序列 = 16k 个 token、隐藏维 2048，FLOPs 按 4·序列²·head_dim·头数 算。图 5(c)（head_dim 128）：序列 8k 时
  FlashAttention-2 370、16k 时 FlashAttention-3 648 TFLOP/s；图 5(e)（head_dim 256）：16k 时 FlashAttention-3 756 TFLOP/s。
  摘要的说法是"最高约 740 TFLOP/s（75% 利用率）"。
- [J] Dao-AILab/flash-attention 仓库的 assets/flash2_h100_fwd_bwd_benchmark.png（提交 4f285b3，2023-07-17）：
  H100 80GB SXM5 上 benchmark_flash_attention.py 的**前向 + 反向**；(b) 不带因果遮罩、head_dim 128：序列 8k 时
  FlashAttention-2 335 TFLOP/s；(a) head_dim 64：8k 时 294。
- [C] Dao，FlashAttention-2，arXiv 2307.08691（2023-07）：A100 80GB SXM4 上"最高 230 TFLOP/s，理论峰值的 73%"，
  前向（各种 head_dim、有无因果遮罩里最好的一种）。
- [D] NVIDIA/nccl-tests 的 issue #212，NCCL 维护者（NVIDIA）2024-05-06 的回答：8 块 H100 的 NVLink 线速 450 GB/s，
  扣掉约 20% 的协议开销，环形算法（NCCL_ALGO=RING）的总线带宽约 370 GB/s；默认的 NVLink SHARP（NVLS）all-reduce
  在 8 块卡上峰值总线带宽约 480 GB/s（算法带宽约 275 GB/s），要大于 256 MB 的消息才到得了。
- [H] NVIDIA/nccl-tests 的 issue #309，一位用户 2025-05-23 贴的 NCCL 日志（一台 8 块 H100 的 HGX，不强制算法）：
  all-reduce 从 8 B 到 1 MB 用 Ring 算法、LL 协议，2 MB 起才用 NVLS（Simple 协议）。这是一台机器的观察，不是文档。
- [I] MLCommons 参考实现 mlcommons/inference（标签 v4.1，提交 379ee53，2024-07-24）：language/llama2-70b/README.md
  用 processorca.py --seqlen_limit=1024 造数据集（processorca.py 只留 tok_input_length < 1024、tok_output_length
  < 1024 的样本，即输入、输出都不超过 1023 个 token）；README 给的 FP32 参考模型每个样本平均输出 294.45 个 token
  （"Tokens per sample"）；平均输入长度它没有给。mlperf.conf：*.Server.target_latency_percentile = 99，
  llama2-70b.Server.ttft_latency = 2000、tpot_latency = 200（毫秒）；loadgen/results.h 里 TTFT 和 TPOT 都在这个
  百分位上和约束比较——约束是对第 99 百分位说的。
- [E] MLPerf Inference v4.1（MLCommons，2024-08），Datacenter / Closed，NVIDIA DGX H100（8 块 H100-SXM-80GB，
  TensorRT 10.2、CUDA 12.4），llama2-70b-99.9：Offline 24,524.9 token/s（84.4792 样本/s）；Server 21,605.8 token/s，
  约束 p99 TTFT ≤ 2 s、p99 TPOT ≤ 200 ms（[I]），平均 TPOT 154.96 ms，p99 TPOT 175.35 ms，p99 TTFT 461.28 ms。出处：mlcommons/inference_results_v4.1 仓库
  closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99.9/{Offline,Server}/performance/run_1/
  mlperf_log_summary.txt；同一提交的 closed/NVIDIA/configs/llama2-70b/Offline：4 份 × 张量并行 2、use_fp8、
  每份 gpu_batch_size 896；configs/llama2-70b/Server：同样 4 份 × 2，每份 gpu_batch_size 1024（H100_SXM_80GB_TP2x1
  的值，TP2x4 和它的 HighAccuracy 继承；server_target_qps 75 和 Server 的 summary 里的 target_qps 一致）。MLCommons 的结果编号（result ID）我们没能核对，所以这里写仓库里的路径。
- [F] NVIDIA TensorRT-LLM 文档 docs/source/performance/perf-overview.md（提交 00f3768，写着"NEW for v1.0"的版本；
  v1.0 出在 2025 年，0.19 版是 2025-04）：Llama 3.1 8B FP8
  （nvidia/Llama-3.1-8B-Instruct-FP8），1 块 H100 SXM 80GB（TP1），trtllm-bench throughput，所有请求的输入、输出长度
  都相同：128/2048 22,714、1000/1000 15,220、2048/128 3,450、5000/500 3,459 输出 token/s。
- [G] gpt-fast（pytorch-labs/gpt-fast）README 的基准表（2023-11-30，提交 d2c5d82；PyTorch 博客 "Accelerating
  Generative AI with PyTorch II: GPT, Fast"）：A100-80GB（功耗限制在 330 W），torch.compile；
  Llama-2-7B BF16 104.9、INT8 155.58，Llama-2-70B INT8 19.13 token/s；README 还写"经验上峰值带宽约 1700 GB/s"。
  "批 1、提示只有 5 个 token"是 2023-12-16 的版本（提交 c5d3454，这几个数没变）补的说明；generate.py 的命令行
  默认生成 200 个 token（--max_new_tokens 的默认值）。

【模型的假设（务必看）】
- 峰值都是 hw_specs 的稠密峰值（H100 SXM5：FP8 1978.9、BF16/FP16 989.4 TFLOP/s，HBM 3.35 TB/s；A100 80GB：
  FP16 312 TFLOP/s，HBM 2.039 TB/s）。[A] 和 [G] 的机器不一定跑在这些频率上（[G] 的 A100 限功耗 330 W）。
- 演示 2 的 all-reduce：[A] 的表把消息写成 1K、65K、1M、268M……它的脚本用 -b 8 -f 2，所以是 2 的幂（1K = 1024、
  65K = 65,536、268M = 268,435,456 字节：标签是截断的写法）；
  实测时间按 nccl-tests 的定义从总线带宽反推：时间 = 2(n−1)/n × 消息 ÷ 总线带宽。环形模型的链路带宽用 NVLink 4
  的单向 450 GB/s、每跳 3 µs（hw_specs 的假设）。
- 演示 3、4 的上界（**我们的定义，不是 MLPerf 的**）：每个请求输入 P、输出 O 个 token；一个副本（replica）里同时有
  B 个序列在 decode，每步每个序列出一个 token，同一步里顺带把新请求的 prefill 做掉（每步 B/O 个请求的 prefill
  FLOPs，权重不另读）；一步的时间 = max(总 FLOPs ÷ 峰值, 读的字节 ÷ 带宽)——计算和访存完全重叠、没有通信、没有
  kernel 启动、没有调度。KV cache 按每个序列的平均上下文 P + O/2 算，B 取装得下的所有值里吞吐最高的那个（显存放不下
  权重 + B 份平均 KV 就不行）。吞吐上界 = 副本数 × B ÷ 一步的时间。这是 token/s 的上界（时间的下界）。
- 演示 3：MLPerf 不公布批大小，也不公布每个请求的长度；输出长度 O 取 [E] 的 token/s ÷ 样本/s（平均每个样本
  输出的 token 数）。平均输入长度 P 参考实现（[I]）没有给，只给了上限：每个输入都不超过 1023 个 token，所以平均输入
  也不超过 1023——**这一行是数据集的上限，另两行 256、512 是假设值**。精度按 [E] 的
  use_fp8：权重 FP8（每个输出通道一个 FP32 scale，llm_math 的 "fp8"）、在 FP8 张量核上算；KV cache 按 8 位算
  （假设：MLPerf 的记录没写 KV 的格式，8 位让上界更高，仍是上界）。4 份 × 2 块卡（[E] 的配置），张量并行按
  hw_specs.gang 理想地合并两块卡。
- 演示 4：同样的定义，P、O 是 [F] 表里的定长；FP8 权重和计算、KV 8 位（假设），1 块 H100。
- 演示 5：下界 = 读一遍"激活参数"的权重 + KV cache 的字节 ÷ HBM 带宽（llm_math.decode_step，批 1）；上下文取
  105 个位置（[G] 提示 5 个 token、命令行默认生成 200 个，平均约 105——假设 README 的数是用默认值跑的；KV 只占读的
  字节的 1% 以下）。INT8 的 scale 按
  每个输出通道一个 FP16（llm_math 的 "int8"）。[G] 的"Memory Bandwidth"列 = 模型所有参数和缓冲区的字节 × token/s
  （gpt-fast 的 generate.py），和我们"每步真正读的字节 × token/s"口径不同，两个都打印。
- 演示 6：默认用第 3 讲的 QCFG 小模型（随机权重，只看时间，不看输出），float64（每个数 8 字节）；它的 FLOPs 和字节
  来自 transformer_lab.analytic_ops（账本按 BF16 记字节，这里乘 4 换成 float64；换成别的模型时按它权重的数据类型，
  float32 乘 2）。带宽用 np.add.reduce 扫一个和模型权重一样大的数组量（QCFG 小，放得进 CPU 缓存，量到的是缓存的
  带宽；另量一个 2^24 个数、float64 时 134 MB 的数组作对照）；矩阵乘速度用 256 × 256 的方阵乘量；"一次 numpy 调用的
  固定开销"用 1×64 @ 64×64 的矩阵乘量。观察里的两个门槛（实测 ÷ 下界 ≥ 2 倍才说"主要是调用开销"、快 1.5 倍以上
  才说"放进了缓存"）是判断用的约定，不是事实。

【运行】python3 06_roofline_vs_measured.py （约 0.1 秒）；加 --time 时多一个演示 6，在你的机器上计时，约 3 秒，
每次的数都不一样。--time 后面可以跟秒数（例如 --time 1）：每项测量反复跑这么久再取平均（不写时 0.4 秒；越短越受
机器上别的进程干扰），表里印着这次用的时长。

【依赖】本目录的 console、hw_specs（H100、A100、gang、NVLINK4、ring_allreduce、roofline_bound）、
llm_math（LLAMA2_70B、LLAMA2_7B、LLAMA31_8B、decode_step、prefill_step、max_batch、matmul_intensity）；
演示 6 另用 ../lecture02 的 transformer_lab（NumpyTransformer、init_params）、ledger_lab（analytic_ops、sum_rows）、
hub_lab 和 real_model_lab（真实模型的文件在本机时用它），和 ../lecture03 的 quant_lab（QCFG，需要 ../prereq3）。
"""
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02", "lecture03", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", _sub))

import numpy as np  # noqa: E402

from console import (fmt_bytes, fmt_num, fmt_time, print_header, print_note,  # noqa: E402
                     print_observations, print_table)
from hw_specs import A100, H100, NVLINK4, gang, ring_allreduce, roofline_bound  # noqa: E402
from llm_math import (LLAMA2_70B, LLAMA2_7B, LLAMA31_8B, decode_step, matmul_intensity,  # noqa: E402
                      max_batch, prefill_step)

T, G = 1e12, 1e9
H100_SMS = 132                                # H100 SXM5 的 SM 数（NVIDIA H100 Datasheet / Hopper 架构白皮书）
BOUND_ZH = {"compute": "算力", "memory": "带宽"}

# ---- 出处：代号 -> 一句话（演示末尾打印；全文见模块说明的出处表）----
SOURCES = {
    "A": "Microsoft Azure，Azure/AI-benchmarking-guide：Azure_Results/ND_H100_v5_results.md、ND_A100_v4_results.md"
         "（2024-09-24/25）",
    "B": "Shah 等，FlashAttention-3，arXiv 2407.08608（2024-07），图 5",
    "C": "Dao，FlashAttention-2，arXiv 2307.08691（2023-07）",
    "D": "NVIDIA/nccl-tests issue #212，NCCL 维护者的回答（2024-05-06）",
    "E": "MLPerf Inference v4.1（2024-08）Closed，NVIDIA DGX H100：mlcommons/inference_results_v4.1 的"
         " mlperf_log_summary.txt 与 configs/llama2-70b",
    "F": "NVIDIA TensorRT-LLM 文档 perf-overview.md（v1.0 的版本，提交 00f3768，2025）",
    "G": "pytorch-labs/gpt-fast README（2023-11-30，提交 d2c5d82；说明补于 2023-12-16，提交 c5d3454）",
    "H": "NVIDIA/nccl-tests issue #309，一位用户贴的 NCCL 日志（2025-05-23）",
    "J": "Dao-AILab/flash-attention 的 assets/flash2_h100_fwd_bwd_benchmark.png（提交 4f285b3，2023-07，前向 + 反向）",
    "I": "mlcommons/inference v4.1：language/llama2-70b/README.md、processorca.py、mlperf.conf、loadgen",
}

# ---- 公开的实测：计算型内核（演示 1）----
# (内核, 芯片, hw_specs 的数据类型, 显示的精度, 条件, 实测 FLOP/s, 算术强度的算法, 出处)
# 算术强度：GEMM 按 llm_math.matmul_intensity（FP8 每个数 1 字节，输出也按 1 字节，最少搬的字节）；
# 注意力前向按 FLOPs ÷ (读 Q、K、V + 写 O 的字节)（每个数 2 字节）= 序列长度 / 2（和头数、head_dim 无关）。
KERNELS = [
    ("GEMM cuBLASLt", H100, "fp8", "FP8", "1024³", 274.1 * T, ("gemm", 1024), "A"),
    ("GEMM cuBLASLt", H100, "fp8", "FP8", "8192³", 1290.1 * T, ("gemm", 8192), "A"),
    ("GEMM cuBLASLt", H100, "fp8", "FP8", "32768³", 1382.2 * T, ("gemm", 32768), "A"),
    ("FA2 前向", H100, "fp16", "FP16", "d128 8k", 370 * T, ("attn", 8192), "B"),
    ("FA2（*）", H100, "fp16", "FP16", "d128 8k 批2", 327.9 * T, None, "A"),
    ("FA2 前向+反向", H100, "fp16", "FP16", "d128 8k 批2", 335 * T, None, "J"),
    ("FA3 前向", H100, "fp16", "FP16", "d128 16k", 648 * T, ("attn", 16384), "B"),
    ("FA3 前向", H100, "fp16", "FP16", "d256 16k", 756 * T, ("attn", 16384), "B"),
    ("FA2 前向", A100, "fp16", "FP16", "最好的一种", 230 * T, None, "C"),
]
FA3_ABSTRACT = 740 * T                        # [B] 摘要："最高约 740 TFLOP/s（75%）"

# ---- 公开的实测：HBM 带宽（演示 2）----  (芯片, 测法, 实测 字节/秒, 出处)
HBM = [
    (H100, "Copy（读 + 写）", 2.90 * T, "A"),
    (H100, "Triad（读 2 写 1）", 2.97 * T, "A"),
    (A100, "Copy（读 + 写）", 1.61 * T, "A"),
    (A100, "Triad（读 2 写 1）", 1.70 * T, "A"),
    (A100, "经验峰值（约）", 1700 * G, "G"),
]

H100_DOT = 3.18 * T                           # [A]：H100 的 Dot（只读两个数组）3.18 TB/s

# ---- 公开的实测：8 块 H100 上 NCCL all-reduce（NVLS）的总线带宽（演示 2，[A]）----
# [A] 的消息标签 -> (字节数：当作 2 的幂，见模块说明, 总线带宽 字节/秒)
ALLREDUCE_N = 8
ALLREDUCE = [("1K", 2 ** 10, 0.07 * G), ("16K", 2 ** 14, 0.95 * G), ("65K", 2 ** 16, 2.72 * G), ("1M", 2 ** 20, 43.70 * G),
             ("16M", 2 ** 24, 234.45 * G), ("268M", 2 ** 28, 423.38 * G), ("8G", 2 ** 33, 478.87 * G)]
NCCL_RING_BUSBW = 370 * G                     # [D]：环形算法的有效总线带宽（约）
NCCL_NVLS_PEAK = 480 * G                      # [D]：NVLS 在 8 块卡上的峰值总线带宽（约）
NCCL_RING_LL_MAX = 2 ** 20                    # [H]：不强制算法时，一台 8 块 H100 上 1 MB 及以下用 Ring/LL（一台机器的日志）

# ---- MLPerf Inference v4.1，Llama 2 70B，8 块 H100（演示 3，[E]）----
MLPERF_OFFLINE_TOK = 24524.9                  # token/s
MLPERF_OFFLINE_SAMPLES = 84.4792              # 样本/s
MLPERF_SERVER_TOK = 21605.79                  # token/s（约束 TTFT ≤ 2 s、TPOT ≤ 200 ms）
MLPERF_SERVER_TPOT = 0.154960329              # 秒：平均 TPOT（Mean Time to Output Token）
MLPERF_SERVER_TPOT_P99 = 0.175354317          # 秒：第 99 百分位的 TPOT（99.00 percentile time to output token）
MLPERF_SERVER_TTFT_P99 = 0.461278089          # 秒：第 99 百分位的 TTFT（99.00 percentile first token latency）
MLPERF_TPOT_LIMIT = 0.200                     # 秒：Server 的约束 p99 TPOT ≤ 200 ms（[I]）
MLPERF_TTFT_LIMIT = 2.0                       # 秒：Server 的约束 p99 TTFT ≤ 2 s（[I]）
MLPERF_REPLICAS, MLPERF_TP = 4, 2             # [E] 的配置：4 份 × 张量并行 2
MLPERF_GPU_BATCH = 896                        # [E] 的 Offline 配置：每份最多同时 896 个序列
MLPERF_SERVER_GPU_BATCH = 1024                # [E] 的 Server 配置：每份最多同时 1024 个序列
MLCOMMONS_SEQLEN_LIMIT = 1024                 # [I]：processorca.py --seqlen_limit=1024，只留输入、输出都 < 1024 个 token 的样本
MLCOMMONS_REF_TOKENS = 294.45                 # [I]：FP32 参考模型每个样本平均输出的 token 数（README 的 Tokens per sample）
INPUT_CAP = MLCOMMONS_SEQLEN_LIMIT - 1        # 每个输入最多 1023 个 token，所以平均输入也不超过它
ASSUMED_INPUTS = (256, 512)                   # 平均输入长度 P：**假设**（参考实现没给平均值）
MLPERF_INPUTS = ASSUMED_INPUTS + (INPUT_CAP,)

# ---- TensorRT-LLM 的 Llama 3.1 8B FP8，1 块 H100（演示 4，[F]）----  (输入, 输出, 输出 token/s)
TRTLLM_8B = [(128, 2048, 22714), (1000, 1000, 15220), (2048, 128, 3450), (5000, 500, 3459)]

# ---- gpt-fast，批 1，A100-80GB（演示 5，[G]）----  (模型, 显示名, 权重格式, token/s, README 的带宽 字节/秒)
GPT_FAST = [(LLAMA2_7B, "Llama-2-7B BF16", "bf16", 104.9, 1397.31 * G),
            (LLAMA2_7B, "Llama-2-7B INT8", "int8", 155.58, 1069.20 * G),
            (LLAMA2_70B, "Llama-2-70B INT8", "int8", 19.13, 1322.58 * G)]
GPT_FAST_CONTEXT = 105                        # 平均上下文（假设：提示 5 + 命令行默认生成的 200 个的一半）
GPT_FAST_EMPIRICAL_BW = 1700 * G              # [G]："经验上峰值带宽约 1700 GB/s"

# ---- 演示 6：在这台 CPU 上计时（只在 --time 时）----
TIME_SECONDS = 0.4                            # 每项测量大约用多久（秒）
CPU_PROMPT = 16                               # 先 prefill 这么多个 token，再计 decode 一步的时间
CPU_MATMUL_N = 256                            # 量矩阵乘速度用的方阵边长
CPU_TINY = 64                                 # 量"一次 numpy 调用的固定开销"用的小矩阵乘：1×64 @ 64×64
CPU_OVERHEAD_RATIO = 2                        # 实测 ÷ 下界到这么多倍以上，才说"时间主要是调用的固定开销"（判断用的门槛）
CPU_CALLS_PER_LAYER = 50                      # 假设：transformer_lab 的前向每层调用 numpy 不到这么多次（数过：约 40 次，含 reshape 之类的视图）
CPU_CACHE_GAIN = 1.5                          # 同样大小的数组比大数组快这么多倍以上，才说"放进了缓存"（判断用的门槛）
CPU_BIG_ARRAY = 2 ** 24                       # 对照用的大数组：2^24 个数（float64 时 134 MB）


def _src(keys):
    """出处注：本演示用到的出处代号各一行。"""
    for k in keys:
        print_note(f"[{k}] {SOURCES[k]}", rest_prefix="    ")


def _pct(x):
    return f"{100 * x:.1f}%"


# ---------------------------------------------------------------------------
def kernel_intensity(kind):
    """一个内核的算术强度（FLOP/字节）：GEMM 用 matmul_intensity（FP8，1 字节），注意力前向 = 序列长度 / 2。"""
    if kind is None:
        return None
    what, n = kind
    if what == "gemm":
        return matmul_intensity(n, n, n, bytes_per_el=1.0)
    # 前向 FLOPs = 4·s²·d·h；读 Q、K、V、写 O = 4·s·d·h 个数 × 2 字节 -> 强度 = s / 2
    return n / 2


def demo1_compute_kernels():
    print_header("演示 1：计算型内核——实测吞吐 ÷ 数据手册的稠密峰值")
    rows, share = [], {}
    for name, chip, dtype, shown, cond, meas, kind, src in KERNELS:
        peak = chip.peak_flops(dtype)
        inten = kernel_intensity(kind)
        bound = "—"
        if inten is not None:
            # 强度 × 1 字节 -> 1 FLOP：roofline_bound 比较 FLOPs / 峰值 和 字节 / 带宽
            bound = BOUND_ZH[roofline_bound(inten, 1.0, chip, dtype)]
        share[(name, chip.name, cond)] = meas / peak
        rows.append([name, chip.name.split()[0], shown, cond, "—" if inten is None else f"{inten:,.0f}", bound,
                     f"{meas / T:,.1f}", f"{peak / T:,.1f}", _pct(meas / peak), src])
    print_table(["内核", "芯片", "精度", "条件", "强度\nFLOP/B", "受限于", "实测\nTFLOP/s", "峰值\nTFLOP/s",
                 "实测÷峰值", "出处"], rows)
    print_note("（*）[A] 跑的是 flash-attention 仓库的 benchmark_flash_attention.py，它每组配置打印前向、反向、"
               "前向 + 反向三个 TFLOP/s；[A] 的表只有一个数，没说是哪一个。这一行和前向 + 反向的一行没有算强度"
               "（前向的算法对反向不成立）。")
    _src("ABJC")
    g1 = share[("GEMM cuBLASLt", H100.name, "1024³")]
    g8 = share[("GEMM cuBLASLt", H100.name, "8192³")]
    g32 = share[("GEMM cuBLASLt", H100.name, "32768³")]
    fa2_b = share[("FA2 前向", H100.name, "d128 8k")]
    fa2_a = share[("FA2（*）", H100.name, "d128 8k 批2")]
    fa2_fb = share[("FA2 前向+反向", H100.name, "d128 8k 批2")]
    fa3 = share[("FA3 前向", H100.name, "d256 16k")]
    fa3_128 = share[("FA3 前向", H100.name, "d128 16k")]
    fa2_a100 = share[("FA2 前向", A100.name, "最好的一种")]
    ridge = H100.ridge_point("fp8")
    abstract = FA3_ABSTRACT / H100.peak_flops("fp16")
    f1 = 2 * 1024 ** 3
    t1_bound, t1_meas = f1 / H100.peak_flops("fp8"), f1 / (274.1 * T)
    print_observations([
        f"表里算了强度的每个内核按 roofline 都受算力限制（强度都高于 H100 FP8 的拐点 {ridge:.0f} FLOP/B、16 位的 "
        f"{H100.ridge_point('bf16'):.0f} FLOP/B），下界就是 FLOPs ÷ 峰值；实测只到峰值的 {_pct(g1)} 到 {_pct(fa3)}。",
        f"FP8 GEMM 越大越接近峰值：1024³ 只有 {_pct(g1)}，8192³ {_pct(g8)}，32768³ {_pct(g32)}"
        f"（[A] 的测法：随机初始化、预热 10,000 次）。1024³ 按峰值只要 {fmt_time(t1_bound)}，实测（FLOPs ÷ 实测速度）"
        f"{fmt_time(t1_meas)}：这么小的矩阵乘，kernel 启动、收尾的固定开销和填不满 {H100_SMS} 个 SM（比如输出按 128×128 的块"
        f"切，只有 {(1024 // 128) ** 2} 块）都有份，表里分不开。",
        f"同一个 FlashAttention-2、同一组配置（head_dim 128、16 个头、FP16、批 2 × 序列 8192、不带遮罩：[A] 跑的 flash-attention"
        f" 基准脚本、[B] 图 5 和 [J] 的图都是这组）：[B] 的前向 {_pct(fa2_b)}，[A] {_pct(fa2_a)}，[J] 的前向 + 反向"
        f" {_pct(fa2_fb)}。[A] 离 [J] 只差 {_pct(abs(fa2_a / fa2_fb - 1))}、离 [B] 的前向差 {_pct(1 - fa2_a / fa2_b)}，"
        "所以 [A] 很可能是前向 + 反向——但这是推断：[A] 的表没写是哪一项（见表下的注），它的脚本第二天还改了取哪一组"
        "（出处表的 [A]）。前向 + 反向每秒的 FLOPs 本来就比前向低（[J] 对 [B]），所以这不说明 [A] 测得不准，"
        "只说明它和 [B] 量的多半不是同一件事。",
        f"FlashAttention-3 用上 Hopper 的异步（TMA、warp 专门化）后，head_dim 256 到 {_pct(fa3)}，head_dim 128 到 "
        f"{_pct(fa3_128)}；[B] 的摘要说'最高约 {FA3_ABSTRACT / T:.0f} TFLOP/s'= {_pct(abstract)}，"
        f"图里最高的一格是 {fa3 * H100.peak_flops('fp16') / T:.0f}。"
        f"FlashAttention-2 在它设计时面对的 A100 上到 {_pct(fa2_a100)}（[C]），搬到 H100 上只有 {_pct(fa2_b)}："
        f"新硬件的峰值要新写法才拿得到。",
    ])
    return {"gemm_1024": g1, "gemm_8192": g8, "gemm_32768": g32, "fa2_h100_paper": fa2_b, "fa2_h100_azure": fa2_a,
            "fa3_d256": fa3, "fa3_d128": fa3_128, "fa2_a100": fa2_a100, "fa3_abstract": abstract, "gemm_1024_time": t1_meas}


# ---------------------------------------------------------------------------
def busbw_to_time(n_bytes, n, busbw):
    """nccl-tests 的定义：总线带宽 = 算法带宽 × 2(n−1)/n，算法带宽 = 消息 ÷ 时间 -> 时间 = 2(n−1)/n × 消息 ÷ 总线带宽。"""
    return 2 * (n - 1) / n * n_bytes / busbw


def demo2_memory_and_allreduce():
    print_header("演示 2：HBM 带宽与 8 块 H100 的 all-reduce——实测 vs 数据手册、vs 环形模型")
    rows, share = [], {}
    print("HBM 带宽（顺序读写一大块显存）：")
    for chip, how, meas, src in HBM:
        share[(chip.name, how)] = meas / chip.mem_bw
        rows.append([chip.name, how, f"{meas / T:.2f}", f"{chip.mem_bw / T:.3g}", _pct(meas / chip.mem_bw), src])
    print_table(["芯片", "测法", "实测 TB/s", "手册 TB/s", "实测÷手册", "出处"], rows)
    n = ALLREDUCE_N
    rows, ar = [], {}
    print()
    print_note(f"{n} 块 H100 的 all-reduce（[A]：NCCL 强制 NVLS、in-place）：实测的总线带宽，和环形模型"
               f"（NVLink 4 单向 {fmt_bytes(NVLINK4.bw)}/s、每跳 {fmt_time(NVLINK4.hop_latency)}）：")
    for label, size, busbw in ALLREDUCE:
        t_meas = busbw_to_time(size, n, busbw)
        model = ring_allreduce(size, n, NVLINK4)
        model_busbw = 2 * (n - 1) / n * size / model["time"]
        ar[label] = {"t_meas": t_meas, "t_model": model["time"], "busbw": busbw, "model_busbw": model_busbw}
        rows.append([label, fmt_bytes(size), f"{busbw / G:.2f}", fmt_time(t_meas), f"{model_busbw / G:.3g}",
                     fmt_time(model["time"]), f"{model['time'] / t_meas:.2f}"])
    print_table(["[A] 标签", "消息", "实测 busbw\nGB/s", "实测时间", "环模型 busbw\nGB/s", "环模型时间",
                 "模型÷实测\n（时间）"], rows)
    _src("ADGH")
    h_copy, h_triad = share[(H100.name, "Copy（读 + 写）")], share[(H100.name, "Triad（读 2 写 1）")]
    a_triad, a_gf = share[(A100.name, "Triad（读 2 写 1）")], share[(A100.name, "经验峰值（约）")]
    small, dec1, big = ar["1K"], ar["16K"], ar["8G"]
    steps = 2 * (n - 1)
    hop = fmt_time(NVLINK4.hop_latency)
    lat_model = ring_allreduce(2 ** 10, n, NVLINK4)["t_latency"]
    dec1_bytes = LLAMA2_70B.d_model * 2                  # 批 1 时一次 all-reduce：一个 token 的激活，BF16
    mids = [ar[k]["t_model"] / ar[k]["t_meas"] for k in ("65K", "1M", "16M", "268M")]
    mid_lo, mid_hi = min(mids), max(mids)
    print_observations([
        f"顺序读写一大块显存（STREAM 式的测法）也到不了手册带宽：H100 Copy {_pct(h_copy)}、Triad {_pct(h_triad)}，"
        f"A100 Triad {_pct(a_triad)}；[G] 在限功耗的 A100 上说'经验峰值约 "
        f"{GPT_FAST_EMPIRICAL_BW / G:.0f} GB/s'= {_pct(a_gf)}，和 [A] 对得上。"
        f"decode 受带宽限制时，按手册带宽算的是下界；想估计实际的时间，该用打过这个折扣的带宽——那就不再是严格的下界"
        f"（同一份 [A] 的 Dot 测到 {H100_DOT / T:.2f} TB/s，高于 Triad）。",
        f"最小的消息（1K）实测约 {fmt_time(small['t_meas'])}，16K（{dec1_bytes:,} 字节：{LLAMA2_70B.name} 批 1 时"
        f"一次 all-reduce 的大小）约 {fmt_time(dec1['t_meas'])}；环形模型（{steps} 步 × 每跳 {hop}）光延迟项就是 "
        f"{fmt_time(lat_model)}。但 [A] 的脚本强制了 NVLS（见出处表）：NVSwitch 在交换机里做归约，不走 {steps} 步的环，"
        f"这些时间主要是 NVLS 一次 all-reduce 的固定开销，摊成'每跳多少'没有意义。不强制时，[H] 里一台 8 块 H100 的 NCCL 对"
        f" 1M（{NCCL_RING_LL_MAX:,} 字节）及以下的消息选 Ring/LL；那种默认情形 [A] 没有量，所以第 1 讲 05 假设的每跳 {hop}"
        f" 对默认的 NCCL 是大是小，这张表回答不了。",
        f"最大的消息（8G）实测总线带宽 {big['busbw'] / G:.1f} GB/s，比环形模型的 {big['model_busbw'] / G:.1f} GB/s"
        f"（= 单向 {fmt_bytes(NVLINK4.bw)}/s 的线速，几乎没有延迟）还高 {_pct(big['busbw'] / big['model_busbw'] - 1)}：NVLS 由 NVSwitch 做加法，"
        f"[D] 说这时总线带宽不再对应线上真正走的字节，环形模型对它不是下界。[D] 说环形算法实际约 {NCCL_RING_BUSBW / G:.0f} GB/s"
        f"（线速的 {_pct(NCCL_RING_BUSBW / NVLINK4.bw)}），NVLS 峰值约 {NCCL_NVLS_PEAK / G:.0f} GB/s——"
        f"和 [A] 的 {big['busbw'] / G:.1f} 对得上。",
        f"65K 到 268M 之间，环形模型（连同每跳 {hop}）的时间是实测的 {mid_lo:.2f} 到 {mid_hi:.2f} 倍：数字接近，"
        f"机制却不同（实测是强制的 NVLS，不是环），只说明这一段 NVLS 和这个公式差不多快。decode 每层 all-reduce 的"
        f"消息是 批 × d_model × 2 字节（{LLAMA2_70B.name}、批 64 时 {64 * LLAMA2_70B.d_model * 2:,} 字节 = 1M），"
        f"这么大的消息默认的 NCCL 走 Ring/LL（[H]），服务框架还常用自己的 one-shot all-reduce：张量并行的实测"
        f"（gpt-fast，A100）和环形模型的对照见第 1 讲 05 的演示 2。",
    ])
    return {"hbm_h100_copy": h_copy, "hbm_h100_triad": h_triad, "hbm_a100_triad": a_triad, "hbm_a100_gptfast": a_gf,
            "ar": ar, "lat_model_1k": lat_model, "mid_range": (mid_lo, mid_hi)}


# ---------------------------------------------------------------------------
def step_bound(model, chip, batch, n_in, n_out, w_fmt="fp8", kv_bits=8.0, dtype="fp8"):
    """
    一个副本里 batch 个序列各 decode 一个 token、顺带做 batch / n_out 个新请求的 prefill 的一步：roofline 下界 -> dict。

    【推导】平均上下文 c = n_in + n_out/2；FLOPs = decode_step(batch, c) 的 FLOPs + (batch / n_out) × 一个长 n_in 的
    提示的 prefill FLOPs（prefill_step，lm_head 只算最后一个位置）；字节 = decode_step 的权重 + KV（prefill 的权重
    在同一步里已经读过，不另算）；时间 = max(FLOPs ÷ 峰值, 字节 ÷ 带宽)。返回 flops、bytes、time、bound。
    """
    ctx = n_in + n_out / 2
    d = decode_step(model, chip, batch, ctx, w_fmt=w_fmt, kv_bits=kv_bits, dtype=dtype)
    flops = d["flops"] + batch / n_out * prefill_step(model, chip, n_in, w_bits=8.0, dtype=dtype)["flops"]
    nbytes = d["w_bytes"] + d["kv_bytes"]
    t_c, t_m = flops / chip.peak_flops(dtype), nbytes / chip.mem_bw
    return {"flops": flops, "bytes": nbytes, "time": max(t_c, t_m), "bound": "compute" if t_c >= t_m else "memory"}


def throughput_bound(model, chip, n_in, n_out, w_fmt="fp8", kv_bits=8.0, dtype="fp8", replicas=1, max_seqs=None):
    """
    一种工作负载（每个请求输入 n_in、输出 n_out 个 token）的输出 token/s 上界（见模块说明的"上界"定义）-> dict。

    【推导】吞吐 = 副本数 × B ÷ step_bound(B) 的时间，B 取 1、2、4、… 和 B_max（装得下权重 + B 份平均上下文
    n_in + n_out/2 的 KV 的最大批，llm_math.max_batch；给了 max_seqs 时不超过它）里吞吐最高的；受算力限制以后
    吞吐不再随 B 变，所以取到的是最小的那个达到最高吞吐的 B。
    返回 tok_s、batch（取到上界的 B）、b_max、step（那一步的时间）、bound（那一步受什么限制）。
    【边界】一个序列都放不下时抛 ValueError。
    """
    ctx = n_in + n_out / 2
    b_max = max_batch(model, chip, ctx, fmt=w_fmt, kv_bits=kv_bits)
    if max_seqs is not None:
        b_max = min(b_max, max_seqs)
    if b_max < 1:
        raise ValueError(f"{model.name} 在 {chip.name} 上连一个平均上下文 {ctx:g} 的序列都放不下")
    best = None
    for b in sorted({1 << k for k in range(b_max.bit_length())} | {b_max}):
        st = step_bound(model, chip, b, n_in, n_out, w_fmt, kv_bits, dtype)
        tok = replicas * b / st["time"]
        if best is None or tok > best["tok_s"] * (1 + 1e-9):
            best = {"tok_s": tok, "batch": b, "b_max": b_max, "step": st["time"], "bound": st["bound"]}
    return best


def demo3_mlperf_llama2_70b():
    print_header("演示 3：MLPerf Inference v4.1 的 Llama 2 70B（8 块 H100）——实测 ÷ roofline 上界")
    n_out = MLPERF_OFFLINE_TOK / MLPERF_OFFLINE_SAMPLES
    chip = gang(H100, MLPERF_TP)
    rows, res = [], {}
    for n_in in MLPERF_INPUTS:
        b = throughput_bound(LLAMA2_70B, chip, n_in, n_out, replicas=MLPERF_REPLICAS)
        capped = throughput_bound(LLAMA2_70B, chip, n_in, n_out, replicas=MLPERF_REPLICAS,
                                  max_seqs=MLPERF_GPU_BATCH)
        res[n_in] = {"bound": b, "capped": capped}
        rows.append([n_in, "上限 [I]" if n_in == INPUT_CAP else "假设", b["b_max"], b["batch"], f"{b['tok_s']:,.0f}",
                     BOUND_ZH[b["bound"]], _pct(MLPERF_OFFLINE_TOK / b["tok_s"]), _pct(MLPERF_SERVER_TOK / b["tok_s"])])
    print_table(["平均输入 P", "P 的来历", "每份最大批\n装得下", "到上界\n的批", "上界\ntoken/s", "受限于",
                 "Offline\n÷上界", "Server\n÷上界"], rows)
    print_note(f"实测 [E]：Offline {MLPERF_OFFLINE_TOK:,.1f} token/s、Server {MLPERF_SERVER_TOK:,.1f} token/s"
               f"（p99 TTFT ≤ 2 s、p99 TPOT ≤ 200 ms）；平均每个样本输出 {n_out:.1f} 个 token（= token/s ÷ 样本/s）。"
               f"上界按 {MLPERF_REPLICAS} 份 × {MLPERF_TP} 块 H100、FP8、KV 8 位（假设）。'到上界的批'是 1、2、4、…"
               f" 里第一个受算力限制的批，更大的批吞吐不变。")
    _src("AEI")
    mid = res[512]["bound"]
    gemm_rate = 1290.1 * T / H100.peak_flops("fp8")      # [A] 8192³ FP8 GEMM 的实测效率
    attn = [k[5] / H100.peak_flops(k[2]) for k in KERNELS if k[1] is H100 and k[0].endswith("前向")]   # 推理只跑前向
    lo, mid_r, hi = (MLPERF_OFFLINE_TOK / res[n]["bound"]["tok_s"] for n in MLPERF_INPUTS)
    cap_same = all(abs(v["capped"]["tok_s"] / v["bound"]["tok_s"] - 1) < 1e-9 for v in res.values())
    per_replica = MLPERF_SERVER_TOK / MLPERF_REPLICAS
    in_flight = per_replica * MLPERF_SERVER_TPOT
    srv = step_bound(LLAMA2_70B, chip, round(in_flight), 512, n_out)
    tpot_room = MLPERF_TPOT_LIMIT - MLPERF_SERVER_TPOT_P99
    print_observations([
        f"MLPerf 不公布批大小和输入长度，所以'上界'要先定义（见模块说明）。参考实现只给了输入长度的上限（[I]：每个输入"
        f"不超过 {INPUT_CAP} 个 token），而平均输入越长，prefill 的 FLOPs 越多，上界越低：不管真实的平均输入是多少，"
        f"Offline 的实测都不超过上界的 {_pct(hi)}（P = {INPUT_CAP} 那一行）。平均输入取 {ASSUMED_INPUTS[0]} 和 "
        f"{ASSUMED_INPUTS[1]}（假设）时是 {_pct(lo)} 和 {_pct(mid_r)}：结论随这个没公布的数变，所以都印出来。",
        f"输出长度用 [E] 自己的：token/s ÷ 样本/s = {n_out:.1f} 个 token；参考实现的 FP32 模型每个样本平均输出 "
        f"{MLCOMMONS_REF_TOKENS} 个（[I]），两者差 {_pct(abs(n_out / MLCOMMONS_REF_TOKENS - 1))}。",
        f"装得下的批上这个工作负载受{BOUND_ZH[mid['bound']]}限制（P = 512 时每份能放 {mid['b_max']} 个序列，"
        f"批 {mid['batch']} 时已受算力限制；[E] 的 Offline 配置每份最多 {MLPERF_GPU_BATCH} 个"
        f"{'不改变上界' if cap_same else '会压低上界'}）。如果每个矩阵乘只跑到 [A] 实测的 FP8 GEMM 效率"
        f"（8192³：{_pct(gemm_rate)}），上界乘上这个数，P = 512 时 Offline 是它的 "
        f"{_pct(MLPERF_OFFLINE_TOK / (mid['tok_s'] * gemm_rate))}；剩下的要在注意力（演示 1：H100 上的 FlashAttention"
        f" 只到 {_pct(min(attn))}–{_pct(max(attn))}）、采样、调度、张量并行的通信里找——出处都没有给出逐项的分解。",
        f"Server 场景用 Little 定律反推同时在 decode 的序列数：每份 {per_replica:,.0f} token/s × 平均 TPOT "
        f"{1e3 * MLPERF_SERVER_TPOT:.0f} ms ≈ {in_flight:.0f} 个，是 [E] 的 Server 配置每份上限 "
        f"{MLPERF_SERVER_GPU_BATCH} 个的 {_pct(in_flight / MLPERF_SERVER_GPU_BATCH)}。同样 {round(in_flight)} 个序列（P = 512）时 roofline 的一步是 "
        f"{fmt_time(srv['time'])}，实测平均 TPOT 是它的 {MLPERF_SERVER_TPOT / srv['time']:.1f} 倍。约束是对第 99 百分位"
        f"说的（[I]）：p99 TPOT {1e3 * MLPERF_SERVER_TPOT_P99:.1f} ms，离 {1e3 * MLPERF_TPOT_LIMIT:.0f} ms 还剩 "
        f"{1e3 * tpot_room:.1f} ms；p99 TTFT {1e3 * MLPERF_SERVER_TTFT_P99:.0f} ms，只用了 "
        f"{MLPERF_TTFT_LIMIT:.0f} s 的 {_pct(MLPERF_SERVER_TTFT_P99 / MLPERF_TTFT_LIMIT)}——紧的是 TPOT。Server 的吞吐是"
        f" Offline 的 {_pct(MLPERF_SERVER_TOK / MLPERF_OFFLINE_TOK)}。",
    ])
    return {"n_out": n_out, "bounds": {k: v["bound"]["tok_s"] for k, v in res.items()},
            "capped": {k: v["capped"]["tok_s"] for k, v in res.items()}, "b_max_512": mid["b_max"],
            "ratio_512": MLPERF_OFFLINE_TOK / mid["tok_s"], "ratio_cap": hi, "in_flight": in_flight,
            "gemm_rate": gemm_rate, "server_step": srv["time"],
            "in_flight_share": in_flight / MLPERF_SERVER_GPU_BATCH, "tpot_room_p99": tpot_room,
            "ttft_share_p99": MLPERF_SERVER_TTFT_P99 / MLPERF_TTFT_LIMIT,
            "n_out_vs_ref": n_out / MLCOMMONS_REF_TOKENS - 1}


# ---------------------------------------------------------------------------
def demo4_trtllm_llama31_8b(mlperf_ratios=None):
    """mlperf_ratios：演示 3 的 (P = 512 时, P = 上限时) Offline ÷ 上界；不给时重算。"""
    print_header("演示 4：TensorRT-LLM 的 Llama 3.1 8B（1 块 H100，FP8，定长请求）——实测 ÷ roofline 上界")
    rows, ratio = [], {}
    for n_in, n_out, meas in TRTLLM_8B:
        b = throughput_bound(LLAMA31_8B, H100, n_in, n_out)
        ratio[(n_in, n_out)] = meas / b["tok_s"]
        rows.append([f"{n_in}/{n_out}", b["b_max"], f"{b['tok_s']:,.0f}", BOUND_ZH[b["bound"]], f"{meas:,}",
                     _pct(meas / b["tok_s"])])
    print_table(["输入/输出", "最大批\n装得下", "上界 token/s", "受限于", "实测 token/s", "实测÷上界"], rows)
    _src("F")
    if mlperf_ratios is None:
        n_out = MLPERF_OFFLINE_TOK / MLPERF_OFFLINE_SAMPLES
        mlperf_ratios = tuple(MLPERF_OFFLINE_TOK / throughput_bound(LLAMA2_70B, gang(H100, MLPERF_TP), p, n_out,
                                                                    replicas=MLPERF_REPLICAS)["tok_s"]
                              for p in (512, INPUT_CAP))
    r512, rcap = mlperf_ratios
    worst = min(ratio, key=ratio.get)
    best = max(ratio, key=ratio.get)
    lo, hi = ratio[worst], ratio[best]
    print_observations([
        f"这里请求长度是定的，上界没有长度上的假设（只剩 KV 8 位、计算和访存完全重叠这些）。四种长度下实测是上界的 "
        f"{_pct(ratio[worst])}（{worst[0]}/{worst[1]}）到 {_pct(ratio[best])}（{best[0]}/{best[1]}）。",
        f"[F] 自己说这些数'不应看作 TensorRT-LLM 能达到的峰值'，很多选项用的是默认值；MLPerf（演示 3）是为那个基准"
        f"专门做的提交。两处的比值不能直接比：这里实测时间是下界的 {1 / hi:.1f}–{1 / lo:.1f} 倍；演示 3 的比值取决于"
        f"没公布的平均输入（P = 512 时 {_pct(r512)}，到数据集的上限 {INPUT_CAP} 时 {_pct(rcap)}），离上界多远说不准。",
    ])
    return {"ratios": ratio, "mlperf_ratios": (r512, rcap)}


# ---------------------------------------------------------------------------
def demo5_batch1_tpot():
    print_header("演示 5：批大小 1 的 decode（gpt-fast，A100-80GB）——每 token 时间 ÷ 读权重的下界")
    rows, res = [], {}
    for model, name, fmt, tok_s, readme_bw in GPT_FAST:
        d = decode_step(model, A100, 1, GPT_FAST_CONTEXT, w_fmt=fmt, kv_bits=16)
        nbytes = d["w_bytes"] + d["kv_bytes"]
        tpot = 1 / tok_s
        bound = d["time"]
        bound_emp = nbytes / GPT_FAST_EMPIRICAL_BW
        res[name] = {"tpot": tpot, "bound": bound, "ratio": bound / tpot, "ratio_emp": bound_emp / tpot,
                     "our_bw": nbytes / tpot, "bytes": nbytes, "kv_share": d["kv_bytes"] / nbytes}
        rows.append([name, fmt_bytes(nbytes), fmt_time(tpot), fmt_time(bound), _pct(bound / tpot),
                     _pct(bound_emp / tpot), f"{nbytes / tpot / G:,.0f}", f"{readme_bw / G:,.0f}"])
    print_table(["模型与格式", "每步读", "实测 TPOT", "下界\n（手册带宽）", "下界÷实测", f"下界÷实测\n（{GPT_FAST_EMPIRICAL_BW / G:.0f} GB/s）",
                 "每步读×tok/s\nGB/s", "[G] 的带宽\nGB/s"], rows)
    _src("G")
    b16, i8, big = res["Llama-2-7B BF16"], res["Llama-2-7B INT8"], res["Llama-2-70B INT8"]
    print_observations([
        f"批 1 时 decode 一步要把权重读一遍，下界 = 字节 ÷ 带宽；Llama-2-7B BF16 实测 TPOT {fmt_time(b16['tpot'])}，"
        f"下界 {fmt_time(b16['bound'])}，下界 ÷ 实测 = {_pct(b16['ratio'])}，即批 1 的 decode 用上了手册带宽的"
        f" {_pct(b16['ratio'])}；按 [G] 自己说的经验峰值 {GPT_FAST_EMPIRICAL_BW / G:.0f} GB/s 算，是 "
        f"{_pct(b16['ratio_emp'])}。",
        f"INT8 每步读的字节是 BF16 的 {_pct(i8['bytes'] / b16['bytes'])}，TPOT 却只降到 {_pct(i8['tpot'] / b16['tpot'])}"
        f"：下界 ÷ 实测从 {_pct(b16['ratio'])} 掉到 {_pct(i8['ratio'])}。'字节减半、时间减半'只在下界上"
        f"成立。gpt-fast 的 INT8 只量化权重，乘之前先把权重转回激活的精度（quantize.py 的 WeightOnlyInt8Linear），"
        f"多出转换的活；慢在这里还是别处，这张表分不出来。",
        f"70B INT8 一块卡（每步 {fmt_bytes(big['bytes'])}）是 {_pct(big['ratio'])}，比 7B INT8 高。[G] 自己的'带宽'列"
        f"把整个模型和缓冲区（含预先分配的 KV cache）都算进去，比我们'每步真正读的字节 × token/s'多一点，两个口径"
        f"都印出来了。上下文 {GPT_FAST_CONTEXT}（假设）时 KV 只占 7B BF16 每步读的字节的 {_pct(b16['kv_share'])}。",
    ])
    return res


# ---------------------------------------------------------------------------
def _rate(fn, seconds):
    """反复调用 fn 约 seconds 秒，返回每次调用的平均时间（秒）。只在 --time 的演示里用。"""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return dt / n


def cpu_decode_roofline(params, cfg, seconds=TIME_SECONDS):
    """
    在这台 CPU 上：numpy 模型 decode 一步的实测时间和它的 roofline 下界 -> dict（演示 6 用；钩子见下）。

    【参数】params, cfg：transformer_lab.NumpyTransformer(params, cfg) 能接受的参数和配置（默认 QCFG 的随机权重；
    真实的小模型落地以后可以直接传它的 params 和 cfg）。seconds：每项测量大约用的秒数。
    【推导】字节 = transformer_lab.analytic_ops 账本的权重 + KV 字节 × (每个数的字节 / 2)（账本按 BF16 记；模型的
    数据类型取自它的权重，QCFG 是 float64 = 8 字节）；FLOPs = 账本的 FLOPs（一个 token，前面已有 CPU_PROMPT 个位置）；
    带宽 = 扫一遍和权重一样大（最多 CPU_BIG_ARRAY 个数）、同样数据类型的数组的速度；矩阵乘速度 = CPU_MATMUL_N 方阵乘
    （同样数据类型）的 FLOP/s。下界 = max(FLOPs ÷ 矩阵乘速度, 字节 ÷ 带宽)。
    """
    from ledger_lab import BYTES_PER_EL, analytic_ops, sum_rows
    from transformer_lab import NumpyTransformer
    model = NumpyTransformer(params, cfg)
    cache = model.new_cache(1)
    model.forward(np.zeros((1, CPU_PROMPT), dtype=np.int64), cache)
    one = np.zeros((1, 1), dtype=np.int64)

    def step():
        cache.pos = CPU_PROMPT                         # 每次都在同一个位置 decode（只挪 pos，见 KVCache）
        model.forward(one, cache)

    t_step = _rate(step, seconds)
    dt = np.asarray(params["layers"][0]["wq"]).dtype
    rows = analytic_ops(cfg, 1, 1, CPU_PROMPT, last_only=True)
    scale = dt.itemsize / BYTES_PER_EL
    w_bytes, kv_bytes = sum_rows(rows, "w") * scale, sum_rows(rows, "kv") * scale
    flops = sum_rows(rows, "flops")
    small = np.ones(min(CPU_BIG_ARRAY, max(1, int(w_bytes // dt.itemsize))), dtype=dt)
    bw = small.nbytes / _rate(lambda: np.add.reduce(small), seconds)
    big = np.ones(CPU_BIG_ARRAY, dtype=dt)
    bw_big = big.nbytes / _rate(lambda: np.add.reduce(big), seconds)
    a = np.ones((CPU_MATMUL_N, CPU_MATMUL_N), dtype=dt)
    mm = 2 * CPU_MATMUL_N ** 3 / _rate(lambda: a @ a, seconds)
    x, w = np.ones((1, CPU_TINY), dtype=dt), np.ones((CPU_TINY, CPU_TINY), dtype=dt)
    t_tiny = _rate(lambda: x @ w, seconds / 2)
    t_c, t_m = flops / mm, (w_bytes + kv_bytes) / bw
    return {"dtype": dt.name, "t_step": t_step, "flops": flops, "bytes": w_bytes + kv_bytes, "bw": bw, "bw_big": bw_big,
            "matmul": mm, "t_compute": t_c, "t_memory": t_m, "bound": max(t_c, t_m), "t_tiny": t_tiny}


def time_seconds(argv):
    """
    命令行参数 -> 演示 6 每项测量的秒数；没有 --time 时 None。--time 后面跟一个正数就用它，不跟时用 TIME_SECONDS。
    【边界】--time 后面跟的不是正的有限数（0、负数、nan、inf、写错的字）：ValueError。
    """
    if "--time" not in argv:
        return None
    i = argv.index("--time")
    if i + 1 == len(argv) or argv[i + 1].startswith("--"):
        return TIME_SECONDS
    try:
        seconds = float(argv[i + 1])
    except ValueError:
        seconds = float("nan")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"--time 后面的秒数必须是正数（收到 {argv[i + 1]!r}）；不写秒数时每项测量约 {TIME_SECONDS} 秒")
    return seconds


def demo6_your_cpu(params=None, cfg=None, seconds=TIME_SECONDS):
    """
    演示 6（--time）：这台 CPU 上 numpy 模型 decode 一步 vs 它自己的 roofline。

    【模型】params、cfg 不给时用第 3 讲的 QCFG（init_params 种子 0）。__main__ 在真实模型 SmolLM2 的文件已经在本机时
    （hub_lab.gguf_path(fetch=False)：CS349E_GGUF 或缓存；这个演示不为它下载）装它的 float32 版本传进来。
    """
    if params is None or cfg is None:
        from quant_lab import QCFG
        from transformer_lab import init_params
        cfg = QCFG
        params = init_params(cfg, seed=0)
    print_header(f"演示 6：你的 CPU 上 numpy 模型（{cfg.name}）decode 一步 vs 它自己的 roofline（每次都不同）")
    r = cpu_decode_roofline(params, cfg, seconds)
    ratio, calls, gain = r["t_step"] / r["bound"], r["t_step"] / r["t_tiny"], r["bw"] / r["bw_big"]
    print_table(["量", "值"], [
        ["decode 一步的 FLOPs", fmt_num(r["flops"])],
        [f"decode 一步读的字节（{r['dtype']}）", fmt_bytes(r["bytes"])],
        ["numpy 扫同样大小数组的带宽", f"{fmt_bytes(r['bw'])}/s"],
        [f"numpy 扫 {CPU_BIG_ARRAY:,} 个数的数组的带宽（对照）", f"{fmt_bytes(r['bw_big'])}/s"],
        [f"numpy {CPU_MATMUL_N}×{CPU_MATMUL_N} 矩阵乘速度", f"{fmt_num(r['matmul'])}FLOP/s"],
        ["下界：FLOPs ÷ 矩阵乘速度", fmt_time(r["t_compute"])],
        ["下界：字节 ÷ 带宽", fmt_time(r["t_memory"])],
        ["实测：decode 一步", fmt_time(r["t_step"])],
        ["实测 ÷ 下界", f"{r['t_step'] / r['bound']:.1f}×"],
        [f"一次 1×{CPU_TINY} @ {CPU_TINY}×{CPU_TINY} 的时间", fmt_time(r["t_tiny"])],
        [f"每项测量反复跑的时长（1×{CPU_TINY} 那项减半）", fmt_time(seconds)],
    ])
    print_observations([
        f"这一步的下界是 {fmt_time(r['bound'])}（受{'带宽' if r['t_memory'] >= r['t_compute'] else '算力'}限制），"
        f"实测 {fmt_time(r['t_step'])}，是下界的 {ratio:.1f} 倍。",
        (f"一次很小的矩阵乘就要 {fmt_time(r['t_tiny'])}，实测的一步相当于 {calls:.0f} 次这样的调用："
         f"transformer_lab 的说明里记着，小模型 decode 一步的时间几乎全是 numpy 调用的固定开销。这和 GPU 上小"
         f" kernel 的启动开销吃掉时间是同一件事（演示 1 的 1024³ GEMM）。"
         if ratio >= CPU_OVERHEAD_RATIO and calls <= CPU_CALLS_PER_LAYER * cfg.n_layers else
         f"实测是下界的 {ratio:.1f} 倍，却相当于 {calls:.0f} 次很小的矩阵乘（一次 {fmt_time(r['t_tiny'])}）——远多于"
         f"一步里 numpy 调用的次数（每层约 {CPU_CALLS_PER_LAYER} 次以内，{cfg.n_layers} 层），所以差距不是调用的"
         f"固定开销：更可能是这台机器此刻很忙（别的进程抢核和内存带宽），多跑几次看看。"
         if ratio >= CPU_OVERHEAD_RATIO else
         f"实测离下界不到 {CPU_OVERHEAD_RATIO} 倍：这个模型每一步要做的事足够多，numpy 每次调用的固定开销（一次"
         f"很小的矩阵乘 {fmt_time(r['t_tiny'])}）相比之下不算什么，时间由"
         f"{'读权重' if r['t_memory'] >= r['t_compute'] else '矩阵乘'}决定。"),
        f"这个模型一步读 {fmt_bytes(r['bytes'])}；这次扫同样大小的数组是扫 {CPU_BIG_ARRAY:,} 个数的 "
        f"{gain:.1f} 倍快" + ("：数组小到放得进 CPU 的缓存。放不进缓存的大模型，该用的是对照的那一行。"
                             if gain >= CPU_CACHE_GAIN and r["bytes"] < CPU_BIG_ARRAY * 8 else
                             "：这个模型一步读的字节比对照的数组还多，放不进任何缓存，这个差别只是测量的波动"
                             "（机器忙时常见），多跑几次取稳定的。" if gain >= CPU_CACHE_GAIN else
                             "：两者差不多，量的都是内存（不是缓存）的带宽。"),
    ])
    return r


if __name__ == "__main__":
    try:
        timed = time_seconds(sys.argv[1:])
    except ValueError as e:
        sys.exit(str(e))
    demo1_compute_kernels()
    demo2_memory_and_allreduce()
    m3 = demo3_mlperf_llama2_70b()
    demo4_trtllm_llama31_8b((m3["ratio_512"], m3["ratio_cap"]))
    demo5_batch1_tpot()
    if timed is not None:
        from hub_lab import gguf_path  # 真实模型的文件在本机就用它（不下载），否则用 QCFG
        path = gguf_path(fetch=False)
        if path:
            from real_model_lab import load_gguf
            P_real, cfg_real, _ = load_gguf(path, dtype=np.float32)
            demo6_your_cpu(P_real, cfg_real, timed)
        else:
            demo6_your_cpu(seconds=timed)

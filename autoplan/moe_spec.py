"""Mixture-of-experts and multi-head latent attention: the two optional parts of a ModelSpec.

`MoESpec` says which blocks route tokens to experts and how wide the experts are; `MLASpec`
describes DeepSeek's low-rank attention. Parameter counts and costs live in `autoplan.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import ConfigError
from autoplan.yaml_io import show

MAX_EXPERTS = 2**16
"""Most routed experts per layer (DeepSeek-V3: 256; far past any published model)."""
ROUTER_DTYPES = ("fp32", "bf16", "fp16")
"""Precisions a router GEMM and its softmax/sigmoid may run in (Megatron-Core --moe-router-dtype
offers fp32 and fp64 on top of the model's own; bf16/fp16 stand for 'the model's')."""
DEEPSEEK_BIAS_UPDATE_RATE = 0.001
"""Bias update speed gamma of DeepSeek-V3's pre-training (arXiv 2412.19437 §4.2)."""
ROUTING_DEFAULTS = {"route_groups": 1, "route_groups_per_token": None,
                    "routed_scaling_factor": 1.0,
                    "router_bias_update_rate": DEEPSEEK_BIAS_UPDATE_RATE}
"""MoESpec fields a saved model leaves out at their defaults, so that model files and plans
written before they existed read back byte-identical (moe_dict)."""


def moe_dict(data: dict) -> dict:
    """A saved MoESpec mapping (yaml_io.to_dict) without the ROUTING_DEFAULTS at their
    defaults."""
    return {k: v for k, v in data.items()
            if not (k in ROUTING_DEFAULTS and v == ROUTING_DEFAULTS[k])}


def _count(field: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(field, f"got {show(value)}", f"expected an integer in [{low}, {high}]")
    return value


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class MoESpec:
    """Routed experts in some or all blocks (Shazeer et al. 2017; Fedus et al. 2021, Switch;
    DeepSeek-AI 2024, DeepSeekMoE). A MoE block replaces the dense MLP by a router and experts."""

    num_experts: int
    """Routed experts per MoE layer (E)."""
    experts_per_token: int
    """Experts each token is sent to (top-k)."""
    expert_ffn_hidden_size: int
    """Inner width of each routed expert's MLP (its kind is the model's `mlp`), in elements."""
    num_shared_experts: int = 0
    """Experts every token passes through besides the routed ones, each of
    expert_ffn_hidden_size width (DeepSeek-V3: 1; Qwen2-MoE: shared width / expert width)."""
    first_dense_layers: int = 0
    """Leading blocks that keep the dense MLP of ffn_hidden_size (DeepSeek-V3: 3)."""
    layer_freq: int = 1
    """After the dense ones, every layer_freq-th block is MoE (1: all; 2: interleaved,
    Llama 4 Maverick), counting from the first block after the dense ones."""
    router_dtype: str = "fp32"
    """Precision of the router GEMM (h x E) and its scores: fp32, bf16 or fp16."""
    capacity_factor: float | None = None
    """Tokens an expert takes at most, as a multiple of the even share (tokens*k/E); tokens past
    it are dropped. None: dropless (every routed token is computed)."""
    load_imbalance: float = 1.0
    """Stated factor by which the busiest expert's tokens exceed the mean (>= 1); the cost
    model prices the slowest rank's expert GEMMs and all-to-all at it."""
    router_aux_free: bool = False
    """DeepSeek-V3's router (arXiv 2412.19437 §2.1.2): sigmoid affinities, experts chosen by
    affinity plus a per-expert bias that balances the load instead of an auxiliary loss, gates
    the chosen affinities normalised; adds E (non-trained) values per MoE layer."""
    route_groups: int = 1
    """Groups the routed experts are split into for group-limited routing (HF `n_group`,
    Megatron --moe-router-num-groups; DeepSeek-V3: 8, one per node of its EP 64); 1: none."""
    route_groups_per_token: int | None = None
    """Groups a token's experts may come from (HF `topk_group`, Megatron
    --moe-router-group-topk; DeepSeek-V3: 4, "each token ... sent to at most 4 nodes");
    chosen by the sum of each group's two highest scores. None: every group (route_groups 1)."""
    routed_scaling_factor: float = 1.0
    """Factor on the routed experts' gates (HF `routed_scaling_factor`, Megatron
    --moe-router-topk-scaling-factor; DeepSeek-V3: 2.5)."""
    router_bias_update_rate: float = DEEPSEEK_BIAS_UPDATE_RATE
    """Bias update speed gamma of router_aux_free: after each step b_i += gamma * sign(mean load
    - load_i) (§2.1.2; 0.001 for the first 14.3T tokens, §4.2; Megatron
    --moe-router-bias-update-rate, default 1e-3). Only with router_aux_free."""

    def __post_init__(self) -> None:
        _count("model.moe.num_experts", self.num_experts, 1, MAX_EXPERTS)
        _count("model.moe.experts_per_token", self.experts_per_token, 1, MAX_EXPERTS)
        if self.experts_per_token > self.num_experts:
            raise ConfigError("model.moe.experts_per_token",
                              f"{self.experts_per_token} exceeds num_experts={self.num_experts}",
                              "route each token to at most num_experts experts")
        _count("model.moe.expert_ffn_hidden_size", self.expert_ffn_hidden_size, 1, 2**22)
        _count("model.moe.num_shared_experts", self.num_shared_experts, 0, MAX_EXPERTS)
        _count("model.moe.first_dense_layers", self.first_dense_layers, 0, 2**16)
        _count("model.moe.layer_freq", self.layer_freq, 1, 2**16)
        if self.router_dtype not in ROUTER_DTYPES:
            raise ConfigError("model.moe.router_dtype", f"got {show(self.router_dtype)}",
                              f"choose one of {', '.join(ROUTER_DTYPES)}")
        cf = self.capacity_factor
        if cf is not None and not (_number(cf) and 0.0 < cf <= self.num_experts):
            raise ConfigError("model.moe.capacity_factor", f"got {show(cf)}",
                              f"expected null (dropless) or a number in (0, {self.num_experts}]")
        li = self.load_imbalance
        if not _number(li) or not 1.0 <= li <= self.num_experts:
            raise ConfigError("model.moe.load_imbalance", f"got {show(li)}",
                              f"expected a number in [1, num_experts={self.num_experts}]")
        if not isinstance(self.router_aux_free, bool):
            raise ConfigError("model.moe.router_aux_free", f"got {show(self.router_aux_free)}",
                              "expected true or false")
        self._check_routing()

    def _check_routing(self) -> None:
        """route_groups, route_groups_per_token, routed_scaling_factor, router_bias_update_rate."""
        e, g = self.num_experts, _count("model.moe.route_groups", self.route_groups, 1,
                                        self.num_experts)
        if e % g:
            raise ConfigError("model.moe.route_groups", f"{g} does not divide num_experts={e}",
                              "choose a divisor of num_experts")
        per = self.route_groups_per_token
        if g == 1 and per not in (None, 1):
            raise ConfigError("model.moe.route_groups_per_token", f"{show(per)} with "
                              "route_groups=1", "set route_groups, or drop route_groups_per_token")
        if g > 1:
            if per is None:
                raise ConfigError("model.moe.route_groups_per_token", f"missing with "
                                  f"route_groups={g}", f"give an integer in [1, {g}]")
            _count("model.moe.route_groups_per_token", per, 1, g)
            if e // g < 2:  # a group's score is the sum of its two best experts' scores
                raise ConfigError("model.moe.route_groups", f"{g} groups of {e // g} expert",
                                  "group-limited routing needs at least 2 experts per group")
            if self.experts_per_token > per * (e // g):
                raise ConfigError("model.moe.route_groups_per_token",
                                  f"{per} groups of {e // g} experts hold fewer than "
                                  f"experts_per_token={self.experts_per_token}",
                                  "allow more groups per token")
        scale = self.routed_scaling_factor
        if not _number(scale) or not 0.0 < scale <= 1e3:
            raise ConfigError("model.moe.routed_scaling_factor", f"got {show(scale)}",
                              "expected a number in (0, 1000]")
        rate = self.router_bias_update_rate
        if not _number(rate) or not 0.0 <= rate <= 1.0:
            raise ConfigError("model.moe.router_bias_update_rate", f"got {show(rate)}",
                              "expected a number in [0, 1]")
        if rate != DEEPSEEK_BIAS_UPDATE_RATE and not self.router_aux_free:
            raise ConfigError("model.moe.router_bias_update_rate", f"{rate} with "
                              "router_aux_free=false", "set router_aux_free: true, or drop it")

    def is_moe_layer(self, i: int) -> bool:
        """Block i (0-based) routes to experts: past the dense ones, every layer_freq-th."""
        j = i - self.first_dense_layers
        return j >= 0 and j % self.layer_freq == 0

    def moe_layers(self, num_layers: int) -> int:
        """How many of num_layers blocks are MoE."""
        return sum(self.is_moe_layer(i) for i in range(num_layers))

    @property
    def groups_per_token(self) -> int:
        """Groups a token may be routed to (route_groups when not limited)."""
        return self.route_groups if self.route_groups_per_token is None \
            else self.route_groups_per_token

    @property
    def routed_share(self) -> float:
        """Expected tokens per expert over tokens: k / E (GShard's even share)."""
        return self.experts_per_token / self.num_experts


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2 §2.1): queries and keys/values
    pass through low-rank latents; each head has a RoPE part and a no-position part."""

    kv_lora_rank: int
    """Width of the compressed key/value latent (d_c; DeepSeek-V3: 512)."""
    qk_rope_head_dim: int
    """Per-head width of the rotary query/key part (d_h^R; 64), the key part shared by heads."""
    qk_nope_head_dim: int
    """Per-head width of the query/key part without position (d_h; 128)."""
    v_head_dim: int
    """Per-head width of the values (128)."""
    q_lora_rank: int | None = None
    """Width of the compressed query latent (d_c'; 1536); None: queries projected directly."""

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            _count(f"model.mla.{name}", getattr(self, name), 1, 2**20)
        if self.q_lora_rank is not None:
            _count("model.mla.q_lora_rank", self.q_lora_rank, 1, 2**20)

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key: no-position plus rotary part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def moe_presets() -> list:  # list[ModelSpec]; imported late: model_spec imports this module
    """Built-in MoE models, each read from its Hugging Face config.json (cited per entry), and
    the tiny MoE and MLA models of the CPU tests."""
    from autoplan.model_spec import (
        DEEPSEEK_V3_ROPE_SCALING,
        GPT_OSS_ROPE_SCALING,
        MlpKind,
        ModelSpec,
        NormKind,
        PositionKind,
        RopeScaling,
    )

    def moe(name: str, layers: int, hidden: int, heads: int, kv: int, vocab: int, seq: int,
            spec: MoESpec, ffn: int | None = None, head_dim: int | None = None,
            bias: bool = False, mla: MLASpec | None = None, mtp_layers: int = 0,
            rope_theta: float = 10000.0, rope_scaling: RopeScaling | None = None) -> ModelSpec:
        return ModelSpec(mtp_layers=mtp_layers, rope_theta=rope_theta, rope_scaling=rope_scaling,
            name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
            ffn_hidden_size=ffn or spec.expert_ffn_hidden_size, vocab_size=vocab, seq_len=seq,
            mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM, position=PositionKind.ROPE, bias=bias,
            head_dim=head_dim, moe=spec, mla=mla)

    return [
        # huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json: hidden 4096,
        # intermediate 14336, 32 layers, 32 heads, 8 KV heads, vocab 32000, 8 local experts,
        # top-2, "rope_theta": 1e6; 46.7B total / 12.9B active (Jiang et al. 2024, "Mixtral of
        # Experts" §2).
        moe("mixtral-8x7b", 32, 4096, 32, 8, 32000, 4096, MoESpec(8, 2, 14336), rope_theta=1e6),
        # huggingface.co/mistralai/Mixtral-8x22B-v0.1/blob/main/config.json: hidden 6144,
        # intermediate 16384, 56 layers, 48 heads, 8 KV heads, vocab 32768, "rope_theta": 1e6;
        # 141B / 39B active (mistral.ai/news/mixtral-8x22b).
        moe("mixtral-8x22b", 56, 6144, 48, 8, 32768, 4096, MoESpec(8, 2, 16384), rope_theta=1e6),
        # huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json: hidden 2048, 48 layers, 32
        # heads of 128, 4 KV heads, 128 experts of 768, top-8, vocab 151936, no dense layers
        # (mlp_only_layers []), "rope_theta": 1000000; 30.5B / 3.3B active (model card: the
        # count with both embedding tables, 3.353B, cut to two digits). Pre-training context 4096
        # for most tokens (Qwen3 technical report §3.2, stage S1/S2).
        moe("qwen3-30b-a3b", 48, 2048, 32, 4, 151936, 4096, MoESpec(128, 8, 768),
            ffn=6144, head_dim=128, rope_theta=1e6),
        # huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json: hidden 4096, 94 layers,
        # 64 heads of 128, 4 KV heads, 128 experts of 1536, top-8, "rope_theta": 1000000;
        # 235B / 22B active.
        moe("qwen3-235b-a22b", 94, 4096, 64, 4, 151936, 4096, MoESpec(128, 8, 1536),
            ffn=12288, head_dim=128, rope_theta=1e6),
        # huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: hidden 7168, 61 layers
        # (first_k_dense_replace 3, dense intermediate 18432), 128 heads, MLA (q_lora_rank 1536,
        # kv_lora_rank 512, qk_rope 64, qk_nope 128, v 128), 256 routed experts of 2048 + 1
        # shared, top-8, sigmoid router with a bias (aux-loss-free, "topk_method": "noaux_tc",
        # "scoring_func": "sigmoid", "norm_topk_prob": true) limited to "topk_group": 4 of
        # "n_group": 8 groups, gates scaled by "routed_scaling_factor": 2.5, vocab 129280; 671B / 37B
        # active without the multi-token-prediction module, "activated" leaving out the input
        # embedding (36.63B; tests/unit/test_moe_spec.py) (DeepSeek-V3 report §4.2: 4K
        # pre-training sequences). head_dim 160 = (192 + 128) / 2, the attention core's width.
        # "num_nextn_predict_layers": 1, one multi-token-prediction module (report §2.2, D = 1;
        # README_WEIGHTS.md: 11.5B unique parameters besides the shared embedding and head).
        # "rope_theta": 10000, the default; rope_scaling YaRN (type yarn, factor 40, original
        # 4096, beta_fast 32, beta_slow 1, mscale = mscale_all_dim = 1: the softmax scale times
        # 1.874, cos/sin unscaled), as the released model and torchtitan's 671B flavor rotate.
        moe("deepseek-v3", 61, 7168, 128, 128, 129280, 4096,
            MoESpec(256, 8, 2048, num_shared_experts=1, first_dense_layers=3,
                    router_aux_free=True, route_groups=8, route_groups_per_token=4,
                    routed_scaling_factor=2.5),
            ffn=18432, head_dim=160, mla=MLASpec(512, 64, 128, 128, q_lora_rank=1536),
            mtp_layers=1, rope_scaling=DEEPSEEK_V3_ROPE_SCALING),
        # huggingface.co/openai/gpt-oss-120b/blob/main/config.json: hidden 2880, 36 layers, 64
        # heads of 64, 8 KV heads, 128 experts of 2880, top-4, attention and expert biases,
        # vocab 201088 (o200k_harmony); 116.8B / 5.13B active (gpt-oss model card, Table 1,
        # active counting the unembedding but not the embedding). Alternating sliding-window
        # layers and attention sinks are not modelled. "rope_theta": 150000; rope_scaling YaRN
        # (rope_type yarn, factor 32, original 4096, beta_fast 32, beta_slow 1, truncate false:
        # cos/sin times 0.1 ln 32 + 1 = 1.347, HF's convention).
        moe("gpt-oss-120b", 36, 2880, 64, 8, 201088, 4096, MoESpec(128, 4, 2880),
            head_dim=64, bias=True, rope_theta=150000.0, rope_scaling=GPT_OSS_ROPE_SCALING),
        # CPU tests: 4 blocks, the first dense, 8 experts of 128, top-2, byte vocabulary.
        moe("tiny-moe", 4, 64, 4, 4, 256, 64, MoESpec(8, 2, 128, first_dense_layers=1),
            ffn=128),
        # CPU tests of DeepSeek-V3's router: tiny-moe with one shared expert and the
        # aux-loss-free sigmoid router over 4 groups of 2 experts, 2 groups per token, gates
        # scaled by 2.5 as deepseek-v3's; the bias moves 10x faster than DeepSeek's 0.001 so
        # that a few steps change the routing.
        moe("tiny-deepseek", 4, 64, 4, 4, 256, 64,
            MoESpec(8, 2, 128, num_shared_experts=1, first_dense_layers=1, router_aux_free=True,
                    route_groups=4, route_groups_per_token=2, routed_scaling_factor=2.5,
                    router_bias_update_rate=0.01), ffn=128),
        # CPU tests of MLA: tiny-moe's dense blocks with DeepSeek-V3's kind of attention at
        # small widths (q and kv latents 32; per head 16 + 8 rotary for q/k, 16 for v, so
        # d_v < d_qk as in DeepSeek-V3's 128 < 192); head_dim 20 = (24 + 16) / 2, the attention
        # core's mean width (as deepseek-v3's).
        ModelSpec(name="tiny-mla", num_layers=4, hidden_size=64, num_heads=4,
                  ffn_hidden_size=128, vocab_size=256, seq_len=64, mlp=MlpKind.SWIGLU,
                  norm=NormKind.RMSNORM, position=PositionKind.ROPE, bias=False, head_dim=20,
                  mla=MLASpec(32, 8, 16, 16, q_lora_rank=32)),
    ]

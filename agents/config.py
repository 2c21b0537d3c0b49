"""All hyperparameters of GAGPOAgent in one dataclass, validated, and saved with every checkpoint."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from agents.advantages import REGISTRY, Estimator
from wrappers.prompt import ACTION_MODES, CHOOSE, GENERATE, prompt_template
from wrappers.text_wrappers import parse_backoff_spec, parse_key_spec

#: The built-in estimators' names, in the registry's order (agents.advantages.REGISTRY declares each one).
ESTIMATORS = tuple(REGISTRY)
DTYPES = ("auto", "float32", "bfloat16")
BACKENDS = ("hf", "vllm")
LR_SCHEDULES = ("constant", "linear", "cosine")
EXPERT_NEEDS_CHOOSE = f"expert_members needs action_mode={CHOOSE!r} (an expert member plays an admissible choice)"
# Clip ranges of the length-normalised action ratio. A choice among a few candidates moves its probability a lot
# per update, so PPO's 0.2 binds there. A generated action's ratio is a geometric mean over its tokens and barely
# moves: on SmolLM2-135M in generate mode (lab/bench/clip.py, results/clip/clip-range.json) 0.2 clipped 0% of the
# actions and GSPO's 3e-4/4e-4 68-89%; 0.03 clipped 14% at the pretrained default (full fine-tuning, lr 1e-6),
# about the share GSPO reports, and 0% with LoRA at lr 1e-5 (0.01: 36% and 5%).
CLIP_CHOOSE = (0.2, 0.2)
CLIP_GENERATE = (0.03, 0.03)


@dataclass
class GAGPOConfig:
    """Hyperparameters. Defaults follow docs/algorithm.md; ``"auto"`` values depend on the model (see ``resolved``)."""

    # --- rollout layout: each iteration plays num_groups tasks, group_size episodes each
    num_groups: int = field(default=4, metadata={"help": "rollout groups (tasks) per iteration"})
    group_size: int = field(default=8, metadata={"help": "episodes per group, all on the same task"})
    vec_mode: str = field(default="sync", metadata={"help": '"sync" or "async" (worker processes)'})
    pipeline: bool = field(
        default=False,
        metadata={
            "help": "step half of the sub-envs in their workers while the policy acts for the other half "
            "(vec_mode async; same actions and episodes as without)"
        },
    )
    task_pool: int = field(
        default=0,
        metadata={"help": "train on task seeds 0 .. task_pool - 1 (0: any seed, i.e. a fresh task almost every time)"},
    )
    # --- advantage estimation (docs/algorithm.md)
    estimator: str = field(default="gagpo", metadata={"help": " | ".join(REGISTRY)})
    gamma: float = field(default=0.95, metadata={"help": "discount factor"})
    lam: float = field(
        default=0.8, metadata={"help": "GAGPO's lambda (choice: 0.8 until the learning benchmark says otherwise)"}
    )
    gae_lambda: float = field(default=0.95, metadata={"help": "the PPO-with-critic baseline's GAE lambda"})
    normalize: str = field(default="group", metadata={"help": "GAGPO normalisation: group | batch | none"})
    bootstrap_truncated: bool = field(
        default=True,
        metadata={"help": "GAGPO: bootstrap a time-limit truncation with the group's value of the next state"},
    )
    omega: float = field(default=1.0, metadata={"help": "GiGPO, GraphGPO and G2PO: weight of the step-level term"})
    gigpo_std_norm: bool = field(default=True, metadata={"help": "GiGPO: divide by the std (GRPO-style) in both terms"})
    adv_eps: float = field(default=1e-6, metadata={"help": "epsilon added to the std in every normalisation"})
    advantage_scale: str = field(
        default="estimator",
        metadata={"help": "estimator (as it computes them) | unit (the batch's advantages divided by their RMS)"},
    )
    zero_failed_groups: bool = field(
        default=False, metadata={"help": "zero the advantages of groups in which no episode succeeded"}
    )
    # DAPO's dynamic sampling (verl-agent's dynamic GiGPO): a group whose advantages are all zero teaches nothing
    # but dilutes the loss; more groups are played until num_groups informative ones are in, within a cap.
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "drop groups whose advantages are all zero and play more (new tasks) until num_groups "
            "informative groups are in, at most max_extra_rounds more rounds of num_groups"
        },
    )
    max_extra_rounds: int = field(
        default=2, metadata={"help": "dynamic_sampling: extra rounds of num_groups groups per iteration, at most"}
    )
    state_key: str = field(default="state", metadata={"help": "state | observation | history:k"})
    # Key back-off (docs/algorithm.md#key-back-off): coarser keys, finest first, for rows whose (group, state) set
    # has fewer than backoff_min_count rows; each a state_key spec or "group" (the whole group). () turns it off.
    key_backoff: tuple = field(default=(), metadata={"help": "key backoff"})
    backoff_min_count: int = field(default=2, metadata={"help": "backoff min count"})
    episode_coef: float = field(
        default=0.0, metadata={"help": "GAGPO only: adds episode_coef * the GRPO advantage (the paper's ablation)"}
    )
    # The 2026 step-level estimators (docs/rivals.md); defaults are their published runs' settings.
    hgpo_history: int = field(
        default=-1,
        metadata={
            "help": "HGPO: previous states that define its deepest history group, K (groups of depth 1 .. K + 1); "
            "-1: history_length, the history the prompt shows"
        },
    )
    hgpo_alpha: float = field(
        default=1.0, metadata={"help": "HGPO: a group of depth k weighs (k + 1) ** hgpo_alpha (0: uniform)"}
    )
    hgpo_base_group: bool = field(
        default=False, metadata={"help": "HGPO: add the episode-level advantage as a group of depth 0 (weight 1)"}
    )
    hgpo_std_norm: bool = field(
        default=True, metadata={"help": "HGPO: divide by the group's std (mean_std_norm), else centre only"}
    )
    graphgpo_gamma: float = field(
        default=0.1, metadata={"help": "GraphGPO: a step's return is 10 * graphgpo_gamma ** (distance to the goal)"}
    )
    graphgpo_progress: bool = field(
        default=False,
        metadata={"help": "GraphGPO: reward the distance closed, d(next) - d(state) + 1, instead of d(next)"},
    )
    graphgpo_episode_coef: float = field(default=1.0, metadata={"help": "GraphGPO: weight of the episode-level term"})
    graphgpo_std_norm: bool = field(
        default=True, metadata={"help": "GraphGPO: divide by the std in both terms (mean_std_norm), else centre"}
    )
    g2po_std_norm: bool = field(
        default=True, metadata={"help": "G2PO: divide by the std in its three terms (mean_std_norm), else centre"}
    )
    # --- env interface
    action_mode: str = field(
        default="auto", metadata={"help": "generate | choose | auto (choose for the tiny model, generate otherwise)"}
    )
    choose_score: str = field(
        default="auto", metadata={"help": "sum | mean | auto (mean for the tiny model, sum otherwise)"}
    )
    history_length: int = field(
        default=2, metadata={"help": "previous (observation, action) pairs shown in the prompt"}
    )
    max_prompt_tokens: int = field(
        default=1024, metadata={"help": "prompt length cap (older history is dropped first)"}
    )
    max_new_tokens: int = field(default=64, metadata={"help": "generate mode: tokens per response"})
    show_admissible: bool = field(default=True, metadata={"help": "list the admissible actions in the prompt"})
    memory: bool = field(
        default=False,
        metadata={"help": "show the episode's memory in the prompt: places seen and what they held (ALFWorld text)"},
    )
    # A built-in template (wrappers.prompt.TEMPLATES: verl-agent's ALFWorld and WebShop structure in this project's
    # words) or a file with the placeholders of wrappers.prompt.PLACEHOLDERS (verl-agent's exact text, say).
    prompt_template: str = field(
        default="generic",
        metadata={"help": "the prompt's user message: generic | alfworld | webshop | PATH of a template file"},
    )
    strict_format: bool = field(
        default=False,
        metadata={
            "help": "generate mode: a response without <think> </think> or with CJK characters is penalised and "
            "counted unparsed (verl-agent's rule; its action still plays)"
        },
    )
    invalid_action_penalty: float = field(
        default=0.01, metadata={"help": "reward subtracted for an invalid or unparsable action"}
    )
    revisit_penalty: float = field(
        default=0.0,
        metadata={"help": "reward subtracted for a valid action back to a state the episode was already in"},
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature during rollouts"})
    # A deterministic policy can fail in ways sampled rollouts never show (a loop that sampling leaves by chance);
    # a greedy member puts the greedy episode of every training task in its group, where its advantage judges it.
    greedy_members: int = field(
        default=0,
        metadata={"help": "members of each rollout group that act greedily (the rest sample); < group_size"},
    )
    # Off-policy guidance (as LUFFY mixes demonstrations into GRPO groups): an expert member plays the env's
    # expert_action() in every training task, so a group whose sampled members miss the task still holds a win, and
    # at the states they share GAGPO's state groups contrast the expert's choice with theirs. Its rows enter the
    # update like the others, scored with the policy's own probability of the expert's action (choose mode).
    expert_members: int = field(
        default=0,
        metadata={
            "help": "members of each rollout group that play the env's expert (after the greedy ones; choose "
            "mode); greedy_members + expert_members < group_size"
        },
    )
    expert: str = field(
        default="oracle",
        metadata={
            "help": "the expert the expert members play: oracle (the env's expert_action()) or a kind the env "
            "lists in EXPERTS (MiniHouse: search, sweep)"
        },
    )
    # --- optimisation
    learning_rate: float | None = field(
        default=None, metadata={"help": "AdamW learning rate; none: 1e-3 for the tiny model, 1e-6 otherwise"}
    )
    lr_schedule: str = field(
        default="constant",
        metadata={
            "help": "constant | linear | cosine: the learning rate over each learn() call, from learning_rate to 0 "
            "at its total_timesteps (SB3's progress)"
        },
    )
    # 0: 4 for the tiny model (a sweep on Sokoban and Maze: 4 epochs reached the bar in 0.5-0.7x the env steps of 2),
    # 2 otherwise (PPO practice for LLMs, where rollouts are dear and ratios drift with every epoch)
    n_epochs: int = field(
        default=0, metadata={"help": "passes over each rollout in the update (0: 4 for the tiny model, 2 otherwise)"}
    )
    minibatch_size: int = field(default=64, metadata={"help": "actions per optimiser step"})
    # None: 0.2 in choose mode; generate mode: see ``resolved``
    clip_range_low: float | None = field(
        default=None, metadata={"help": "PPO clip: lower bound 1 - clip_range_low on the ratio"}
    )
    clip_range_high: float | None = field(
        default=None, metadata={"help": "PPO clip: upper bound 1 + clip_range_high on the ratio"}
    )
    ratio: str = field(
        default="action",
        metadata={"help": "action (length-normalised, one per action) | token (per-token, the ablation)"},
    )
    kl_coef: float = field(
        default=0.0, metadata={"help": "k3 KL to the frozen initial policy (LoRA: the adapter-disabled model)"}
    )
    ent_coef: float = field(default=0.0, metadata={"help": "entropy bonus coefficient"})
    vf_coef: float = field(default=0.5, metadata={"help": "value-loss coefficient (ppo estimator only)"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clipping threshold"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    # 0: 4096 on a CPU, where small forwards of rows of similar length run fastest (MiniHouse, tiny model, one
    # thread: a 64-row minibatch of full houses 1.0 s at 2048-4096 padded tokens per forward, 1.2 s at 16384, 2.2 s
    # in one forward), 16384 on an accelerator.
    token_budget: int = field(
        default=0,
        metadata={
            "help": "padded tokens per forward: micro-batches of the update (gradients accumulate over them) and "
            "batches of acting (0: 4096 on a CPU, 16384 on an accelerator)"
        },
    )
    # --- model
    # Generate mode's rollout engine: "hf" (sampling on the training weights) or "vllm" (an in-process vLLM engine
    # with a copy of them, synced once per iteration; the [vllm] extra). Choose mode always scores with the
    # trainer's forward (see agents/vllm_backend.py for why).
    backend: str = field(
        default="hf",
        metadata={
            "help": "generate mode's rollout engine: hf | vllm (in-process vLLM, weights synced once per iteration)"
        },
    )
    # the engine's share of the GPU while it is awake (it sleeps in updates)
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "vllm backend: the engine's share of the GPU while awake (CUDA only)"}
    )
    # Truncated importance sampling for the sampler/trainer mismatch (TRL's vllm_importance_sampling_correction):
    # each action's loss term is weighted by min(exp(mean over its tokens of old_logp - rollout_logp), rollout_is_cap).
    # auto: on with backend="vllm" (another engine, maybe another dtype), off with "hf" (the trainer samples itself)
    rollout_is: str = field(default="auto", metadata={"help": "auto | on | off"})
    rollout_is_cap: float = field(default=2.0, metadata={"help": "rollout is cap"})
    # Overlap (docs/overlap.md): iteration k's update runs in a thread while rollout k+1 is played with the frozen
    # weights of an older version (at most max_staleness updates behind); the loss corrects the gap (decoupled PPO).
    overlap: bool = field(
        default=False,
        metadata={"help": "run each update beside the next rollout (off: the sequential loop, bit for bit)"},
    )
    max_staleness: int = field(
        default=1,
        metadata={"help": "overlap: rollout k acts with the weights of update k - max_staleness (0: waits, = sync)"},
    )
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N | mps"})
    dtype: str = field(
        default="auto",
        metadata={
            "help": "compute dtype: auto (bf16 on CUDA, fp32 otherwise) | float32 | bfloat16 (weights train in fp32)"
        },
    )
    lora_r: int = field(default=0, metadata={"help": "LoRA rank (0: full fine-tuning)"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "trade compute for memory in the update"})
    fsdp: bool = field(
        default=False,
        metadata={"help": "under a launch: shard weights, gradients and optimiser state (FSDP2); else DDP"},
    )
    tiny_vocab_size: int = field(
        default=1024, metadata={"help": "tiny model: BPE vocabulary size (trained on the env's text)"}
    )
    tiny_hidden_size: int = field(default=64, metadata={"help": "tiny model: hidden size"})
    tiny_layers: int = field(default=2, metadata={"help": "tiny model: transformer layers"})
    tiny_heads: int = field(
        default=4,
        metadata={"help": "tiny model: attention heads (key/value heads: half; vLLM on a CPU needs head size >= 32)"},
    )
    torch_threads: int = field(
        default=0,
        metadata={"help": "0: half the CPU cores (two busy threads on a shared 2-core box are slower than one)"},
    )
    seed: int = field(default=0, metadata={"help": "seed for the model, sampling and the task sampler"})

    def __post_init__(self) -> None:
        if isinstance(self.key_backoff, list):  # JSON gives back a list
            self.key_backoff = tuple(self.key_backoff)
        self.validate()

    def _check_types(self) -> None:
        """Each value has its field's type: ``num_groups=2.5``, ``"4"``, ``inf``, ``show_admissible="no"`` fail."""
        allowed = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "tuple": (tuple,)}
        for f in dataclasses.fields(self):
            name, value = f.name, getattr(self, f.name)
            kinds = [k.strip() for k in str(f.type).split("|")]
            if value is None and "None" in kinds:
                continue
            ok = False
            for kind in kinds:
                types = allowed.get(kind, ())
                if isinstance(value, types) and (kind == "bool" or not isinstance(value, bool)):
                    ok = kind not in ("float", "int") or math.isfinite(value)
                    break
            if not ok:
                words = {"int": "a finite int", "float": "a finite number", "bool": "True or False", "str": "a string",
                         "tuple": "a tuple or list"}  # fmt: skip
                wanted = " or ".join(words.get(k, k) for k in kinds)
                raise ValueError(f"GAGPOConfig: {name} must be {wanted}, got {value!r}")

    def validate(self) -> None:
        """Raise one readable ValueError for the first bad value."""

        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"GAGPOConfig: {message}")

        self._check_types()
        check(
            re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device) is not None,
            f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {self.device!r}",
        )

        check(self.estimator in REGISTRY, f"estimator must be one of {tuple(REGISTRY)}, got {self.estimator!r}")
        check(self.num_groups >= 1 and self.group_size >= 1, "num_groups and group_size must be >= 1")
        # SB3 refuses n_steps * n_envs == 1 with advantage normalisation: the baseline is the sample itself.
        check(
            self.group_size >= 2 or not self.estimator_spec.needs_group,
            f"estimator {self.estimator!r} needs group_size >= 2: its baseline is the group's other episodes, so a "
            "group of one gets advantage 0 on every step and never learns (or use an estimator with a critic: "
            f"{', '.join(e.name for e in REGISTRY.values() if e.needs_critic)})",
        )
        check(self.seed >= 0, f"seed must be >= 0 (numpy's generators take no negative seed), got {self.seed}")
        check(self.vec_mode in ("sync", "async"), f"vec_mode must be 'sync' or 'async', got {self.vec_mode!r}")
        check(
            not self.pipeline or self.vec_mode == "async",
            "pipeline needs vec_mode='async': a lane steps in worker processes while the policy acts for the other",
        )
        check(self.task_pool >= 0, f"task_pool must be >= 0, got {self.task_pool}")
        check(self.max_extra_rounds >= 0, f"max_extra_rounds must be >= 0, got {self.max_extra_rounds}")
        check(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
        check(0.0 <= self.lam <= 1.0, f"lam must be in [0, 1], got {self.lam}")
        check(0.0 <= self.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check(
            self.normalize in ("group", "batch", "none"),
            f"normalize must be group|batch|none, got {self.normalize!r}",
        )
        check(self.adv_eps > 0, "adv_eps must be > 0")
        check(
            self.advantage_scale in ("estimator", "unit"),
            f"advantage_scale must be estimator|unit, got {self.advantage_scale!r}",
        )
        try:
            parse_key_spec(self.state_key)
        except ValueError as err:
            check(False, str(err))
        for spec in self.key_backoff:
            try:
                parse_backoff_spec(spec)
            except ValueError as err:
                check(False, f"key_backoff: {err}")
        check(len(set(self.key_backoff)) == len(self.key_backoff), f"key_backoff repeats a key: {self.key_backoff}")
        check(self.backoff_min_count >= 1, f"backoff_min_count must be >= 1, got {self.backoff_min_count}")
        check(
            -1 <= self.hgpo_history <= 32,
            f"hgpo_history must be in [-1, 32] (-1: history_length), got {self.hgpo_history}",
        )
        check(0.0 <= self.hgpo_alpha <= 10.0, f"hgpo_alpha must be in [0, 10], got {self.hgpo_alpha}")
        check(0.0 < self.graphgpo_gamma <= 1.0, f"graphgpo_gamma must be in (0, 1], got {self.graphgpo_gamma}")
        check(
            self.omega >= 0 and self.graphgpo_episode_coef >= 0,
            f"omega and graphgpo_episode_coef must be >= 0, got {self.omega} and {self.graphgpo_episode_coef}",
        )
        check(
            self.action_mode in ("auto", *ACTION_MODES),
            f"action_mode must be {'|'.join(('auto', *ACTION_MODES))}, got {self.action_mode!r}",
        )
        check(
            self.choose_score in ("auto", "sum", "mean"),
            f"choose_score must be auto|sum|mean, got {self.choose_score!r}",
        )
        check(self.history_length >= 0, "history_length must be >= 0")
        try:  # the builder's own reading: a template file's placeholders are checked here too
            prompt_template(self.prompt_template)
        except ValueError as err:
            check(False, str(err))
        check(self.max_prompt_tokens >= 16, "max_prompt_tokens must be >= 16")
        check(self.max_new_tokens >= 1, "max_new_tokens must be >= 1")
        check(self.invalid_action_penalty >= 0, "invalid_action_penalty must be >= 0")
        check(self.revisit_penalty >= 0, "revisit_penalty must be >= 0")
        check(self.temperature > 0, "temperature must be > 0")
        check(
            0 <= self.greedy_members < self.group_size,
            f"greedy_members must be in [0, group_size), got {self.greedy_members} (group_size {self.group_size})",
        )
        check(
            self.expert_members >= 0 and self.greedy_members + self.expert_members < self.group_size,
            f"expert_members must be >= 0 and leave a sampled member: greedy_members + expert_members < group_size, "
            f"got {self.greedy_members} + {self.expert_members} (group_size {self.group_size})",
        )
        check(self.expert_members == 0 or self.action_mode != GENERATE, EXPERT_NEEDS_CHOOSE)
        check(self.learning_rate is None or self.learning_rate > 0, "learning_rate must be > 0")
        check(self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        check(self.n_epochs >= 0, f"n_epochs must be >= 0 (0: auto), got {self.n_epochs}")
        check(self.minibatch_size >= 1, f"minibatch_size must be >= 1, got {self.minibatch_size}")
        for name in ("clip_range_low", "clip_range_high"):
            value = getattr(self, name)
            check(value is None or 0 < value < 1, f"{name} must be in (0, 1), got {value}")
        check(self.ratio in ("action", "token"), f"ratio must be 'action' or 'token', got {self.ratio!r}")
        check(min(self.kl_coef, self.ent_coef, self.vf_coef) >= 0, "kl_coef, ent_coef and vf_coef must be >= 0")
        check(self.max_grad_norm > 0, "max_grad_norm must be > 0")
        check(self.token_budget == 0 or self.token_budget >= 64, "token_budget must be 0 (auto) or >= 64")
        check(self.lora_r >= 0, "lora_r must be >= 0")
        check(not (self.fsdp and self.lora_r > 0), "fsdp shards full fine-tuning; LoRA trains under DDP (fsdp=False)")
        check(self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        check(self.torch_threads >= 0, "torch_threads must be >= 0")
        check(self.backend in BACKENDS, f"backend must be one of {BACKENDS}, got {self.backend!r}")
        check(self.rollout_is in ("auto", "on", "off"), f"rollout_is must be auto|on|off, got {self.rollout_is!r}")
        check(self.rollout_is_cap >= 1, f"rollout_is_cap must be >= 1, got {self.rollout_is_cap}")
        check(self.max_staleness >= 0, f"max_staleness must be >= 0, got {self.max_staleness}")
        check(
            0 < self.vllm_gpu_memory_utilization <= 1,
            f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}",
        )
        check(
            self.tiny_heads >= 1 and self.tiny_hidden_size % self.tiny_heads == 0,
            f"tiny_heads must divide tiny_hidden_size ({self.tiny_hidden_size}), got {self.tiny_heads}",
        )

    @property
    def estimator_spec(self) -> Estimator:
        """The registry's entry for ``estimator``: its function, the fields it reads, whether it needs a critic."""
        return REGISTRY[self.estimator]

    def resolved(self, tiny: bool, accelerator: bool = False) -> GAGPOConfig:
        """A copy with every ``"auto"`` / ``None`` / 0 replaced by its value for this model (``tiny``: the
        library's tiny model, fresh or warm-started) and device (``accelerator``: not a CPU)."""
        if tiny and self.lora_r > 0:
            raise ValueError("lora_r > 0 needs a pretrained model: the tiny model starts random and trains all weights")
        action_mode = (CHOOSE if tiny else GENERATE) if self.action_mode == "auto" else self.action_mode
        if self.expert_members and action_mode == GENERATE:
            raise ValueError(f"GAGPOConfig: {EXPERT_NEEDS_CHOOSE} (action_mode 'auto' is generate for this model)")
        clip = CLIP_GENERATE if action_mode == GENERATE and self.ratio == "action" else CLIP_CHOOSE
        return dataclasses.replace(
            self,
            action_mode=action_mode,
            clip_range_low=clip[0] if self.clip_range_low is None else self.clip_range_low,
            clip_range_high=clip[1] if self.clip_range_high is None else self.clip_range_high,
            choose_score=("mean" if tiny else "sum") if self.choose_score == "auto" else self.choose_score,
            learning_rate=(1e-3 if tiny else 1e-6) if self.learning_rate is None else self.learning_rate,
            n_epochs=(4 if tiny else 2) if self.n_epochs == 0 else self.n_epochs,
            token_budget=(16384 if accelerator else 4096) if self.token_budget == 0 else self.token_budget,
            rollout_is=("on" if self.backend == "vllm" else "off") if self.rollout_is == "auto" else self.rollout_is,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GAGPOConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"GAGPOConfig: unknown hyperparameters {unknown}")
        return cls(**values)

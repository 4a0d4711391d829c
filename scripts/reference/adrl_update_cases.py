"""Writes PPO updates of the authors' trainer (ADRL) as parity cases for poad_jax.

Runs the POAD authors' own agent, buffer and trainers (github
morning9393/ADRL, `mappo/`, checked at commit 5ec1aa5) on a CPU in float32,
records one full update per case (every minibatch's losses, KL, skip decision
and gradients before clipping; the weights before and after) and writes them
with everything poad_jax needs to replay the same update to one `.npz` file.
The case format is docs/adrl_parity.md's; `python -m poad_jax.bench
adrl_parity --cases=FILE.npz` checks a file.

Not part of poad_jax: it needs torch, transformers, peft, tokenizers and
safetensors, in a separate environment, and a checkout of ADRL:

    python -m venv adrl-venv && adrl-venv/bin/pip install torch==2.13.0 transformers peft tokenizers safetensors
    adrl-venv/bin/python scripts/reference/adrl_update_cases.py --adrl=<ADRL checkout> \\
        --out=tests/fixtures/adrl_update_cases.npz

The ADRL files are read, not copied: at load time the same kind of CPU port as
`../shared/reference/adrl/adrl_cpu.patch` is applied to their text in memory
(CUDA -> CPU, float16 -> float32, AutoTokenizer with BOS), and the modules that
pull in environments (the code agent) are stubbed.

The model: by default a tiny random LLaMA (2 layers, hidden 32) over a
word-level tokenizer whose pre-tokenizer also splits digits from letters (so an
action's word count and token count differ: "room2" is one word, two tokens),
written to a temporary directory and stored in the case file; the critic head's
widths are reduced to 64 and 32 (`--head-sizes`) to keep the file small (the
authors' code computes the same way at any width).  `--model=<HF directory>`
(e.g. SmolLM2-135M-Instruct as poad_jax converts it) and `--head-sizes=1024,512`
make a full-size case file, which records the directory instead of the weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import tempfile
import types

import numpy as np

ADRL_COMMIT = "5ec1aa5"

# The CPU port, applied to the ADRL sources' text when they are loaded.
CPU_PORT = (
    ('"cuda:0"', '"cpu"'),
    ('"cuda"', '"cpu"'),
    ("torch_dtype=torch.float16", "dtype=torch.float32"),
    ('device_map="auto"', "device_map=None"),
    (".half()", ".float()"),
    ("from transformers import LlamaTokenizer, LlamaForCausalLM\n",
     "from transformers import LlamaTokenizer, LlamaForCausalLM, AutoTokenizer\n"),
    ("LlamaTokenizer.from_pretrained(model_name)", "AutoTokenizer.from_pretrained(model_name, add_bos_token=True, padding_side='right')"),
)
ADRL_MODULES = ("mappo.utils.util", "mappo.models.critic", "mappo.agents.llama_lora_agent",
                "mappo.utils.language_buffer", "mappo.trainers.llm_trainer_tppo", "mappo.trainers.llm_trainer_appo")

WORDS = ("you are in the kitchen living room bedroom see a pancake microwave and fridge it is closed open "
         "on off step walk to grab put close turn heat with , . : 0 1 2 3 4 5 6 7 8 9").split()
# Observations of one case share their word count (TWOSOME's critic reads the last padded column).
OBSERVATIONS = (
    "you are in the kitchen . you see a pancake and a microwave . it is closed . step {t}",
    "you are in the bedroom . you see a fridge and a pancake . it is open . step {t}",
    "you are in the bedroom . you see a microwave and a pancake . it is on . step {t}",
    "you are in the kitchen . you see the pancake in the microwave . it is off . step {t}",
)
SHORT_OBSERVATIONS = ("you are in the kitchen . step {t}", "you see a pancake . step {t}")
ACTIONS = ("walk to the kitchen", "walk to the living room2", "open the microwave", "close the microwave",
           "put the pancake in the microwave", "turn on the microwave", "grab the pancake", "heat the pancake")


@dataclasses.dataclass(frozen=True)
class Case:
    """One update of the authors' trainer and the data it sees."""

    name: str
    algo: str  # POAD | NTPO | TWOSOME
    threads: int
    steps: int
    epochs: int
    minibatches: int
    cp_steps: int
    entropy_coef: float
    lr: float
    critic_lr: float
    max_grad_norm: float
    done_at: tuple[tuple[int, int], ...]  # (step, thread) pairs that end an episode with reward 1
    zero_advantage_at: tuple[tuple[int, int], ...] = ()  # done steps whose token values are set to the reward
    kl_rows: tuple[tuple[int, int], ...] = ()  # (step, thread) rows whose old log-probs are lowered by kl_shift
    kl_shift: float = 0.0
    varied_lengths: bool = True  # observations of different lengths (token level only)
    # TWOSOME: the second row of the first epoch's first loss chunk gets an old value that puts its
    # advantage this far from the first row's (0: not set).  A chunk of two nearly equal advantages
    # is where the chunk's mean and std must be computed with care (docs/adrl_parity.md).
    near_gap: float = 0.0


CASES = (
    # POAD: 2 epochs x 2 minibatches, 2 loss chunks, exact-zero advantages, clipped values and
    # gradients, a KL skip, episodes ending inside the batch, observations of several lengths.
    Case("poad", "POAD", threads=2, steps=4, epochs=2, minibatches=2, cp_steps=2, entropy_coef=1e-4,
         lr=3e-3, critic_lr=1e-3, max_grad_norm=0.5, done_at=((1, 0), (2, 1), (3, 0)),
         zero_advantage_at=((1, 0),), kl_rows=((2, 1),), kl_shift=0.5),
    # NTPO (gamma_w = gamma inside an action): 1 epoch x 2 minibatches, grad clipping at 0.05.
    Case("ntpo", "NTPO", threads=2, steps=4, epochs=1, minibatches=2, cp_steps=1, entropy_coef=0.01,
         lr=3e-3, critic_lr=1e-3, max_grad_norm=0.05, done_at=((2, 0), (3, 1))),
    # TWOSOME: 2 epochs x 2 minibatches, 2 loss chunks (advantages normalised per chunk), word normaliser.
    Case("twosome", "TWOSOME", threads=2, steps=4, epochs=2, minibatches=2, cp_steps=2, entropy_coef=0.01,
         lr=3e-3, critic_lr=1e-3, max_grad_norm=0.5, done_at=((1, 1), (3, 0)), kl_rows=((1, 0),),
         kl_shift=0.6, varied_lengths=False),
    # TWOSOME with a first loss chunk of two advantages 7.6e-6 apart (about 128 float32 ulps at 0.86),
    # at 2.0e-6 and at 4.0e-5: each chunk's normalised advantages are +-1/sqrt(2) exactly, and a mean
    # rounded to float32 moves them by up to ulp / gap.
    Case("twosome_near", "TWOSOME", threads=2, steps=4, epochs=2, minibatches=2, cp_steps=2, entropy_coef=0.01,
         lr=3e-3, critic_lr=1e-3, max_grad_norm=0.5, done_at=((1, 1), (3, 0)), varied_lengths=False, near_gap=-7.6e-6),
    Case("twosome_nearer", "TWOSOME", threads=2, steps=4, epochs=1, minibatches=2, cp_steps=2, entropy_coef=0.01,
         lr=3e-3, critic_lr=1e-3, max_grad_norm=0.5, done_at=((2, 0), (3, 1)), varied_lengths=False, near_gap=2.0e-6),
)


def near_sweep(count: int) -> tuple[Case, ...]:
    """`count` variants of `twosome_near` (1 epoch): gaps log-spaced from 1.5e-6 to 4e-5, of alternating
    sign, each in the two episode layouts of `twosome_near` and `twosome_nearer` (docs/adrl_parity.md's
    16-case measurement is `--near-sweep=16`)."""
    base = next(case for case in CASES if case.name == "twosome_near")
    layouts = (((1, 1), (3, 0)), ((2, 0), (3, 1)))
    gaps = np.geomspace(1.5e-6, 4e-5, (count + 1) // 2)
    out = []
    for i, gap in enumerate(gaps):
        for j, done in enumerate(layouts):
            sign = 1.0 if (i + j) % 2 else -1.0
            out.append(dataclasses.replace(base, name=f"near{i}{j}", near_gap=float(sign * gap), done_at=done, epochs=1))
    return tuple(out[:count])


def load_adrl(root: pathlib.Path) -> dict[str, types.ModuleType]:
    """The ADRL modules the update needs, from `root`'s `mappo/`, CPU-ported in memory."""
    for package in ("mappo", "mappo.agents", "mappo.models", "mappo.trainers", "mappo.utils"):
        module = types.ModuleType(package)
        module.__path__ = []
        sys.modules[package] = module
    stub = types.ModuleType("mappo.agents.llama_lora_code_agent")  # DataSciCoding's agent: never instantiated
    stub.CodeLlamaLoRAgent = type("CodeLlamaLoRAgent", (), {})
    sys.modules[stub.__name__] = stub
    modules = {}
    for name in ADRL_MODULES:
        path = root / (name.replace(".", "/") + ".py")
        source = path.read_text()
        for old, new in CPU_PORT:
            source = source.replace(old, new)
        module = types.ModuleType(name)
        module.__file__ = str(path)
        sys.modules[name] = module
        exec(compile(source, str(path), "exec"), module.__dict__)
        modules[name.rsplit(".", 1)[1]] = module
    return modules


def write_tiny_model(directory: pathlib.Path, seed: int) -> None:
    """A random 2-layer LLaMA and its word-level tokenizer (BOS added, right padding, pad id 0)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for word in WORDS + ["room", "living"]:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=False)])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", padding_side="right")
    fast.save_pretrained(directory)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # logits of a tiny model need larger embeddings to be far from uniform
        model.model.embed_tokens.weight.normal_(0.0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)


def adrl_args(case: Case, max_new_tokens: int, vocab_size: int) -> argparse.Namespace:
    """The trainer's and the buffer's arguments: ADRL's `config.py` defaults and the case's settings."""
    return argparse.Namespace(
        clip_param=0.2, ppo_epoch=case.epochs, num_mini_batch=case.minibatches, value_loss_coef=0.5,
        max_grad_norm=case.max_grad_norm, huber_delta=10.0, entropy_coef=case.entropy_coef, use_max_grad_norm=True,
        use_clipped_value_loss=True, use_huber_loss=False, lr=case.lr, critic_lr=case.critic_lr, opti_eps=1e-5,
        gradient_cp_steps=case.cp_steps, episode_length=case.steps, n_rollout_threads=case.threads, gamma=0.95,
        gae_lambda=0.95, use_gae=True, use_popart=False, use_valuenorm=False, algorithm_name=case.algo,
        max_new_tokens=max_new_tokens, vacab_size=vocab_size,
    )


def narrow_head(critic, hidden_size: int, sizes: tuple[int, int], seed: int) -> None:
    """Replaces the critic's MLP by one of widths `sizes` (PyTorch's default init, no biases)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    critic.v_head_mlp1 = nn.Linear(hidden_size, sizes[0], bias=False)
    critic.v_head_mlp2 = nn.Linear(sizes[0], sizes[1], bias=False)
    critic.v_head_mlp3 = nn.Linear(sizes[1], 1, bias=False)


def lora_modules(actor) -> dict[tuple[int, str], tuple]:
    """{(layer, "q_proj" | "v_proj"): (lora_A Linear, lora_B Linear)} of the peft actor."""
    found = {}
    for name, module in actor.named_modules():
        if name.endswith(("q_proj", "v_proj")) and hasattr(module, "lora_A"):
            layer = int(name.split("layers.")[1].split(".")[0])
            found[(layer, name.rsplit(".", 1)[1])] = (module.lora_A["default"], module.lora_B["default"])
    return found


def head_linears(critic) -> list:
    return [critic.v_head_mlp1, critic.v_head_mlp2, critic.v_head_mlp3]


def ours(agent, read) -> dict[str, np.ndarray]:
    """LoRA and head tensors in poad_jax's layout: A `[L, in, r]`, B `[L, r, out]`, head kernels `[in, out]`.

    `read(parameter) -> tensor` picks what to read (the weight, or its gradient)."""
    loras = lora_modules(agent.actor)
    layers = 1 + max(layer for layer, _ in loras)

    def host(parameter):  # a parameter without a gradient reads as zeros
        value = read(parameter)
        return np.zeros(tuple(parameter.shape), np.float32).T if value is None else _numpy(value).T

    out = {}
    for target in ("q_proj", "v_proj"):
        out[f"lora_a/{target}"] = np.stack([host(loras[(i, target)][0].weight) for i in range(layers)])
        out[f"lora_b/{target}"] = np.stack([host(loras[(i, target)][1].weight) for i in range(layers)])
    for i, linear in enumerate(head_linears(agent.critic)):
        out[f"head/{i}"] = host(linear.weight)
    return out


def _numpy(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().astype(np.float32)


def observation(case: Case, step: int, thread: int) -> str:
    templates = OBSERVATIONS + (SHORT_OBSERVATIONS if case.varied_lengths else ())
    return templates[(3 * thread + step) % len(templates)].format(t=step % 10)


def available_actions(step: int, thread: int) -> list[str]:
    count = 3 + (step + thread) % 3
    start = (2 * step + thread) % len(ACTIONS)
    return [ACTIONS[(start + k) % len(ACTIONS)] for k in range(count)]


def joint_tokens(agent, obs: str, action: str) -> tuple[list[int], list[int]]:
    """(prompt, action) token ids as the authors' agent tokenizes `obs + " " + action` (BOS included)."""
    ids = agent.tokenizer([obs + " " + action])["input_ids"][0]
    action_len = len(agent.tokenizer([action])["input_ids"][0]) - 1  # their count: without BOS
    return list(ids[:-action_len]), list(ids[-action_len:])


class Recorder:
    """Hooks on the trainer that record every minibatch: losses, KL, skip, gradients before clipping."""

    def __init__(self, trainer, agent, token_level: bool):
        import torch

        self.minibatches: list[dict] = []
        self.agent, self.trainer, self.token_level = agent, trainer, token_level
        self.permutations: list[np.ndarray] = []
        actor_params = {id(p) for p in agent.actor.parameters() if p.requires_grad}
        real_clip = torch.nn.utils.clip_grad_norm_
        real_update = trainer.ppo_update
        real_policy_loss = trainer.cal_policy_loss
        real_value_loss = trainer.cal_value_loss
        real_zero_grad = trainer.policy_optimizer.zero_grad
        real_shuffle = np.random.shuffle
        current = {}

        def clip(parameters, max_norm, *args, **kwargs):
            parameters = list(parameters)
            is_actor = any(id(p) in actor_params and p.grad is not None for p in parameters)
            key = "actor_grads" if is_actor else "critic_grads"
            current[key] = ours(agent, lambda p: p.grad)
            norm = real_clip(parameters, max_norm, *args, **kwargs)
            current[key.replace("grads", "grad_norm")] = float(norm)
            return norm

        def zero_grad(*args, **kwargs):
            # A KL skip zeroes the actor's gradients without clipping them: record them here.
            grads = [p.grad for p in agent.actor.parameters() if p.requires_grad and p.grad is not None]
            if current.get("in_update") and grads and "actor_grads" not in current:
                current["actor_grads"] = ours(agent, lambda p: p.grad)
                current["skipped"] = True
            return real_zero_grad(*args, **kwargs)

        def policy_loss(*args):
            result = real_policy_loss(*args)
            entropy = args[3]
            if self.token_level:
                loss, kl, entropy_mean = result
                mask = args[4]
                entropy_mean = float((entropy * mask).sum() / mask.sum())
            else:
                loss, kl = result
                entropy_mean = float(entropy.mean())
            current.setdefault("chunks", []).append((float(loss), float(kl), entropy_mean))
            current.setdefault("chunk_advantages", []).append(_numpy(args[2]))
            return result

        def value_loss(*args):
            result = real_value_loss(*args)
            current["value_loss"] = float(result) / trainer.value_loss_coef
            return result

        def update(sample):
            current.clear()
            current["in_update"] = True
            result = real_update(sample)
            current["in_update"] = False
            current.setdefault("skipped", False)
            self.minibatches.append(dict(current))
            return result

        def shuffle(array):
            real_shuffle(array)
            self.permutations.append(np.array(array))

        torch.nn.utils.clip_grad_norm_ = clip
        trainer.policy_optimizer.zero_grad = zero_grad
        trainer.cal_policy_loss = policy_loss
        trainer.cal_value_loss = value_loss
        trainer.ppo_update = update
        np.random.shuffle = shuffle


def run_case(case: Case, adrl: dict, model_dir: pathlib.Path, head_sizes: tuple[int, int], seed: int) -> dict:
    """One case: the rollout through the authors' agent, the buffer's GAE, one `trainer.train`
    (its wall time is stored as `seconds_update`, the Recorder's gradient copies included)."""
    import time

    import torch

    token_level = case.algo != "TWOSOME"
    max_new_tokens = 10
    torch.manual_seed(seed)
    np.random.seed(seed)
    agent = adrl["llama_lora_agent"].LlamaLoRAgent(str(model_dir), max_new_tokens, case.algo)
    hidden = agent.base_model.config.hidden_size
    narrow_head(agent.critic, hidden, head_sizes, seed + 1)
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():  # LoRA B = 0 would leave A's gradient 0: start from a random adapter
        for _, lora_b in lora_modules(agent.actor).values():
            lora_b.weight.copy_(0.05 * torch.randn(lora_b.weight.shape, generator=generator))
    args = adrl_args(case, max_new_tokens, agent.base_model.config.vocab_size)
    buffer = adrl["language_buffer"].LanguageBuffer(args, 1, agent.tokenizer.pad_token_id)
    T, B = case.steps, case.threads
    obs = np.array([[observation(case, t, b) for b in range(B)] for t in range(T + 1)], dtype=object)
    ava = np.array([[",".join(available_actions(t, b)) for b in range(B)] for t in range(T + 1)], dtype=object)
    if not case.varied_lengths:  # TWOSOME's critic reads the last (padded) column: one length for all
        lengths = {len(agent.tokenizer([o])["input_ids"][0]) for o in obs.ravel()}
        assert len(lengths) == 1, f"observations of one length expected, got lengths {sorted(lengths)}"
    buffer.obs[0, :, :, 0] = obs
    buffer.available_actions[0, :, :, 0] = ava
    done = np.zeros((T, B), bool)
    for t, b in case.done_at:
        done[t, b] = True
    rewards = done.astype(np.float32)
    torch.manual_seed(seed + 3)
    for t in range(T):
        actions, action_tokens, values, log_probs = agent.infer_for_rollout(obs[t], ava[t])
        buffer.actions[0, t, :, 0] = actions
        buffer.action_tokens[0, t, :, 0] = action_tokens
        buffer.rewards[0, t, :, 0] = rewards[t]
        buffer.masks[0, t + 1, :, 0] = 1.0 - done[t]
        if token_level:
            buffer.tppo_values[0, t, :, 0] = values
            buffer.tppo_log_probs[0, t, :, 0] = log_probs
        else:
            buffer.action_level_v_values[0, t, :, 0] = values
            buffer.action_level_log_probs[0, t, :, 0] = log_probs
    for t, b in case.zero_advantage_at:  # V = r on every token of a done step: its advantages are exactly 0
        assert done[t, b] and token_level
        buffer.tppo_values[0, t, b, 0, :] = np.where(buffer.action_tokens[0, t, b, 0] != 0, rewards[t, b], 0.0)
    for t, b in case.kl_rows:
        if token_level:
            row = buffer.tppo_log_probs[0, t, b, 0]
            buffer.tppo_log_probs[0, t, b, 0] = np.where(buffer.action_tokens[0, t, b, 0] != 0, row - case.kl_shift, 0.0)
        else:
            buffer.action_level_log_probs[0, t, b, 0] -= case.kl_shift
    next_values = agent.get_next_values(obs[T]).reshape(B, 1)
    if token_level:
        buffer.batch_process_tppo(next_values)
    else:
        buffer.batch_process_appo(next_values)
    if case.near_gap:
        set_near_pair(case, buffer, next_values, seed + 4)

    initial = ours(agent, lambda p: p)
    trainer_cls = adrl["llm_trainer_tppo"].TPPOTrainer if token_level else adrl["llm_trainer_appo"].APPOTrainer
    trainer = trainer_cls(args, agent, 1)
    recorder = Recorder(trainer, agent, token_level)
    np.random.seed(seed + 4)
    start = time.perf_counter()
    trainer.train(buffer)
    seconds = time.perf_counter() - start
    if case.near_gap:
        assert np.array_equal(recorder.permutations[0], first_permutation(case, seed + 4)), "order not as predicted"
    final = ours(agent, lambda p: p)
    packed = pack_case(case, agent, buffer, recorder, initial, final, next_values[:, 0], head_sizes, max_new_tokens)
    packed["seconds_update"] = np.array(seconds)
    packed["torch_threads"] = np.array(torch.get_num_threads())
    return packed


def first_permutation(case: Case, seed: int) -> np.ndarray:
    """The row order (ADRL's step-major flat index) the trainer's first epoch draws after `np.random.seed(seed)`."""
    order = np.arange(case.steps * case.threads)
    np.random.RandomState(seed).shuffle(order)
    return order


def set_near_pair(case: Case, buffer, next_values, shuffle_seed: int) -> None:
    """Moves the old value of the first epoch's first loss chunk's second row until its advantage (their
    buffer's GAE) is `case.near_gap` from the first row's; the GAE is redone by their buffer each time."""
    chunk = case.steps * case.threads // case.minibatches // case.cp_steps
    assert case.algo == "TWOSOME" and chunk == 2, "a near pair needs TWOSOME and loss chunks of two rows"
    first, second = (divmod(int(i), case.threads) for i in first_permutation(case, shuffle_seed)[:2])
    values = buffer.action_level_v_values[0, :, :, 0]
    advantages = buffer.action_level_advantages[0, :, :, 0]
    for _ in range(50):  # the second row's value also moves the first's advantage when it follows it
        miss = np.float32(advantages[second] - advantages[first] - np.float32(case.near_gap))
        if miss == 0:
            break
        values[second] += miss
        buffer.batch_process_appo(next_values)
    print(f"{case.name}: rows {first}, {second} (step, thread) of the first chunk have advantages "
          f"{advantages[first]:.9g}, {advantages[second]:.9g}")


def pack_case(case, agent, buffer, recorder, initial, final, bootstrap, head_sizes, max_new_tokens) -> dict:
    """The case's arrays in poad_jax's row order (thread-major: row = thread * steps + step)."""
    token_level = case.algo != "TWOSOME"
    T, B = case.steps, case.threads
    rows = [(t, b) for b in range(B) for t in range(T)]
    ours_row = {t * B + b: b * T + t for t, b in rows}  # ADRL's flat index (step-major) -> ours
    out: dict[str, np.ndarray] = {}
    prompts, actions, candidates, texts, chosen = [], [], [], [], []
    for t, b in rows:
        action = buffer.actions[0, t, b, 0]
        prompt, action_ids = joint_tokens(agent, buffer.obs[0, t, b, 0], action)
        assert action_ids == [i for i in buffer.action_tokens[0, t, b, 0] if i != 0], (t, b)
        prompts.append(prompt)
        actions.append(action_ids)
        offered = buffer.available_actions[0, t, b, 0].split(",")
        row_candidates = []
        for text in offered:
            candidate_prompt, candidate_ids = joint_tokens(agent, buffer.obs[0, t, b, 0], text)
            assert candidate_prompt == prompt, "the prompt must tokenize alike before every candidate"
            row_candidates.append(candidate_ids)
        candidates.append(row_candidates)
        texts.append(offered)
        chosen.append(offered.index(action))
    out["prompts"] = _ragged(prompts)
    out["actions"] = _ragged(actions)
    width = max(len(c) for row in candidates for c in row)
    count = max(len(row) for row in candidates)
    cand = np.full((len(rows), count, width), -1, np.int64)
    for n, row in enumerate(candidates):
        for k, ids in enumerate(row):
            cand[n, k, : len(ids)] = ids
    out["candidates"] = cand
    out["candidate_texts"] = np.array(json.dumps(texts))
    out["chosen"] = np.array(chosen, np.int32)
    out["rewards"] = np.array([buffer.rewards[0, t, b, 0] for t, b in rows], np.float32)
    out["dones"] = np.array([buffer.masks[0, t + 1, b, 0] == 0 for t, b in rows])
    out["bootstrap_value"] = np.asarray(bootstrap, np.float32)
    if token_level:
        pick = lambda array: np.stack([array[0, t, b, 0] for t, b in rows]).astype(np.float32)
        out["old_logprobs"], out["old_values"] = pick(buffer.tppo_log_probs), pick(buffer.tppo_values)
        out["advantages"], out["returns"] = pick(buffer.tppo_advantages), pick(buffer.tppo_returns)
    else:
        pick = lambda array: np.array([array[0, t, b, 0] for t, b in rows], np.float32)
        out["old_logprobs"], out["old_values"] = pick(buffer.action_level_log_probs), pick(buffer.action_level_v_values)
        out["advantages"], out["returns"] = pick(buffer.action_level_advantages), pick(buffer.action_level_returns)
    assert len(recorder.permutations) == case.epochs
    size = B * T // case.minibatches
    out["orders"] = np.array([[[ours_row[int(i)] for i in perm[m * size:(m + 1) * size]]
                               for m in range(case.minibatches)] for perm in recorder.permutations], np.int32)
    mbs = recorder.minibatches
    assert len(mbs) == case.epochs * case.minibatches
    grid = lambda values: np.array(values, np.float64).reshape(case.epochs, case.minibatches)
    out["policy_objective"] = grid([np.mean([c[0] for c in m["chunks"]]) for m in mbs])
    out["approx_kl"] = grid([np.mean([c[1] for c in m["chunks"]]) for m in mbs])
    out["entropy"] = grid([np.mean([c[2] for c in m["chunks"]]) for m in mbs])
    out["value_loss"] = grid([m["value_loss"] for m in mbs])
    # The normalised advantages their policy loss received, chunks joined: rows as in `orders`.
    seen = np.stack([np.concatenate(m["chunk_advantages"]) for m in mbs])  # [E * M, size, agents (, tokens)]
    out["policy_advantages"] = seen.reshape(case.epochs, case.minibatches, size, *seen.shape[3:])
    out["skipped"] = grid([m["skipped"] for m in mbs]).astype(bool)
    out["actor_grad_norm"] = grid([np.sqrt(sum(np.sum(np.square(v)) for k, v in m["actor_grads"].items()
                                               if k.startswith("lora"))) for m in mbs])
    out["critic_grad_norm"] = grid([m["critic_grad_norm"] for m in mbs])
    for key in initial:
        out[f"initial/{key}"] = initial[key]
        out[f"delta/{key}"] = final[key] - initial[key]
        source = "actor_grads" if key.startswith("lora") else "critic_grads"
        out[f"grads/{key}"] = np.stack([m[source][key] for m in mbs]).reshape(
            case.epochs, case.minibatches, *initial[key].shape)
    meta = dict(
        method=case.algo.lower(), epochs=case.epochs, num_minibatches=case.minibatches, loss_chunks=case.cp_steps,
        ent_coef=case.entropy_coef, actor_lr=case.lr, critic_lr=case.critic_lr, max_grad_norm=case.max_grad_norm,
        gamma=0.95, lam=0.95, clip_eps=0.2, value_clip_eps=0.2, vf_coef=0.5, target_kl=0.02, adam_eps=1e-5,
        gamma_w=0.95 if case.algo == "NTPO" else 1.0, threads=B, steps=T, head_sizes=list(head_sizes),
        lora_rank=8, lora_alpha=16.0, lora_targets=["q_proj", "v_proj"], max_new_tokens=max_new_tokens,
        twosome_normalization="word", zero_advantage_at=case.zero_advantage_at, kl_rows=case.kl_rows,
    )
    out["meta"] = np.array(json.dumps(meta))
    return out


def _ragged(lists: list[list[int]]) -> np.ndarray:
    width = max(len(x) for x in lists)
    array = np.full((len(lists), width), -1, np.int64)
    for n, ids in enumerate(lists):
        array[n, : len(ids)] = ids
    return array


def model_arrays(model_dir: pathlib.Path) -> dict[str, np.ndarray]:
    """The base model's config and tensors (HF names), for a self-contained case file."""
    from safetensors.numpy import load_file

    out = {"model/config_json": np.array((model_dir / "config.json").read_text())}
    for path in sorted(model_dir.glob("*.safetensors")):
        for name, value in load_file(str(path)).items():
            out[f"model/{name}"] = value.astype(np.float32)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adrl", required=True, type=pathlib.Path, help="ADRL checkout (the folder holding mappo/)")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--model", type=pathlib.Path, help="HF model directory (default: a tiny random LLaMA)")
    parser.add_argument("--head-sizes", default="64,32", help="the critic head's two widths (ADRL: 1024,512)")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--near-sweep", type=int, default=0, metavar="N",
                        help="instead of the committed cases, N TWOSOME cases whose first loss chunk holds two "
                             "nearly equal advantages (gaps 1.5e-6 to 4e-5)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: the committed cases; the update's time is recorded either way)")
    args = parser.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    adrl = load_adrl(args.adrl.resolve())
    head_sizes = tuple(int(x) for x in args.head_sizes.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            model_dir = pathlib.Path(tmp) / "tiny"
            write_tiny_model(model_dir, args.seed)
            arrays = model_arrays(model_dir)
        else:
            model_dir = args.model.resolve()
            arrays = {"model/directory": np.array(str(model_dir))}
        arrays["versions"] = np.array(json.dumps({"adrl": ADRL_COMMIT, "torch": torch.__version__,
                                                  "transformers": transformers.__version__}))
        cases = near_sweep(args.near_sweep) if args.near_sweep else CASES
        wanted = [case.name for case in cases] if args.near_sweep else args.cases.split(",")
        for case in cases:
            if case.name not in wanted:
                continue
            result = run_case(case, adrl, model_dir, head_sizes, args.seed)
            arrays.update({f"{case.name}/{key}": value for key, value in result.items()})
            print(f"{case.name}: skipped {result['skipped'].astype(int).tolist()}, "
                  f"actor grad norm {np.round(result['actor_grad_norm'], 4).tolist()}, "
                  f"critic grad norm {np.round(result['critic_grad_norm'], 4).tolist()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

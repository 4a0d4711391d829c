"""The PyTorch + PEFT side of `bench train_step`: the same PPO step as `poad_jax.agent.learner`.

Only the benchmarks import this module (torch and peft are the `bench`
extra).  The step mirrors one POAD update of the learner with one epoch and
one minibatch:

- advantages: token-level GAE over each thread's stream of action tokens
  with POAD's discounts (1 inside an action, gamma (1 - done) at its end),
  normalised over the valid tokens;
- actor: the base model with LoRA on q_proj/v_proj (PEFT), final hidden
  states sliced to the action-predicting columns, logits only there,
  log-probs and full-vocabulary entropy of softmax(logits / temperature);
- critic: the MLP head (hidden -> 1024 -> 512 -> 1, ReLU) on the
  precomputed frozen-base features;
- loss: clipped policy loss + vf_coef x clipped value loss - ent_coef x
  entropy (token means); the update is skipped when approx KL > target_kl;
  each optimiser clips its gradients to a global norm of max_grad_norm and
  takes one Adam(eps) step.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn


def critic_head(hidden_size: int, sizes=(1024, 512)) -> nn.Module:
    dims = (hidden_size, *sizes)
    layers: list[nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(dims[-1], 1))
    return nn.Sequential(*layers)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


@torch.no_grad()
def poad_gae(rewards, dones, values, valid, bootstrap, num_threads, gamma, lam):
    """Token-level GAE with POAD discounts; rows `[N, A]`, N = threads x steps."""
    lengths = valid.sum(-1)
    action_end = torch.arange(valid.shape[1])[None, :] == (lengths[:, None] - 1)
    stream = lambda x: x.reshape(num_threads, -1)
    r = stream(torch.where(action_end, rewards[:, None], 0.0))
    done = stream(action_end & dones[:, None])
    end = stream(action_end)
    v, ok = stream(values), stream(valid)
    discount = torch.where(end, gamma * (1.0 - done.float()), torch.ones_like(r))
    advantages = torch.zeros_like(r)
    gae = torch.zeros(num_threads)
    next_value = bootstrap.clone()
    for j in range(r.shape[1] - 1, -1, -1):
        delta = r[:, j] + discount[:, j] * next_value - v[:, j]
        new_gae = delta + discount[:, j] * lam * gae
        gae = torch.where(ok[:, j], new_gae, gae)
        next_value = torch.where(ok[:, j], v[:, j], next_value)
        advantages[:, j] = torch.where(ok[:, j], new_gae, 0.0)
    returns = advantages + v
    return advantages.reshape(values.shape), returns.reshape(values.shape)


class TorchPPOStep:
    """Holds the PEFT actor, the critic head and both Adam optimisers."""

    def __init__(self, directory: str, head_sizes=(1024, 512), *, lora_rank=8, lora_alpha=16.0,
                 targets=("q_proj", "v_proj"), actor_lr=1e-6, critic_lr=5e-5, adam_eps=1e-5,
                 gamma=0.95, lam=0.95, clip_eps=0.2, value_clip_eps=0.2, vf_coef=0.5,
                 ent_coef=0.01, max_grad_norm=0.5, target_kl=0.02, temperature=1.0, autocast_dtype=None):
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        base = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
        lora = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=list(targets), lora_dropout=0.0,
                          bias="none")
        self.model = get_peft_model(base, lora)
        self.model.train()
        self.head = critic_head(base.config.hidden_size, head_sizes)
        self.actor_params = [p for p in self.model.parameters() if p.requires_grad]
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=actor_lr, eps=adam_eps)
        self.critic_opt = torch.optim.Adam(self.head.parameters(), lr=critic_lr, eps=adam_eps)
        self.autocast_dtype = autocast_dtype  # e.g. torch.bfloat16: the forward under CPU autocast
        self.hp = dict(gamma=gamma, lam=lam, clip_eps=clip_eps, value_clip_eps=value_clip_eps, vf_coef=vf_coef,
                       ent_coef=ent_coef, max_grad_norm=max_grad_norm, target_kl=target_kl,
                       temperature=temperature)

    def _decoder(self):
        return self.model.base_model.model  # LlamaForCausalLM with LoRA layers injected

    def action_logprobs(self, tokens, positions, prompt_len):
        """(logprobs [N, A], entropy [N, A]) over the action columns, logits only there."""
        causal_lm = self._decoder()
        hidden = causal_lm.model(input_ids=tokens, position_ids=positions).last_hidden_state
        action_len = tokens.shape[1] - prompt_len
        window = hidden[:, prompt_len - 1 : prompt_len - 1 + action_len]
        logits = causal_lm.lm_head(window).float() / self.hp["temperature"]
        logp = torch.log_softmax(logits, -1)
        logprobs = logp.gather(-1, tokens[:, prompt_len:, None])[..., 0]
        entropy = -(logp.exp() * logp).sum(-1)
        return logprobs, entropy

    def step(self, batch: dict, num_threads: int) -> dict:
        """One PPO update on `batch`; returns phase timings (seconds) and stats."""
        hp = self.hp
        t0 = time.perf_counter()
        mask = batch["action_mask"]
        advantages, returns = poad_gae(
            batch["rewards"], batch["dones"], batch["old_values"], mask, batch["bootstrap_value"],
            num_threads, hp["gamma"], hp["lam"],
        )
        mean = masked_mean(advantages, mask)
        std = masked_mean((advantages - mean) ** 2, mask).sqrt()
        advantages = torch.where(mask, (advantages - mean) / (std + 1e-8), 0.0)

        if self.autocast_dtype is None:
            autocast = contextlib.nullcontext()
        else:
            autocast = torch.autocast("cpu", dtype=self.autocast_dtype)
        with autocast:
            logprobs, entropy = self.action_logprobs(batch["tokens"], batch["positions"], batch["prompt_len"])
        values = self.head(batch["features"])[..., 0]
        old_logprobs, old_values = batch["old_logprobs"], batch["old_values"]
        ratio = torch.exp(logprobs - old_logprobs)
        policy_loss = masked_mean(
            -torch.minimum(ratio * advantages, ratio.clamp(1 - hp["clip_eps"], 1 + hp["clip_eps"]) * advantages), mask
        )
        clipped = old_values + (values - old_values).clamp(-hp["value_clip_eps"], hp["value_clip_eps"])
        value_loss = 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)
        entropy_mean = masked_mean(entropy, mask)
        loss = policy_loss + hp["vf_coef"] * value_loss - hp["ent_coef"] * entropy_mean
        log_ratio = (logprobs - old_logprobs).detach()
        approx_kl = masked_mean(log_ratio.exp() - 1.0 - log_ratio, mask)
        t1 = time.perf_counter()

        self.actor_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()

        skipped = bool(approx_kl > hp["target_kl"])
        if not skipped:
            torch.nn.utils.clip_grad_norm_(self.actor_params, hp["max_grad_norm"])
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), hp["max_grad_norm"])
            self.actor_opt.step()
            self.critic_opt.step()
        t3 = time.perf_counter()
        return {
            "forward_s": t1 - t0,
            "backward_s": t2 - t1,
            "optimizer_s": t3 - t2,
            "loss": float(loss),
            "approx_kl": float(approx_kl),
            "skipped": skipped,
        }

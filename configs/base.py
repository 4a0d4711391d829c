"""Defaults shared by every task (the paper's PPO hyper-parameters, DESIGN.md §5).

Task configs (datasci.py, overcooked.py, virtualhome.py) start from
`get_config()` here and override what differs.  Every field can be set on
the command line: `--config.method=ntpo --config.ppo.actor_lr=1e-6`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.name = "base"
    config.method = "poad"  # poad | ntpo | twosome
    config.gamma_w = -1.0  # NTPO's intra-action discount; < 0 means gamma (NTPO) / 1 (POAD)
    config.seed = 0
    # Model: a name (smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct, tiny-random),
    # a Hugging Face directory, or a .gguf file.
    config.model = "smollm2-135m-instruct"
    config.dtype = "float32"  # float32 on CPU; bfloat16 on GPU
    # Matmul operands: "float32" (matmuls in `dtype`, exact) or "bfloat16"
    # (bfloat16 base weights and operands, float32 accumulation: 1.7x the
    # learner's and 1.3x the sampler's speed on CPUs with AMX/AVX-512-BF16).
    config.matmul_dtype = "float32"
    config.remat = "full"  # full | dots | none: what the layer scan keeps for backward
    config.lora = ml_collections.ConfigDict(dict(rank=8, alpha=16.0, targets=("q_proj", "v_proj")))

    config.env = ml_collections.ConfigDict()
    config.env.name = "toy/decisive_token"
    config.env.kwargs = ml_collections.ConfigDict()
    config.env.vector_mode = "inline"  # inline | threads | processes

    config.num_threads = 4
    config.rollout_length = 32
    config.total_env_steps = 40_000

    config.prompt_format = "raw"  # chat | raw
    config.system_prompt = ""
    config.max_prompt_tokens = 1024
    config.restricted_sampling = "trie"  # trie | action_scores (the paper code's way)
    config.twosome_normalization = "token"  # token | word

    config.sampling = ml_collections.ConfigDict(
        dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=128)
    )

    config.ppo = ml_collections.ConfigDict(
        dict(
            gamma=0.99,
            lam=0.95,
            clip_eps=0.2,
            value_clip_eps=0.2,
            vf_coef=0.5,
            ent_coef=0.01,
            max_grad_norm=0.5,
            target_kl=0.02,
            epochs=1,
            num_minibatches=4,
            accumulation_steps=1,
            actor_lr=5e-7,
            critic_lr=1e-5,
            adam_eps=1e-5,
            normalize_advantages=True,
        )
    )
    config.critic = ml_collections.ConfigDict(
        dict(kind="head", hidden_sizes=(1024, 512), target_update_every=0)
    )

    config.checkpoint_every = 1  # updates between checkpoints
    config.keep_checkpoints = 2
    config.tensorboard = True
    config.plot = True
    return config

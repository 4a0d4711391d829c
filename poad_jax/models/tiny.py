"""A tiny random-weight model with a word-level tokenizer, for tests and smoke runs.

`load("tiny-random")` gives a 2-layer LLaMA over a small vocabulary: fast to
compile and to train on CPU, so the whole pipeline (sampler, rollout,
learner, checkpoints) can be exercised in seconds.  The tokenizer maps each
word (and punctuation mark) to one token, with a leading-space marker so that
`decode(encode(" a b")) == " a b"`.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
from flax import nnx

from poad_jax.models.llama import Llama, LlamaConfig, LoraConfig

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<user>", "<assistant>")
BASE_WORDS = (
    "walk to the red blue green door you are in a hall with doors step your next is "
    "1 2 3 4 5 6 7 8 9 0 . , : ; ( ) = _ def return import from model x y train "
    "pick up put open close turn on off go heat microwave pancake kitchen"
).split()


class WordTokenizer:
    """Word-level tokenizer with the project's Tokenizer interface."""

    def __init__(self, words: tuple[str, ...] = tuple(BASE_WORDS)):
        vocab = list(SPECIAL_TOKENS)
        for word in words:
            for piece in (word, " " + word):
                if piece not in vocab:
                    vocab.append(piece)
        self.vocab = vocab
        self.index = {piece: i for i, piece in enumerate(vocab)}
        self.pad_token_id = self.index["<pad>"]
        self.eos_token_ids = (self.index["<eos>"],)
        self.bos_token_id = None
        self.unk_token_id = self.index["<unk>"]
        self.vocab_size = len(vocab)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        del add_special_tokens
        pieces = re.findall(r" ?[A-Za-z0-9_]+| ?[^\sA-Za-z0-9_]|<[a-z]+>", text)
        return [self.index.get(piece, self.index.get(piece.strip(), self.unk_token_id)) for piece in pieces]

    def unknown_words(self, text: str) -> list[str]:
        """The words of `text` outside the vocabulary (each encodes as `<unk>`), in order, once each."""
        pieces = re.findall(r" ?[A-Za-z0-9_]+| ?[^\sA-Za-z0-9_]|<[a-z]+>", text)
        unknown = [p.strip() for p in pieces if p not in self.index and p.strip() not in self.index]
        return list(dict.fromkeys(unknown))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        pieces = []
        for i in ids:
            piece = self.vocab[int(i)]
            if skip_special_tokens and piece in SPECIAL_TOKENS:
                continue
            pieces.append(piece)
        return "".join(pieces)

    def render_chat(self, messages, add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role'] if m['role'] == 'user' else 'assistant'}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))


def tiny_random_model(
    seed: int = 0,
    lora: LoraConfig | None = LoraConfig(),
    hidden_size: int = 32,
    num_layers: int = 2,
    dtype=jnp.float32,
    embedding_std: float = 0.5,
    matmul_dtype=None,
    remat: str = "full",
) -> tuple[Llama, WordTokenizer]:
    """A random 2-layer LLaMA (GQA 4/2 heads) over the word tokenizer's vocabulary."""
    tokenizer = WordTokenizer()
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_ids[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Llama(config, lora=lora, dtype=dtype, matmul_dtype=matmul_dtype, remat=remat, rngs=nnx.Rngs(seed))
    # With tied embeddings the logits are bounded by |RMSNorm(h)| |e_v| =
    # sqrt(H) |e_v|; the default 0.02 init would cap every log-odds near 1, so
    # a tiny model gets embeddings of std `embedding_std` instead.
    model.embed[...] = (model.embed[...] * (embedding_std / 0.02)).astype(model.embed[...].dtype)
    return model, tokenizer

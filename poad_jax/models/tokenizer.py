"""Text <-> token ids and chat rendering, on the `tokenizers` library (no torch).

A `Tokenizer` wraps a `tokenizers.Tokenizer` (BPE model, pre-tokenizer,
decoder, special tokens) plus what `tokenizer.json` does not hold: the chat
template and the token ids that end a turn.  It is built either from a
Hugging Face directory (`Tokenizer.from_directory`) or from GGUF metadata
(`poad_jax.models.gguf_convert.tokenizer_from_gguf`), and saved back as a
Hugging Face directory (`tokenizer.json` + `tokenizer_config.json`).

The chat template is rendered the way transformers renders it: a sandboxed
jinja2 environment with `trim_blocks`, `lstrip_blocks`, the `loopcontrols`
extension, a `tojson` filter, `raise_exception` and `strftime_now`; the
template sees `messages`, `add_generation_prompt` and the special token
strings (`bos_token`, `eos_token`, ...).  The rendered text is encoded without
adding special tokens (the template writes them itself).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import tokenizers

from poad_jax.models.errors import ModelLoadError

# Tokens that end a turn or a document in the model families we load.  A
# generation stops at any of them (plus whatever eos the checkpoint declares).
TURN_END_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
)

_SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


def _token_text(value: Any) -> str | None:
    """A special token as written in `tokenizer_config.json` (a string or an AddedToken dict)."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _compile_chat_template(template: str):
    """A jinja2 template compiled in transformers' sandboxed environment."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as error:  # pragma: no cover - jinja2 ships with the dependencies
        raise ModelLoadError("chat templates need jinja2: pip install jinja2") from error

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format_string):
        return datetime.datetime.now().strftime(format_string)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    return environment.from_string(template)


class Tokenizer:
    """Byte-level BPE tokenizer with chat template and end-of-turn ids.

    Attributes:
      eos_token_ids: every id that ends a turn or a sequence (the first is the
        primary end token, e.g. `<|im_end|>`).
      pad_token_id: id used to pad batches (never attended to).
      bos_token_id: id prepended by `encode(..., add_special_tokens=True)` when
        the checkpoint asks for one, else the declared bos id or None.
      vocab_size: number of ids the tokenizer knows (added tokens included);
        the model's embedding may be larger (padding rows), never smaller.
      chat_template: the jinja2 source, or None.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        chat_template: str | None,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        bos_token_id: int | None,
        special_tokens: dict[str, str | None] | None = None,
    ):
        if not eos_token_ids:
            raise ValueError("a tokenizer needs at least one end-of-sequence id")
        self.backend = backend
        self.chat_template = chat_template
        self.eos_token_ids = tuple(int(i) for i in dict.fromkeys(eos_token_ids))
        self.pad_token_id = int(pad_token_id)
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.special_tokens = dict(special_tokens or {})
        self._compiled_template = None

    # -- text <-> ids --------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token strings in the text map to their ids.

        `add_special_tokens=True` applies the checkpoint's post-processor (e.g.
        a BOS prefix where the checkpoint declares one).
        """
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids` (bytes joined before UTF-8 decoding, as transformers does)."""
        ids = [int(i) for i in ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string, or None."""
        return self.backend.token_to_id(token)

    # -- chat ----------------------------------------------------------------

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat template rendered over `messages` (`[{"role", "content"}, ...]`)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._compiled_template is None:
            self._compiled_template = _compile_chat_template(self.chat_template)
        context = {name: token for name, token in self.special_tokens.items() if token is not None}
        return self._compiled_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **context
        )

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of `render_chat(messages)`, encoded without added special tokens."""
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)

    # -- persistence ---------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> None:
        """Writes `tokenizer.json` and `tokenizer_config.json` into `directory`.

        `tokenizer_config.json` holds the chat template, the special token
        strings and (our key) `eos_token_ids`, so `from_directory` restores
        this tokenizer exactly.
        """
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        config = {name: token for name, token in self.special_tokens.items() if token is not None}
        config.update(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": self.chat_template,
                "eos_token_ids": list(self.eos_token_ids),
                "pad_token_id": self.pad_token_id,
                "bos_token_id": self.bos_token_id,
            }
        )
        if self.chat_template is None:
            del config["chat_template"]
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))

    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> "Tokenizer":
        """Loads a Hugging Face tokenizer directory.

        Reads `tokenizer.json` (required), `tokenizer_config.json` (special
        tokens, chat template), `chat_template.jinja` if present, and the eos
        ids of `config.json` / `generation_config.json`.
        """
        directory = pathlib.Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"no tokenizer.json in {directory}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as error:
            raise ModelLoadError(f"corrupt tokenizer file {path}: {error}") from error
        config = _read_json(directory / "tokenizer_config.json")
        chat_template = config.get("chat_template")
        if isinstance(chat_template, list):  # [{"name": ..., "template": ...}]
            named = {entry.get("name"): entry.get("template") for entry in chat_template}
            chat_template = named.get("default", next(iter(named.values()), None))
        jinja_file = directory / "chat_template.jinja"
        if chat_template is None and jinja_file.is_file():
            chat_template = jinja_file.read_text()
        special = {name: _token_text(config.get(name)) for name in _SPECIAL_NAMES}

        def token_id(text):
            return None if text is None else backend.token_to_id(text)

        eos_ids = list(config.get("eos_token_ids") or [])
        for source in (_read_json(directory / "generation_config.json"), _read_json(directory / "config.json")):
            declared = source.get("eos_token_id")
            eos_ids += declared if isinstance(declared, list) else ([declared] if declared is not None else [])
        if token_id(special["eos_token"]) is not None:
            eos_ids.append(token_id(special["eos_token"]))
        eos_ids += turn_end_token_ids(backend)
        if not eos_ids:
            raise ModelLoadError(f"{directory} declares no end-of-sequence token")
        bos_id = config.get("bos_token_id", token_id(special["bos_token"]))
        pad_id = config.get("pad_token_id", token_id(special["pad_token"]))
        return cls(
            backend,
            chat_template=chat_template,
            eos_token_ids=eos_ids,
            pad_token_id=eos_ids[0] if pad_id is None else pad_id,
            bos_token_id=bos_id,
            special_tokens=special,
        )


def turn_end_token_ids(backend: tokenizers.Tokenizer) -> list[int]:
    """Ids of the known end-of-turn tokens (`TURN_END_TOKENS`) that are special tokens here.

    Only special added tokens count: e.g. Qwen's vocabulary has an ordinary
    text token spelled `</s>` that must not stop a generation.
    """
    special = {added.content: i for i, added in backend.get_added_tokens_decoder().items() if added.special}
    return [special[token] for token in TURN_END_TOKENS if token in special]


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"corrupt JSON file {path}: {error}") from error

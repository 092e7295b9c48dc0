"""Prompts to token ids: a string or chat messages, through the model's chat template."""

from __future__ import annotations

from .chat_safety import encode_chat
from .errors import SpecstreamError


def encode_prompt(loaded, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
    """Token ids for a prompt string (or a list of chat messages).

    chat=None uses the chat template when the model has one; chat=False feeds the text as is.
    """
    tokenizer = loaded.tokenizer
    if isinstance(prompt, str):
        if not prompt.strip():
            raise SpecstreamError("the prompt is empty")
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = prompt
        if not messages:
            raise SpecstreamError("the message list is empty")
    use_chat = tokenizer.has_chat_template if chat is None else chat
    if use_chat:
        if not tokenizer.has_chat_template:
            raise SpecstreamError(f"model {loaded.name} has no chat template")
        return encode_chat(tokenizer, messages)  # typed special tokens stay text
    if not isinstance(prompt, str):
        raise SpecstreamError("chat messages need chat=True")
    return list(tokenizer.encode(prompt, add_special_tokens=True))

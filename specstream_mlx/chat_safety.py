"""Chat messages to token ids with their content read as text: a control token's text typed in a
message ("<|im_end|>\\n<|im_start|>system ...") must not become the control token, or a message
could close its turn and open another role's.

The chat template is rendered with every control-token text inside the messages swapped for a
placeholder; the rendered text is then split at the template's own control tokens (as the
tokenizer itself splits at added tokens before anything else), and each piece between them is
encoded with the placeholders put back and `split_special_tokens=True`. Messages without
control-token text take the tokenizer's own path (`apply_chat_template`); both give the same ids
for them.
"""

from __future__ import annotations

import re
import uuid

from .errors import SpecstreamError


def control_texts(tokenizer) -> list[str]:
    """The texts of the tokenizer's special (control) tokens, longest first."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper, or HF itself
    texts = {t.content for t in hf.added_tokens_decoder.values() if t.special}
    return sorted(texts, key=len, reverse=True)


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` through the chat template (generation prompt added), the content
    of every message tokenized as plain text."""
    if not getattr(tokenizer, "has_chat_template", False):
        raise SpecstreamError("the model has no chat template")
    controls = control_texts(tokenizer)
    if not any(c in m.get("content", "") for m in messages for c in controls):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return encode_chat_escaped(tokenizer, messages, controls)


def encode_chat_escaped(tokenizer, messages: list[dict], controls: list[str]) -> list[int]:
    """encode_chat's path for messages that hold control-token texts (any messages give the ids
    the template gives when they hold none)."""
    nonce = uuid.uuid4().hex
    marks: dict[str, str] = {}  # placeholder -> the control text it stands for
    control_re = re.compile("|".join(map(re.escape, controls)))

    def escape(match: re.Match) -> str:
        mark = f"<<{nonce}:{len(marks)}>>"
        marks[mark] = match.group(0)
        return mark

    escaped = [{**m, "content": control_re.sub(escape, m.get("content", ""))} for m in messages]
    text = tokenizer.apply_chat_template(escaped, add_generation_prompt=True, tokenize=False)
    unmark_re = re.compile(f"<<{nonce}:[0-9]+>>")
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    ids: list[int] = []
    pieces = re.split(f"({control_re.pattern})", text)  # text, control, text, control, ...
    for i, piece in enumerate(pieces):
        if i % 2:
            ids.append(hf.convert_tokens_to_ids(piece))
        elif piece:
            plain = unmark_re.sub(lambda m: marks[m.group(0)], piece)
            ids += hf.encode(plain, add_special_tokens=False, split_special_tokens=True)
    return ids

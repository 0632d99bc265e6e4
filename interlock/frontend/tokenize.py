"""vLLM's ``/tokenize`` and ``/detokenize`` bodies: parsed, checked and answered (pure).

``POST /tokenize`` takes ``{"model", "prompt"}`` (special tokens added as for a completion unless
``add_special_tokens`` is false) or ``{"model", "messages"}`` (rendered through the chat template
as for a chat completion, ``add_generation_prompt`` defaulting to true) and answers
``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` only when
``return_token_strs``). ``POST /detokenize`` takes ``{"model", "tokens"}`` and answers
``{"prompt"}``. Unknown fields are refused by name, as everywhere.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from interlock.errors import InvalidRequest
from interlock.frontend.limits import MAX_INT32
from interlock.frontend.schemas import ChatMessage, chat_messages_of, decode_body
from interlock.frontend.tokenizer import ModelTokenizer


class TokenizeRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    tokens: list[Annotated[int, msgspec.Meta(ge=0, le=MAX_INT32)]]


_tokenize_decoder = msgspec.json.Decoder(TokenizeRequest)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)


def parse_tokenize(body: bytes, *, max_depth: int) -> TokenizeRequest:
    req: TokenizeRequest = decode_body(_tokenize_decoder, TokenizeRequest, body, max_depth)
    if (req.prompt is None) == (req.messages is None):
        raise InvalidRequest("send exactly one of prompt and messages", param="prompt")
    if req.messages is not None and req.add_generation_prompt and req.continue_final_message:
        raise InvalidRequest(
            "continue_final_message and add_generation_prompt cannot both be true",
            param="continue_final_message",
        )
    return req


def parse_detokenize(body: bytes, *, max_depth: int) -> DetokenizeRequest:
    req: DetokenizeRequest = decode_body(_detokenize_decoder, DetokenizeRequest, body, max_depth)
    return req


def tokenize(req: TokenizeRequest, tok: ModelTokenizer, max_model_len: int) -> dict[str, Any]:
    if req.messages is not None:
        if tok.chat_template is None:
            raise InvalidRequest(f"model {req.model!r} has no chat template", param="messages")
        text = tok.chat_template.render(
            chat_messages_of(req.messages),
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            extra=req.chat_template_kwargs,
        )
        ids = tok.encode(text, add_special_tokens=bool(req.add_special_tokens))
    else:
        add = True if req.add_special_tokens is None else req.add_special_tokens
        ids = tok.encode(req.prompt or "", add_special_tokens=add)
    strs = (
        [tok.token_bytes(t).decode("utf-8", errors="replace") for t in ids] if req.return_token_strs else None
    )
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def detokenize(req: DetokenizeRequest, tok: ModelTokenizer) -> dict[str, Any]:
    if any(t >= tok.vocab_size for t in req.tokens):
        raise InvalidRequest(f"token ids must be below the vocabulary size {tok.vocab_size}", param="tokens")
    return {"prompt": tok.decode(req.tokens)}

"""OpenAI API request bodies (the fields `costline engine serve` honours) and OpenAI's error shape.

Unknown fields are accepted and ignored, as vLLM does for OpenAI fields it does not implement;
a field it does implement with a bad value is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = Field(None, validate_default=True)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=1)  # one choice per request (what load generators send)
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        # a batch of prompts (a list of strings or of id lists) with one element is that prompt
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("give one prompt per request (a list of prompts is not served)")
            return v[0]
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: the text ones, in order
            return " ".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens


ErrorType = Literal["BadRequestError", "NotFoundError", "ServiceUnavailableError", "InternalServerError"]


def error_body(message: str, err_type: ErrorType, code: int, param: str | None = None) -> dict:
    """OpenAI's error object, as vLLM returns it (`{"error": {message, type, param, code}}`)."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}

"""Pydantic request/response schemas: the admin families and the OpenAI request bodies."""

from gateway.schemas.admin import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPublic,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
    UsagePublic,
)
from gateway.schemas.openai import ChatCompletionRequest, ChatMessage, CompletionRequest, StreamOptions

__all__ = [
    "ApiKeyCreate",
    "ApiKeyCreated",
    "ApiKeyPublic",
    "ApiKeysPublic",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "StreamOptions",
    "TenantCreate",
    "TenantPublic",
    "TenantUpdate",
    "TenantsPublic",
    "UsagePublic",
]

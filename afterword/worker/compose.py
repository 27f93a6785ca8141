"""Wiring the worker to a service from configuration (or from an embedding host's objects)."""

from __future__ import annotations

from collections.abc import Mapping

from ..app.service import ContinuationService
from ..config import Config, OutboxChannelConfig, SlackChannelConfig, WebhookChannelConfig
from ..history import ConversationHistory, DurableHistory
from . import channels as ch
from .channels import Channel
from .loop import Worker
from .synthesizers import AnthropicSynthesizer, OpenAISynthesizer, Synthesizer, TemplateSynthesizer
from .taskfollow import TaskFollower, follows_any, load_wire


def synthesizer_from_config(config: Config, environ: Mapping[str, str]) -> Synthesizer:
    s = config.synthesis
    if s.provider == "openai":
        assert s.base_url and s.model
        key = environ.get(s.api_key_env) if s.api_key_env else None
        return OpenAISynthesizer(
            s.base_url, s.model, key, timeout_s=config.limits.synthesis_timeout_ms / 1000
        )
    if s.provider == "anthropic":
        assert s.base_url and s.model
        key = environ.get(s.api_key_env) if s.api_key_env else None
        return AnthropicSynthesizer(
            s.base_url,
            s.model,
            key,
            max_tokens=s.max_tokens,
            timeout_s=config.limits.synthesis_timeout_ms / 1000,
        )
    return TemplateSynthesizer()


def channels_from_config(config: Config, environ: Mapping[str, str]) -> dict[str, ch.Channel]:
    out: dict[str, ch.Channel] = {}
    for key, cfg in config.channels.items():
        if isinstance(cfg, OutboxChannelConfig):
            out[key] = ch.OutboxChannel(cfg.path)
        elif isinstance(cfg, SlackChannelConfig):
            out[key] = ch.SlackChannel(cfg.base_url, environ.get(cfg.token_env, ""))
        elif isinstance(cfg, WebhookChannelConfig):
            out[key] = ch.WebhookChannel(cfg.url, dict(cfg.headers))
    return out


def attach_worker(
    service: ContinuationService,
    *,
    synthesizer: Synthesizer | None = None,
    channels: Mapping[str, Channel] | None = None,
    history: ConversationHistory | None = None,
) -> Worker:
    """A worker over ``service``, registered with it (metrics read its queue; an operator's
    "delivered" resolution is appended to the history through it)."""
    environ = service.environ
    if history is None:
        history = DurableHistory(service.store)
    worker = Worker(
        service,
        synthesizer or synthesizer_from_config(service.config, environ),
        dict(channels) if channels is not None else channels_from_config(service.config, environ),
        history,
    )
    service.register_worker(worker)
    return worker


def attach_task_follower(service: ContinuationService, worker: Worker) -> TaskFollower | None:
    """The follower of the service's task-backed continuations, sharing ``worker``'s
    concurrency limit; ``None`` when no selected server is one the service follows (loopback
    streamable HTTP) or the MCP SDK 2.x line is not installed (then nothing is imported)."""
    config = service.config
    if not follows_any(config.mcp_servers, config.continuation_servers):
        return None
    wire = load_wire()
    if wire is None:
        return None
    return TaskFollower(
        service,
        wire,
        mcp_servers=config.mcp_servers,
        limiter=worker.limiter,
        clock_ms=service.clock_ms,
        subscribe=service.subscribe,
    )


__all__ = ["attach_task_follower", "attach_worker", "channels_from_config", "synthesizer_from_config"]

"""Wiring the worker to a service from configuration (or from an embedding host's objects)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..app.service import ContinuationService
from ..config import Config, OutboxChannelConfig, SlackChannelConfig, WebhookChannelConfig
from ..continuations import lifecycle
from ..continuations.model import Continuation
from . import channels as ch
from .loop import Worker
from .synth import AnthropicSynthesizer, OpenAISynthesizer, Synthesizer, TemplateSynthesizer


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
    channels: Mapping[str, Any] | None = None,
    history: Any = None,
) -> Worker:
    environ = service._environ
    if history is None:
        from ..history import DurableHistory

        history = DurableHistory(service.store)
    worker = Worker(
        service,
        synthesizer or synthesizer_from_config(service.config, environ),
        dict(channels) if channels is not None else channels_from_config(service.config, environ),
        history,
    )

    async def after_resolved_delivered(rec: Continuation) -> Continuation:
        # History-only commit: the operator verified the post; we never post again here.
        recorded, code = await worker.record_history(rec)
        now = service.clock_ms()
        new, _ = await service.transition(rec.id, lambda r: lifecycle.with_history(r, recorded, code, now))
        return new

    service.after_resolved_delivered = after_resolved_delivered  # type: ignore[method-assign]
    service.worker = worker  # type: ignore[attr-defined]
    return worker


__all__ = ["attach_worker", "channels_from_config", "synthesizer_from_config"]

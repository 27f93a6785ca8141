"""Worker loop, synthesizers and channel adapters."""

from .channels import (
    Channel,
    ChunkDelivery,
    ChunkReceipt,
    OutboxChannel,
    ReconcilingChannel,
    SlackChannel,
    WebhookChannel,
)
from .errors import PermanentDeliveryError, RetryableDeliveryError, SynthesisError, UnconfirmedDeliveryError
from .loop import Worker
from .synthesizers import (
    AnthropicSynthesizer,
    OpenAISynthesizer,
    SynthesisRequest,
    Synthesizer,
    TemplateSynthesizer,
)

__all__ = [
    "AnthropicSynthesizer",
    "Channel",
    "ChunkDelivery",
    "ChunkReceipt",
    "OpenAISynthesizer",
    "OutboxChannel",
    "PermanentDeliveryError",
    "ReconcilingChannel",
    "RetryableDeliveryError",
    "SlackChannel",
    "SynthesisError",
    "SynthesisRequest",
    "Synthesizer",
    "TemplateSynthesizer",
    "UnconfirmedDeliveryError",
    "WebhookChannel",
    "Worker",
]

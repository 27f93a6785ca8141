"""Local fakes the worker tests start themselves on 127.0.0.1 (free ports, own threads)."""

from ._http import HANG, FakeServer, Reply, Request
from .anthropic import FakeAnthropic
from .clock import Clock
from .openai import FakeOpenAI
from .slack import FakeSlack
from .webhook import FakeWebhook

__all__ = [
    "HANG",
    "Clock",
    "FakeAnthropic",
    "FakeOpenAI",
    "FakeServer",
    "FakeSlack",
    "FakeWebhook",
    "Reply",
    "Request",
]

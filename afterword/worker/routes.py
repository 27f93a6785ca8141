"""Which channel adapter delivers to a destination, and whether the destination is still
allowed (checked at synthesis and again at delivery: configuration may change between)."""

from __future__ import annotations

from collections.abc import Mapping

from ..app.ports import WorkerPorts
from ..config import ChannelConfig, channel_allows
from ..continuations.model import Continuation
from .channels import Channel


class Routes:
    def __init__(self, ports: WorkerPorts, channels: Mapping[str, Channel]) -> None:
        self.ports = ports
        self.channels = channels

    def channel(self, destination: str) -> tuple[Channel, ChannelConfig | None] | None:
        """The adapter for ``destination`` (by its first segment, or ``"*"``) and its config."""
        segment = destination.split(":", 1)[0]
        configured = self.ports.config.channel_for(destination)
        cfg = configured[1] if configured else None
        if segment in self.channels:
            return self.channels[segment], cfg
        if "*" in self.channels:
            return self.channels["*"], cfg
        return None

    def problem(self, rec: Continuation) -> tuple[str, str] | None:
        """Why ``rec`` cannot be delivered where it is bound, as (code, message); None if it can."""
        if rec.claim.mode not in ("reply", "notify_if_actionable"):
            return None
        dest = rec.claim.reply_to
        if not dest:
            return ("no_destination", "no physical route is bound")
        found = self.channel(dest)
        if found is None:
            return ("no_channel", "no channel adapter serves this conversation")
        _, cfg = found
        if cfg is not None and not channel_allows(cfg, dest):
            return ("destination_revoked", "the channel allowlist no longer admits this destination")
        return None

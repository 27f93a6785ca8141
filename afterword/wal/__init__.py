"""Bounded write-ahead transaction log with group commit and idempotent replay."""

from .errors import TransactionTooLarge, WalClosedError, WalCorruptError, WalError, WalEvidenceError
from .layout import Frame, SegmentHeader, decode_frame_at, encode_frame
from .log import WalOptions, WalStatistics, WriteAheadLog
from .log_frames import LogFrames
from .scan import NamedSegment, ReplayPlan, SegmentImage, scan_chain

__all__ = [
    "Frame",
    "LogFrames",
    "NamedSegment",
    "ReplayPlan",
    "SegmentHeader",
    "SegmentImage",
    "TransactionTooLarge",
    "WalClosedError",
    "WalCorruptError",
    "WalError",
    "WalEvidenceError",
    "WalOptions",
    "WalStatistics",
    "WriteAheadLog",
    "decode_frame_at",
    "encode_frame",
    "scan_chain",
]

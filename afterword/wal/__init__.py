"""Bounded write-ahead transaction log with group commit and idempotent replay."""

from .errors import TransactionTooLarge, WalClosedError, WalCorruptError, WalError
from .frame import Frame, SegmentHeader, decode_frame_at, encode_frame
from .log import WalOptions, WalStatistics, WriteAheadLog
from .scan import ReplayPlan, SegmentImage, scan_chain

__all__ = [
    "Frame",
    "ReplayPlan",
    "SegmentHeader",
    "SegmentImage",
    "TransactionTooLarge",
    "WalClosedError",
    "WalCorruptError",
    "WalError",
    "WalOptions",
    "WalStatistics",
    "WriteAheadLog",
    "decode_frame_at",
    "encode_frame",
    "scan_chain",
]

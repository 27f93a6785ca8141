from collections.abc import Callable
from typing import TypeVar

_F = TypeVar("_F")

def read_run(
    data: bytes,
    offset: int,
    salt: int,
    expect: int,
    max_payload: int,
    out: list[_F],
    frame_type: type[_F],
    hash64: Callable[[bytes, int], int],
    /,
) -> tuple[int, int]: ...

def find_aligned(data: bytes, pattern: bytes, start: int, /) -> int: ...

from collections.abc import Callable

def read_spans(
    data: bytes,
    offset: int,
    salt: int,
    expect: int,
    max_payload: int,
    hash64: Callable[[bytes, int], int],
    /,
) -> tuple[int, int, bytes]: ...

def find_aligned(data: bytes, pattern: bytes, start: int, /) -> int: ...

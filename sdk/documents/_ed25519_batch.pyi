def check(
    address: int,
    authors: list[bytes],
    encoded: list[bytes],
    signatures: list[bytes],
    answers: bytearray,
    first_chunk: int,
    chunk_step: int,
    chunk_size: int,
    stop: bytearray,
    /,
) -> int: ...
def settle(answers: bytearray, index: int, /) -> int: ...

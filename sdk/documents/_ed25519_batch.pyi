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
def seal(
    sign: int,
    encrypt: int,
    random: int,
    secret_key: bytes,
    sig_prefix: bytes,
    ad_prefix: bytes,
    epoch: int,
    timestamp: int,
    signer: int,
    key: bytes,
    sds: bytes,
    /,
) -> bytes: ...
def open_sealed(
    decrypt: int,
    verify: int,
    sig_prefix: bytes,
    ad_prefix: bytes,
    envelopes: list[bytes],
    keys: list[bytes],
    rosters: list[bytes],
    /,
) -> list[tuple[int, bytes | None, bytes | None]]: ...

class Feed:
    """A growing batch that verification threads check as entries are added."""

    waiting: int
    taken: int
    count: int
    def __init__(self, capacity: int) -> None: ...
    def add(self, author: bytes, encoded: bytes, signature: bytes, /) -> int: ...
    def seal(self) -> None: ...
    def stop(self) -> None: ...
    def run(self, address: int, answers: bytearray, idle: float, /) -> int: ...
    def settle(self, answers: bytearray, index: int, /) -> int: ...

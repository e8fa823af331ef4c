"""Content decoding with a bound: a compressed body never grows past the size limit.

httpx decompresses each chunk it receives in one call, so one 64 KiB chunk of a
gzip bomb becomes 64 MB before anyone can count it. :class:`BoundedDecoder`
decodes a body's ``Content-Encoding`` (``gzip``, ``deflate``, ``identity``, and
any chain of them, e.g. ``gzip, deflate``) in steps of at most :data:`STEP`
bytes out, with zlib's ``max_length``/``unconsumed_tail``, and stops with
:class:`BodyTooLarge` as soon as the decoded body passes its limit. Memory is
the limit plus a few steps, whatever the compression ratio.

Only what can be decoded this way is asked for (:data:`ACCEPT_ENCODING`); a
coding a server sends unasked and unknown here is passed through undecoded, as
httpx does.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

#: Sent as ``Accept-Encoding``: the codings :class:`BoundedDecoder` decodes in bounded steps.
ACCEPT_ENCODING = "gzip, deflate"
#: Most bytes one decompression step may produce.
STEP = 64 * 1024


class BodyTooLarge(Exception):
    """The decoded body passed the limit; ``data`` holds the part decoded so far."""

    def __init__(self, data: bytes) -> None:
        super().__init__("the body is larger than the limit")
        self.data = data


class DecodingError(Exception):
    """The body does not decode as its ``Content-Encoding`` says."""


class _Inflate:
    """One zlib stage: gzip, or deflate (zlib-wrapped, or raw as some servers send it)."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        wbits = zlib.MAX_WBITS | 16 if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
        self._z = zlib.decompressobj(wbits)
        self._started = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """Decode ``data``: the output in pieces of at most :data:`STEP` bytes, lazily."""
        while True:
            try:
                piece = self._z.decompress(data, STEP)
            except zlib.error as exc:
                if self.coding == "deflate" and not self._started:
                    # Raw deflate without the zlib header: try once more as such.
                    self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                    self._started = True
                    continue
                raise DecodingError(f"the {self.coding} body cannot be decoded: {exc}") from None
            self._started = True
            data = self._z.unconsumed_tail
            if piece:
                yield piece
            # Output may be pending inside zlib even with no input left: drain it.
            if not data and len(piece) < STEP:
                return

    def end(self) -> bytes:
        try:
            return self._z.flush()
        except zlib.error as exc:
            raise DecodingError(f"the {self.coding} body cannot be decoded: {exc}") from None


class BoundedDecoder:
    """Decodes a body of ``content_encoding`` into at most ``limit`` bytes.

    Call :meth:`feed` with each raw chunk, then :meth:`finish`; both return the
    decoded bytes so far and raise :class:`BodyTooLarge` past ``limit`` (raw
    bytes count too: a body whose compressed form alone passes the limit is too
    large) or :class:`DecodingError` for a broken body.
    """

    def __init__(self, content_encoding: str | None, limit: int) -> None:
        self.limit = limit
        self._stages: list[_Inflate] = []
        if content_encoding:  # most answers have none
            codings = [c.strip().lower() for c in content_encoding.split(",")]
            # Codings are listed in the order they were applied: undo them last first.
            self._stages = [
                _Inflate(c) for c in reversed(codings) if c in ("gzip", "x-gzip", "deflate")
            ]
        self._out: list[bytes] = []
        self._size = 0
        self._raw = 0

    def feed(self, data: bytes) -> None:
        """Decode one raw chunk."""
        self._raw += len(data)
        if self._raw > self.limit:
            raise BodyTooLarge(self._joined())
        self._push(0, data)

    def finish(self) -> bytes:
        """The whole decoded body, once the raw body has ended."""
        for index, stage in enumerate(self._stages):
            self._push(index + 1, stage.end())
        return self._joined()

    def _push(self, index: int, data: bytes) -> None:
        if index == len(self._stages):
            if data:
                self._size += len(data)
                self._out.append(data)
                if self._size > self.limit:
                    raise BodyTooLarge(self._joined())
            return
        for piece in self._stages[index].pieces(data):
            self._push(index + 1, piece)

    def _joined(self) -> bytes:
        data = b"".join(self._out)
        self._out = [data]
        return data

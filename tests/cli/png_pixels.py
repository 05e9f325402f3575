#!/usr/bin/env python3
"""Count a PNG's pixels near given colours, decoding the file with Python's zlib alone
(independently of kiln's writer): png_pixels.py FILE RRGGBB:MIN... prints
"WIDTHxHEIGHT RRGGBB=COUNT ..." and exits 1 when a colour has fewer than MIN pixels or the
file is no well-formed 8-bit RGB or RGBA PNG (every chunk's CRC checked)."""
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    at, idat, ihdr, ended = 8, b"", None, False
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        (crc,) = struct.unpack(">I", data[at + 8 + n:at + 12 + n])
        if zlib.crc32(kind + body) != crc:
            raise ValueError("chunk %r: bad CRC" % kind)
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            ended = True
            break
        at += 12 + n
    if not ihdr or not ended:
        raise ValueError("no IHDR or no IEND")
    w, h, depth, ctype, _, _, interlace = ihdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise ValueError("not 8-bit RGB/RGBA, or interlaced")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    if len(raw) != h * (stride + 1):
        raise ValueError("%d bytes of pixels, expected %d" % (len(raw), h * (stride + 1)))
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif f != 0:
                raise ValueError("row %d: filter %d" % (y, f))
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def main():
    path, wants = sys.argv[1], sys.argv[2:]
    try:
        w, h, bpp, rows = decode(path)
    except (ValueError, struct.error, zlib.error, OSError) as e:
        print("%s: %s" % (path, e))
        return 1
    targets = []
    for spec in wants:
        hexrgb, least = spec.split(":")
        targets.append((hexrgb, tuple(bytes.fromhex(hexrgb)), int(least), [0]))
    for line in rows:
        for x in range(0, w * bpp, bpp):
            r, g, b = line[x], line[x + 1], line[x + 2]
            for _, (tr, tg, tb), _, count in targets:
                if abs(r - tr) <= 24 and abs(g - tg) <= 24 and abs(b - tb) <= 24:
                    count[0] += 1
    print("%dx%d " % (w, h) + " ".join("%s=%d" % (t[0], t[3][0]) for t in targets))
    return 0 if all(t[3][0] >= t[2] for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())

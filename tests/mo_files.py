"""Writes GNU gettext .mo files for tests (the format: magic, count, two string tables)."""

import pathlib
import struct


def write_mo(
    path: pathlib.Path,
    messages: list[tuple[str, str]],
    charset: str = "UTF-8",
    big_endian: bool = False,
) -> None:
    """`messages` are (original, translation) with gettext's encodings: "ctx\\x04id" for a
    context, "singular\\x00plural" and "form0\\x00form1" for plurals. The header is added."""
    header = f"Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2;\n"
    entries = sorted([("", header)] + messages)
    originals = [o.encode(charset) for o, _ in entries]
    translations = [t.encode(charset) for _, t in entries]
    order = ">" if big_endian else "<"
    count = len(entries)
    originals_at = 28
    translations_at = originals_at + 8 * count
    data_at = translations_at + 8 * count
    tables, blob = [], b""
    for strings in (originals, translations):
        table = []
        for s in strings:
            table.append((len(s), data_at + len(blob)))
            blob += s + b"\x00"
        tables.append(table)
    out = struct.pack(order + "7I", 0x950412DE, 0, count, originals_at, translations_at, 0, data_at)
    for table in tables:
        for length, offset in table:
            out += struct.pack(order + "2I", length, offset)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out + blob)

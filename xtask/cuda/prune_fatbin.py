"""Zero the GPU code of other architectures in a CUDA shared library's .nv_fatbin section.

Usage: python3 prune_fatbin.py IN.so OUT.so ARCH[,ARCH...]     (e.g. 90 for Hopper)

MLX's CUDA wheel carries its kernels for sm_75 ... sm_121 plus PTX: 64 MB of its 145 MB
libmlx.so, already compressed, so the library does not shrink under xz below ~70 MB. Only
the payloads of other architectures are zeroed; every header stays, so the CUDA loader still
walks the fat binaries and simply finds no code for those architectures (a GPU of another
architecture then fails to load the kernels, with CUDA's error). The file keeps its size and
layout, and zeros compress to nothing.
"""

import collections
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50


def section(data, name):
    """(offset, size) of the ELF64 section called `name`."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):
        name_off, = struct.unpack_from("<I", data, shoff + i * shentsize)
        off, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
        return name_off, off, size
    strtab = header(shstrndx)[1]
    for i in range(shnum):
        name_off, off, size = header(i)
        end = data.index(b"\0", strtab + name_off)
        if data[strtab + name_off:end].decode() == name:
            return off, size
    sys.exit(f"no {name} section")


def main():
    src, dst, keep = sys.argv[1], sys.argv[2], {int(a) for a in sys.argv[3].split(",")}
    data = bytearray(open(src, "rb").read())
    off, size = section(data, ".nv_fatbin")
    kept, zeroed = collections.Counter(), collections.Counter()
    p, end = off, off + size
    while p + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, p)
        if magic != FATBIN_MAGIC:
            p += 8  # fat binaries are 8-aligned; skip padding
            continue
        q, q_end = p + header_size, p + header_size + fat_size
        while q < q_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, q)
            arch, = struct.unpack_from("<I", data, q + 28)
            label = f"{'PTX' if kind == 1 else 'SASS'} sm_{arch}"
            if arch in keep:
                kept[label] += payload
            else:
                data[q + entry_header:q + entry_header + payload] = bytes(payload)
                zeroed[label] += payload
            q += entry_header + payload
        p = q_end
    for name, counts in (("kept", kept), ("zeroed", zeroed)):
        print(name + ":", ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(counts.items())))
    open(dst, "wb").write(data)


if __name__ == "__main__":
    main()

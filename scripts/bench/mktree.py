#!/usr/bin/env python3
"""Write a deterministic tarball shaped like a source tree: 8 500 files in 1 500 directories.

Usage: mktree.py OUT.tar [FILES DIRS]

Directory depth, names and file sizes come from a fixed seed (sizes log-normal around 3 KiB,
capped at 256 KiB; about 40 MB in all), so every machine untars the same tree. Entries carry a
fixed mtime, uid 0 and modes 0755/0644.
"""

import io
import random
import sys
import tarfile

SEED = 20240605
MTIME = 1_700_000_000


def main() -> int:
    if len(sys.argv) not in (2, 4):
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    n_files, n_dirs = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else (8500, 1500)
    rng = random.Random(SEED)
    words = [
        "fn", "let", "mut", "impl", "struct", "enum", "match", "return", "self", "pub",
        "use", "mod", "where", "trait", "const", "static", "loop", "while", "for", "in",
    ]
    base = " ".join(rng.choice(words) for _ in range(80_000)).encode()

    dirs = ["tree"]
    while len(dirs) < n_dirs:
        parent = rng.choice(dirs[-200:]) if rng.random() < 0.8 else rng.choice(dirs)
        if parent.count("/") >= 7:
            parent = "tree"
        dirs.append(f"{parent}/d{len(dirs):04d}")

    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = MTIME
            tar.addfile(info)
        for i in range(n_files):
            d = dirs[i % len(dirs)] if i < len(dirs) else rng.choice(dirs)
            size = min(int(rng.lognormvariate(8.0, 1.2)), 256 * 1024)
            start = rng.randrange(0, len(base) - size - 1)
            data = f"// file {i}\n".encode() + base[start : start + size]
            info = tarfile.TarInfo(f"{d}/f{i:05d}.rs")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = MTIME
            tar.addfile(info, io.BytesIO(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())

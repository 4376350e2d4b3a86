#!/usr/bin/env python3
"""The durability floor: how many writes + fdatasync the disk under DIR allows per second.

Writes a RECORD-byte record after the previous one into a zero-filled file and fdatasyncs it,
COUNT times, one after the other (as a write-ahead log does for one sequential writer). Prints `fsync_floor <ops/s> <p50 us> <p99 us>`.

usage: fsync_floor.py DIR [COUNT] [RECORD]
"""

import os
import sys
import tempfile
import time


def main() -> None:
    directory = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    record = b"x" * (int(sys.argv[3]) if len(sys.argv) > 3 else 512)
    fd, path = tempfile.mkstemp(prefix="fsync-floor.", dir=directory)
    try:
        # Zero-filled ahead (as a write-ahead log is), so that a sync carries no size change.
        os.write(fd, bytes(len(record) * count))
        os.fsync(fd)
        lat = []
        start = time.perf_counter()
        for i in range(count):
            t = time.perf_counter()
            os.pwrite(fd, record, i * len(record))
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    p50 = lat[len(lat) // 2] * 1e6
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6
    print(f"fsync_floor {count / elapsed:.0f} {p50:.0f} {p99:.0f}")


if __name__ == "__main__":
    main()

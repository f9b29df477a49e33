# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A target engine driven over stdin/stdout by test_hostile_peers.py (not a test module).

Arguments (optional): `nofile=N` lowers this process's RLIMIT_NOFILE to N before the
engine starts; `field=value` sets a TcpBackendConfig field (int values).

It prints its EngineDesc and one region's MemoryDesc (hex, one line each), then answers
one command per stdin line:
  exhaust   open /dev/null until this process is out of descriptors (EMFILE)
  cpu <s>   sleep <s> seconds and print the CPU seconds this process used meanwhile
  free      close those descriptors again
  sha       print the sha256 of its region
  stats     print hellos_refused and hellos_dropped
  quit      exit
Only stdin/stdout are used once descriptors are exhausted.
"""

import hashlib
import os
import resource
import sys
import time

import numpy as np

from mori.io import BackendType, IOEngine, TcpBackendConfig


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    fields = {"transfer_timeout_ms": 1000}
    for arg in sys.argv[1:]:
        name, value = arg.split("=")
        if name == "nofile":
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (int(value), hard))
        else:
            fields[name] = int(value)
    eng = IOEngine("target")
    eng.create_backend(BackendType.TCP, TcpBackendConfig(**fields))
    buf = np.zeros(1 << 16, np.uint8)
    mem = eng.register_array(buf)
    print(eng.get_engine_desc().pack().hex(), flush=True)
    print(mem.pack().hex(), flush=True)
    held = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "exhaust":
            # A low limit keeps the number of descriptors to fill small.
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
            try:
                while True:
                    held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
            print(len(held), flush=True)
        elif cmd == "cpu":
            t0 = _cpu()
            time.sleep(float(arg[0]))
            print(_cpu() - t0, flush=True)
        elif cmd == "free":
            for fd in held:
                os.close(fd)
            held.clear()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            print("freed", flush=True)
        elif cmd == "sha":
            print(hashlib.sha256(buf.tobytes()).hexdigest(), flush=True)
        elif cmd == "stats":
            print(eng._engine.hellos_refused, eng._engine.hellos_dropped, flush=True)
        elif cmd == "quit":
            break
    eng.close()


if __name__ == "__main__":
    main()

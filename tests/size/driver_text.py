#!/usr/bin/env python3
"""The driver's .text bytes in a linked kernel, by the rule tests/size.sh documents.

    driver_text.py KERNEL REPO

KERNEL must carry DWARF line tables (`debug = "line-tables-only"`). Prints
`driver_text_layer NAME N` lines (where the counted bytes come from, see `layers`),
`driver_text_symbols N`, `driver_text_inlined N` and, last, `driver_text_bytes N`.
"""
import bisect
import json
import os
import re
import subprocess
import sys


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


# The NIC links (hal/src/virtio_net and the virtio-drivers crate it wraps; the Intel links,
# hal/src/intel, igb.rs and e1000e.rs) are not the RDMA driver: counted apart, as
# link_text_symbols.
LINK = r"(bareverbs_hal::(virtio_net|intel|igb|e1000e)|virtio_drivers)::"


# The second device, software RoCEv2 (src/device/rxe), is counted apart too (rxe_text_*):
# its functions, and any driver function whose name mentions it (the verbs layer instantiated
# for it, its drop glue).
RXE = "bareverbs::device::rxe::"


# The example's RoCE demo and the RoCE peer mode (examples/unikernel/src/roce.rs,
# qemu/peers/src/roce_peer.rs) use
# only the rxe device: driver code inlined into them is the rxe device's. So is driver code inlined into any function of the
# example instantiated for the rxe device (the kernel is built with v0 symbol mangling, whose
# names carry the generic arguments: `bareverbs_lab_peers::peer::run_case::<…Rxe<…>…>`).
RXE_USER = r"(bareverbs_unikernel::roce|bareverbs_lab_peers::roce_peer)(::|$)"


def driver_crate_symbol(name):
    """A function of the driver crates (generic instantiations and impls for their types
    included), or the drop glue of one of their types; the link's included."""
    return bool(
        re.match(r"(bareverbs|bareverbs_hal)::", name.lstrip("<"))
        or re.match(r"core::ptr::drop_in_place(?:::)?<\(?(bareverbs|bareverbs_hal)::", name)
    )


def rxe_symbol(name):
    return driver_crate_symbol(name) and RXE in name and not link_symbol(name)


def rxe_user(name):
    if driver_crate_symbol(name) or link_symbol(name):
        return False
    return bool(re.match(RXE_USER, name.lstrip("<"))) or RXE in name


def driver_symbol(name):
    return driver_crate_symbol(name) and not link_symbol(name) and RXE not in name


def link_symbol(name):
    return bool(
        re.match(LINK, name.lstrip("<"))
        or re.match(r"core::ptr::drop_in_place(?:::)?<\(?" + LINK, name)
    )


# The layer a driver source file belongs to (`driver_text_layer` lines), by path in the
# repository, and the same layers by module path, for the bytes no driver file claims.
LAYERS = (
    ("src/device/pvrdma/", "bareverbs::device::pvrdma", "pvrdma"),
    ("src/verbs/", "bareverbs::verbs", "verbs"),
    ("src/error", "bareverbs::error", "error"),
    ("src/events.rs", "bareverbs::events", "events"),
    ("src/dma.rs", "bareverbs::dma", "dma"),
    ("src/pci.rs", "bareverbs::pci", "pci"),
    ("hal/src/", "bareverbs_hal", "hal"),
    ("src/", "bareverbs", "other"),
)


def layers(kernel, driver_file, repo, addresses):
    """Bytes by layer. Each counted byte goes to the innermost frame of its inline chain (from
    llvm-symbolizer) that lies in a driver file, so core code a driver function inlined counts
    with that function's file. A byte no driver file claims (compiler-made code of line 0, the
    drop glue of a driver type, whose lines are core's) goes by the module path of the innermost
    frame's function: the first driver path in its name (`drop_in_place<T>` goes by T's);
    `unattributed` when neither says."""
    out = run_input(
        ["llvm-symbolizer", "--inlining", "--output-style=JSON", "--obj=" + kernel],
        "".join(f"{a:#x}\n" for a in addresses),
    )
    counts = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        frames = json.loads(line)["Symbol"]
        name = None
        for frame in frames:
            f = os.path.normpath(frame.get("FileName", ""))
            if driver_file(f):
                rel = f[len(repo) + 1 :]
                name = next(n for prefix, _, n in LAYERS if rel.startswith(prefix))
                break
        if name is None and frames:
            m = re.search(r"\bbareverbs(?:_hal)?::[\w:]*", frames[0].get("FunctionName", ""))
            path = m.group(0) if m else ""
            name = next((n for _, module, n in LAYERS if path.startswith(module + "::")), None)
        name = name or "unattributed"
        counts[name] = counts.get(name, 0) + 1
    return counts


def run_input(cmd, text):
    return subprocess.run(cmd, input=text, capture_output=True, text=True, check=True).stdout


def main():
    kernel, repo = sys.argv[1], os.path.abspath(sys.argv[2])
    roots = (repo + "/src/", repo + "/hal/src/")
    link_dir = tuple(repo + "/hal/src/" + d for d in ("virtio_net", "intel", "igb.rs", "e1000e.rs"))
    rxe_dir = repo + "/src/device/rxe/"

    def driver_file(f):
        return f.startswith(roots) and not f.startswith(link_dir) and not f.startswith(rxe_dir)

    # Text symbols with a size: (start, end, name); aliases (same start) once.
    syms = {}
    for line in run("nm", "-S", "-t", "d", "-C", kernel).splitlines():
        f = line.split(" ", 3)
        if len(f) == 4 and f[2] in ("t", "T", "w", "W") and int(f[1]) > 0:
            syms.setdefault(int(f[0]), (int(f[0]) + int(f[1]), f[3]))
    driver = sorted((a, e) for a, (e, n) in syms.items() if driver_symbol(n))

    # Symbols counted whole by some line (the driver's, the rxe device's, the link's): their
    # bytes are never counted again as code inlined elsewhere.
    claimed = sorted(
        (a, e) for a, (e, n) in syms.items() if driver_symbol(n) or rxe_symbol(n) or link_symbol(n)
    )
    claimed_starts = [a for a, _ in claimed]

    def in_claimed(x):
        i = bisect.bisect_right(claimed_starts, x) - 1
        return i >= 0 and claimed[i][0] <= x < claimed[i][1]

    text_lo, text_hi = None, None
    for line in run("objdump", "-h", kernel).splitlines():
        f = line.split()
        if len(f) >= 4 and f[1] == ".text":
            text_lo = int(f[3], 16)
            text_hi = text_lo + int(f[2], 16)
    if text_lo is None:
        sys.exit("driver_text.py: no .text section")

    # Each line-number program's compilation directory (relative paths are relative to it).
    comp_dir, stmt = {}, None
    info_text = run("llvm-dwarfdump", "--debug-info", kernel)
    for line in info_text.splitlines():
        m = re.search(r"DW_AT_stmt_list\s*\((0x[0-9a-f]+)\)", line)
        if m:
            stmt = int(m.group(1), 16)
            continue
        m = re.search(r'DW_AT_comp_dir\s*\("(.*)"\)', line)
        if m and stmt is not None:
            comp_dir[stmt] = m.group(1)
            stmt = None

    # The decoded line tables: (address, line, file, end_sequence) in table order.
    rows, dirs, files, cdir, fidx, fname = [], {}, {}, "", None, None
    for line in run("llvm-dwarfdump", "--debug-line", kernel).splitlines():
        if line.startswith("debug_line["):
            off = int(line[len("debug_line[") : line.index("]")], 16)
            dirs, files, cdir = {}, {}, comp_dir.get(off, "")
            continue
        m = re.match(r'include_directories\[\s*(\d+)\] = "(.*)"', line)
        if m:
            dirs[int(m.group(1))] = m.group(2)
            continue
        m = re.match(r"file_names\[\s*(\d+)\]:", line)
        if m:
            fidx = int(m.group(1))
            continue
        m = re.match(r'\s+name: "(.*)"', line)
        if m:
            fname = m.group(1)
            continue
        m = re.match(r"\s+dir_index: (\d+)", line)
        if m:
            files[fidx] = os.path.normpath(os.path.join(cdir, dirs.get(int(m.group(1)), ""), fname))
            continue
        m = re.match(r"0x([0-9a-f]+)\s+(\d+)\s+\d+\s+(\d+)\s.*?(end_sequence)?\s*$", line)
        if m:
            rows.append((int(m.group(1), 16), int(m.group(2)), files.get(int(m.group(3)), ""), bool(m.group(4))))

    # Code inlined at a call site in a driver file: part of an inlined driver function's body
    # (core code included), wherever that function itself was inlined.
    inlined = set()

    def take(entry):
        if entry is None or not driver_file(entry["call_file"]):
            return
        for a, b in entry["ranges"]:
            if text_lo <= a < b <= text_hi:
                for x in range(a, b):
                    if not in_claimed(x):
                        inlined.add(x)

    entry, low, in_ranges = None, None, False
    for line in info_text.splitlines():
        if re.match(r"0x[0-9a-f]+:\s+DW_TAG_", line) or re.match(r"0x[0-9a-f]+:\s+NULL", line):
            take(entry)
            entry = {"call_file": "", "ranges": []} if "DW_TAG_inlined_subroutine" in line else None
            low, in_ranges = None, False
            continue
        if entry is None:
            continue
        m = re.search(r'DW_AT_call_file\s*\("(.*)"\)', line)
        if m:
            entry["call_file"] = os.path.normpath(m.group(1))
            continue
        m = re.search(r"DW_AT_low_pc\s*\((0x[0-9a-f]+)\)", line)
        if m:
            low = int(m.group(1), 16)
            continue
        m = re.search(r"DW_AT_high_pc\s*\((0x[0-9a-f]+)\)", line)
        if m and low is not None:
            entry["ranges"].append((low, int(m.group(1), 16)))
            continue
        if "DW_AT_ranges" in line:
            in_ranges = True
        if in_ranges:
            for a, b in re.findall(r"\[(0x[0-9a-f]+), (0x[0-9a-f]+)\)", line):
                entry["ranges"].append((int(a, 16), int(b, 16)))
            if line.rstrip().endswith("))"):
                in_ranges = False
    take(entry)

    # Bytes outside the driver's symbols whose innermost source line is in a driver file.
    for (a, ln, f, end), (b, _, _, _) in zip(rows, rows[1:]):
        if end or not (text_lo <= a < b <= text_hi) or ln == 0 or not driver_file(f):
            continue
        for x in range(a, b):
            if not in_claimed(x):
                inlined.add(x)
    users = sorted((a, e) for a, (e, n) in syms.items() if rxe_user(n))
    in_user = set()
    for a, e in users:
        in_user.update(x for x in range(a, e) if x in inlined)
    inlined -= in_user
    symbols = sum(e - a for a, e in driver)
    link = sum(e - a for a, (e, n) in syms.items() if link_symbol(n))
    rxe = sorted((a, e) for a, (e, n) in syms.items() if rxe_symbol(n))
    # The rxe device's code inlined elsewhere: bytes whose innermost line is in its files.
    rxe_inlined = 0
    for (a, ln, f, end), (b, _, _, _) in zip(rows, rows[1:]):
        if end or not (text_lo <= a < b <= text_hi) or ln == 0 or not f.startswith(rxe_dir):
            continue
        rxe_inlined += sum(1 for x in range(a, b) if not in_claimed(x))
    rxe_inlined += len(in_user)
    rxe_symbols = sum(e - a for a, e in rxe)
    # BAREVERBS_SIZE_TOP=N: the N largest driver symbols, on stderr (where the bytes are).
    top = int(os.environ.get("BAREVERBS_SIZE_TOP", "0") or 0)
    for a, e in sorted(driver, key=lambda r: r[0] - r[1])[:top]:
        print(f"{e - a:6d} {syms[a][1]}", file=sys.stderr)
    if top:
        # ... and the functions the most inlined driver bytes landed in.
        all_starts = sorted(syms)
        where = {}
        for x in inlined:
            i = bisect.bisect_right(all_starts, x) - 1
            a = all_starts[i] if i >= 0 else None
            name = syms[a][1] if a is not None and x < syms[a][0] else "(no symbol)"
            where[name] = where.get(name, 0) + 1
        for name, n in sorted(where.items(), key=lambda r: -r[1])[:top]:
            print(f"{n:6d} inlined into {name}", file=sys.stderr)
    print(f"link_text_symbols {link}")
    print(f"rxe_text_symbols {rxe_symbols}")
    print(f"rxe_text_inlined {rxe_inlined}")
    print(f"rxe_text_bytes {rxe_symbols + rxe_inlined}")
    counted = sorted(inlined.union(*(range(a, e) for a, e in driver)))
    by_layer = layers(kernel, driver_file, repo, counted)
    for name, n in sorted(by_layer.items(), key=lambda r: -r[1]):
        print(f"driver_text_layer {name} {n}")
    print(f"driver_text_symbols {symbols}")
    print(f"driver_text_inlined {len(inlined)}")
    print(f"driver_text_bytes {symbols + len(inlined)}")


main()

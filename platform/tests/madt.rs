//! The ACPI parser the SMP bring-up relies on, on tables built here: well-formed ones (RSDT
//! and XSDT, xAPIC and x2APIC entries), and firmware that lies: truncated tables, lengths
//! past the bound or past readable memory, entries of length 0 or running past the end, bad
//! checksums, zero processors, disabled ones, duplicates and more than the platform keeps.

use bareverbs_platform::acpi::{
    AcpiError, CpuEntry, MAX_CPUS, MAX_MADT_LEN, PhysMem, find_rsdp, parse_madt, read_madt,
};

/// Physical memory made of a few regions; everything else is unreadable.
#[derive(Default)]
struct Mem(Vec<(u64, Vec<u8>)>);

impl Mem {
    fn put(&mut self, at: u64, bytes: Vec<u8>) {
        self.0.push((at, bytes));
    }
}

impl PhysMem for Mem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        for (at, bytes) in &self.0 {
            if addr >= *at && addr + buf.len() as u64 <= at + bytes.len() as u64 {
                let o = (addr - at) as usize;
                buf.copy_from_slice(&bytes[o..o + buf.len()]);
                return true;
            }
        }
        false
    }
}

fn fix_checksum(t: &mut [u8], at: usize, over: usize) {
    t[at] = 0;
    let s = t[..over].iter().fold(0u8, |s, x| s.wrapping_add(*x));
    t[at] = 0u8.wrapping_sub(s);
}

/// A table with `sig`, the body appended to the 36-byte header, length and checksum right.
fn sdt(sig: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 36];
    t[..4].copy_from_slice(sig);
    t.extend_from_slice(body);
    let len = t.len() as u32;
    t[4..8].copy_from_slice(&len.to_le_bytes());
    t[8] = 1;
    t[10..16].copy_from_slice(b"BVTEST");
    let n = t.len();
    fix_checksum(&mut t, 9, n);
    t
}

fn rsdp(rsdt: u32, xsdt: Option<u64>) -> Vec<u8> {
    let mut r = vec![0u8; 36];
    r[..8].copy_from_slice(b"RSD PTR ");
    r[9..15].copy_from_slice(b"BVTEST");
    r[16..20].copy_from_slice(&rsdt.to_le_bytes());
    if let Some(x) = xsdt {
        r[15] = 2;
        r[20..24].copy_from_slice(&36u32.to_le_bytes());
        r[24..32].copy_from_slice(&x.to_le_bytes());
        fix_checksum(&mut r, 8, 20);
        fix_checksum(&mut r, 32, 36);
    } else {
        r.truncate(20);
        fix_checksum(&mut r, 8, 20);
    }
    r
}

fn lapic(uid: u8, id: u8, flags: u32) -> Vec<u8> {
    let mut e = vec![0, 8, uid, id];
    e.extend_from_slice(&flags.to_le_bytes());
    e
}

fn x2apic(id: u32, flags: u32, uid: u32) -> Vec<u8> {
    let mut e = vec![9, 16, 0, 0];
    e.extend_from_slice(&id.to_le_bytes());
    e.extend_from_slice(&flags.to_le_bytes());
    e.extend_from_slice(&uid.to_le_bytes());
    e
}

fn madt(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut body = 0xFEE0_0000u32.to_le_bytes().to_vec();
    body.extend_from_slice(&1u32.to_le_bytes());
    for e in entries {
        body.extend_from_slice(e);
    }
    sdt(b"APIC", &body)
}

const RSDP_AT: u64 = 0xF_5A40;
const RSDT_AT: u64 = 0x0FFE_0000;
const XSDT_AT: u64 = 0x0FFE_1000;
const MADT_AT: u64 = 0x0FFE_2000;
const FACP_AT: u64 = 0x0FFE_3000;

/// A machine with the BIOS area, an RSDT listing a FACP and the MADT, and the MADT given.
fn machine(madt_bytes: Vec<u8>, with_xsdt: bool) -> Mem {
    let mut m = Mem::default();
    let mut bios = vec![0u8; 0x2_0000];
    let r = rsdp(RSDT_AT as u32, with_xsdt.then_some(XSDT_AT));
    let o = (RSDP_AT - 0xE_0000) as usize;
    bios[o..o + r.len()].copy_from_slice(&r);
    m.put(0xE_0000, bios);
    let mut rsdt_body = (FACP_AT as u32).to_le_bytes().to_vec();
    rsdt_body.extend_from_slice(&(MADT_AT as u32).to_le_bytes());
    m.put(RSDT_AT, sdt(b"RSDT", &rsdt_body));
    if with_xsdt {
        let mut x = FACP_AT.to_le_bytes().to_vec();
        x.extend_from_slice(&MADT_AT.to_le_bytes());
        m.put(XSDT_AT, sdt(b"XSDT", &x));
    }
    m.put(FACP_AT, sdt(b"FACP", &[0u8; 100]));
    m.put(MADT_AT, madt_bytes);
    m
}

fn ids(cpus: &[CpuEntry]) -> Vec<u32> {
    cpus.iter().map(|c| c.apic_id).collect()
}

#[test]
fn a_well_formed_rsdt_machine_lists_its_cpus() {
    let entries = [
        lapic(0, 0, 1),
        lapic(1, 1, 1),
        // An I/O APIC and an interrupt override between them: skipped by length.
        vec![1, 12, 0, 0, 0, 0, 0xC0, 0xFE, 0, 0, 0, 0],
        vec![2, 10, 0, 0, 2, 0, 0, 0, 0, 0],
        lapic(2, 3, 1),
    ];
    let m = machine(madt(&entries), false);
    let rsdp = find_rsdp(&m, None).expect("found by the scan");
    assert_eq!(rsdp, RSDP_AT);
    let t = read_madt(&m, rsdp).expect("parsed");
    assert_eq!(ids(t.cpus()), [0, 1, 3]);
    assert_eq!(t.cpus()[2].uid, 2);
    assert_eq!(t.lapic_addr, 0xFEE0_0000);
    assert_eq!(t.flags, 1);
    assert_eq!((t.disabled, t.dropped), (0, 0));
}

#[test]
fn the_xsdt_is_preferred_and_x2apic_entries_are_read() {
    let entries = [lapic(0, 0, 1), x2apic(300, 1, 7)];
    let mut m = machine(madt(&entries), true);
    // An RSDT that lies (no MADT) proves the XSDT was the one read.
    m.0.retain(|(at, _)| *at != RSDT_AT);
    m.put(RSDT_AT, sdt(b"RSDT", &(FACP_AT as u32).to_le_bytes()));
    let t = read_madt(&m, find_rsdp(&m, Some(RSDP_AT)).unwrap()).expect("parsed");
    assert_eq!(ids(t.cpus()), [0, 300]);
    assert_eq!(t.cpus()[1].uid, 7);
}

#[test]
fn a_madt_with_zero_entries_lists_no_cpu() {
    let m = machine(madt(&[]), false);
    let t = read_madt(&m, RSDP_AT).expect("an empty MADT is well-formed");
    assert!(t.cpus().is_empty());
    assert_eq!((t.disabled, t.dropped), (0, 0));
}

#[test]
fn disabled_and_hotplug_cpus_are_counted_not_started() {
    // Flags 0: disabled; flags 2: online-capable (hot-pluggable), not enabled now.
    let entries = [
        lapic(0, 0, 1),
        lapic(1, 1, 0),
        lapic(2, 2, 2),
        x2apic(9, 0, 9),
    ];
    let t = read_madt(&machine(madt(&entries), false), RSDP_AT).unwrap();
    assert_eq!(ids(t.cpus()), [0]);
    assert_eq!(t.disabled, 3);
}

#[test]
fn duplicates_broadcast_ids_and_cpus_past_the_bound_are_dropped() {
    let mut entries = vec![lapic(0, 0, 1), lapic(1, 0, 1), lapic(2, 0xFF, 1)];
    for i in 1..=MAX_CPUS as u8 + 2 {
        entries.push(lapic(i + 10, i, 1));
    }
    let t = read_madt(&machine(madt(&entries), false), RSDP_AT).unwrap();
    assert_eq!(t.cpus().len(), MAX_CPUS);
    assert_eq!(t.cpus()[0].apic_id, 0);
    assert_eq!(t.cpus()[MAX_CPUS - 1].apic_id, MAX_CPUS as u32 - 1);
    // The duplicate 0, the broadcast 0xFF and the three past MAX_CPUS (IDs 16, 17, 18).
    assert_eq!(t.dropped, 5);
}

#[test]
fn an_entry_of_length_zero_is_refused_not_looped_on() {
    let t = madt(&[lapic(0, 0, 1), vec![0x7F, 0, 0, 0]]);
    let e = parse_madt(&machine(t, false), MADT_AT).unwrap_err();
    assert_eq!(e, AcpiError::Entry { offset: 52, len: 0 });
}

#[test]
fn an_entry_running_past_the_table_is_refused() {
    // The last entry says 40 bytes; 8 remain.
    let mut last = lapic(1, 1, 1);
    last[1] = 40;
    let t = madt(&[lapic(0, 0, 1), last]);
    let e = parse_madt(&machine(t, false), MADT_AT).unwrap_err();
    assert_eq!(
        e,
        AcpiError::Entry {
            offset: 52,
            len: 40
        }
    );
}

#[test]
fn a_processor_entry_too_short_for_its_fields_is_refused() {
    let mut short = x2apic(5, 1, 5);
    short[1] = 8;
    short.truncate(8);
    let e = parse_madt(&machine(madt(&[short]), false), MADT_AT).unwrap_err();
    assert_eq!(e, AcpiError::Entry { offset: 44, len: 8 });
}

#[test]
fn lengths_that_lie_are_refused() {
    // Longer than the memory holding it: unreadable, not read past.
    let mut t = madt(&[lapic(0, 0, 1)]);
    t[4..8].copy_from_slice(&4096u32.to_le_bytes());
    assert!(matches!(
        parse_madt(&machine(t, false), MADT_AT),
        Err(AcpiError::Unreadable { .. })
    ));
    // Past the bound: refused before any read of its body.
    let mut t = madt(&[lapic(0, 0, 1)]);
    t[4..8].copy_from_slice(&(MAX_MADT_LEN + 1).to_le_bytes());
    assert_eq!(
        parse_madt(&machine(t, false), MADT_AT).unwrap_err(),
        AcpiError::Length {
            table: *b"APIC",
            len: MAX_MADT_LEN + 1
        }
    );
    // u32::MAX: no overflow, the same refusal.
    let mut t = madt(&[]);
    t[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        parse_madt(&machine(t, false), MADT_AT),
        Err(AcpiError::Length { len: u32::MAX, .. })
    ));
    // Shorter than the header and than the MADT's fixed fields.
    for len in [0u32, 20, 40] {
        let mut t = madt(&[]);
        t[4..8].copy_from_slice(&len.to_le_bytes());
        let n = (len as usize).clamp(36, t.len());
        fix_checksum(&mut t, 9, n);
        let e = parse_madt(&machine(t, false), MADT_AT).unwrap_err();
        assert_eq!(
            e,
            AcpiError::Length {
                table: *b"APIC",
                len
            },
            "length {len}"
        );
    }
}

#[test]
fn a_truncated_madt_is_unreadable() {
    let mut t = madt(&[lapic(0, 0, 1), lapic(1, 1, 1)]);
    t.truncate(50);
    assert!(matches!(
        parse_madt(&machine(t, false), MADT_AT),
        Err(AcpiError::Unreadable { .. })
    ));
}

#[test]
fn bad_checksums_and_signatures_are_refused() {
    let mut t = madt(&[lapic(0, 0, 1)]);
    t[40] ^= 1;
    assert_eq!(
        parse_madt(&machine(t, false), MADT_AT).unwrap_err(),
        AcpiError::Checksum { table: *b"APIC" }
    );
    let m = machine(sdt(b"SSDT", &[0; 8]), false);
    assert_eq!(read_madt(&m, RSDP_AT).unwrap_err(), AcpiError::NoMadt);
    assert!(matches!(
        parse_madt(&m, MADT_AT),
        Err(AcpiError::Signature {
            expected: [b'A', b'P', b'I', b'C'],
            ..
        })
    ));
    let mut m = machine(madt(&[]), false);
    // The RSDP's checksum broken.
    let bios = &mut m.0[0].1;
    bios[(RSDP_AT - 0xE_0000) as usize + 8] ^= 0x55;
    assert_eq!(find_rsdp(&m, Some(RSDP_AT)), Err(AcpiError::RsdpChecksum));
    assert_eq!(find_rsdp(&m, None), Err(AcpiError::NoRsdp));
}

#[test]
fn an_rsdt_pointing_nowhere_or_too_long_is_handled() {
    let mut m = machine(madt(&[lapic(0, 0, 1)]), false);
    // A pointer into unreadable memory before the MADT's: skipped, the MADT still found.
    m.0.retain(|(at, _)| *at != RSDT_AT);
    let mut body = 0xDEAD_0000u32.to_le_bytes().to_vec();
    body.extend_from_slice(&(MADT_AT as u32).to_le_bytes());
    m.put(RSDT_AT, sdt(b"RSDT", &body));
    assert_eq!(ids(read_madt(&m, RSDP_AT).unwrap().cpus()), [0]);
    // An RSDT claiming more entries than the bound.
    m.0.retain(|(at, _)| *at != RSDT_AT);
    let mut t = sdt(b"RSDT", &body);
    t[4..8].copy_from_slice(&(36 + 4 * 100_000u32).to_le_bytes());
    m.put(RSDT_AT, t);
    assert!(matches!(
        read_madt(&m, RSDP_AT),
        Err(AcpiError::Length {
            table: [b'R', b'S', b'D', b'T'],
            ..
        })
    ));
}

#[test]
fn the_rsdp_is_found_in_the_ebda() {
    let mut m = machine(madt(&[lapic(0, 0, 1)]), false);
    m.0.remove(0);
    // EBDA segment 0x9FC0 at 0x40E: the RSDP in its first KiB.
    let mut low = vec![0u8; 0xA0000];
    low[0x40E..0x410].copy_from_slice(&0x9FC0u16.to_le_bytes());
    let r = rsdp(RSDT_AT as u32, None);
    low[0x9FC00 + 0x30..0x9FC00 + 0x30 + r.len()].copy_from_slice(&r);
    m.put(0, low);
    assert_eq!(find_rsdp(&m, None), Ok(0x9FC30));
    assert!(read_madt(&m, 0x9FC30).is_ok());
}

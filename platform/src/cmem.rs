//! `memcpy`, `memmove`, `memset`, `memcmp` and `bcmp`: the C symbols the precompiled `core` of
//! the linux-gnu target calls, for a kernel without a C library. Plain Rust over `core` only,
//! so the host benchmark (tests/bench/rxe_guest.rs) compiles this same file into its binary,
//! where these symbols take the place of the C library's.
//!
//! Copies and fills are x86's string instructions: `rep movsq` / `rep stosq` for the whole
//! 8-byte words, then `rep movsb` / `rep stosb` for the last 0 to 7 bytes. The processor runs
//! them in its fast-string microcode (tens of bytes a cycle on anything since the P6 for
//! large counts), an emulator (QEMU's TCG) in one helper loop, and an instruction counter sees
//! one instruction per word. In inline assembly, so the compiler cannot recognise the loop
//! and turn the body back into a call to the function itself. Rust's inline assembly is
//! entered with the direction flag clear and must leave it clear.

use core::arch::asm;

/// # Safety
///
/// C `memcpy`: `dst` and `src` valid for `n` bytes, not overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract: both ranges are valid for `n` bytes.
    unsafe { copy_forward(dst, src, n) };
    dst
}

/// Copies `n` bytes from `src` to `dst`, lowest address first: 8-byte words, then the tail.
///
/// # Safety
///
/// `dst` and `src` valid for `n` bytes; they may overlap only with `dst` below `src` (each
/// element of a `rep movs` is read before it is written, in order, so a forward copy never
/// reads a byte it has overwritten then).
#[inline(always)]
unsafe fn copy_forward(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: the caller's contract covers the `n` bytes both instructions touch (the words,
    // then the tail, contiguous); the direction flag is clear on entry (Rust's asm rules), so
    // both copy upwards; no stack, no flags changed.
    unsafe {
        asm!(
            "rep movsq",
            "mov ecx, {tail:e}",
            "rep movsb",
            tail = in(reg) n & 7,
            inout("rcx") n >> 3 => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
}

/// # Safety
///
/// C `memmove`: `dst` and `src` valid for `n` bytes; they may overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize).wrapping_sub(src as usize) >= n {
        // `dst` below `src`, or apart: upwards is safe.
        // SAFETY: the caller's contract; the overlap, if any, is the one `copy_forward` takes.
        unsafe { copy_forward(dst, src, n) };
    } else {
        // `dst` inside `src..src + n`: downwards, the tail's last byte first, then the words
        // from the last one down. With the direction flag set, `rep movsb` copies the `n & 7`
        // bytes at the top downwards from `src + n - 1`, leaving `rsi`/`rdi` one below them;
        // 7 lower is the start of the last whole word, from which `rep movsq` copies the
        // `n >> 3` words downwards. Each element is read before it is written, highest first,
        // so no byte is read after being overwritten.
        // SAFETY: the caller's contract: both ranges are valid for `n` bytes; the order above
        // reads every byte before it is overwritten; the direction flag is cleared again
        // before the block ends, as Rust requires.
        unsafe {
            asm!(
                "std",
                "rep movsb",
                "sub rsi, 7",
                "sub rdi, 7",
                "mov rcx, {words}",
                "rep movsq",
                "cld",
                words = in(reg) n >> 3,
                inout("rcx") n & 7 => _,
                inout("rdi") dst.add(n).wrapping_sub(1) => _,
                inout("rsi") src.add(n).wrapping_sub(1) => _,
                options(nostack)
            );
        }
    }
    dst
}

/// # Safety
///
/// C `memset`: `dst` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    let word = u64::from(c as u8) * 0x0101_0101_0101_0101;
    // SAFETY: the caller's contract: `dst` is valid for `n` bytes, which the words and then
    // the tail fill upwards (the direction flag is clear on entry); no stack, no flags.
    unsafe {
        asm!(
            "rep stosq",
            "mov ecx, {tail:e}",
            "rep stosb",
            tail = in(reg) n & 7,
            inout("rcx") n >> 3 => _,
            inout("rdi") dst => _,
            in("rax") word,
            options(nostack, preserves_flags)
        );
    }
    dst
}

// Comparisons stay byte loops, with volatile accesses so that the compiler cannot turn them
// back into calls to themselves (the driver compares only short fields).

/// # Safety
///
/// C `memcmp`: `a` and `b` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the caller's contract: both ranges are valid for `n` bytes.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// # Safety
///
/// C `bcmp`: as `memcmp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { memcmp(a, b, n) }
}

//! `memcpy`, `memmove`, `memset`, `memcmp` and `bcmp`: the C symbols the precompiled `core` of
//! the linux-gnu target calls, for a kernel without a C library. Plain Rust over `core` only,
//! so the host benchmark (tests/bench/rxe_guest.rs) compiles this same file into its binary,
//! where these symbols take the place of the C library's.

// Byte loops with volatile accesses, so that the compiler cannot turn them back into calls to
// themselves.

/// # Safety
///
/// C `memcpy`: `dst` and `src` valid for `n` bytes, not overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller's contract: both ranges are valid for `n` bytes.
        unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
    }
    dst
}

/// # Safety
///
/// C `memmove`: `dst` and `src` valid for `n` bytes; they may overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) < (src as usize) {
        for i in 0..n {
            // SAFETY: the caller's contract; copying forwards is safe when dst < src.
            unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
        }
    } else {
        for i in (0..n).rev() {
            // SAFETY: the caller's contract; copying backwards is safe when dst >= src.
            unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
        }
    }
    dst
}

/// # Safety
///
/// C `memset`: `dst` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller's contract: `dst` is valid for `n` bytes.
        unsafe { dst.add(i).write_volatile(c as u8) };
    }
    dst
}

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

// The kernel binaries' build script (each binary's `build.rs` includes this file after naming
// `LINKER_SCRIPT`, `linker/unikernel.ld` relative to its manifest): links the binary
// freestanding: our linker script, no PIE, no C runtime.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir");
    let script = format!("{dir}/{LINKER_SCRIPT}");
    println!("cargo:rerun-if-changed={script}");
    for arg in [
        format!("-Wl,-T,{script}"),
        "-static".into(),
        "-no-pie".into(),
        "-nostartfiles".into(),
        "-nostdlib".into(),
        "-Wl,--build-id=none".into(),
        "-Wl,-n".into(),
        // Identical functions folded into one (the driver's code for two devices or types that
        // compiles to the same bytes): 671 bytes of driver text, 2,288 of the kernel's. `all`,
        // not `safe`: Rust promises no distinct function addresses (`safe` folds nothing
        // here), and lld folds only code this way, never data.
        "-Wl,--icf=all".into(),
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
}

//! Links the kernel binary freestanding: our linker script, no PIE, no C runtime.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir");
    let script = format!("{dir}/../../linker/unikernel.ld");
    println!("cargo:rerun-if-changed={script}");
    for arg in [
        format!("-Wl,-T,{script}"),
        "-static".into(),
        "-no-pie".into(),
        "-nostartfiles".into(),
        "-nostdlib".into(),
        "-Wl,--build-id=none".into(),
        "-Wl,-n".into(),
        "-Wl,--icf=all".into(),
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
}

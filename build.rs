//! Link settings of the binaries.
//!
//! On Linux with glibc the binaries are linked with packed relative
//! relocations (`DT_RELR`, glibc 2.36 and later, as in the operator image).
//! A position-independent Rust binary carries one relocation for nearly
//! every pointer in its read-only data (vtables, string tables), 24 bytes
//! each in the classic format: several megabytes that the loader reads at
//! every start and that then stay resident in the process. Packed, they
//! take a few kilobytes; the binary stays position-independent.
//! `REDPILOT_NO_RELR=1` links the classic way (for an older glibc).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=REDPILOT_NO_RELR");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let off = std::env::var("REDPILOT_NO_RELR").is_ok_and(|v| v == "1");
    if os == "linux" && env == "gnu" && !off {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

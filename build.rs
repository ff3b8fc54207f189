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
//!
//! The release build's functions are laid out in the order
//! `hack/hot-symbols.txt` gives (the linker's `--symbol-ordering-file`): the
//! ones an idle operator runs first and together, so the few hundred pages
//! of code it keeps resident are not spread one function each over the
//! whole text (`make hot-symbols` makes the list; `src/pages.rs` gives the
//! rest back). Names the list has and the build lacks are passed over.
//! The option is LLD's, the linker Rust uses on x86-64 Linux;
//! `REDPILOT_NO_SYMBOL_ORDER=1` leaves it out (for another linker).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=REDPILOT_NO_RELR");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let off = std::env::var("REDPILOT_NO_RELR").is_ok_and(|v| v == "1");
    if os == "linux" && env == "gnu" && !off {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=hack/hot-symbols.txt");
    println!("cargo:rerun-if-env-changed=REDPILOT_NO_SYMBOL_ORDER");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let no_order = std::env::var("REDPILOT_NO_SYMBOL_ORDER").is_ok_and(|v| v == "1");
    let list = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("hack/hot-symbols.txt");
    if os == "linux" && arch == "x86_64" && release && !no_order && list.is_file() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

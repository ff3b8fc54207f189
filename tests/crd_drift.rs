//! The checked-in `crds/redis.yaml` is exactly what the Rust types generate,
//! so what `make install`, OLM bundles and the suites apply matches the code.

use redpilot::api::crds_yaml;

#[test]
fn checked_in_crds_match_the_rust_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/redis.yaml");
    let checked_in = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let generated = crds_yaml().expect("rendering the CRDs");
    if checked_in != generated {
        let first_difference = checked_in
            .lines()
            .zip(generated.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| format!("line {}:\n  checked in: {a}\n  generated:  {b}", i + 1))
            .unwrap_or_else(|| {
                format!(
                    "lengths differ: {} vs {} lines",
                    checked_in.lines().count(),
                    generated.lines().count()
                )
            });
        panic!(
            "crds/redis.yaml is out of date with src/api/ ({first_difference}).\n\
             Regenerate it with `cargo run -- crd --output crds/redis.yaml`."
        );
    }
}
